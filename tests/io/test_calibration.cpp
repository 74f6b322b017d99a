// Calibration JSON: exact round trip, application over a cluster, and hostile input.
#include "tally/io/calibration.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "io_test_util.hpp"
#include "tally/core/operators.hpp"
#include "tally/core/presets.hpp"

namespace tally::io::test_calibration {
namespace {

using test::data_path;
using test::expect_invalid;
using test::fixture;
using test::replaced;

const char* const kSrc = "test/calibration.json";
Calibration parse(const std::string& text) { return parse_calibration(text, kSrc); }

Calibration sample() {
  Calibration c;
  c.source = "tally bench allreduce, 2 nodes x 8 ranks, gloo";
  c.intra_node = LinkSpec{.bandwidth_bps = 2.345678901234e11, .latency_s = 3.1e-6};
  c.inter_node = LinkSpec{.bandwidth_bps = 4.8e10, .latency_s = 1.0 / 3.0 * 1e-5};
  c.mfu = 0.4321;
  c.points = {{"allreduce", 16, 1048576, 0.000123456789, 7.61e9},
              {"reduce_scatter", 8, 0, 0, 0},
              {"all_gather", 1, 1e12, 12.5, 1.0 / 7.0 * 1e10}};
  return c;
}

void expect_equal(const Calibration& a, const Calibration& b) {
  EXPECT_EQ(a.source, b.source);
  ASSERT_EQ(a.intra_node.has_value(), b.intra_node.has_value());
  if (a.intra_node) {
    EXPECT_EQ(a.intra_node->bandwidth_bps, b.intra_node->bandwidth_bps);  // exact: shortest
    EXPECT_EQ(a.intra_node->latency_s, b.intra_node->latency_s);          // round-trip digits
  }
  ASSERT_EQ(a.inter_node.has_value(), b.inter_node.has_value());
  if (a.inter_node) {
    EXPECT_EQ(a.inter_node->bandwidth_bps, b.inter_node->bandwidth_bps);
    EXPECT_EQ(a.inter_node->latency_s, b.inter_node->latency_s);
  }
  EXPECT_EQ(a.mfu, b.mfu);
  ASSERT_EQ(a.points.size(), b.points.size());
  for (std::size_t i = 0; i < a.points.size(); ++i) {
    EXPECT_EQ(a.points[i].collective, b.points[i].collective);
    EXPECT_EQ(a.points[i].ranks, b.points[i].ranks);
    EXPECT_EQ(a.points[i].size_bytes, b.points[i].size_bytes);
    EXPECT_EQ(a.points[i].seconds_median, b.points[i].seconds_median);
    EXPECT_EQ(a.points[i].busbw_bps, b.points[i].busbw_bps);
  }
}

TEST(Calibration, RoundTripIsExact) {
  const Calibration c = sample();
  const std::string text = calibration_to_json(c);
  expect_equal(parse(text), c);
  EXPECT_EQ(calibration_to_json(parse(text)), text);  // and stable
  for (const char* key : {"\"alpha_s\"", "\"beta_bytes_per_s\"", "\"busbw_bytes_per_s\"",
                          "\"seconds_median\"", "\"size_bytes\"", "\"tally-calibration\""})
    EXPECT_NE(text.find(key), std::string::npos) << key;
}

TEST(Calibration, RoundTripEmpty) {
  Calibration c;
  c.source = "nothing measured";
  expect_equal(parse(calibration_to_json(c)), c);
}

TEST(Calibration, RoundTripThroughFile) {
  const auto path = test::temp_file("calibration_round_trip.json", calibration_to_json(sample()));
  expect_equal(load_calibration(path), sample());
}

TEST(Calibration, FixtureLoads) {
  const Calibration c = load_calibration(data_path("calibration.json"));
  ASSERT_TRUE(c.intra_node.has_value());
  EXPECT_EQ(c.intra_node->latency_s, 2.5e-5);
  EXPECT_EQ(c.intra_node->bandwidth_bps, 3.2e9);
  EXPECT_FALSE(c.inter_node.has_value());
  EXPECT_EQ(c.mfu, 0.42);
  ASSERT_EQ(c.points.size(), 2u);
  EXPECT_EQ(c.points[1].size_bytes, 67108864.0);
}

TEST(Calibration, SourceDefaultsToFileName) {
  EXPECT_EQ(parse("{}").source, kSrc);
}

TEST(Calibration, ApplyOverridesOnlyWhatWasMeasured) {
  const ClusterSpec base = *cluster_preset("a100-80g");
  const ClusterSpec c = apply_calibration(base, load_calibration(data_path("calibration.json")));
  EXPECT_EQ(c.intra_node.bandwidth_bps, 3.2e9);
  EXPECT_EQ(c.intra_node.latency_s, 2.5e-5);
  EXPECT_EQ(c.inter_node.bandwidth_bps, base.inter_node.bandwidth_bps);
  EXPECT_EQ(c.inter_node.latency_s, base.inter_node.latency_s);
  EXPECT_EQ(c.mfu, 0.42);
  EXPECT_EQ(c.gpu.memory_bytes, base.gpu.memory_bytes);
}

TEST(Calibration, ApplyRejectsInvalidResult) {
  Calibration c;
  c.source = "hand-made";
  c.mfu = 2.0;  // never produced by the reader, but a caller could build it
  expect_invalid([&] { apply_calibration(*cluster_preset("a100-80g"), c); }, {"hand-made", "mfu"});
}

// ---- hostile input ----------------------------------------------------------------------------------

TEST(CalibrationBad, WriterRefusesWhatCannotBeRead) {
  Calibration c = sample();
  c.points[0].seconds_median = std::numeric_limits<double>::quiet_NaN();
  expect_invalid([&] { calibration_to_json(c); }, {"calibration_to_json", "points[0].seconds_median = nan", "finite"});
  c = sample();
  c.intra_node->bandwidth_bps = 0;
  expect_invalid([&] { calibration_to_json(c); }, {"intra_node.beta_bytes_per_s = 0"});
  c = sample();
  c.points[2].collective = "All Reduce";
  expect_invalid([&] { calibration_to_json(c); }, {"points[2].collective"});
}

TEST(CalibrationBad, FormatAndVersion) {
  const auto text = fixture("calibration.json");
  expect_invalid([&] { parse(replaced(text, "\"tally-calibration\"", "\"nccl-tests\"")); },
                 {kSrc, "format = \"nccl-tests\"", "tally-calibration"});
  expect_invalid([&] { parse(replaced(text, "\"version\": 1", "\"version\": 2")); },
                 {kSrc, "version = 2", "[1, 1]"});
}

TEST(CalibrationBad, UnknownKeys) {
  const auto text = fixture("calibration.json");
  expect_invalid([&] { parse(replaced(text, "\"mfu\"", "\"mfu_\"")); }, {kSrc, "unknown key \"mfu_\""});
  expect_invalid([&] { parse(replaced(text, "\"alpha_s\"", "\"alpha_us\"")); },
                 {kSrc, "unknown key \"alpha_us\" in intra_node"});
  expect_invalid([&] { parse(replaced(text, "\"busbw_bytes_per_s\"", "\"busbw_gbps\"")); },
                 {kSrc, "unknown key \"busbw_gbps\" in points[0]"});
}

TEST(CalibrationBad, WrongTypesAndRanges) {
  const auto text = fixture("calibration.json");
  expect_invalid([&] { parse(replaced(text, "\"ranks\": 4", "\"ranks\": \"4\"")); },
                 {kSrc, "points[0].ranks = \"4\"", "a string"});
  expect_invalid([&] { parse(replaced(text, "\"ranks\": 4", "\"ranks\": 0")); },
                 {kSrc, "points[0].ranks = 0", "[1, 1048576]"});
  expect_invalid([&] { parse(replaced(text, "\"seconds_median\": 0.00055", "\"seconds_median\": -1")); },
                 {kSrc, "points[0].seconds_median = -1", "[0, 1000000]"});
  expect_invalid([&] { parse(replaced(text, "\"beta_bytes_per_s\": 3.2e+09", "\"beta_bytes_per_s\": 0")); },
                 {kSrc, "intra_node.beta_bytes_per_s = 0", "[1000000, "});
  expect_invalid([&] { parse(replaced(text, "\"alpha_s\": 2.5e-05", "\"alpha_s\": true")); },
                 {kSrc, "intra_node.alpha_s = true", "a boolean"});
  expect_invalid([&] { parse(replaced(text, "\"collective\": \"allreduce\"", "\"collective\": 7")); },
                 {kSrc, "points[0].collective = 7"});
  expect_invalid([&] { parse(R"({"points": {"collective": "allreduce"}})"); },
                 {kSrc, "points", "array"});
  expect_invalid([&] { parse(R"({"points": [42]})"); }, {kSrc, "points[0] = 42", "object"});
  expect_invalid([&] { parse(R"({"intra_node": {"alpha_s": 1e-6}})"); },
                 {kSrc, "intra_node.beta_bytes_per_s missing"});
}

TEST(CalibrationBad, NotJsonNotObject) {
  expect_invalid([] { parse("{\"points\": [}"); }, {kSrc, "not valid JSON"});
  expect_invalid([] { parse("\"calibration\""); }, {kSrc, "must be a JSON object"});
}

}  // namespace
}  // namespace tally::io::test_calibration

