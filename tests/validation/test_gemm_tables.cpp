// The GPU presets' GEMM clock (core/roofline.hpp) against measured GEMM tables: XLA's default bf16
// GEMM performance table for H100 (sm_90) and B200 (sm_100), 375 shapes each (b 1–4; m, n, k
// 256–4096), kept in tests/data/xla_gemm_bf16.json with its source. The H100/H200 and B200 presets'
// kernel constants are Note [GEMM calibration]'s fit to these tables (presets.cpp); this test
// re-fits them, checks the presets carry that fit, and reports how closely the clock reproduces
// every measured GEMM.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "fixture.hpp"

#include "tally/core/presets.hpp"
#include "tally/core/roofline.hpp"

namespace tally {
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

}  // namespace
}  // namespace tally
