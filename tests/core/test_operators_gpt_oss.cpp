// GPT-OSS's own kernels under Megatron-Core (Note [GPT-OSS kernels], core/operators.hpp): the
// unfused YaRN rotary, the GLU's clamp and the experts' fc2 bias, each against a hand count of
// what Megatron-Core core_r0.17.0's code reads and writes (models/common/embeddings/rope_utils.py,
// fusions/fused_bias_geglu.py, transformer/moe/experts.py), and the setups they must leave alone.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "tally/core/model.hpp"
#include "tally/core/operators.hpp"
#include "tally/core/presets.hpp"
#include "tally/core/types.hpp"

namespace tally::test_operators_gpt_oss {
namespace {

// Bytes of the ops named in `names`, by name and pass ("name" forward or backward — backward
// kernels carry their own names — "name/r" replayed), and whether each is a routed expert's.
struct Seen {
  std::map<std::string, double> bytes;
  std::map<std::string, bool> routed;
};
Seen kernels(const std::vector<Op>& ops) {
  Seen out;
  for (const Op& op : ops) {
    const std::string name(op.name);
    if (!name.starts_with("rotary") && !name.starts_with("glu-clamp") &&
        !name.starts_with("expert-bias"))
      continue;
    EXPECT_EQ(op.kind, OpKind::memory) << name;
    const std::string key = name + (op.pass == Pass::recompute ? "/r" : "");
    EXPECT_EQ(out.bytes.count(key), 0u) << key;  // each kernel once per pass
    out.bytes[key] = op.bytes;
    out.routed[key] = op.routed_expert;
  }
  return out;
}

// gpt-oss-120b, one sequence of 4096 tokens, TP 1, EP 8 (16 local experts), bf16 (e = 2),
// dropless. By hand:
//   rotary on q and k: T·(h_q + h_kv) = 4096·(64·64 + 8·64) = 18,874,368 elements; unfused
//     (mscale = 0.1·ln 32 + 1 ≠ 1): t·cos 2e + negation e + cat 2e + ·sin 2e + sum 3e + final cat
//     2e = 12e = 24 B each: 452,984,832; backward ·sin 2e, negation e, chunk's cat 2e, ·cos 2e,
//     the empty slice's zero-filled gradient e, two sums of t's three gradients 6e = 14e = 28 B:
//     528,482,304
//   routed tokens: 4096 tokens × 4 experts each = 16,384 rows, f = h = 2880: 47,185,920 elements
//   glu-clamp: two clamps over the f-wide halves 2e + 2e, their cat 4e = 8e = 16 B per element:
//     754,974,720; backward the gate's le (e + 1) and where (1 + 2e), the linear half's ge and le
//     (e + 1 each), logical_and_ 3 and where (1 + 2e), chunk's cat 4e = 11e + 8 = 30 B:
//     1,415,577,600
//   expert-bias (fc2 out, h wide): b·p e, the sum 3e, the cat 2e = 6e: 566,231,040; backward
//     the gradients of b and p, 3e each, split's cat 2e = 8e: 754,974,720
TEST(OperatorsGptOss, MegatronCoresKernelsByHand) {
  const ModelSpec m = *model_preset("gpt-oss-120b");
  EXPECT_NEAR(m.rotary_attention_scale, 0.1 * std::log(32.0) + 1, 1e-12);
  EXPECT_EQ(m.glu_clamp, 7.0);
  const Seen s = kernels(layer_ops(m, OperatorSetup{.seq = 4096, .ep = 8}));
  const std::map<std::string, double> want{
      {"rotary", 452984832.0},          {"rotary.backward", 528482304.0},
      {"glu-clamp", 754974720.0},       {"glu-clamp.backward", 1415577600.0},
      {"expert-bias", 566231040.0},     {"expert-bias.backward", 754974720.0}};
  EXPECT_EQ(s.bytes, want);
  for (const char* k : {"glu-clamp", "glu-clamp.backward", "expert-bias", "expert-bias.backward"})
    EXPECT_TRUE(s.routed.at(k)) << k;  // the experts' tokens, arrived by all-to-all
  EXPECT_FALSE(s.routed.at("rotary"));
}

// Without the attention factor, the clamp and the biases the same model runs TE's fused RoPE
// (2e forward, 3e backward) and neither extra kernel; eager kernels (Note [eager kernels]) keep
// their own rotary count (16 + 2e each way), the local ones the fused count, and neither has the
// extra expert kernels.
TEST(OperatorsGptOss, OnlyMegatronCoreOnThisArchitecture) {
  ModelSpec plain = *model_preset("gpt-oss-120b");
  plain.rotary_attention_scale = 1.0;
  plain.glu_clamp = 0.0;
  plain.linear_bias = plain.expert_bias = false;
  const double w = 4096.0 * 4608.0;
  EXPECT_EQ(kernels(layer_ops(plain, OperatorSetup{.seq = 4096, .ep = 8})).bytes,
            (std::map<std::string, double>{{"rotary", 4 * w}, {"rotary.backward", 6 * w}}));
  const ModelSpec m = *model_preset("gpt-oss-120b");
  EXPECT_EQ(kernels(layer_ops(m, OperatorSetup{.seq = 4096, .ep = 8, .kernels = Kernels::eager}))
                .bytes,
            (std::map<std::string, double>{{"rotary", 20 * w}, {"rotary.backward", 20 * w}}));
  // Megatron-LM's local modules (Note [local kernels]) have no TEGroupedMLP: fused counts.
  EXPECT_EQ(kernels(layer_ops(m, OperatorSetup{.seq = 4096, .ep = 8, .kernels = Kernels::local}))
                .bytes,
            (std::map<std::string, double>{{"rotary", 4 * w}, {"rotary.backward", 6 * w}}));
  // A dense model with biases (GPT-3) adds no expert kernels.
  for (const Op& op : layer_ops(*model_preset("gpt3-175b"), OperatorSetup{.seq = 2048}))
    EXPECT_FALSE(op.name.starts_with("glu-clamp") || op.name.starts_with("expert-bias"))
        << op.name;
}

// Megatron-Core's moe_act checkpoint wraps bias_act_func (the clamp with the activation) and
// ends before the down projection: save-matmuls replays the clamp and the rotary, not the fc2
// bias; full recompute replays the whole forward, the bias included.
TEST(OperatorsGptOss, ReplaysFollowTheCheckpoint) {
  const ModelSpec m = *model_preset("gpt-oss-120b");
  const Seen sel = kernels(
      layer_ops(m, OperatorSetup{.seq = 4096, .recompute = Recompute::save_matmuls, .ep = 8}));
  EXPECT_EQ(sel.bytes.at("glu-clamp/r"), 754974720.0);
  EXPECT_EQ(sel.bytes.at("rotary/r"), 452984832.0);
  EXPECT_EQ(sel.bytes.count("expert-bias/r"), 0u);
  const Seen full =
      kernels(layer_ops(m, OperatorSetup{.seq = 4096, .recompute = Recompute::full, .ep = 8}));
  EXPECT_EQ(full.bytes.at("expert-bias/r"), 566231040.0);
  EXPECT_EQ(full.bytes.at("glu-clamp/r"), 754974720.0);
}

// YaRN's default attention factor (HF get_mscale) and the fields' ranges.
TEST(OperatorsGptOss, AttentionFactorAndClampAreChecked) {
  EXPECT_NEAR(yarn_attention_factor(32), 1.3465735902799727, 1e-12);
  EXPECT_EQ(yarn_attention_factor(1), 1.0);
  EXPECT_EQ(yarn_attention_factor(0.5), 1.0);
  EXPECT_THROW(yarn_attention_factor(0), InvalidInput);
  ModelSpec m = *model_preset("gpt-oss-120b");
  m.rotary_attention_scale = 0;
  EXPECT_THROW(m.validate(), InvalidInput);
  m.rotary_attention_scale = std::nan("");
  EXPECT_THROW(m.validate(), InvalidInput);
  m = *model_preset("gpt3-175b");  // learned positions: no rotary to scale
  m.rotary_attention_scale = 1.5;
  EXPECT_THROW(m.validate(), InvalidInput);
  m = *model_preset("gpt3-175b");  // GeLU: no gate to clamp
  m.glu_clamp = 7;
  EXPECT_THROW(m.validate(), InvalidInput);
  m = *model_preset("gpt-oss-120b");
  m.glu_clamp = -1;
  EXPECT_THROW(m.validate(), InvalidInput);
}

}  // namespace
}  // namespace tally::test_operators_gpt_oss
