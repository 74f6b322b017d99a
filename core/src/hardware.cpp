#include "tally/core/hardware.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace tally {

double GpuSpec::peak_flops(Precision p) const {
  // fp32 training runs its matmuls on TF32 tensor cores (PyTorch's allow_tf32 / Megatron default).
  switch (p) {
    case Precision::fp32: return peak_tf32_flops;
    case Precision::bf16:
    case Precision::fp16: return peak_bf16_flops;
    case Precision::fp8:
    case Precision::mxfp8: return peak_fp8_flops;
    case Precision::nvfp4: return peak_fp4_flops;
  }
  return 0;
}

const KernelPerf& GpuSpec::gemm_kernels(Precision p) const {
  if ((p == Precision::fp8 || p == Precision::mxfp8) && fp8_gemm) return *fp8_gemm;
  if (p == Precision::nvfp4 && fp4_gemm) return *fp4_gemm;
  return kernels;
}

bool GpuSpec::supports(Precision p) const {
  switch (p) {
    case Precision::fp8: return peak_fp8_flops > 0;
    case Precision::mxfp8: return peak_fp8_flops > 0 && peak_fp4_flops > 0;
    case Precision::nvfp4: return peak_fp4_flops > 0;
    default: return true;
  }
}

namespace {

void check(double v, HardwareBounds b, const char* field, const char* unit) {
  require_real(std::isfinite(v) && v >= b.lo && v <= b.hi, field, v,
               [&] {
                 return "must be in [" + format_number(b.lo) + ", " + format_number(b.hi) + "] " +
                        unit;
               });
}

}  // namespace

double ClusterSpec::checkpoint_write_bps_for(int gpus) const {
  if (checkpoint_write_bps > 0) return checkpoint_write_bps;
  const int g = std::max(gpus_per_node, 1);
  return checkpoint_write_bps_per_node * double((std::max(gpus, 1) + g - 1) / g);
}

void ClusterSpec::validate() const {
  check(gpu.memory_bytes, kMemoryBytesBounds, "gpu memory", "bytes of HBM per GPU");
  check(gpu.peak_bf16_flops, kPeakFlopsBounds, "gpu peak_bf16_flops", "FLOP/s");
  check(gpu.peak_tf32_flops, kPeakFlopsBounds, "gpu peak_tf32_flops", "FLOP/s");
  // Optional peaks: 0 means "none" (a GPU without FP8 tensor cores).
  if (gpu.peak_fp32_flops != 0)
    check(gpu.peak_fp32_flops, kPeakFlopsBounds, "gpu peak_fp32_flops", "FLOP/s (or 0: none)");
  if (gpu.peak_fp8_flops != 0)
    check(gpu.peak_fp8_flops, kPeakFlopsBounds, "gpu peak_fp8_flops", "FLOP/s (or 0: none)");
  if (gpu.peak_fp4_flops != 0)
    check(gpu.peak_fp4_flops, kPeakFlopsBounds, "gpu peak_fp4_flops", "FLOP/s (or 0: none)");
  if (gpu.compute_capability < 0 || gpu.compute_capability > 999)
    throw InvalidInput("gpu compute_capability = " + std::to_string(gpu.compute_capability) +
                       ": must be 10 * major + minor in [0, 999] (90 for 9.0; 0 = not known)");
  if (gpus_per_node < 1)
    throw InvalidInput("gpus_per_node = " + std::to_string(gpus_per_node) + ": must be >= 1");
  if (nvlink_domain != 0 && (nvlink_domain < gpus_per_node || nvlink_domain % gpus_per_node != 0))
    throw InvalidInput("nvlink_domain = " + std::to_string(nvlink_domain) +
                       ": must be 0 (one host) or a multiple of gpus_per_node = " +
                       std::to_string(gpus_per_node) + " (whole hosts share a fabric)");
  check(intra_node.bandwidth_bps, kBandwidthBpsBounds, "intra-node bandwidth", "bytes/s");
  check(inter_node.bandwidth_bps, kBandwidthBpsBounds, "inter-node bandwidth", "bytes/s");
  check(intra_node.latency_s, kLatencySBounds, "intra-node latency", "seconds");
  check(inter_node.latency_s, kLatencySBounds, "inter-node latency", "seconds");
  check(failure_rate_per_hour, kFailureRateBounds, "failure rate", "per GPU-hour");
  if (checkpoint_write_bps != 0)
    check(checkpoint_write_bps, kBandwidthBpsBounds, "checkpoint write bandwidth",
          "bytes/s (or 0: per node × nodes)");
  check(checkpoint_write_bps_per_node, kBandwidthBpsBounds, "checkpoint write bandwidth per node",
        "bytes/s");
  check(mfu, kUtilisationBounds, "mfu", "(fraction of peak)");
}

}  // namespace tally
