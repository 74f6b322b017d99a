// The kernel clock (core/roofline.hpp) against its sources: the published large-GEMM throughputs the
// presets are anchored to, and the tile/wave quantisation arithmetic of NVIDIA's "Matrix
// Multiplication Background User's Guide" (A100: 108 SMs, 256×128 tiles).
#include "tally/core/roofline.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tally/core/operators.hpp"
#include "tally/core/presets.hpp"

namespace tally::test_roofline {
namespace {

// stas00/ml-engineering, compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS": bf16
// torch.matmul, best shape of a brute-force search: A100 271.2 TFLOP/s at 1024×10240×5120, the
// A100 preset's anchor; H100 794.5 at 2048×2048×13312, where the H100 and H200 presets (fitted to
// XLA's measured table, whose best is 804.7: tests/validation/test_gemm_tables.cpp) come within
// 1.5 %.
TEST(Roofline, PresetsReproduceThePublishedBestGemm) {
  const GpuSpec a100 = cluster_preset("a100-80g")->gpu;
  EXPECT_NEAR(gemm_efficiency(a100.kernels, 1024, 10240, 5120) * a100.peak_bf16_flops / 1e12,
              271.2, 0.01);
  for (const char* name : {"h100-80g", "h200"}) {
    const GpuSpec h = cluster_preset(name)->gpu;
    EXPECT_NEAR(gemm_efficiency(h.kernels, 2048, 2048, 13312) * h.peak_bf16_flops / 1e12 / 794.5,
                1.0, 0.015)
        << name;
  }
}

// A training step holds the A100 at its 400 W cap. H. He ("Strangely, Matrix Multiplications on
// GPUs Run Faster When Given 'Predictable' Data!", thonking.ai, 2024) timed a 16-bit cuBLAS
// 8192³ on an A100 at 257 TFLOP/s with torch.randn inputs and at 295 with zeros (the same
// kernel under the cap with fewer bits flipping). The preset prices 8192³ at the search's burst
// 271.2 and a training GEMM at He's 257; both A100 presets are the same 400 W SXM part.
TEST(Roofline, A100GemmsRunAtThePowerCap) {
  for (const char* name : {"a100-80g", "a100-40g"}) {
    const GpuSpec a100 = cluster_preset(name)->gpu;
    const double n = 8192, flops = 2 * n * n * n;
    EXPECT_NEAR(gemm_efficiency(a100.kernels, 8192, 8192, 8192) * 312, 271.2, 0.01) << name;
    const Op op{.name = "8192^3", .kind = OpKind::gemm, .m = 8192, .n = 8192, .k = 8192,
                .flops = flops, .bytes = 3 * n * n * 2};
    EXPECT_NEAR(flops / op_seconds(op, a100, Precision::bf16) / 1e12, 257.0, 0.01) << name;
    EXPECT_NEAR(a100.kernels.sustained_gemm, 257 / 271.2, 1e-6) << name;
  }
}

// The published figure is the best of a shape search (A100: stas00's MAMF; H100/H200 and B200:
// the best of XLA's measured table), so no shape may beat it. Without the
// ceiling the A100 preset ran a 2304 × 9216 × 32768 weight gradient (Narayanan 2021's 1.7B MLP) at
// 280 TFLOP/s, above the 271.2 measured maximum: that shape quantises better than the anchor's.
TEST(Roofline, NoShapeBeatsThePublishedBest) {
  const struct { const char* name; double best; } gpus[] = {
      {"a100-80g", 271.2}, {"h100-80g", 804.715405124361}, {"h200", 804.715405124361},
      {"b200", 1670.467342710337}};
  for (const auto& g : gpus) {
    const GpuSpec gpu = cluster_preset(g.name)->gpu;
    double top = 0;
    for (std::int64_t m : {1024, 2304, 4096, 8192, 16384, 32768})
      for (std::int64_t n : {1024, 2304, 6912, 9216, 13824})
        for (std::int64_t k : {2304, 8192, 32768, 131072})
          top = std::max(top, gemm_efficiency(gpu.kernels, m, n, k) * gpu.peak_bf16_flops / 1e12);
    EXPECT_LE(top, g.best * (1 + 1e-12)) << g.name;
    EXPECT_GT(top, 0.99 * g.best) << g.name;  // and large GEMMs do reach it
  }
  const GpuSpec a100 = cluster_preset("a100-80g")->gpu;
  KernelPerf uncapped = a100.kernels;
  uncapped.gemm_ceiling = 1;
  EXPECT_GT(gemm_efficiency(uncapped, 2304, 9216, 32768) * 312, 275.0);  // the defect it closes
}

// Only the 256×128 tile (smaller tiles made useless): M = 2304 (9 row tiles), K = 4096. N = 1536
// is 12 column tiles, 108 tiles = one full wave of 108 SMs; N = 1664 is 13 columns, 117 tiles, so a
// second wave runs 9 tiles on 108 SMs: useful output 2304·1664 of 216 tiles' 256·128 each.
TEST(Roofline, WaveQuantisationFollowsTheGuide) {
  const KernelPerf kp{.sm_count = 108, .tile_m = 256, .tile_n = 128, .gemm_fraction = 1,
                      .gemm_half_k = 0, .half_tile_efficiency = 1e-6};
  EXPECT_NEAR(gemm_efficiency(kp, 2304, 1536, 4096), 1.0, 1e-12);
  EXPECT_NEAR(gemm_efficiency(kp, 2304, 1664, 4096), 2304.0 * 1664 / (216.0 * 256 * 128), 1e-12);
  // Tile quantisation: N = 1537 pads a 13th column of tiles, computing 127 padded columns.
  EXPECT_LT(gemm_efficiency(kp, 2304, 1537, 4096), gemm_efficiency(kp, 2304, 1536, 4096));
  // Batches fill waves like tiles: 12 batches of a 9-tile GEMM are one wave.
  EXPECT_NEAR(gemm_efficiency(kp, 2304, 128, 64, 12), 1.0, 1e-12);
}

// With smaller tiles allowed, a GEMM that leaves most of a wave idle picks them (at their cost).
TEST(Roofline, SmallerTilesRescueSmallGemms) {
  KernelPerf kp{.sm_count = 108, .tile_m = 256, .tile_n = 128, .gemm_fraction = 1,
                .gemm_half_k = 0, .half_tile_efficiency = 0.9};
  // 256×128 output: one 256×128 tile for 108 SMs (q = 1/108); 64×64 tiles (256 halved twice, 128
  // once): 8 tiles at 0.9³ — the best of the six shapes tried.
  const double eta = gemm_efficiency(kp, 256, 128, 4096);
  EXPECT_NEAR(eta, 8.0 / 108 * std::pow(0.9, 3), 1e-12);
}

TEST(Roofline, InnerDimensionSaturates) {
  KernelPerf kp{.sm_count = 108, .gemm_fraction = 0.8, .gemm_half_k = 128};
  double last = 0;
  for (std::int64_t k : {16, 64, 128, 1024, 8192}) {
    const double eta = gemm_efficiency(kp, 8192, 8192, k);
    EXPECT_GT(eta, last) << k;
    last = eta;
  }
  // k = k½ gives half of what the same output shape reaches as k → ∞.
  const double big_k = 1 << 20;
  EXPECT_NEAR(gemm_efficiency(kp, 8192, 8192, 128) /
                  gemm_efficiency(kp, 8192, 8192, std::int64_t(big_k)) * (big_k / (big_k + 128)),
              0.5, 1e-12);
}

TEST(Roofline, MemoryBoundKernelsRunAtTheStreamingFraction) {
  GpuSpec g = cluster_preset("a100-80g")->gpu;
  // 1 GB read + written at 2.039 TB/s × 0.85.
  EXPECT_NEAR(roofline_seconds(g, 0, 1, 1e9), 1e9 / (2.039e12 * 0.85), 1e-15);
  // A kernel with FLOPs is bound by whichever roof is lower.
  EXPECT_NEAR(roofline_seconds(g, 1e15, 1e15, 1e9), 1.0, 1e-12);
  g.kernels.kernel_overhead_s = 5e-6;
  EXPECT_NEAR(roofline_seconds(g, 0, 1, 0), 5e-6, 1e-18);
}

// Note [attention table], on a table worked by hand: head dims 64 and 128; at 128 two sequences,
// and two shapes at 8192 (MHA and GQA) that average. Fractions (forward / backward):
//   d 64,  s 2048: 0.30 / 0.26      d 128, s 2048: 0.40 / 0.36
//   d 128, s 8192: 0.50 / 0.46 and 0.60 / 0.52 → 0.55 / 0.49
TEST(Roofline, AttentionTableByHeadDimAndSequence) {
  KernelPerf kp{.sm_count = 132, .attention_forward_fraction = 0.9,
                .attention_backward_fraction = 0.8};
  EXPECT_DOUBLE_EQ(attention_fraction(kp, false, 128, 4096), 0.9) << "empty: the figure";
  EXPECT_DOUBLE_EQ(attention_fraction(kp, true, 128, 4096), 0.8);
  kp.attention_table = {{.head_dim = 64, .seq = 2048, .forward = 0.30, .backward = 0.26},
                        {.head_dim = 128, .seq = 2048, .forward = 0.40, .backward = 0.36},
                        {.head_dim = 128, .seq = 8192, .forward = 0.50, .backward = 0.46},
                        {.head_dim = 128, .seq = 8192, .forward = 0.60, .backward = 0.52}};
  // s 4096 is halfway between 2048 and 8192 in log2: (0.40 + 0.55) / 2, (0.36 + 0.49) / 2.
  EXPECT_NEAR(attention_fraction(kp, false, 128, 4096), 0.475, 1e-12);
  EXPECT_NEAR(attention_fraction(kp, true, 128, 4096), 0.425, 1e-12);
  // Outside the measured sequences: the end points.
  EXPECT_NEAR(attention_fraction(kp, false, 128, 1024), 0.40, 1e-12);
  EXPECT_NEAR(attention_fraction(kp, false, 128, 65536), 0.55, 1e-12);
  // Head dims: 80 is nearer 64 in log2 (0.32 vs 0.68), 96 nearer 128 (0.58 vs 0.42); 256 → 128.
  EXPECT_NEAR(attention_fraction(kp, false, 80, 2048), 0.30, 1e-12);
  EXPECT_NEAR(attention_fraction(kp, false, 96, 2048), 0.40, 1e-12);
  EXPECT_NEAR(attention_fraction(kp, false, 256, 8192), 0.55, 1e-12);
  // op_seconds takes it: an attention kernel of head dim 64 runs at 0.30 of the bf16 peak, at
  // the power-capped clock (Note [power cap]: the H200 preset's 1/1.128136, as its GEMMs).
  GpuSpec g = cluster_preset("h200")->gpu;
  g.kernels.attention_table = kp.attention_table;
  g.kernels.kernel_overhead_s = 0;  // the preset's 2 µs a kernel aside
  const double cap = 1 / 1.128136;
  const Op op{.name = "attention", .kind = OpKind::attention, .pass = Pass::forward, .m = 2048,
              .n = 2048, .k = 64, .batch = 1, .flops = 1e12, .bytes = 0};
  EXPECT_NEAR(op_seconds(op, g, Precision::bf16), 1e12 / (989.4e12 * 0.30 * cap), 1e-12);
  Op replay = op, backward = op;
  replay.pass = Pass::recompute;  // a replay of the forward kernel
  backward.pass = Pass::backward;
  EXPECT_NEAR(op_seconds(replay, g, Precision::bf16), 1e12 / (989.4e12 * 0.30 * cap), 1e-12);
  EXPECT_NEAR(op_seconds(backward, g, Precision::bf16), 1e12 / (989.4e12 * 0.26 * cap), 1e-12);
  g.kernels.attention_table[0].forward = 1.5;
  EXPECT_THROW(validate_kernel_perf(g), InvalidInput);
}

TEST(Roofline, BadShapesAndFiguresAreRejected) {
  const KernelPerf kp{.sm_count = 108};
  EXPECT_THROW(gemm_efficiency(kp, 0, 1, 1), InvalidInput);
  EXPECT_THROW(gemm_efficiency(kp, 1, 1, 1, 0.5), InvalidInput);
  GpuSpec g = cluster_preset("h100-80g")->gpu;
  EXPECT_NO_THROW(validate_kernel_perf(g));
  g.kernels.gemm_fraction = 1.5;
  try {
    validate_kernel_perf(g);
    FAIL() << "accepted gemm_fraction 1.5";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("gemm_fraction = 1.5"), std::string::npos) << e.what();
  }
}

// Note [GEMM residuals]: a measured shape takes its own ratio exactly; between two measured
// shapes at equal distance in (log2 m, log2 n, log2 k), the geometric mean of their ratios; single
// and batched GEMMs apart; nothing measured of a kind: 1.
TEST(Roofline, GemmResidualsHonourMeasuredShapes) {
  KernelPerf kp;
  EXPECT_EQ(gemm_residual(kp, 4, 4, 4), 1.0);  // a preset: no table
  kp.gemm_residuals = {{.log2_m = 2, .log2_n = 2, .log2_k = 2, .log_ratio = std::log(2.0)},
                       {.log2_m = 4, .log2_n = 4, .log2_k = 4, .log_ratio = std::log(0.5)}};
  EXPECT_DOUBLE_EQ(gemm_residual(kp, 4, 4, 4), 2.0);
  EXPECT_DOUBLE_EQ(gemm_residual(kp, 16, 16, 16), 0.5);
  EXPECT_NEAR(gemm_residual(kp, 8, 8, 8), 1.0, 1e-12);  // √(2 · 0.5)
  // Distance² 3 to (4,4,4) and 27 to (16,16,16): weights 1/9 and 1/729, ln r = (81 ln 2 −
  // ln 2)/82.
  EXPECT_NEAR(gemm_residual(kp, 2, 2, 2), std::exp(80 * std::log(2.0) / 82), 1e-12);
  EXPECT_EQ(gemm_residual(kp, 4, 4, 4, 8), 1.0);  // batched: no batched point measured
  kp.gemm_residuals.push_back(
      {.log2_m = 2, .log2_n = 2, .log2_k = 2, .log2_batch = 3, .log_ratio = std::log(3.0)});
  EXPECT_DOUBLE_EQ(gemm_residual(kp, 4, 4, 4, 8), 3.0);
  EXPECT_DOUBLE_EQ(gemm_residual(kp, 64, 64, 64, 16), 3.0);  // the only batched point
  EXPECT_DOUBLE_EQ(gemm_residual(kp, 4, 4, 4), 2.0);         // single ones unchanged
}

}  // namespace
}  // namespace tally::test_roofline

