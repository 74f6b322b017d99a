// Low-precision weight copies (issue 15; tally/engine/experiments/fp8.hpp, engine/runtime/
// lowp_weights.hpp) on a tiny GPT (C 64, L 2, a 2, V 64, T 32, B 4):
//   the copies   bytes by hand from the formats' definitions (OFP8 / MX v1.0 / NVFP4: 1 or ½ byte
//                per element + one scale byte per 32 or 16, two copies); the row and column copies'
//                relation (per-tensor and 2D-tiled NVFP4: one the other's transpose)
//   the GEMM     forward on the row copy, dgrad on the column copy, and the weight gradient dyᵀ·x
//                independent of the copies (straight through, Transformer Engine's Linear)
//   the run      every format: the copies' bytes, the model states by hand (2N + 2N + 12N + the
//                copies, N counted from the layer definitions), 0 codes off core's emulation,
//                a refresh that follows the weights, the loss falling and near the run without
//                copies
//   the CLI      bad flags exit 2 with one line; --json carries the figures
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../support/subprocess.hpp"
#include "lowp_weights.hpp"
#include "tally/engine/experiments/fp8.hpp"

#ifndef TALLY_BINARY
#error "TALLY_BINARY must name the tally executable"
#endif

namespace tally::engine::exp_fp8 {
namespace {

using nlohmann::json;
using subprocess::Ran;
using subprocess::run_command;

constexpr double kLimit_s = 120;  // one CLI run on a loaded 2-core box; ctest's 300 s backstop
constexpr Precision kFormats[] = {Precision::fp8, Precision::mxfp8, Precision::nvfp4};

Fp8Options tiny(Precision format) {
  return Fp8Options{.format = format,
                    .model = {.hidden = 64, .layers = 2, .heads = 2, .vocab = 64, .seq = 32,
                              .micro_batch = 4},
                    .threads = 1};
}

std::string message(const Fp8Options& o) {
  try {
    o.validate();
  } catch (const InvalidInput& e) {
    return e.what();
  }
  return "no throw";
}

TEST(Fp8Options, BadInputNamesTheFlag) {
  Fp8Options o = tiny(Precision::bf16);
  EXPECT_EQ(message(o), "--format = bf16: allowed fp8, mxfp8, nvfp4");
  o = tiny(Precision::mxfp8);
  o.model.hidden = 48;
  EXPECT_EQ(message(o), "--hidden = 48: mxfp8 needs a multiple of 32 (its blocks run along every "
                        "weight dimension)");
  o.format = Precision::nvfp4;  // 48 = 3·16 tiles
  EXPECT_EQ(message(o), "no throw");
  o.steps = 1;
  EXPECT_EQ(message(o), "--steps = 1: must be in [2, 100000]");
}

// A 32×64 weight whose rows grow in magnitude (row r ~ 0.01·(1 + r)); per format the bytes of
// both copies by hand, each element's rounding error, and how the column copy relates to the row
// copy.
TEST(LowpWeight, CopiesAndTheirBytes) {
  const std::int64_t out = 32, in = 64, n = out * in;
  const torch::Tensor w = (torch::arange(n, torch::kFloat).sin().view({out, in}) * 0.01 *
                           (torch::arange(out, torch::kFloat) + 1).unsqueeze(1))
                              .to(torch::kBFloat16);
  for (Precision f : kFormats) {
    SCOPED_TRACE(std::string(to_string(f)));
    LowpWeight c(f, out, in);
    c.allocate_payload();
    c.allocate_scales();
    c.refresh(w);
    const double expected = f == Precision::fp8     ? 2.0 * n                   // e4m3 W, Wᵀ
                            : f == Precision::mxfp8 ? 2.0 * (n + n / 32.0)      // + e8m0 per 32
                                                    : 2.0 * (n / 2.0 + n / 16.0);  // e2m1 + e4m3/16
    EXPECT_EQ(c.payload_bytes(), expected);
    // core's ledger for a GPU that keeps both copies (the engine's, Note [low-precision copies])
    EXPECT_EQ(c.payload_bytes(), low_precision_copy_bytes(f, Fp8GemmLayouts::tn_only) * double(n));
    EXPECT_EQ(c.scale_bytes(), f == Precision::fp8 ? 4 : f == Precision::mxfp8 ? 0 : 8);
    const torch::Tensor row = c.dequantize(CopyLayout::row), col = c.dequantize(CopyLayout::col);
    EXPECT_EQ(row.sizes(), (std::vector<std::int64_t>{out, in}));
    EXPECT_EQ(col.sizes(), (std::vector<std::int64_t>{in, out}));
    // Every element within its format's rounding of the weight (row copy): a normal e4m3 value
    // is off by at most half an ulp, 2^-4 relative — MX up to 2^-3: its scale 2^(⌊log2 amax⌋ − 8)
    // (MX v1.0 §6.3) puts a block's amax in [256, 512), and what lies above 448 clamps to 448 —
    // a subnormal by half of 2^-9 / scale, and the scale is at least 448/amax (per tensor) or
    // 2^8/amax (MX), so 2^-17·amax bounds it; e2m1 by a quarter of its value (the grid 4, 6 at
    // the top), or a quarter of s·g ≈ amax_tile/6 below 0.5: amax/20 bounds it.
    const torch::Tensor wf = w.to(torch::kFloat);
    const double amax = wf.abs().max().item<double>();
    const double rel = f == Precision::nvfp4 ? 0.25 : f == Precision::mxfp8 ? 1.0 / 8 : 1.0 / 16;
    const double absolute = f == Precision::nvfp4 ? amax / 20 : amax * std::ldexp(1.0, -17);
    EXPECT_TRUE(((row - wf).abs() <= wf.abs() * rel + absolute).all().item<bool>());
    if (f != Precision::mxfp8) {
      // One scale for the tensor (fp8) or one per 16×16 tile (NVFP4 2D): the same values.
      EXPECT_TRUE(col.t().equal(row));
    } else {
      // Blocks of 32 along in (one row each) vs along out (rows 0–31 of a column, whose largest
      // sets a coarser scale for the small rows): the column copy rounds those rows differently.
      EXPECT_FALSE(col.t().equal(row));
    }
  }
  EXPECT_THROW(LowpWeight(Precision::mxfp8, 48, 64), InvalidInput);
  EXPECT_THROW(LowpWeight(Precision::bf16, 32, 32), InvalidInput);
}

// y = x·W_rowᵀ + b; dx = dy·W_col (the column copy); dW = dyᵀ·x and db = Σ dy, the copies playing
// no part (the wgrad goes straight to the high-precision weight). Without copies both GEMMs read W.
TEST(LowpLinear, ForwardAndDgradOnTheCopiesWgradStraightThrough) {
  torch::manual_seed(3);
  const std::int64_t out = 64, in = 32;
  const torch::Tensor w0 = torch::randn({out, in}) * 0.1, b0 = torch::randn({out});
  const torch::Tensor x0 = torch::randn({2, 3, in}), dy = torch::randn({2, 3, out});
  LowpWeight c(Precision::mxfp8, out, in);
  c.allocate_payload();
  c.allocate_scales();
  c.refresh(w0);
  const torch::Tensor wr = c.dequantize(CopyLayout::row), wc = c.dequantize(CopyLayout::col);
  for (const LowpWeight* copies : {static_cast<const LowpWeight*>(&c),
                                   static_cast<const LowpWeight*>(nullptr)}) {
    SCOPED_TRACE(copies ? "copies" : "none");
    const torch::Tensor w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
    const torch::Tensor x = x0.clone().requires_grad_(true);
    const torch::Tensor y = lowp_linear(x, w, b, copies);
    y.backward(dy);
    const torch::Tensor fwd = copies ? wr : w0, dgrad = copies ? wc.t() : w0;
    EXPECT_TRUE(torch::allclose(y, torch::matmul(x0, fwd.t()) + b0, 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(x.grad(), torch::matmul(dy, dgrad), 1e-5, 1e-6));
    const torch::Tensor dw = dy.reshape({-1, out}).t().matmul(x0.reshape({-1, in}));
    EXPECT_TRUE(torch::allclose(w.grad(), dw, 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(b.grad(), dy.reshape({-1, out}).sum(0), 1e-5, 1e-6));
  }
  EXPECT_FALSE(torch::allclose(wc.t(), w0, 1e-3, 1e-4));  // the copy is not the weight
}

// The tiny GPT: C = 64, L = 2, V = 64, T = 32. N = V·C + T·C + L·(12C² + 13C) + 2C = 106,240;
// linear weights 12C²L = 98,304, their biases 9CL = 1,152.
TEST(Fp8Run, EveryFormatOnATinyGpt) {
  const double C = 64, L = 2, N = 64 * C + 32 * C + L * (12 * C * C + 13 * C) + 2 * C;
  const double weights = 12 * C * C * L, biases = 9 * C * L;
  ASSERT_EQ(N, 106240);
  for (Precision f : kFormats) {
    SCOPED_TRACE(std::string(to_string(f)));
    const Fp8Result r = run_fp8(tiny(f));
    EXPECT_EQ(r.n_params, N);
    EXPECT_EQ(r.linear_weights, weights);
    const double per_weight = f == Precision::fp8     ? 2
                              : f == Precision::mxfp8 ? 2 * (1 + 1 / 32.0)
                                                      : 2 * (0.5 + 1 / 16.0);
    const double scales = f == Precision::fp8 ? 4 * 8 : f == Precision::mxfp8 ? 0 : 8 * 8;
    EXPECT_EQ(r.copy_bytes, per_weight * weights);
    EXPECT_EQ(r.scale_bytes, scales);
    EXPECT_EQ(r.measured_states.params, 2 * N);  // bf16
    EXPECT_EQ(r.measured_states.grads, 2 * N);   // bf16, alive after step 1
    EXPECT_EQ(r.measured_states.master, 12 * N); // Adam fp32 m, v, master
    EXPECT_EQ(r.measured_state_bytes, 16 * N + per_weight * weights + scales);
    // Core copies the biases too (gemm_weight_share) and counts no tensor scales.
    EXPECT_NEAR(r.predicted_states.bytes.total() - r.measured_state_bytes,
                per_weight * biases - scales, 1e-6);
    EXPECT_EQ(r.checked_elements, 2 * weights);
    EXPECT_EQ(r.mismatches_initial, 0);
    EXPECT_EQ(r.mismatches_final, 0);
    EXPECT_EQ(r.refresh_mismatches, 0);
    EXPECT_EQ(r.unexplained_changes, 0);
    EXPECT_GT(r.codes_changed, 0);
    EXPECT_GT(r.weights_changed, weights);  // Adam's first step moves nearly every weight
    ASSERT_EQ(r.losses.size(), 20u);
    ASSERT_EQ(r.reference_losses.size(), 20u);
    EXPECT_NEAR(r.losses[0], std::log(64.0), 0.3);  // the untrained model: about uniform
    EXPECT_LT(r.losses.back(), 0.6 * r.losses.front());
    EXPECT_LE(r.loss_gap, fp8_loss_tolerance(f));
    for (const Fp8Check& c : fp8_checks(r)) EXPECT_TRUE(c.ok) << c.what << ": " << c.measured;
  }
}

TEST(Fp8Cli, BadFlagsExitTwoWithOneLine) {
  const std::vector<std::vector<std::string>> cases = {
      {"--format", "int8"}, {"--format", "mxfp8", "--hidden", "48", "--heads", "2"},
      {"--steps", "1"}, {"--lr", "nan"}};
  const std::vector<std::string> says = {"--format", "--hidden = 48: mxfp8 needs a multiple of 32",
                                         "--steps = 1", "--lr"};
  for (std::size_t i = 0; i < cases.size(); ++i) {
    std::vector<std::string> args = {TALLY_BINARY, "run", "fp8"};
    args.insert(args.end(), cases[i].begin(), cases[i].end());
    const Ran r = run_command(args, kLimit_s);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(says[i]), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// NVFP4 on C = 32, L = 1 (N = 32·32 + 16·32 + 12·1024 + 13·32 + 64 = 14,304): the report's figures.
TEST(Fp8Cli, JsonCarriesTheFigures) {
  const Ran r = run_command({TALLY_BINARY, "run", "fp8", "--format", "nvfp4", "--hidden", "32",
                             "--heads", "2", "--layers", "1", "--vocab", "32", "--seq", "16",
                             "--micro-batch", "4", "--steps", "10", "--threads", "1", "--json"},
                            kLimit_s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["experiment"], "fp8");
  EXPECT_EQ(j["format"], "nvfp4");
  EXPECT_TRUE(j["ok"].get<bool>()) << j["failed_checks"].dump();
  EXPECT_EQ(j["model"]["params"], 14304);
  const double weights = 12 * 32 * 32;
  EXPECT_EQ(j["model"]["linear_weights"], weights);
  EXPECT_EQ(j["memory"]["copy_bytes"]["measured"].get<double>(), 1.125 * weights);
  EXPECT_EQ(j["memory"]["copy_bytes"]["ratio"].get<double>(), 1.0);
  EXPECT_EQ(j["memory"]["tensor_scale_bytes"].get<double>(), 4 * 8);
  EXPECT_EQ(j["codes"]["mismatches_final"], 0);
  EXPECT_EQ(j["training"]["losses"].size(), 10u);
  EXPECT_NE(r.err.find("fp8: nvfp4 step 10/10: loss "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("fp8: reference (no copies) step 10/10"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tally::engine::exp_fp8
