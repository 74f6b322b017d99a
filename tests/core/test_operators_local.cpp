// Megatron-LM's own modules and its unfused loss in the operator inventory (Note [local kernels]
// and Note [loss kernels], core/operators.hpp): each added kernel's bytes worked by hand from the
// lines of code it stands for, and everything else left as the fused inventory has it.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "tally/core/operators.hpp"
#include "tally/core/presets.hpp"

namespace tally::test_operators_local {
namespace {

// A GPT layer as Megatron-LM's papers run it: biases on every linear layer, 4h GeLU MLP.
ModelSpec gpt(std::int64_t h, std::int64_t a) {
  return ModelSpec{.name = "gpt", .hidden = h, .layers = 24, .heads = a, .kv_heads = a,
                   .ffn = 4 * h, .vocab = 51200, .max_positions = 2048, .tied_embeddings = true,
                   .linear_bias = true, .mlp = MlpKind::gelu, .norm = NormKind::layernorm,
                   .position = PositionKind::learned};
}

// Memory kernels by (name, pass) → bytes.
std::map<std::pair<std::string, Pass>, double> memory_ops(const std::vector<Op>& ops) {
  std::map<std::pair<std::string, Pass>, double> out;
  for (const Op& op : ops)
    if (op.kind == OpKind::memory) out[{std::string(op.name), op.pass}] += op.bytes;
  return out;
}

// The 1.7B model of Narayanan et al. 2021 Table 1 (h 2304, 24 heads) at t = 2, b = 4, s = 2048,
// full recompute, materialised attention, fp16: per rank T = 8192 tokens, h_q = h_kv = 1152,
// f/t = 4608, e = 2.
TEST(OperatorsLocal, MegatronLocalModulesAddTheirKernelsByHand) {
  const ModelSpec m = gpt(2304, 24);
  OperatorSetup s{.seq = 2048, .micro_batch = 4, .tp = 2, .recompute = Recompute::full,
                  .attention = Attention::materialized};
  const auto fused = memory_ops(layer_ops(m, s));
  s.kernels = Kernels::local;
  const auto local = memory_ops(layer_ops(m, s));
  const double T = 4 * 2048.0, e = 2, h = 2304, hq = 1152, f = 4608;
  const std::map<std::pair<std::string, Pass>, double> added = {
      // qkv: output + bias (read + write the GEMM's output), its gradient summed over the tokens
      {{"qkv-bias", Pass::forward}, 2 * e * T * 3 * hq},
      {{"qkv-bias", Pass::recompute}, 2 * e * T * 3 * hq},
      {{"qkv-bias.backward", Pass::backward}, e * T * 3 * hq},
      // context permute(2, 0, 1, 3).contiguous(): read + write; the gradient is a view (below)
      {{"context-copy", Pass::forward}, 2 * e * T * hq},
      {{"context-copy", Pass::recompute}, 2 * e * T * hq},
      // out-proj's and MLP down's biases (T·h each, no SP) and MLP up's (T·f/t) summed
      {{"bias-grads.backward", Pass::backward}, e * (T * h + T * h + T * f)}};
  EXPECT_EQ(local.size(), fused.size() + added.size());
  // Megatron-LM's fused LayerNorm (megatron/fused_kernels/layer_norm_cuda_kernel.cu) computes
  // its backward in two passes, the weight's and bias's gradients (x and dy read) and then the
  // input's (x and dy read, dx written): 5e a element where Transformer Engine's one pass moves
  // 3e (Note [norm backward passes]).
  for (const char* n : {"norm-1.backward", "norm-2.backward"}) {
    const std::pair<std::string, Pass> key{n, Pass::backward};
    EXPECT_DOUBLE_EQ(fused.at(key), 3 * e * T * h) << n;
    EXPECT_DOUBLE_EQ(local.at(key), 5 * e * T * h) << n;
  }
  for (const auto& [key, bytes] : added) {
    SCOPED_TRACE(key.first);
    ASSERT_TRUE(local.contains(key));
    EXPECT_DOUBLE_EQ(local.at(key), bytes);
    EXPECT_FALSE(fused.contains(key));
  }
  for (const auto& [key, bytes] : fused) {
    if (!key.first.starts_with("norm-") || key.second != Pass::backward) {
      EXPECT_DOUBLE_EQ(local.at(key), bytes) << key.first;
    }
  }
  // No kernel at all for the copy's gradient, so no launch overhead either (0 bytes before).
  EXPECT_FALSE(local.contains({"context-copy.backward", Pass::backward}));
  EXPECT_EQ(to_string(Kernels::local), "local");
  EXPECT_EQ(parse_kernels("local"), Kernels::local);
}

// Sequence parallelism splits the row-parallel outputs' tokens (out-proj, MLP down: T/t each);
// flash attention writes [s, b, h] itself (no context copy); a model without linear biases (Llama)
// has no bias kernels; and Megatron-LM's local modules run no fp8.
TEST(OperatorsLocal, WhatEachKernelNeeds) {
  const ModelSpec m = gpt(2304, 24);
  OperatorSetup s{.seq = 2048, .micro_batch = 4, .tp = 2, .sequence_parallel = true,
                  .attention = Attention::materialized, .kernels = Kernels::local};
  const double T = 4 * 2048.0, e = 2, h = 2304, f = 4608;
  auto local = memory_ops(layer_ops(m, s));
  EXPECT_DOUBLE_EQ(local.at({"bias-grads.backward", Pass::backward}),
                   e * (T / 2 * h + T / 2 * h + T * f));
  s.attention = Attention::flash;
  local = memory_ops(layer_ops(m, s));
  EXPECT_FALSE(local.contains({"context-copy", Pass::forward}));
  EXPECT_TRUE(local.contains({"qkv-bias", Pass::forward}));

  const ModelSpec llama = *model_preset("llama-3-8b");
  const OperatorSetup l{.seq = 4096, .micro_batch = 1, .attention = Attention::materialized,
                        .dropout = false, .kernels = Kernels::local};
  const auto ll = memory_ops(layer_ops(llama, l));
  EXPECT_FALSE(ll.contains({"qkv-bias", Pass::forward}));
  EXPECT_FALSE(ll.contains({"bias-grads.backward", Pass::backward}));
  EXPECT_DOUBLE_EQ(ll.at({"context-copy", Pass::forward}), 2 * 2 * 4096.0 * 4096);

  const OperatorSetup fp8{.seq = 2048, .kernels = Kernels::local, .recipe = Precision::fp8};
  EXPECT_THROW(layer_ops(m, fp8), InvalidInput);
}

// Megatron-LM's _VocabParallelCrossEntropy, a kernel per line (megatron/mpu/cross_entropy.py at
// de7dc40f88), per fp32 logit of the rank's T × V/t, e = 2: logits.float() 2 + 4, max 4,
// sub_ 4 + 4, exp(out=) 4 + 4, sum 4, div_ 4 + 4 = 38 forward; backward mul_ 4 + 4 and the cast's
// backward 4 + 2 = 14. Llama 3 8B's vocabulary 128,256 splits evenly over t = 8.
TEST(OperatorsLocal, UnfusedVocabParallelLossByHand) {
  const ModelSpec m = *model_preset("llama-3-8b");
  OperatorSetup os{.seq = 4096, .micro_batch = 1, .tp = 8, .dropout = false,
                   .loss = Loss::vocab_parallel};
  const double logits = 4096.0 * 128256 / 8;
  const auto b = memory_ops(output_ops(m, os));
  EXPECT_DOUBLE_EQ(b.at({"cross-entropy", Pass::forward}), 38 * logits);
  EXPECT_DOUBLE_EQ(b.at({"cross-entropy.backward", Pass::backward}), 14 * logits);
  os.loss = Loss::fused;  // one fused kernel: 2 + 12 and 8 + 2
  const auto fused = memory_ops(output_ops(m, os));
  EXPECT_DOUBLE_EQ(fused.at({"cross-entropy", Pass::forward}), 14 * logits);
  EXPECT_DOUBLE_EQ(fused.at({"cross-entropy.backward", Pass::backward}), 10 * logits);
  EXPECT_EQ(parse_loss("vocab-parallel"), Loss::vocab_parallel);
  EXPECT_EQ(to_string(Loss::vocab_parallel), "vocab-parallel");
  EXPECT_FALSE(parse_loss("unfused").has_value());
}

}  // namespace
}  // namespace tally::test_operators_local
