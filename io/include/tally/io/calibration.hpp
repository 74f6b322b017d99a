// Measured calibration: written by `tally bench allreduce`, read by `tally comm --calibration FILE`
// and the planner, applied over a cluster preset or file (DESIGN.md §3). Format in docs/formats.md:
//
//   {
//     "format": "tally-calibration", "version": 1,       optional on read; checked if present
//     "source": "tally bench allreduce, 2 nodes x 8, gloo",
//     "intra_node": {"alpha_s": 3e-06, "beta_bytes_per_s": 2.5e+11},   optional
//     "inter_node": {"alpha_s": 1e-05, "beta_bytes_per_s": 4.8e+10},   optional
//     "mfu": 0.45,                                                      optional
//     "points": [{"collective": "allreduce", "ranks": 8, "size_bytes": 1048576,
//                 "seconds_median": 0.00012, "seconds_mean": 0.00013,   (mean optional)
//                 "busbw_bytes_per_s": 7.6e+09}, ...],
//     "kernels": {                                                      optional (operator model)
//       "device": "NVIDIA H200", "precision": "bf16", "peak_flops": 9.894e14,
//       "sm_count": 132,                                                optional
//       "memory_bytes_per_s": 4.1e12,       measured streaming (read + write) bandwidth, optional
//       "memory_overhead_s": 3e-07,         a streaming kernel's fixed cost per call, optional
//       "memory_curve": [{"working_set_bytes": 4e6, "bytes_per_s": 9e10}, ...],   optional (a
//                                           host's bandwidth from cache to DRAM, `bench memory`)
//       "gemm": [{"m": 4096, "n": 4096, "k": 4096, "batch": 1, "seconds_median": 0.00021}, ...],
//       "attention": [{"batch": 4, "heads": 32, "seq": 4096, "head_dim": 128, "causal": true,
//                      "forward_seconds": 0.0012, "backward_seconds": 0.0031}, ...],
//       "streaming_kernels": [{"kernel": "gelu", "bytes": 4194304,      optional (a host's
//                              "seconds_median": 0.00143}, ...]        kernel families)
//     }
//   }
//
// alpha_s is the per-step latency and beta_bytes_per_s the per-GPU, per-direction bandwidth of the
// α–β model (LinkSpec: latency_s, bandwidth_bps). All units are SI: seconds, bytes, bytes/s.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tally/core/comm.hpp"
#include "tally/core/hardware.hpp"
#include "tally/core/roofline.hpp"