namespace tally::test_roofline {
namespace {

// Note [GEMM calibration]: constants on the fitting grid are recovered from GEMMs timed by them,
// exactly without noise and closely with ±3 % of it.
TEST(Roofline, FitRecoversKernelConstants) {
  const KernelPerf truth{.sm_count = 108, .tile_m = 256, .tile_n = 128, .gemm_fraction = 0.8,
                         .gemm_half_k = 128, .half_tile_efficiency = 0.9,
                         .kernel_overhead_s = 5e-6};
  const double peak = 312e12;
  std::vector<GemmSample> samples;
  for (std::int64_t m : {256, 1024, 4096, 8192})
    for (std::int64_t n : {128, 1000, 4096})
      for (std::int64_t k : {64, 512, 4096}) {
        const double flops = 2.0 * m * n * k;
        const double t = flops / (peak * gemm_efficiency(truth, m, n, k)) + 5e-6;
        samples.push_back({.m = m, .n = n, .k = k, .seconds = t});
      }
  const KernelPerf fit = fit_gemm_perf(KernelPerf{.sm_count = 108}, peak, samples);
  EXPECT_NEAR(fit.gemm_fraction, 0.8, 1e-9);
  EXPECT_EQ(fit.gemm_half_k, 128);
  EXPECT_NEAR(fit.half_tile_efficiency, 0.9, 1e-9);
  EXPECT_NEAR(fit.kernel_overhead_s, 5e-6, 1e-15);

  for (std::size_t j = 0; j < samples.size(); ++j)
    samples[j].seconds *= 1 + 0.03 * ((j * 7919) % 3 == 0 ? 1 : (j % 2 ? -1 : 0));
  const KernelPerf noisy = fit_gemm_perf(KernelPerf{.sm_count = 108}, peak, samples);
  EXPECT_NEAR(noisy.gemm_fraction, 0.8, 0.05);
  for (const GemmSample& g : samples) {
    const double predicted = 2.0 * g.m * g.n * g.k / (peak * gemm_efficiency(noisy, g.m, g.n, g.k)) +
                             noisy.kernel_overhead_s;
    EXPECT_NEAR(predicted / g.seconds, 1.0, 0.15) << g.m << "x" << g.n << "x" << g.k;
  }
  EXPECT_THROW(fit_gemm_perf(KernelPerf{.sm_count = 108}, peak, {samples[0], samples[1]}),
               InvalidInput);
}

}  // namespace
}  // namespace tally::test_roofline

