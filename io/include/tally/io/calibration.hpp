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
//                 "seconds_median": 0.00012, "busbw_bytes_per_s": 7.6e+09}, ...]
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

#include "tally/core/hardware.hpp"

namespace tally::io {

// One measured collective.
struct CalibrationPoint {
  std::string collective;     // e.g. "allreduce": lower-case letters, digits, '_' or '-'
  int ranks = 0;              // participating ranks
  double size_bytes = 0;      // full tensor bytes S
  double seconds_median = 0;  // median over repetitions
  double busbw_bps = 0;       // bus bandwidth, bytes/s (nccl-tests convention)
};

struct Calibration {
  std::string source;  // what produced it; on read, the file's "source" or else the file name
  std::optional<LinkSpec> intra_node, inter_node;
  std::optional<double> mfu;
  std::vector<CalibrationPoint> points;
};

// Pretty-printed JSON, newline-terminated. Throws InvalidInput if `c` would not read back (a value
// out of range or not finite): what is written can always be read.
std::string calibration_to_json(const Calibration& c);
Calibration parse_calibration(std::string_view json_text, std::string_view source_name);
Calibration load_calibration(const std::filesystem::path& path);

// The cluster with whatever the calibration measured (links, MFU) replacing its figures; validated.
ClusterSpec apply_calibration(ClusterSpec cluster, const Calibration& c);

}  // namespace tally::io