namespace tally::io::test_calibration {
namespace {

// The "kernels" section (bench/gpu/probe.py, `tally bench gemm`): read back exactly, and applied
// over a preset by Note [GEMM calibration]. Times are made from known constants so the expected
// fractions are independent of the reader.
TEST(Calibration, KernelsRoundTripAndApply) {
  const double peak = 312e12;
  const KernelPerf truth{.sm_count = 108, .gemm_fraction = 0.7, .gemm_half_k = 64,
                         .half_tile_efficiency = 0.85, .kernel_overhead_s = 2e-6};
  KernelCalibration k{.device = "test-gpu", .precision = "bf16", .peak_flops = peak,
                      .sm_count = 108, .memory_bps = 1.7e12};
  for (std::int64_t m : {512, 2048, 8192})
    for (std::int64_t n : {256, 3000, 8192})
      for (std::int64_t kk : {128, 1024, 8192})
        k.gemm.push_back({.m = m, .n = n, .k = kk,
                          .seconds = 2.0 * m * n * kk / (peak * gemm_efficiency(truth, m, n, kk)) +
                                     2e-6});
  // b 2 × 16 heads × 4096² × 128 causal: 4·2·16·4096²·128·½ FLOPs; at 0.5 of peak forward and
  // 0.4 of peak backward (2.5 × the FLOPs).
  const double flops = 4.0 * 2 * 16 * 4096.0 * 4096 * 128 * 0.5;
  k.attention.push_back({.batch = 2, .heads = 16, .seq = 4096, .head_dim = 128, .causal = true,
                         .forward_seconds = flops / (0.5 * peak),
                         .backward_seconds = 2.5 * flops / (0.4 * peak)});
  Calibration c{.source = "synthetic", .kernels = k};
  const Calibration back = parse(calibration_to_json(c));
  ASSERT_TRUE(back.kernels.has_value());
  EXPECT_EQ(back.kernels->gemm.size(), k.gemm.size());
  EXPECT_EQ(back.kernels->gemm[5].seconds, k.gemm[5].seconds);
  EXPECT_EQ(back.kernels->attention[0].backward_seconds, k.attention[0].backward_seconds);

  const ClusterSpec a = apply_calibration(*cluster_preset("a100-80g"), back);
  EXPECT_NEAR(a.gpu.kernels.gemm_fraction, 0.7, 1e-9);  // the preset's peak is the same 312T
  // The ceiling is the fastest GEMM measured: here 8192 × 8192 × 8192, one kernel of 2·8192³ FLOPs.
  const double fastest = 2.0 * 8192 * 8192 * 8192 /
                         (2.0 * 8192 * 8192 * 8192 / (peak * gemm_efficiency(truth, 8192, 8192, 8192)) +
                          2e-6);
  EXPECT_NEAR(a.gpu.kernels.gemm_ceiling, fastest / peak, 1e-9);
  EXPECT_EQ(a.gpu.kernels.gemm_half_k, 64);
  EXPECT_NEAR(a.gpu.kernels.half_tile_efficiency, 0.85, 1e-9);
  EXPECT_NEAR(a.gpu.kernels.memory_fraction, 1.7e12 / 2.039e12, 1e-12);
  EXPECT_NEAR(a.gpu.kernels.attention_forward_fraction, 0.5, 1e-9);
  EXPECT_NEAR(a.gpu.kernels.attention_backward_fraction, 0.4, 1e-9);
  // Note [attention table]: the measured shape is the table's one point.
  ASSERT_EQ(a.gpu.kernels.attention_table.size(), 1u);
  EXPECT_EQ(a.gpu.kernels.attention_table[0].head_dim, 128);
  EXPECT_EQ(a.gpu.kernels.attention_table[0].seq, 4096);
  EXPECT_NEAR(a.gpu.kernels.attention_table[0].forward, 0.5, 1e-9);
  EXPECT_NEAR(a.gpu.kernels.attention_table[0].backward, 0.4, 1e-9);
  // Note [cuDNN attention]: the measured attention is the kernel the probe ran, and it prices
  // `--flash-kernel cudnn` too: a Hopper preset's cuDNN table gives way to it.
  ASSERT_FALSE(cluster_preset("h100-80g")->gpu.kernels.cudnn_attention_table.empty());
  EXPECT_TRUE(apply_calibration(*cluster_preset("h100-80g"), back)
                  .gpu.kernels.cudnn_attention_table.empty());
  // No gemm_sustained: the preset's power cap stays (A100: He's 257 of the burst 271.2 TFLOP/s).
  EXPECT_NEAR(a.gpu.kernels.sustained_gemm, 257 / 271.2, 1e-6);
  // Hostile: an unknown precision is a one-line error naming the field.
  std::string text = calibration_to_json(c);
  expect_invalid([&] { parse(replaced(text, "\"bf16\"", "\"bf17\"")); }, {"kernels.precision"});
}

// A host calibration (`tally bench gemm|memory|allreduce` on a CPU): the memory curve reads back
// exactly; host_cluster builds the CPU's "GPU" from it — peak = the best GEMM, 1 × 1 tiles, the
// measured bandwidth — and fits constants that reproduce GEMMs made from known ones.
TEST(Calibration, HostClusterFromAHostCalibration) {
  const double peak = 100e9;
  const KernelPerf truth{.sm_count = 1, .tile_m = 1, .tile_n = 1, .gemm_fraction = 0.95,
                         .gemm_half_k = 8, .gemm_half_mn = 4, .kernel_overhead_s = 5e-6};
  KernelCalibration k{.device = "test-cpu", .precision = "fp32", .peak_flops = peak,
                      .sm_count = 1, .memory_bps = 3e10,
                      .memory_curve = {{2e5, 1.2e11}, {6.4e7, 3e10}}};
  for (std::int64_t m : {8, 64, 512})
    for (std::int64_t n : {16, 256, 1024})
      for (std::int64_t kk : {16, 256, 1024})
        k.gemm.push_back({.m = m, .n = n, .k = kk,
                          .seconds = 2.0 * m * n * kk / (peak * gemm_efficiency(truth, m, n, kk)) +
                                     5e-6});
  Calibration c{.source = "synthetic host", .kernels = k};
  const Calibration back = parse(calibration_to_json(c));
  ASSERT_EQ(back.kernels->memory_curve.size(), 2u);
  EXPECT_EQ(back.kernels->memory_curve[1].bytes_per_s, 3e10);
  EXPECT_EQ(back.kernels->memory_curve[0].working_set_bytes, 2e5);

  const ClusterSpec h = host_cluster(back, false);
  EXPECT_EQ(h.gpu.name, "test-cpu");
  EXPECT_EQ(h.gpu.peak_flops(Precision::fp32), peak);
  EXPECT_EQ(h.gpu.memory_bps, 3e10);
  EXPECT_EQ(h.gpu.kernels.tile_m, 1);
  EXPECT_NEAR(h.gpu.kernels.gemm_fraction, 0.95, 1e-9);
  EXPECT_EQ(h.gpu.kernels.gemm_half_mn, 4);
  EXPECT_EQ(h.gpu.kernels.gemm_half_k, 8);
  // What is missing is named: the link when k >= 2 needs it, the kernels section, the GEMMs.
  expect_invalid([&] { host_cluster(back, true); }, {"intra_node"});
  expect_invalid([&] { host_cluster(Calibration{.source = "x"}, false); }, {"kernels"});
  Calibration few = back;
  few.kernels->gemm.resize(2);
  expect_invalid([&] { host_cluster(few, false); }, {"kernels.gemm", ">= 3"});
  // bench allreduce writing into this file keeps its kernels (merged_with_file); its own link
  // and points win over the file's.
  Calibration with_link = back;
  with_link.intra_node = LinkSpec{.bandwidth_bps = 1e9, .latency_s = 2e-5};
  const auto path = test::temp_file("calibration_merge.json", calibration_to_json(with_link));
  const Calibration fresh{.source = "allreduce",
                          .intra_node = LinkSpec{.bandwidth_bps = 3e9, .latency_s = 1e-5},
                          .points = {{"allreduce", 2, 1e6, 1e-3, 1e9}}};
  const Calibration merged = merged_with_file(fresh, path);
  ASSERT_TRUE(merged.kernels.has_value());
  EXPECT_EQ(merged.kernels->gemm.size(), back.kernels->gemm.size());
  EXPECT_EQ(merged.intra_node->bandwidth_bps, 3e9);
  EXPECT_EQ(merged.points.size(), 1u);
  EXPECT_EQ(merged.source, "allreduce");
  EXPECT_FALSE(merged_with_file(fresh, path.parent_path() / "absent.json").kernels.has_value());
  // A host's kernels on a GPU preset: refused, naming both devices.
  expect_invalid([&] { apply_calibration(*cluster_preset("a100-80g"), back); },
                 {"test-cpu", "cannot describe", "a100"});
}

// Note [memory kernel overhead]: a measured streaming-kernel overhead reads back, reaches the
// host's KernelPerf apart from the GEMM fit's, and is refused outside [0, 1] s naming the field;
// a calibration without it leaves the field unset (memory kernels then take the GEMM figure).
TEST(Calibration, MemoryOverheadRoundTripsAndApplies) {
  const double peak = 100e9;
  KernelCalibration k{.device = "test-cpu", .precision = "fp32", .peak_flops = peak,
                      .sm_count = 1, .memory_bps = 3e10, .memory_overhead_s = 3e-7};
  for (std::int64_t m : {8, 64, 512})
    for (std::int64_t n : {16, 256, 1024})
      for (std::int64_t kk : {16, 256, 1024})  // 95 % of peak plus 10 µs a call
        k.gemm.push_back(
            {.m = m, .n = n, .k = kk, .seconds = 2.0 * m * n * kk / (0.95 * peak) + 1e-5});
  const Calibration c{.source = "synthetic host", .kernels = k};
  const std::string text = calibration_to_json(c);
  const Calibration back = parse(text);
  EXPECT_EQ(back.kernels->memory_overhead_s, 3e-7);
  const ClusterSpec h = host_cluster(back, false);
  EXPECT_EQ(h.gpu.kernels.memory_overhead_s, 3e-7);
  EXPECT_EQ(h.gpu.kernels.kernel_overhead_s, 1e-5);  // the GEMMs' own, from the fit's grid
  Calibration without = back;
  without.kernels->memory_overhead_s.reset();
  EXPECT_FALSE(host_cluster(parse(calibration_to_json(without)), false)
                   .gpu.kernels.memory_overhead_s.has_value());
  const std::string key = "\"memory_overhead_s\": ";
  expect_invalid([&] { parse(replaced(text, key + "3e-07", key + "2")); },
                 {"kernels.memory_overhead_s = 2", "[0, 1]"});
  expect_invalid([&] { parse(replaced(text, key + "3e-07", key + "-1e-06")); },
                 {"kernels.memory_overhead_s", "[0, 1]"});
}

// Note [streaming kernel families]: each measured family reads back exactly, reaches the host's
// KernelPerf as bytes / seconds_median, and a bad entry is refused naming it: a kernel named by
// its layer position instead of its family, a family listed twice, a rate outside the links'
// bounds. Without the list, no rates.
// A synthetic one-core host: 27 GEMMs at 100 GFLOP/s plus 10 µs, n = 256 slowed by `bump`.
KernelCalibration synthetic_host(double bump = 1) {
  const double peak = 100e9;
  KernelCalibration k{.device = "test-cpu", .precision = "fp32", .peak_flops = peak,
                      .sm_count = 1, .memory_bps = 3e10};
  for (std::int64_t m : {8, 64, 512})
    for (std::int64_t n : {16, 256, 1024})
      for (std::int64_t kk : {16, 256, 1024})
        k.gemm.push_back({.m = m, .n = n, .k = kk,
                          .seconds = 2.0 * m * n * kk / peak * (n == 256 ? bump : 1.0) + 1e-5});
  return k;
}

TEST(Calibration, StreamingKernelsRoundTripAndApply) {
  KernelCalibration k = synthetic_host();
  k.streaming_kernels = {{.kernel = "gelu", .bytes = 4194304, .seconds_median = 0.0014},
                         {.kernel = "norm.backward", .bytes = 2621440, .seconds_median = 5.2e-5}};
  const std::string text = calibration_to_json({.source = "synthetic host", .kernels = k});
  const Calibration back = parse(text);
  ASSERT_EQ(back.kernels->streaming_kernels.size(), 2u);
  EXPECT_EQ(back.kernels->streaming_kernels[1].kernel, "norm.backward");
  EXPECT_EQ(back.kernels->streaming_kernels[1].bytes, 2621440);
  EXPECT_EQ(back.kernels->streaming_kernels[1].seconds_median, 5.2e-5);
  const ClusterSpec h = host_cluster(back, false);
  ASSERT_EQ(h.gpu.kernels.streaming_rates.size(), 2u);
  EXPECT_EQ(h.gpu.kernels.streaming_rates[0].family, "gelu");
  EXPECT_DOUBLE_EQ(h.gpu.kernels.streaming_rates[0].bytes_per_s, 4194304 / 0.0014);
  EXPECT_DOUBLE_EQ(streaming_rate_bps(h.gpu.kernels, "norm-2.backward"), 2621440 / 5.2e-5);
  Calibration without = back;
  without.kernels->streaming_kernels.clear();
  const std::string bare = calibration_to_json(without);
  EXPECT_EQ(bare.find("streaming_kernels"), std::string::npos);
  EXPECT_TRUE(host_cluster(parse(bare), false).gpu.kernels.streaming_rates.empty());
  expect_invalid([&] { parse(replaced(text, "\"norm.backward\"", "\"norm-1.backward\"")); },
                 {"streaming_kernels[1].kernel", "norm-1.backward", "kernel family"});
  expect_invalid([&] { parse(replaced(text, "\"norm.backward\"", "\"gelu\"")); },
                 {"streaming_kernels[1].kernel", "at most once"});
  Calibration slow = back;
  slow.kernels->streaming_kernels[0].seconds_median = 1e3;  // 4 kB/s
  expect_invalid([&] { host_cluster(parse(calibration_to_json(slow)), false); },
                 {"streaming_kernels 'gelu'", "4194.3 B/s", "[1000000, 1e+15]"});
}

// Note [GEMM residuals]: applied, every GEMM the calibration measured — single and batched — is
// priced at its measured time, which the fitted terms alone do not reproduce (times with a bump
// at n = 256 no five-constant fit follows); a shape between two measured ones lands between them.
TEST(Calibration, MeasuredGemmsArePricedAtTheirTimes) {
  KernelCalibration k = synthetic_host(1.6);
  k.gemm.push_back({.m = 32, .n = 32, .k = 64, .batch = 16, .seconds = 4e-5});
  const ClusterSpec h =
      host_cluster(parse(calibration_to_json({.source = "synthetic", .kernels = k})), false);
  GpuSpec fitted = h.gpu;  // the fitted terms alone
  fitted.kernels.gemm_residuals.clear();
  const auto seconds_on = [](const GpuSpec& gpu, const GemmSample& g) {
    const Op op{.name = "gemm", .kind = OpKind::gemm, .m = g.m, .n = g.n, .k = g.k,
                .batch = g.batch, .flops = 2.0 * g.batch * double(g.m * g.n * g.k),
                .bytes = 4.0 * g.batch * double(g.m * g.k + g.k * g.n + g.m * g.n)};
    return op_seconds(op, gpu, Precision::fp32);
  };
  const auto priced = [&](const GemmSample& g) { return seconds_on(h.gpu, g); };
  double worst_fit = 0;
  for (const GemmSample& g : k.gemm) {
    EXPECT_NEAR(priced(g) / g.seconds, 1.0, 1e-9)
        << g.m << "x" << g.n << "x" << g.k << "·" << g.batch;
    worst_fit = std::max(worst_fit, std::abs(std::log(seconds_on(fitted, g) / g.seconds)));
  }
  EXPECT_GT(worst_fit, std::log(1.2));  // the fit alone misses some point by more than 20 %
  // m = 64 between n = 16 and 256 (k = 256): no faster than the faster of the two per FLOP, no
  // slower than the slower.
  const double mid = priced({.m = 64, .n = 64, .k = 256});
  const double per_flop = mid / (2.0 * 64 * 64 * 256);
  const double lo = priced({.m = 64, .n = 16, .k = 256}) / (2.0 * 64 * 16 * 256);
  const double hi = priced({.m = 64, .n = 256, .k = 256}) / (2.0 * 64 * 256 * 256);
  EXPECT_GT(per_flop, std::min(lo, hi) * 0.5);
  EXPECT_LT(per_flop, std::max(lo, hi) * 2);
  EXPECT_EQ(h.gpu.kernels.gemm_residuals.size(), k.gemm.size());
}

// Note [power cap]: GEMMs timed at the power cap set sustained_gemm to 1 / the median of measured /
// the burst-predicted time. Three GEMMs at 1.25×, 1.25× and 2× the A100 preset's burst time: the
// median 1.25, so 0.8; the list survives a round trip; GEMMs no slower than the burst leave 1.
TEST(CalibrationKernels, SustainedGemmsSetThePowerCap) {
  const ClusterSpec a100 = *cluster_preset("a100-80g");
  GpuSpec uncapped = a100.gpu;  // the preset's burst terms without its own cap
  uncapped.kernels.sustained_gemm = 1;
  const auto burst = [&](std::int64_t m, std::int64_t n, std::int64_t k) {
    const Op op{.name = "gemm", .kind = OpKind::gemm, .m = m, .n = n, .k = k,
                .flops = 2.0 * double(m) * double(n) * double(k),
                .bytes = 2.0 * double(m * k + k * n + m * n)};
    return op_seconds(op, uncapped, Precision::bf16);
  };
  KernelCalibration k{.device = "test-gpu", .precision = "bf16", .peak_flops = 312e12};
  k.gemm_sustained = {
      {.m = 8192, .n = 4096, .k = 4096, .seconds = 1.25 * burst(8192, 4096, 4096)},
      {.m = 8192, .n = 14336, .k = 4096, .seconds = 2 * burst(8192, 14336, 4096)},
      {.m = 4096, .n = 4096, .k = 8192, .seconds = 1.25 * burst(4096, 4096, 8192)}};
  const Calibration back = parse(calibration_to_json(Calibration{.source = "t", .kernels = k}));
  ASSERT_TRUE(back.kernels.has_value());
  ASSERT_EQ(back.kernels->gemm_sustained.size(), 3u);
  EXPECT_EQ(back.kernels->gemm_sustained[1].seconds, k.gemm_sustained[1].seconds);
  EXPECT_NEAR(apply_calibration(a100, back).gpu.kernels.sustained_gemm, 0.8, 1e-9);
  for (auto& g : k.gemm_sustained) g.seconds = 0.9 * burst(g.m, g.n, g.k);
  const Calibration faster{.source = "t", .kernels = k};
  EXPECT_EQ(apply_calibration(a100, faster).gpu.kernels.sustained_gemm, 1.0);
}

// fitted_link: points an exact α–β all-reduce would give — t = α·2(k−1) + 2S(k−1)/k / β, by hand
// here — give back α and β for their label and rank count only; too few sizes give none.
// Note [sharded collectives] (engine/bench/allreduce.cpp): a reduce-scatter or all-gather point
// is half an all-reduce's steps and bytes, t = α(k−1) + S(k−1)/(kβ) (core/comm.hpp); its label's
// fit recovers that α and β exactly (read as all-reduces they would come out α/2 and 2β), and the
// labels survive the file.
TEST(Calibration, ShardedPointsFitAtTheirOwnSteps) {
  EXPECT_EQ(points_collective(kRingReduceScatterPoints), Collective::reduce_scatter);
  EXPECT_EQ(points_collective(kGlooAllGatherPoints), Collective::all_gather);
  EXPECT_EQ(points_collective(kGlooAllReducePoints), Collective::all_reduce);
  EXPECT_EQ(points_collective(kRingAllReducePoints), Collective::all_reduce);
  const auto half = [](double alpha, double beta, int k, double S) {
    return alpha * (k - 1) + S * (k - 1) / k / beta;
  };
  Calibration c{.source = "test"};
  for (double S : {4.1e4, 1e6, 6.31e6}) {
    c.points.push_back({.collective = std::string(kRingReduceScatterPoints), .ranks = 4,
                        .size_bytes = S, .seconds_median = 1, .busbw_bps = 1,
                        .seconds_mean = half(2.4e-3, 2e9, 4, S)});
    c.points.push_back({.collective = std::string(kGlooAllGatherPoints), .ranks = 4,
                        .size_bytes = S, .seconds_median = 1, .busbw_bps = 1,
                        .seconds_mean = half(1.3e-3, 9.5e8, 4, S)});
  }
  const Calibration back = parse(calibration_to_json(c));
  for (const auto& [label, alpha, beta] :
       {std::tuple{kRingReduceScatterPoints, 2.4e-3, 2e9},
        std::tuple{kGlooAllGatherPoints, 1.3e-3, 9.5e8}}) {
    const std::optional<LinkSpec> l = fitted_link(back, label, 4);
    ASSERT_TRUE(l.has_value()) << label;
    EXPECT_NEAR(l->latency_s / alpha, 1, 1e-9) << label;
    EXPECT_NEAR(l->bandwidth_bps / beta, 1, 1e-9) << label;
  }
  EXPECT_FALSE(fitted_link(back, kGlooAllGatherPoints, 2).has_value());  // none at k = 2
}

TEST(Calibration, FittedLinkPerLabelAndRanks) {
  const auto t = [](double alpha, double beta, int k, double S) {
    return alpha * 2 * (k - 1) + 2 * S * (k - 1) / k / beta;
  };
  Calibration c;
  for (double S : {2.5e5, 1e6, 4e6, 1.6e7}) {
    c.points.push_back({std::string(kGlooAllReducePoints), 4, S, t(3e-4, 2e9, 4, S), 0});
    c.points.push_back({std::string(kRingAllReducePoints), 4, S, t(6e-4, 3e9, 4, S), 0});
    c.points.push_back({std::string(kGlooAllReducePoints), 2, S, t(1e-4, 5e9, 2, S), 0});
  }
  c.points.push_back({"all_gather", 4, 1e6, 1.0, 0});  // another label: not an all-reduce's
  const auto expect_link = [&](std::string_view label, int k, double alpha, double beta) {
    const std::optional<LinkSpec> l = fitted_link(c, label, k);
    ASSERT_TRUE(l.has_value()) << label << " k " << k;
    EXPECT_NEAR(l->latency_s / alpha, 1, 1e-9) << label << " k " << k;
    EXPECT_NEAR(l->bandwidth_bps / beta, 1, 1e-9) << label << " k " << k;
  };
  expect_link(kGlooAllReducePoints, 4, 3e-4, 2e9);
  expect_link(kRingAllReducePoints, 4, 6e-4, 3e9);
  expect_link(kGlooAllReducePoints, 2, 1e-4, 5e9);
  EXPECT_FALSE(fitted_link(c, kRingAllReducePoints, 2).has_value());  // none measured at k = 2
  EXPECT_FALSE(fitted_link(c, kGlooAllReducePoints, 8).has_value());
  EXPECT_FALSE(fitted_link(c, kGlooAllReducePoints, 1).has_value());
  Calibration one;  // a single size cannot separate α from β
  one.points.push_back({std::string(kRingAllReducePoints), 4, 1e6, t(6e-4, 3e9, 4, 1e6), 0});
  EXPECT_FALSE(fitted_link(one, kRingAllReducePoints, 4).has_value());

  // A fit outside the links' bounds is refused, naming the label, k and the value: 1 kB/s.
  Calibration slow;
  for (double S : {1e4, 1e5})
    slow.points.push_back({std::string(kRingAllReducePoints), 2, S, t(1e-3, 1e3, 2, S), 0});
  expect_invalid([&] { fitted_link(slow, kRingAllReducePoints, 2); },
                 {"'allreduce-ring' points at 2 ranks", "beta_bytes_per_s", "[1e6, 1e15]"});

  // Note [mean, not median]: where every point has a mean, the fit reads the means; where one
  // lacks it, the medians.
  Calibration both{.source = "test"};
  for (double S : {2.5e5, 1e6, 4e6})
    both.points.push_back({.collective = std::string(kGlooAllReducePoints), .ranks = 2,
                           .size_bytes = S, .seconds_median = t(1e-4, 5e9, 2, S),
                           .seconds_mean = t(4e-4, 4e9, 2, S)});
  std::optional<LinkSpec> l = fitted_link(both, kGlooAllReducePoints, 2);
  ASSERT_TRUE(l.has_value());
  EXPECT_NEAR(l->latency_s / 4e-4, 1, 1e-9);
  EXPECT_NEAR(l->bandwidth_bps / 4e9, 1, 1e-9);
  both.points[1].seconds_mean = 0;
  l = fitted_link(both, kGlooAllReducePoints, 2);
  ASSERT_TRUE(l.has_value());
  EXPECT_NEAR(l->latency_s / 1e-4, 1, 1e-9);
  EXPECT_NEAR(l->bandwidth_bps / 5e9, 1, 1e-9);
  // The mean round-trips; absent (0) it is not written, and a negative one is refused by name.
  both.points[0].seconds_mean = 3.5e-4;
  const std::string text = calibration_to_json(both);
  const Calibration back = parse(text);
  EXPECT_EQ(back.points[0].seconds_mean, both.points[0].seconds_mean);
  EXPECT_EQ(back.points[1].seconds_mean, 0);
  std::size_t written = 0;
  for (auto at = text.find("seconds_mean"); at != std::string::npos;
       at = text.find("seconds_mean", at + 1))
    ++written;
  EXPECT_EQ(written, 2u) << text;  // points 0 and 2
  expect_invalid([&] { parse(replaced(text, "\"seconds_mean\": 0.00035",
                                      "\"seconds_mean\": -1")); },
                 {kSrc, "points[0].seconds_mean = -1", "[0, 1000000]"});
}

}  // namespace

// Note [host overlap]: overlap points round-trip, and their σ is the median exposed share x =
// (together − work) / comm over the points at the run's k (clamped to [0, 0.95]), as
// σ = x / (1 − x): here x = 0.6, 0.1 and 1.25 → 0.95, median 0.6, σ = 1.5.
TEST(Calibration, OverlapPointsGiveTheHostsSigma) {
  Calibration c{.source = "test"};
  c.overlap = {{.ranks = 2, .size_bytes = 1e6, .work_seconds = 10e-3, .comm_seconds = 5e-3,
                .together_seconds = 13e-3},
               {.ranks = 2, .size_bytes = 4e6, .work_seconds = 10e-3, .comm_seconds = 4e-3,
                .together_seconds = 10.4e-3},
               {.ranks = 2, .size_bytes = 8e6, .work_seconds = 10e-3, .comm_seconds = 2e-3,
                .together_seconds = 12.5e-3},
               {.ranks = 4, .size_bytes = 1e6, .work_seconds = 10e-3, .comm_seconds = 8e-3,
                .together_seconds = 9e-3}};  // together < work: x clamps to 0
  const Calibration back = parse(calibration_to_json(c));
  ASSERT_EQ(back.overlap.size(), 4u);
  EXPECT_EQ(back.overlap[1].ranks, 2);
  EXPECT_EQ(back.overlap[1].size_bytes, 4e6);
  EXPECT_EQ(back.overlap[1].together_seconds, 10.4e-3);
  const std::optional<double> two = overlap_slowdown(back, 2);
  ASSERT_TRUE(two.has_value());
  EXPECT_NEAR(*two, 0.6 / 0.4, 1e-12);
  EXPECT_EQ(overlap_slowdown(back, 4), 0.0);
  EXPECT_FALSE(overlap_slowdown(back, 8).has_value());
  // An even count takes the mean of the middle two: x = 0.1 and 0.6 → 0.35.
  c.overlap.pop_back();
  c.overlap.pop_back();
  EXPECT_NEAR(*overlap_slowdown(c, 2), 0.35 / 0.65, 1e-12);
  // A zero time (divided by) and an unknown key are refused by name.
  expect_invalid(
      [] {
        parse(R"({"overlap": [{"ranks": 2, "size_bytes": 1e6, "work_seconds": 1e-3,
                  "comm_seconds": 0, "together_seconds": 2e-3}]})");
      },
      {"overlap[0].comm_seconds"});
  expect_invalid(
      [] {
        parse(R"({"overlap": [{"ranks": 2, "size_bytes": 1e6, "work_seconds": 1e-3,
                  "comm_seconds": 1e-3, "together_seconds": 2e-3, "sigma": 3}]})");
      },
      {"overlap[0]", "\"sigma\""});
}
}  // namespace tally::io::test_calibration