namespace tally::test_roofline {
namespace {

// A CPU-like kernel (one core, 1 × 1 "tiles": no quantisation): the thin-GEMM factor
// min(m, n)/(min(m, n) + mn½) of Note [GEMM efficiency] by hand, and the fit recovering it.
TEST(Roofline, OuterDimensionSaturationAndItsFit) {
  const KernelPerf cpu{.sm_count = 1, .tile_m = 1, .tile_n = 1, .gemm_fraction = 0.9,
                       .gemm_half_k = 16, .gemm_half_mn = 4, .kernel_overhead_s = 2e-6};
  // m = 4 = mn½ halves it; k = 48: 48/(48 + 16) = 0.75.
  EXPECT_NEAR(gemm_efficiency(cpu, 4, 1000, 48), 0.9 * 0.5 * 0.75, 1e-12);
  // n is the smaller outer dimension here: 12/(12 + 4) = 0.75.
  EXPECT_NEAR(gemm_efficiency(cpu, 1000, 12, 48), 0.9 * 0.75 * 0.75, 1e-12);
  KernelPerf no_outer = cpu;
  no_outer.gemm_half_mn = 0;  // the GPU presets: the factor is 1
  EXPECT_NEAR(gemm_efficiency(no_outer, 4, 1000, 48), 0.9 * 0.75, 1e-12);

  const double peak = 100e9;
  std::vector<GemmSample> samples;
  for (std::int64_t m : {8, 32, 256})
    for (std::int64_t n : {16, 512, 1024})
      for (std::int64_t k : {16, 128, 1024}) {
        const double t = 2.0 * m * n * k / (peak * gemm_efficiency(cpu, m, n, k)) + 2e-6;
        samples.push_back({.m = m, .n = n, .k = k, .seconds = t});
      }
  const KernelPerf fit =
      fit_gemm_perf(KernelPerf{.sm_count = 1, .tile_m = 1, .tile_n = 1}, peak, samples);
  EXPECT_EQ(fit.gemm_half_mn, 4);
  EXPECT_EQ(fit.gemm_half_k, 16);
  EXPECT_NEAR(fit.gemm_fraction, 0.9, 1e-9);
  EXPECT_NEAR(fit.kernel_overhead_s, 2e-6, 1e-15);
}

}  // namespace
}  // namespace tally::test_roofline
