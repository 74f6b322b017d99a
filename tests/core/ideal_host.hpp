// A calibrated host whose kernels run exactly at peak (η = 1: no tile, inner-size or thin-GEMM
// loss, streaming at the full bandwidth W, no per-kernel overhead) and whose link is α, β: the
// host step models' terms are then FLOPs / peak, bytes / W and α·steps + bytes / β, countable by
// hand (tests of core/mlp_step and core/gpt_step).
#pragma once

#include "tally/core/hardware.hpp"

namespace tally::test {

inline ClusterSpec ideal_host(double peak, double alpha, double beta, double W) {
  ClusterSpec h;
  h.gpu.peak_fp32_flops = h.gpu.peak_tf32_flops = h.gpu.peak_bf16_flops = peak;
  h.gpu.memory_bps = W;
  h.gpu.kernels = KernelPerf{.sm_count = 1, .tile_m = 1, .tile_n = 1, .gemm_fraction = 1,
                             .gemm_half_k = 0, .gemm_half_mn = 0, .memory_fraction = 1,
                             .kernel_overhead_s = 0};
  h.intra_node = {.bandwidth_bps = beta, .latency_s = alpha};
  return h;
}

}  // namespace tally::test
