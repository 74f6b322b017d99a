// Hardware as small composable types (STYLE.md, after calculon): a GPU, a link class, a cluster.
// Units are converted once, where a preset or file is read; everything here is SI: bytes, bytes/s,
// seconds, FLOP/s.
#pragma once

#include <cstdint>
#include <string>

#include "tally/core/types.hpp"

namespace tally {

// Physical bounds every hardware figure must meet, wherever it comes from (preset, cluster file,
// calibration file, command line). They reject typos, unit mix-ups and values such as 5e-324 that
// pass a "(0, x]" check and then turn every time into inf; they admit any real or near-future
// system. Units: SI (bytes, bytes/s, FLOP/s, seconds).
struct HardwareBounds {
  double lo, hi;
};
inline constexpr HardwareBounds kMemoryBytesBounds{1e6, 7.1e13};      // 1 MB .. 64 TiB per GPU
inline constexpr HardwareBounds kPeakFlopsBounds{1e9, 1e18};          // 1 GFLOP/s .. 1 EFLOP/s
inline constexpr HardwareBounds kBandwidthBpsBounds{1e6, 1e15};       // 1 MB/s .. 1 PB/s
inline constexpr HardwareBounds kLatencySBounds{0, 1};                // 0 .. 1 s per message
inline constexpr HardwareBounds kFailureRateBounds{0, 1};             // per GPU-hour
inline constexpr HardwareBounds kUtilisationBounds{1e-3, 1};          // fraction of peak

// One link class of the α–β model: time(bytes) = latency_s + bytes / bandwidth_bps.
// bandwidth_bps is the per-GPU, per-direction bandwidth a ring step can use.
struct LinkSpec {
  double bandwidth_bps = 0;
  double latency_s = 0;
};

struct GpuSpec {
  std::string name;
  double memory_bytes = 0;          // usable HBM capacity
  double peak_fp32_flops = 0;       // dense, no sparsity, per second
  double peak_tf32_flops = 0;
  double peak_bf16_flops = 0;       // fp16 is the same on every preset here
  double peak_fp8_flops = 0;        // 0 when the GPU has no FP8 tensor cores
  double peak_flops(Precision p) const;  // tensor-core peak for the training dtype (fp32 → tf32)
};

struct ClusterSpec {
  GpuSpec gpu;
  int gpus_per_node = 8;
  LinkSpec intra_node;               // NVLink / NVSwitch
  LinkSpec inter_node;               // InfiniBand / RoCE, per GPU
  double failure_rate_per_hour = 3e-6;   // λ per GPU (seed: 量级参考，需核实)
  double checkpoint_write_bps = 2e9;     // aggregate sharded-save bandwidth (seed: 2 GB/s)
  // Model FLOP utilisation assumed when turning FLOPs into seconds; one number per GPU type
  // (issue 5: no per-case fudge factors). Overridden by a calibration file.
  double mfu = 0.5;
  // Throws InvalidInput "<field> = <value>: must be in [lo, hi] <unit>" unless every figure is
  // finite and inside its HardwareBounds (a peak of 0 is allowed for the optional fp32/fp8 peaks).
  void validate() const;
};

}  // namespace tally
