// The compute ledger against Kaplan's 6N, Narayanan et al. 2021 eq. 3 (GPT-3 175B) and the
// Mixtral active-parameter count; each reference cited next to its test.
#include "tally/core/compute.hpp"

#include <gtest/gtest.h>

#include "tally/core/model.hpp"
#include "tally/core/presets.hpp"

namespace tally::test_compute {
namespace {

// Kaplan et al. 2020 §2.1: C ≈ 6N per training token, nothing else known for a bare --params.
TEST(Compute, ParamsOnlyIsSixN) {
  const ModelSpec m = model_from_params(7e9);
  EXPECT_DOUBLE_EQ(flops_per_token(m, 2048, Recompute::none), 6 * 7e9);
  EXPECT_DOUBLE_EQ(flops_per_token(m, 2048, Recompute::selective), 6 * 7e9);
  // Narayanan et al. 2021 eq. 3: full recompute turns the factor 72 into 96, i.e. 4/3.
  EXPECT_DOUBLE_EQ(flops_per_token(m, 2048, Recompute::full) /
                       flops_per_token(m, 2048, Recompute::none),
                   4.0 / 3.0);
}

// Narayanan et al. 2021 eq. 3 per token (B·s = 1): 72·L·h²·(1 + s/(6h) + V/(16·L·h)) without
// recompute, 96·(…) with full recompute. Their last term counts only the LM head's
// forward+backward (6Vh) within the 96 form; ours counts the head inside N (and replays it under
// full recompute) plus biases, norms and learned positions: a < 0.5 % difference at 175B.
TEST(Compute, Gpt3MatchesNarayananEq3) {
  const ModelSpec m = *model_preset("gpt3-175b");
  const double L = 96, h = 12288, V = 50257, s = 2048;
  const double bracket = 1 + s / (6 * h) + V / (16 * L * h);
  const double nar72 = 72 * L * h * h * bracket;
  const double nar96 = 96 * L * h * h * bracket;
  EXPECT_NEAR(flops_per_token(m, 2048, Recompute::none) / nar72, 1.0, 0.02);
  EXPECT_NEAR(flops_per_token(m, 2048, Recompute::full) / nar96, 1.0, 0.02);
  // The attention term alone is exactly 12·L·h·s (= 72·L·h²·s/(6h)).
  EXPECT_DOUBLE_EQ(flops_per_token(m, 2048, Recompute::none) - 6 * compute_params(m),
                   12 * L * h * s);
  // Selective recompute adds only the attention forward, 4·L·h·s (Korthikanti et al. 2022 §5).
  EXPECT_DOUBLE_EQ(flops_per_token(m, 2048, Recompute::selective) -
                       flops_per_token(m, 2048, Recompute::none),
                   4 * L * h * s);
}

// Jiang et al. 2024 (Mixtral): 12.9B active parameters per token of 46.7B.
TEST(Compute, MixtralUsesActiveParams) {
  const ModelSpec m = *model_preset("mixtral-8x7b");
  EXPECT_NEAR(compute_params(m) / 1e9, 12.9, 0.05);
  EXPECT_DOUBLE_EQ(flops_per_token(m, 4096, Recompute::none),
                   6 * compute_params(m) + 12.0 * 32 * 4096 * 4096);
  EXPECT_LT(flops_per_token(m, 4096, Recompute::none), 6 * count_params(m).total());
}

// A sliding-window layer's attention spans its window (Note [sliding window]): Mistral 7B v0.1's
// 4096-token window on all 32 layers changes nothing up to s = 4096 and caps the term beyond;
// GPT-OSS 120B's 128-token window on 18 of 36 layers: 12·a·d·(18·s + 18·128) (a = 64, d = 64).
TEST(Compute, SlidingWindowAttentionSpansTheWindow) {
  const ModelSpec mistral = *model_preset("mistral-7b");
  const double n = 6 * compute_params(mistral);
  EXPECT_DOUBLE_EQ(flops_per_token(mistral, 4096, Recompute::none), n + 12.0 * 32 * 4096 * 4096);
  EXPECT_DOUBLE_EQ(flops_per_token(mistral, 16384, Recompute::none), n + 12.0 * 32 * 4096 * 4096);
  const ModelSpec oss = *model_preset("gpt-oss-120b");
  EXPECT_DOUBLE_EQ(flops_per_token(oss, 4096, Recompute::none),
                   6 * compute_params(oss) + 12.0 * 64 * 64 * (18.0 * 4096 + 18.0 * 128));
}

// The seed's generic 7B states N = 7e9; compute uses the same N as the state ledger.
TEST(Compute, NominalParamsShareTheStateLedgersN) {
  EXPECT_DOUBLE_EQ(compute_params(*model_preset("seed-7b")), 7e9);
  const ModelSpec llama = *model_preset("llama-2-7b");
  EXPECT_DOUBLE_EQ(compute_params(llama), count_params(llama).total());
}

TEST(Compute, StepTimeFromHardwareFlops) {
  ComputeSetup s{.model = model_from_params(7e9), .seq_len = 2048, .global_batch = 512,
                 .recompute = Recompute::none, .gpus = 8, .peak_flops = 312e12,
                 .utilisation = 0.5};
  const auto r = step_compute(s);
  EXPECT_DOUBLE_EQ(r.tokens_per_step, 512.0 * 2048);
  EXPECT_DOUBLE_EQ(r.model_flops, 6 * 7e9 * 512 * 2048);
  EXPECT_DOUBLE_EQ(r.hardware_flops, r.model_flops);
  EXPECT_NEAR(r.seconds, 6 * 7e9 * 512 * 2048 / (8 * 312e12 * 0.5), 1e-9);
  EXPECT_NEAR(r.mfu, 0.5, 1e-12);
  EXPECT_NEAR(r.tokens_per_s, r.tokens_per_step / r.seconds, 1e-6);
  s.recompute = Recompute::full;
  const auto f = step_compute(s);
  EXPECT_DOUBLE_EQ(f.model_flops, r.model_flops);
  EXPECT_NEAR(f.seconds / r.seconds, 4.0 / 3.0, 1e-12);
  EXPECT_NEAR(f.mfu, 0.375, 1e-12);  // recompute costs MFU, not model FLOPs
  EXPECT_NE(f.convention().find("recompute full"), std::string::npos) << f.convention();
  EXPECT_NE(f.convention().find("MFU on model FLOPs"), std::string::npos) << f.convention();
}

// Property: FLOPs per token rise with sequence length and with recompute.
TEST(Compute, PropertyMonotone) {
  const ModelSpec m = *model_preset("llama-2-7b");
  double prev = 0;
  for (std::int64_t s : {128, 512, 2048, 8192, 32768}) {
    const double none = flops_per_token(m, s, Recompute::none);
    EXPECT_GT(none, prev);
    EXPECT_GT(flops_per_token(m, s, Recompute::selective), none);
    EXPECT_GT(flops_per_token(m, s, Recompute::full),
              flops_per_token(m, s, Recompute::selective));
    prev = none;
  }
}

// Multi-token prediction (Note [multi-token prediction], model.cpp): each module's 6N over its
// own parameters as a token uses them (the layer with E_act experts, the 2h → h projection, its
// norms), its pass through the shared head, 6·V·h, and its layer's attention over the whole
// sequence, 3 × 2·a·(d_qk + d_v)·s (DeepSeek-V3: a = 128, d_qk = 192, d_v = 128) — all of it on
// the last stage (mtp_flops_per_token). Full recompute replays the module's 2N and attention
// forward as it does the layers'.
TEST(Compute, MultiTokenPredictionAddsItsModules) {
  ModelSpec m = *model_preset("deepseek-v3");
  const double s = 4096, V = 129280, h = 7168, attention = 2 * 128 * (192 + 128) * s;
  const double none = flops_per_token(m, 4096, Recompute::none);
  const double full = flops_per_token(m, 4096, Recompute::full);
  EXPECT_EQ(mtp_flops_per_token(m, 4096, Recompute::none), 0.0);
  m.mtp_layers = 1;
  const double active = count_params(m).mtp_active;
  const double module = 6 * active + 6 * V * h + 3 * attention;
  EXPECT_NEAR(flops_per_token(m, 4096, Recompute::none) - none, module, 1e-6 * module);
  EXPECT_NEAR(mtp_flops_per_token(m, 4096, Recompute::none), module, 1e-6 * module);
  EXPECT_NEAR(flops_per_token(m, 4096, Recompute::full) - full, module + 2 * active + attention,
              1e-6 * module);
  // About a sixtieth more than the main model's 61 layers and head, as one more layer and head.
  EXPECT_GT(module / none, 0.01);
  EXPECT_LT(module / none, 0.05);
}

TEST(Compute, RejectsBadInput) {
  EXPECT_THROW(flops_per_token(model_from_params(7e9), 0, Recompute::none), InvalidInput);
  ComputeSetup s{.model = model_from_params(7e9), .seq_len = 2048, .global_batch = 8,
                 .gpus = 8, .peak_flops = 312e12, .utilisation = 1.5};
  try {
    step_compute(s);
    ADD_FAILURE();
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("utilisation = 1.5"), std::string::npos) << e.what();
  }
  s.utilisation = 0.5;
  s.gpus = 0;
  EXPECT_THROW(step_compute(s), InvalidInput);
}

}  // namespace
}  // namespace tally::test_compute
