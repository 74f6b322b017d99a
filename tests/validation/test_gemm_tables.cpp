// The GPU presets' GEMM clock (core/roofline.hpp) against measured GEMM tables: XLA's default bf16
// GEMM performance table for H100 (sm_90) and B200 (sm_100), 375 shapes each (b 1–4; m, n, k
// 256–4096), kept in tests/data/xla_gemm_bf16.json with its source. The H100/H200 and B200 presets'
// kernel constants are Note [GEMM calibration]'s fit to these tables (presets.cpp); this test
// re-fits them, checks the presets carry that fit, and reports how closely the clock reproduces
// every measured GEMM. The same table's fp8 columns (tests/data/xla_gemm_fp8.json) give the B200's
// fp8 GEMM constants; two published H100 torch._scaled_mm tables
// (tests/data/published_fp8_gemm_h100.json) give Hopper's, and a published B200 cuBLAS FP4 table
// (tests/data/published_fp4_gemm_b200.json) Blackwell's nvfp4 ones.
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

// XLA's sm_90 fp8 columns run their largest GEMMs above the H100's dense fp8 peak, so they are no
// measurement the Hopper presets can take their fp8 constants from (presets.cpp).
TEST(GemmTables, H100Fp8ColumnIsAboveThePeak) {
  const GpuSpec h = cluster_preset("h100-80g")->gpu;
  int above = 0;
  for (int column : {4, 5, 6})
    for (const GemmSample& g : fp8_table("sm_90", column).samples)
      above += 2.0 * g.batch * double(g.m) * double(g.n) * double(g.k) / g.seconds >
               h.peak_fp8_flops;
  EXPECT_GT(above, 50);  // 29 + 28 + 30 rows
}

// A published GEMM table: each row's time from its FLOP/s, and the best FLOP/s.
struct Published {
  std::vector<GemmSample> points;
  double best_flops = 0;
  void add(const nlohmann::json& row) {  // [m, n, k, TFLOP/s]
    const double flops_per_s = row[3].get<double>() * 1e12;
    GemmSample g{.m = row[0], .n = row[1], .k = row[2], .batch = 1};
    g.seconds = 2.0 * double(g.m) * double(g.n) * double(g.k) / flops_per_s;
    points.push_back(g);
    best_flops = std::max(best_flops, flops_per_s);
  }
};

// Predicted / published time of every point at `peak` with constants k (= published / predicted
// FLOP/s): below 1, the model is fast.
std::vector<double> time_ratios(const KernelPerf& k, double peak, const Published& t) {
  std::vector<double> r;
  for (const GemmSample& g : t.points) {
    const double flops = 2.0 * double(g.m) * double(g.n) * double(g.k);
    r.push_back((flops / (peak * gemm_efficiency(k, g.m, g.n, g.k)) + k.kernel_overhead_s) /
                g.seconds);
  }
  return r;
}

// `base`'s shape terms with the best published GEMM as the ceiling and the one fraction at which
// the median time ratio is 1, by bisection over [0.2, 1.5].
KernelPerf median_anchored(KernelPerf base, double peak, const Published& t) {
  base.gemm_ceiling = t.best_flops / peak;
  double lo = 0.2, hi = 1.5;
  for (int i = 0; i < 60; ++i) {
    base.gemm_fraction = (lo + hi) / 2;
    (median(time_ratios(base, peak, t)) > 1 ? lo : hi) = base.gemm_fraction;
  }
  return base;
}

