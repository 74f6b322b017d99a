#include "tally/core/hardware.hpp"

#include <string>

namespace tally {

double GpuSpec::peak_flops(Precision p) const {
  // fp32 training runs its matmuls on TF32 tensor cores (PyTorch's allow_tf32 / Megatron default).
  return p == Precision::fp32 ? peak_tf32_flops : peak_bf16_flops;
}

void ClusterSpec::validate() const {
  auto positive = [](double v, const char* field, const char* hint) {
    if (!(v > 0))
      throw InvalidInput(std::string(field) + " = " + std::to_string(v) + ": must be > 0 (" +
                         hint + ")");
  };
  positive(gpu.memory_bytes, "gpu memory", "bytes of HBM per GPU");
  positive(gpu.peak_bf16_flops, "gpu peak_bf16_flops", "FLOP/s");
  positive(gpu.peak_tf32_flops, "gpu peak_tf32_flops", "FLOP/s");
  if (gpus_per_node < 1)
    throw InvalidInput("gpus_per_node = " + std::to_string(gpus_per_node) + ": must be >= 1");
  positive(intra_node.bandwidth_bps, "intra-node bandwidth", "bytes/s");
  positive(inter_node.bandwidth_bps, "inter-node bandwidth", "bytes/s");
  if (intra_node.latency_s < 0 || inter_node.latency_s < 0)
    throw InvalidInput("link latency must be >= 0 seconds");
  if (failure_rate_per_hour < 0)
    throw InvalidInput("failure rate = " + std::to_string(failure_rate_per_hour) +
                       ": must be >= 0 per GPU-hour");
  positive(checkpoint_write_bps, "checkpoint write bandwidth", "bytes/s");
  if (!(mfu > 0 && mfu <= 1))
    throw InvalidInput("mfu = " + std::to_string(mfu) + ": must be in (0, 1]");
}

}  // namespace tally
