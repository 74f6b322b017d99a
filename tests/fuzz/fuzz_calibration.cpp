// Fuzz harness: the calibration reader and writer (io/include/tally/io/calibration.hpp).
//
// The input is a calibration JSON file. Checked (Note [fuzz contract] in fuzz_check.hpp):
//  - parse_calibration (in memory) and load_calibration (the file) agree, value or message;
//  - an accepted calibration is JSON, and its figures are finite and not subnormal;
//  - an accepted calibration is written by calibration_to_json without complaint, reads back to the
//    same value bit for bit (the kernels section included), and writing that again gives the same
//    text;
//  - apply_calibration over every cluster preset gives a valid cluster or InvalidInput.
#include "fuzz_check.hpp"
#include "tally/core/presets.hpp"
#include "tally/io/calibration.hpp"

namespace tally::fuzz {
namespace {

using namespace tally::io;

bool same_link(const std::optional<LinkSpec>& a, const std::optional<LinkSpec>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a ||
         (same_bits(a->bandwidth_bps, b->bandwidth_bps) && same_bits(a->latency_s, b->latency_s));
}

// The "kernels" section, field by field (bit-exact figures).
bool same_kernels(const std::optional<KernelCalibration>& a,
                  const std::optional<KernelCalibration>& b) {
  if (a.has_value() != b.has_value()) return false;
  if (!a) return true;
  if (a->device != b->device || a->precision != b->precision ||
      !same_bits(a->peak_flops, b->peak_flops) || a->sm_count != b->sm_count ||
      a->memory_bps.has_value() != b->memory_bps.has_value() ||
      (a->memory_bps && !same_bits(*a->memory_bps, *b->memory_bps)) ||
      a->gemm.size() != b->gemm.size() || a->attention.size() != b->attention.size() ||
      a->memory_curve.size() != b->memory_curve.size())
    return false;
  for (std::size_t i = 0; i < a->memory_curve.size(); ++i)
    if (!same_bits(a->memory_curve[i].working_set_bytes, b->memory_curve[i].working_set_bytes) ||
        !same_bits(a->memory_curve[i].bytes_per_s, b->memory_curve[i].bytes_per_s))
      return false;
  for (std::size_t i = 0; i < a->gemm.size(); ++i) {
    const GemmSample &p = a->gemm[i], &q = b->gemm[i];
    if (p.m != q.m || p.n != q.n || p.k != q.k || !same_bits(p.batch, q.batch) ||
        !same_bits(p.seconds, q.seconds))
      return false;
  }
  for (std::size_t i = 0; i < a->attention.size(); ++i) {
    const AttentionPoint &p = a->attention[i], &q = b->attention[i];
    if (p.batch != q.batch || p.heads != q.heads || p.seq != q.seq || p.head_dim != q.head_dim ||
        p.causal != q.causal || !same_bits(p.forward_seconds, q.forward_seconds) ||
        !same_bits(p.backward_seconds, q.backward_seconds))
      return false;
  }
  return true;
}

bool same_calibration(const Calibration& a, const Calibration& b) {
  if (!same_kernels(a.kernels, b.kernels)) return false;
  if (a.source != b.source || !same_link(a.intra_node, b.intra_node) ||
      !same_link(a.inter_node, b.inter_node) || a.mfu.has_value() != b.mfu.has_value() ||
      (a.mfu && !same_bits(*a.mfu, *b.mfu)) || a.points.size() != b.points.size())
    return false;
  for (std::size_t i = 0; i < a.points.size(); ++i) {
    const CalibrationPoint &p = a.points[i], &q = b.points[i];
    if (p.collective != q.collective || p.ranks != q.ranks ||
        !same_bits(p.size_bytes, q.size_bytes) || !same_bits(p.seconds_median, q.seconds_median) ||
        !same_bits(p.busbw_bps, q.busbw_bps))
      return false;
  }
  return true;
}

}  // namespace
}  // namespace tally::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tally::fuzz;
  using namespace tally::io;
  const auto file = read_json_both_ways(
      data, size, "calibration.json", "parse_calibration", [](std::string_view t, const std::string& src) { return parse_calibration(t, src); },
      "load_calibration", [](const fs::path& path) { return load_calibration(path); }, same_calibration);
  if (!file.ok()) return 0;
  const Calibration& c = *file.value;
  for (const auto& link : {c.intra_node, c.inter_node})
    if (link) {
      expect_sane_figure("load_calibration: beta_bytes_per_s", link->bandwidth_bps);
      expect_sane_figure("load_calibration: alpha_s", link->latency_s);
    }
  if (c.mfu) expect_sane_figure("load_calibration: mfu", *c.mfu);
  for (const CalibrationPoint& p : c.points) {
    expect_sane_figure("load_calibration: size_bytes", p.size_bytes);
    expect_sane_figure("load_calibration: seconds_median", p.seconds_median);
    expect_sane_figure("load_calibration: busbw_bytes_per_s", p.busbw_bps);
  }
  const std::string written =
      must_succeed("calibration_to_json", [&] { return calibration_to_json(c); });
  const Calibration back = must_succeed("parse_calibration(calibration_to_json)",
                                        [&] { return parse_calibration(written, "round trip"); });
  FUZZ_CHECK(same_calibration(c, back),
             "calibration_to_json → parse_calibration changed it: " + written);
  FUZZ_CHECK(calibration_to_json(back) == written, "calibration_to_json of the same value differs");

  for (const std::string& name : tally::cluster_preset_names()) {
    const auto applied = attempt(
        "apply_calibration", [&] { return apply_calibration(*tally::cluster_preset(name), c); });
    if (applied.ok()) {
      const auto valid = attempt("ClusterSpec::validate", [&] { applied.value->validate(); });
      FUZZ_CHECK(valid.ok(), "apply_calibration returned an invalid cluster: " + valid.error);
    }
  }
  return 0;
}