// The Hopper presets' fp8 GEMM constants against the two published H100 SXM torch._scaled_mm
// tables they come from (tests/data/published_fp8_gemm_h100.json): bf16's shape terms, the best
// published GEMM as the ceiling, and the one fraction that makes the median of published /
// predicted 1 — recomputed here by bisection.
TEST(GemmTables, HopperFp8GemmsAreThePublishedTables) {
  Published table;
  for (const auto& src : fixture("published_fp8_gemm_h100.json")["sources"])
    for (const auto& r : src["rows"]) table.add(r);
  ASSERT_EQ(table.points.size(), 10u);
  const GpuSpec h = cluster_preset("h100-80g")->gpu;
  const double peak = h.peak_fp8_flops, best = table.best_flops;
  auto ratios = [&](const KernelPerf& k) { return time_ratios(k, peak, table); };
  const KernelPerf k = median_anchored(h.kernels, peak, table);
  for (const char* name : {"h100-80g", "h200"}) {
    SCOPED_TRACE(name);
    const GpuSpec gpu = cluster_preset(name)->gpu;
    ASSERT_TRUE(gpu.fp8_gemm.has_value());
    const KernelPerf& f = *gpu.fp8_gemm;
    EXPECT_NEAR(f.gemm_fraction, k.gemm_fraction, 1e-5);
    EXPECT_NEAR(f.gemm_ceiling, best / peak, 1e-12);
    EXPECT_EQ(f.gemm_half_k, gpu.kernels.gemm_half_k);
    EXPECT_EQ(f.half_tile_efficiency, gpu.kernels.half_tile_efficiency);
    EXPECT_EQ(f.kernel_overhead_s, gpu.kernels.kernel_overhead_s);
    EXPECT_EQ(f.sm_count, gpu.kernels.sm_count);
  }
  const std::vector<double> r = ratios(*h.fp8_gemm);
  const auto [rlo, rhi] = std::minmax_element(r.begin(), r.end());
  std::printf("  h100 fp8: fraction %.6f, ceiling %.4f; published / predicted %.3f to %.3f, "
              "median %.3f\n", h.fp8_gemm->gemm_fraction, h.fp8_gemm->gemm_ceiling, *rlo, *rhi,
              median(r));
  EXPECT_NEAR(median(r), 1.0, 0.005);
  EXPECT_GT(*rlo, 0.9);   // +5 % at worst: predicted faster
  EXPECT_LT(*rhi, 1.25);  // k = 1280 runs 20 % faster than bf16's k½ gives it
  // Before, bf16's constants at the fp8 peak ran every point 5-23 % fast.
  std::vector<double> old = ratios(h.kernels);
  EXPECT_LT(*std::max_element(old.begin(), old.end()), 0.96);
  EXPECT_LT(median(old), 0.88);
  // fp8 on large GEMMs: about 1.7× bf16's speed, not the peaks' 2×.
  const double m = 8192, flops = 2 * m * m * m;
  const double bf16_s = flops / (h.peak_bf16_flops * gemm_efficiency(h.kernels, 8192, 8192, 8192));
  const double fp8_s = flops / (peak * gemm_efficiency(*h.fp8_gemm, 8192, 8192, 8192));
  EXPECT_NEAR(bf16_s / fp8_s, 1.7, 0.1);
}

// The Blackwell presets' nvfp4 GEMM constants against the published B200 cuBLAS FP4 table they come
// from (tests/data/published_fp4_gemm_b200.json): B200's fp8 shape terms, the best published GEMM
// as the ceiling, and the one fraction that makes the median of published / predicted 1.
TEST(GemmTables, BlackwellFp4GemmsAreThePublishedTable) {
  Published table;
  for (const auto& r : fixture("published_fp4_gemm_b200.json")["rows"]) table.add(r);
  ASSERT_EQ(table.points.size(), 7u);
  const GpuSpec b200 = cluster_preset("b200")->gpu;
  const double peak = b200.peak_fp4_flops, best = table.best_flops;
  auto ratios = [&](const KernelPerf& k) { return time_ratios(k, peak, table); };
  const KernelPerf k = median_anchored(*b200.fp8_gemm, peak, table);
  ASSERT_TRUE(b200.fp4_gemm.has_value());
  const KernelPerf& f = *b200.fp4_gemm;
  EXPECT_NEAR(f.gemm_fraction, k.gemm_fraction, 1e-5);
  EXPECT_NEAR(f.gemm_ceiling, best / peak, 1e-12);
  EXPECT_EQ(f.gemm_half_k, b200.fp8_gemm->gemm_half_k);
  EXPECT_EQ(f.half_tile_efficiency, b200.fp8_gemm->half_tile_efficiency);
  EXPECT_EQ(f.kernel_overhead_s, b200.fp8_gemm->kernel_overhead_s);
  const std::vector<double> r = ratios(f);
  const auto [rlo, rhi] = std::minmax_element(r.begin(), r.end());
  std::printf("  b200 nvfp4: fraction %.6f, ceiling %.4f; published / predicted %.3f to %.3f, "
              "median %.3f\n", f.gemm_fraction, f.gemm_ceiling, *rlo, *rhi, median(r));
  EXPECT_NEAR(median(r), 1.0, 0.005);
  EXPECT_GT(*rlo, 0.7);   // the k = 2048 shapes run 30-40 % slower than the fp8 shape terms say
  EXPECT_LT(*rhi, 1.25);
  // Before, bf16's constants at the fp4 peak ran every point 26-140 % fast.
  const std::vector<double> old = ratios(b200.kernels);
  EXPECT_LT(*std::max_element(old.begin(), old.end()), 0.8);
  // Every Blackwell part: the same fractions of its own fp4 peak; an nvfp4 GEMM takes them.
  for (const char* name : {"b200", "b300", "gb200-nvl72", "gb300-nvl72"}) {
    SCOPED_TRACE(name);
    const GpuSpec gpu = cluster_preset(name)->gpu;
    ASSERT_TRUE(gpu.fp4_gemm.has_value());
    EXPECT_EQ(gpu.fp4_gemm->gemm_fraction, f.gemm_fraction);
    EXPECT_NEAR(gpu.fp4_gemm->gemm_ceiling, f.gemm_ceiling, 1e-12);
    EXPECT_EQ(&gpu.gemm_kernels(Precision::nvfp4), &*gpu.fp4_gemm);
    EXPECT_EQ(&gpu.gemm_kernels(Precision::mxfp8), &*gpu.fp8_gemm);
  }
  EXPECT_FALSE(cluster_preset("h100-80g")->gpu.fp4_gemm.has_value());
}

}  // namespace
}  // namespace tally::test_gemm_tables
