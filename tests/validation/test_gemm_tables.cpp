// The GPU presets' GEMM clock (core/roofline.hpp) against measured GEMM tables: XLA's default bf16
// GEMM performance table for H100 (sm_90) and B200 (sm_100), 375 shapes each (b 1–4; m, n, k
// 256–4096), kept in tests/data/xla_gemm_bf16.json with its source. The H100/H200 and B200 presets'
// kernel constants are Note [GEMM calibration]'s fit to these tables (presets.cpp); this test
// re-fits them, checks the presets carry that fit, and reports how closely the clock reproduces
// every measured GEMM. The same table's fp8 columns (tests/data/xla_gemm_fp8.json) give the B200's
// fp8 GEMM constants.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "fixture.hpp"

#include "tally/core/presets.hpp"
#include "tally/core/roofline.hpp"

namespace tally::test_gemm_tables {
namespace {

const nlohmann::json& tables() { return fixture("xla_gemm_bf16.json"); }

struct Table {
  std::vector<GemmSample> samples;
  double best_flops = 0;
};

Table table(const char* key) {
  Table t;
  for (const auto& r : tables()["gpus"][key]["rows"]) {
    GemmSample g{.m = r[1], .n = r[2], .k = r[3], .batch = r[0].get<double>()};
    const double flops_per_s = r[4].get<double>();
    g.seconds = 2.0 * g.batch * double(g.m) * double(g.n) * double(g.k) / flops_per_s;
    t.samples.push_back(g);
    t.best_flops = std::max(t.best_flops, flops_per_s);
  }
  return t;
}

double predicted_seconds(const GpuSpec& gpu, const GemmSample& g) {
  const double flops = 2.0 * g.batch * double(g.m) * double(g.n) * double(g.k);
  return flops / (gpu.peak_bf16_flops * gemm_efficiency(gpu.kernels, g.m, g.n, g.k, g.batch)) +
         gpu.kernels.kernel_overhead_s;
}

struct Case {
  const char* key;
  const char* preset;
};

TEST(GemmTables, PresetsCarryTheFitOfTheMeasuredTable) {
  for (const Case c : {Case{"sm_90", "h100-80g"}, Case{"sm_90", "h200"}, Case{"sm_100_B200", "b200"}}) {
    const GpuSpec gpu = cluster_preset(c.preset)->gpu;
    const Table t = table(c.key);
    ASSERT_EQ(t.samples.size(), 375u) << c.key;
    const KernelPerf fit =
        fit_gemm_perf(KernelPerf{.sm_count = gpu.kernels.sm_count}, gpu.peak_bf16_flops, t.samples);
    EXPECT_NEAR(gpu.kernels.gemm_fraction, fit.gemm_fraction, 1e-4) << c.preset;
    EXPECT_EQ(gpu.kernels.gemm_half_k, fit.gemm_half_k) << c.preset;
    EXPECT_NEAR(gpu.kernels.half_tile_efficiency, fit.half_tile_efficiency, 1e-12) << c.preset;
    EXPECT_EQ(gpu.kernels.kernel_overhead_s, fit.kernel_overhead_s) << c.preset;
    EXPECT_NEAR(gpu.kernels.gemm_ceiling, t.best_flops / gpu.peak_bf16_flops, 1e-12) << c.preset;
  }
}

// How closely the clock reproduces each measured GEMM: median and 90th percentile of
// |log(predicted / measured time)|, printed; bounds are the measured agreement, rounded up.
TEST(GemmTables, ClockReproducesTheMeasuredGemms) {
  for (const Case c : {Case{"sm_90", "h100-80g"}, Case{"sm_100_B200", "b200"}}) {
    const GpuSpec gpu = cluster_preset(c.preset)->gpu;
    std::vector<double> err;
    for (const GemmSample& g : table(c.key).samples)
      err.push_back(std::fabs(std::log(predicted_seconds(gpu, g) / g.seconds)));
    std::sort(err.begin(), err.end());
    const double median = err[err.size() / 2], p90 = err[err.size() * 9 / 10];
    std::printf("  %-10s median |log error| %.3f, 90th percentile %.3f, worst %.3f\n", c.preset,
                median, p90, err.back());
    EXPECT_LT(median, 0.10) << c.preset;
    EXPECT_LT(p90, 0.35) << c.preset;
  }
}

// The table's best H100 GEMM and stas00's independent MAMF search agree within 1.3 %, and the
// preset reaches the table's best on the MAMF search's best shape.
TEST(GemmTables, H100BestAgreesWithTheMamfSearch) {
  const double best = table("sm_90").best_flops;
  EXPECT_NEAR(best / 794.5e12, 1.0, 0.015);
  const GpuSpec h = cluster_preset("h100-80g")->gpu;
  EXPECT_NEAR(gemm_efficiency(h.kernels, 2048, 2048, 13312) * h.peak_bf16_flops, best, 1e6);
}

// fp8 GEMMs (Transformer Engine's forward: e4m3 × e4m3 → bf16) from the same table's fp8 columns,
// kept in tests/data/xla_gemm_fp8.json. B200: the preset's fp8 GEMM constants are the fit to that
// column at the fp8 peak, and the clock reproduces it, the backward's e5m2 columns too. H100: the
// column is not physical — its largest GEMMs run above the 1979 TFLOP/s dense fp8 peak of the
// datasheet (up to 2.6 PFLOP/s) — so the H100/H200 presets keep bf16's constants at the fp8 peak.
Table fp8_table(const char* key, int column) {
  Table t;
  for (const auto& r : fixture("xla_gemm_fp8.json")["gpus"][key]["rows"]) {
    GemmSample g{.m = r[1], .n = r[2], .k = r[3], .batch = r[0].get<double>()};
    const double flops_per_s = r[column].get<double>();
    g.seconds = 2.0 * g.batch * double(g.m) * double(g.n) * double(g.k) / flops_per_s;
    t.samples.push_back(g);
    t.best_flops = std::max(t.best_flops, flops_per_s);
  }
  return t;
}

TEST(GemmTables, Fp8GemmsOfTheB200AreTheMeasuredColumn) {
  const GpuSpec gpu = cluster_preset("b200")->gpu;
  const Table t = fp8_table("sm_100_B200", 4);
  ASSERT_EQ(t.samples.size(), 375u);
  const KernelPerf fit =
      fit_gemm_perf(KernelPerf{.sm_count = gpu.kernels.sm_count}, gpu.peak_fp8_flops, t.samples);
  std::printf("  b200 fp8 fit: fraction %.6f, k½ %.0f, tile %.2f, overhead %.1e s, best %.6f TF\n",
              fit.gemm_fraction, fit.gemm_half_k, fit.half_tile_efficiency, fit.kernel_overhead_s,
              t.best_flops / 1e12);
  ASSERT_TRUE(gpu.fp8_gemm.has_value());
  const KernelPerf& k = *gpu.fp8_gemm;
  EXPECT_NEAR(k.gemm_fraction, fit.gemm_fraction, 1e-4);
  EXPECT_EQ(k.gemm_half_k, fit.gemm_half_k);
  EXPECT_NEAR(k.half_tile_efficiency, fit.half_tile_efficiency, 1e-12);
  EXPECT_EQ(k.kernel_overhead_s, fit.kernel_overhead_s);
  EXPECT_NEAR(k.gemm_ceiling, t.best_flops / gpu.peak_fp8_flops, 1e-9);  // best to 1 MFLOP/s
  // Bounds: the measured agreement, rounded up (as for bf16 above).
  for (int column : {4, 5, 6}) {
    std::vector<double> err;
    for (const GemmSample& g : fp8_table("sm_100_B200", column).samples) {
      const double flops = 2.0 * g.batch * double(g.m) * double(g.n) * double(g.k);
      const double predicted =
          flops / (gpu.peak_fp8_flops * gemm_efficiency(k, g.m, g.n, g.k, g.batch)) +
          k.kernel_overhead_s;
      err.push_back(std::fabs(std::log(predicted / g.seconds)));
    }
    std::sort(err.begin(), err.end());
    std::printf("  b200 fp8 column %d: median |log error| %.3f, 90th percentile %.3f\n", column,
                err[err.size() / 2], err[err.size() * 9 / 10]);
    EXPECT_LT(err[err.size() / 2], 0.11) << column;
    EXPECT_LT(err[err.size() * 9 / 10], 0.35) << column;
  }
  // What the measured column says of fp8 against bf16 on the same shapes: a median speed-up near
  // 1.2×, where bf16's constants at twice the peak gave 2× on large GEMMs.
  const Table bf16 = table("sm_100_B200");
  std::vector<double> speedup;
  for (std::size_t i = 0; i < t.samples.size(); ++i)
    speedup.push_back(bf16.samples[i].seconds / t.samples[i].seconds);
  std::sort(speedup.begin(), speedup.end());
  EXPECT_NEAR(speedup[speedup.size() / 2], 1.2, 0.05);
}

TEST(GemmTables, H100Fp8ColumnIsAboveThePeakAndNotUsed) {
  const GpuSpec h = cluster_preset("h100-80g")->gpu;
  int above = 0;
  for (int column : {4, 5, 6})
    for (const GemmSample& g : fp8_table("sm_90", column).samples)
      above += 2.0 * g.batch * double(g.m) * double(g.n) * double(g.k) / g.seconds >
               h.peak_fp8_flops;
  EXPECT_GT(above, 50);  // 29 + 28 + 30 rows
  EXPECT_FALSE(h.fp8_gemm.has_value());
  EXPECT_FALSE(cluster_preset("h200")->gpu.fp8_gemm.has_value());
}

}  // namespace
}  // namespace tally::test_gemm_tables
