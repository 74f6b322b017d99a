// Cluster JSON → ClusterSpec (DESIGN.md §3 "Cluster input"; format in docs/formats.md).
//
//   {
//     "preset": "a100-80g",                 optional base (core cluster_preset); the rest overrides it
//     "gpu": {"name": "a100-80g",
//             "memory_gib": 80,             GiB = 2^30 bytes  (or "memory_gb": GB = 1e9 bytes)
//             "peak_bf16_tflops": 312,      dense TFLOP/s = 1e12 FLOP/s
//             "peak_tf32_tflops": 156, "peak_fp32_tflops": 19.5, "peak_fp8_tflops": 0,
//             "compute_capability": 8.0},   major.minor; 0 = not known
//     "gpus_per_node": 8,
//     "intra_node": {"bandwidth_gbps": 300, "latency_us": 3},
//     "inter_node": {"bandwidth_gbps": 50, "latency_us": 10},
//     "failure_rate_per_gpu_hour": 3e-6,
//     "checkpoint_write_gbps": 2,
//     "mfu": 0.5
//   }
//
// !!! "gbps" here means GIGABYTES per second (1e9 BYTES/s), not gigabits: NVLink 3 is
// !!! "bandwidth_gbps": 300, a 200 Gb/s HDR InfiniBand NIC is "bandwidth_gbps": 25.
// Bandwidths are per GPU, per direction (what one ring step can use), as in LinkSpec.
//
// Units are converted once, here, to ClusterSpec's SI fields (bytes, bytes/s, s, FLOP/s).
// Without "preset", gpu.memory_*, gpu.peak_bf16_tflops, gpu.peak_tf32_tflops and both links'
// bandwidth_gbps and latency_us are required; other fields default to ClusterSpec's defaults.
// Unknown keys are errors naming the key. The result has passed ClusterSpec::validate().
#pragma once

#include <filesystem>
#include <string_view>

#include "tally/core/hardware.hpp"

namespace tally::io {

ClusterSpec load_cluster(const std::filesystem::path& path);
ClusterSpec parse_cluster(std::string_view json_text, std::string_view source_name);

}  // namespace tally::io