namespace tally::io {

// One measured collective.
struct CalibrationPoint {
  std::string collective;     // e.g. "allreduce": lower-case letters, digits, '_' or '-'
  int ranks = 0;              // participating ranks
  double size_bytes = 0;      // full tensor bytes S
  double seconds_median = 0;  // median over repetitions
  double busbw_bps = 0;       // bus bandwidth, bytes/s (nccl-tests convention)
  double seconds_mean = 0;    // mean over repetitions; 0 = not recorded (optional in the file)
};

// One overlap probe (`tally bench allreduce --overlap-probe`, Note [host overlap] in
// engine/bench/allreduce.cpp): at `ranks` ranks, medians of a fixed amount of CPU work alone, of a
// Gloo all-reduce of size_bytes alone, and of the two started together (the all-reduce launched
// asynchronously, the work, then the wait).
struct OverlapPoint {
  int ranks = 0;
  double size_bytes = 0;
  double work_seconds = 0, comm_seconds = 0, together_seconds = 0;
};

// One measured fused-attention call (PyTorch SDPA / flash): FLOPs 4·b·a·s²·d forward (× ½ causal),
// 2.5 × that backward (core/operators.hpp).
struct AttentionPoint {
  int batch = 0, heads = 0;
  std::int64_t seq = 0, head_dim = 0;
  bool causal = true;
  double forward_seconds = 0, backward_seconds = 0;
};

// One point of a host's streaming-bandwidth curve (`tally bench memory`): a record of the host
// from cache to DRAM; the host step model uses the DRAM end (memory_bps).
struct BandwidthPoint {
  double working_set_bytes = 0;
  double bytes_per_s = 0;
};

// One streaming kernel family timed on the engine's own kernel (`tally bench memory`, Note
// [streaming kernel families] in core/src/operators.cpp): core's bytes of that kernel at the shape
// timed, and its median time per call. Its rate bytes / seconds_median is the family's
// KernelPerf::streaming_rates entry.
struct StreamingKernelPoint {
  std::string kernel;         // a kernel family: core's kernel_family(kernel) == kernel
  double bytes = 0;           // core's bytes of the kernel at the shape timed
  double seconds_median = 0;  // per call
};

// Kernel micro-benchmarks of one device at one precision (`tally bench gemm|memory`,
// bench/gpu/probe.py): they replace the preset's kernel constants (Note [GEMM calibration]).
struct KernelCalibration {
  std::string device, precision;
  double peak_flops = 0;                    // the peak the fractions are relative to
  std::optional<int> sm_count;
  std::optional<double> memory_bps;         // measured streaming bandwidth (read + write)
  std::vector<BandwidthPoint> memory_curve; // by working set, may be empty
  // A streaming kernel's fixed cost per call (`tally bench memory`: a.add_ on 16 floats);
  // KernelPerf::memory_overhead_s, Note [memory kernel overhead] (core/src/operators.cpp).
  std::optional<double> memory_overhead_s;
  std::vector<GemmSample> gemm;
  // GEMMs timed at the power cap (after a training step or back to back; Note [power cap],
  // core/src/presets.cpp): KernelPerf::sustained_gemm = 1 / (the median of measured / the
  // burst-predicted time), at most 1. Empty: the preset's factor stands.
  std::vector<GemmSample> gemm_sustained;
  std::vector<AttentionPoint> attention;
  std::vector<StreamingKernelPoint> streaming_kernels;  // one per family, may be empty
};

struct Calibration {
  std::string source;  // what produced it; on read, the file's "source" or else the file name
  std::optional<LinkSpec> intra_node, inter_node;
  std::optional<double> mfu;
  std::vector<CalibrationPoint> points;
  std::vector<OverlapPoint> overlap;
  std::optional<KernelCalibration> kernels;
};

// Pretty-printed JSON, newline-terminated. Throws InvalidInput if `c` would not read back (a value
// out of range or not finite): what is written can always be read.
std::string calibration_to_json(const Calibration& c);
Calibration parse_calibration(std::string_view json_text, std::string_view source_name);
Calibration load_calibration(const std::filesystem::path& path);

// The cluster with whatever the calibration measured replacing its figures; validated. Kernels:
// sm_count as given; GEMM constants fitted (core fit_gemm_perf) against kernels.peak_flops, then
// rescaled to the cluster's peak for the precision; memory_fraction = measured / the GPU's HBM
// bandwidth (the measured figure itself when the GPU has none); attention: each measured shape's
// executed FLOPs / (peak · seconds) a point of KernelPerf::attention_table (Note [attention
// table], core/roofline.hpp), the two fractions their medians; streaming_kernels: each family's
// bytes / seconds_median its KernelPerf::streaming_rates entry (InvalidInput naming the kernel
// when that rate leaves [1e6, 1e15] B/s).
ClusterSpec apply_calibration(ClusterSpec cluster, const Calibration& c);

// `c` completed from the calibration already at `path`, when that file exists: each of intra_node,
// inter_node, mfu, kernels and points that `c` lacks is taken from the file, so `bench allreduce`,
// `bench gemm` and `bench memory` gather one host's figures in one file. Throws InvalidInput when
// the existing file does not read.
Calibration merged_with_file(Calibration c, const std::filesystem::path& path);

// The calibrated host itself as a one-node cluster, for machines no preset describes (this CPU):
// its "GPU" has the kernels section's device name, peak_flops at every precision (the best GEMM
// `tally bench gemm` measured), memory_bytes_per_s, sm_count (threads) and 1 × 1 tiles (a CPU
// GEMM has no tile or wave quantisation); the intra_node link is the calibration's. Then
// apply_calibration fits the GEMM constants. Throws InvalidInput naming what is missing: a
// kernels section with >= 3 GEMMs and memory_bytes_per_s, and intra_node when `need_link`.
ClusterSpec host_cluster(const Calibration& c, bool need_link);

// The labels of the all-reduce points `tally bench allreduce` writes: Gloo's all-reduce, tally's
// ring (engine/bench/allreduce.cpp).
inline constexpr std::string_view kGlooAllReducePoints = "allreduce";
inline constexpr std::string_view kRingAllReducePoints = "allreduce-ring";
// And of the sharded halves `bench allreduce --sharded` times as `run zero` calls them (Note
// [sharded collectives] there): tally's ring reduce-scatter, Gloo's all-gather.
inline constexpr std::string_view kRingReduceScatterPoints = "reduce-scatter-ring";
inline constexpr std::string_view kGlooAllGatherPoints = "all-gather";
// The collective a label's points time: reduce-scatter and all-gather for the two above, else an
// all-reduce (the labels above, and any other a file names).
Collective points_collective(std::string_view label);

// The α–β link fitted (core fit_alpha_beta, the bench's own fit) to the calibration's points
// labelled `collective` measured at `ranks` ranks, each the label's points_collective: an
// all-reduce at steps 2(k−1), bytes per rank 2S(k−1)/k, a reduce-scatter or all-gather at k−1 and
// S(k−1)/k (core/comm.hpp), on their mean times where every one has it, else their medians
// (Note [mean, not median], engine/bench/allreduce.cpp). nullopt when fewer than 2 distinct sizes
// were measured there or no positive bandwidth fits; throws InvalidInput naming the label, k and
// the value when the fit leaves the links' bounds (β in [1e6, 1e15] B/s, α in [0, 1] s: core's
// kBandwidthBpsBounds, kLatencySBounds), as a file's own link would. A run whose collectives use
// different implementations prices each on its own fit (Note [per-implementation links],
// core/mlp_step.hpp).
std::optional<LinkSpec> fitted_link(const Calibration& c, std::string_view collective, int ranks);

// Note [host overlap]'s σ at `ranks` ranks: per overlap point x = (together − work) / comm, the
// fraction of the collective the work did not hide, clamped to [0, kMaxExposedFraction]; σ of
// core's overlap_exposed_s (x = σ / (1 + σ)) from the median x: σ = x / (1 − x). nullopt when the
// file has no overlap point at `ranks`.
inline constexpr double kMaxExposedFraction = 0.95;
std::optional<double> overlap_slowdown(const Calibration& c, int ranks);

}  // namespace tally::io
