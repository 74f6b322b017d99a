// The fine-tuning planner (core/finetune_plan.hpp, Note [fine-tuning step]).
#include "tally/core/finetune_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "tally/core/activations.hpp"
#include "tally/core/presets.hpp"

namespace tally::test_finetune_plan {
namespace {

PlanRequest request(const char* model, const char* gpu, int gpus, std::int64_t batch,
                    std::int64_t seq) {
  return PlanRequest{.model = *model_preset(model), .cluster = *cluster_preset(gpu), .gpus = gpus,
                     .global_batch = batch, .seq = seq};
}

// A GPT layer's GEMMs forward are 2·T·12h² FLOPs (qkv 3h², out-proj h², MLP 8h²); backward adds
// the activation gradients (the same again) and the weight gradients (the same again). A frozen
// layer skips the weight gradients: 48·T·h² of the full 72·T·h². The materialised attention's
// scores and context GEMMs keep both backward GEMMs — their operands are activations.
TEST(FineTunePlan, FrozenWeightsSkipTheirWeightGradients) {
  const ModelSpec m = *model_preset("gpt2-124m");
  const double T = 1024, h = 768;
  for (Attention att : {Attention::flash, Attention::materialized}) {
    const OperatorSetup os{.seq = 1024, .micro_batch = 1, .attention = att, .dropout = false};
    double linear = 0, attention_full = 0, attention_frozen = 0;
    for (const Op& op : layer_ops(m, os)) {
      const bool core = op.kind == OpKind::attention || op.name.starts_with("scores") ||
                        op.name.starts_with("context");
      if (core) {
        attention_full += op.flops;
        if (runs_when_frozen(op)) attention_frozen += op.flops;
      } else if (op.kind == OpKind::gemm && runs_when_frozen(op)) {
        linear += op.flops;
      }
    }
    EXPECT_DOUBLE_EQ(linear, 48 * T * h * h) << to_string(att);
    EXPECT_DOUBLE_EQ(attention_frozen, attention_full) << to_string(att);
  }
  EXPECT_FALSE(runs_when_frozen(Op{.name = "lm-head.wgrad"}));
  EXPECT_FALSE(runs_when_frozen(Op{.name = "embedding.backward"}));
  EXPECT_TRUE(runs_when_frozen(Op{.name = "lm-head.dgrad"}));
}

// QLoRA and LoRA run the same kernels but for the dequantization passes; gradient checkpointing
// replays the forward (slower) and keeps only the layer inputs (smaller); memory is the ledger's
// static bytes plus the activations, held as the planner holds them.
TEST(FineTunePlan, StepAndMemoryOfOneConfiguration) {
  const PlanRequest r = request("llama-2-7b", "a100-40g", 1, 16, 2048);
  const LoraSetup qlora{.method = FineTune::qlora}, lora{.method = FineTune::lora};
  const FineTuneEval q = evaluate_finetune(r, qlora, 2, Recompute::none);
  const FineTuneEval l = evaluate_finetune(r, lora, 2, Recompute::none);
  EXPECT_GT(q.dequant_s, 0);
  EXPECT_EQ(l.dequant_s, 0);
  EXPECT_NEAR(q.compute_s - l.compute_s, q.dequant_s, 1e-12);
  EXPECT_EQ(q.grad_accum, 8);
  const FineTuneEval ck = evaluate_finetune(r, qlora, 2, Recompute::full);
  EXPECT_GT(ck.compute_s, q.compute_s);
  EXPECT_LT(ck.activation_bytes, q.activation_bytes);
  // The backbone's activations plus the adapters' (Note [activation inventory], LoRA adapters):
  // q and v, r = 8, lora_dropout 0.05, bf16 — per token per layer 2·16 + 2·8192 + 8192 bytes.
  const double adapters = 32 * 2 * 2048 * (32 + 16384 + 8192.0);
  const double act = activations(r.model, ActivationSetup{.seq = 2048, .micro_batch = 2,
                                                          .dropout = false})
                         .peak_stage_bytes +
                     adapters;
  EXPECT_DOUBLE_EQ(q.activation_bytes, act);
  EXPECT_DOUBLE_EQ(q.fit.allocated_bytes, finetune_ledger(r.model, qlora).static_bytes() + act);
  EXPECT_DOUBLE_EQ(q.step_s, q.compute_s + q.optimizer_s + q.allreduce_s);
  EXPECT_DOUBLE_EQ(q.tokens_per_s, 16 * 2048 / q.step_s);
  EXPECT_THROW(evaluate_finetune(r, qlora, 3, Recompute::none), InvalidInput);  // 16 per GPU
  EXPECT_THROW(evaluate_finetune(r, qlora, 2, Recompute::selective), InvalidInput);
  PlanRequest odd = r;
  odd.gpus = 3;
  EXPECT_THROW(plan_finetune(odd, qlora), InvalidInput);
}

// The plan: fitting configurations fastest first; the longest sequence that fits is the edge —
// it fits and 64 more tokens do not. Llama-2-70B: LoRA's bf16 backbone (138 GB) fits no H100,
// QLoRA's does.
// The attention kernel a fine-tune is timed with is named in its convention, as a plan's is: not
// the default fa2, FlashAttention 1's class or cuDNN's (Hopper), and the cuDNN one is faster there.
TEST(FineTunePlan, ConventionNamesTheAttentionKernel) {
  const LoraSetup lora{.method = FineTune::lora};
  PlanRequest r = request("llama-2-7b", "h100-80g", 1, 16, 4096);
  const FineTunePlan v2 = plan_finetune(r, lora, 1);
  EXPECT_EQ(v2.convention.find("attention kernels"), std::string::npos) << v2.convention;
  EXPECT_EQ(v2.convention.find("cuDNN"), std::string::npos) << v2.convention;
  r.flash_kernel = FlashKernel::fa1;
  EXPECT_NE(plan_finetune(r, lora, 1).convention.find("FlashAttention-1-class"),
            std::string::npos);
  r.flash_kernel = FlashKernel::cudnn;
  const FineTunePlan c = plan_finetune(r, lora, 1);
  EXPECT_NE(c.convention.find("cuDNN's fused attention"), std::string::npos) << c.convention;
  ASSERT_TRUE(v2.feasible() && c.feasible());
  EXPECT_LT(c.best[0].step_s, v2.best[0].step_s);
}

TEST(FineTunePlan, SearchAndLongestSequence) {
  const PlanRequest r = request("llama-2-7b", "a100-40g", 1, 16, 2048);
  const LoraSetup qlora{.method = FineTune::qlora};
  const FineTunePlan p = plan_finetune(r, qlora, 4);
  ASSERT_TRUE(p.feasible());
  ASSERT_EQ(p.best.size(), 4u);
  for (std::size_t i = 0; i < p.best.size(); ++i) {
    EXPECT_TRUE(p.best[i].fit.fits);
    if (i > 0) {
      EXPECT_LE(p.best[i - 1].step_s, p.best[i].step_s);
    }
  }
  ASSERT_GT(p.max_seq, 0);
  EXPECT_EQ(p.max_seq % 64, 0);
  const double statics = finetune_ledger(r.model, qlora).static_bytes();
  auto fits_at = [&](std::int64_t seq) {
    // Checkpointing keeps layer inputs; the replayed layer holds its adapters' terms too, which
    // only the blocks' backward sees (Note [backward phases]): per token 2·(8 + 8) A outputs,
    // 2·(4096 + 4096) dropped inputs and their 1-byte masks.
    const ActivationSetup a{.seq = seq, .recompute = Recompute::full, .dropout = false};
    const ActivationResult plain = activations(r.model, a);
    const double act = std::max(plain.loss_phase_bytes,
                                plain.blocks_phase_bytes + double(seq) * (32 + 16384 + 8192.0));
    return check_fit(statics, act, 0, r.memory_budget()).fits;
  };
  EXPECT_TRUE(fits_at(p.max_seq));
  EXPECT_FALSE(fits_at(p.max_seq + 64));

  const PlanRequest big = request("llama-2-70b", "h100-80g", 8, 64, 4096);
  EXPECT_FALSE(plan_finetune(big, LoraSetup{.method = FineTune::lora}).feasible());
  EXPECT_FALSE(plan_finetune(big, LoraSetup{.method = FineTune::lora}).near_misses.empty());
  const FineTunePlan q70 = plan_finetune(big, qlora);
  ASSERT_TRUE(q70.feasible());
  EXPECT_GT(q70.best.front().allreduce_s, 0);  // 8 GPUs reduce the adapters' gradients
}

}  // namespace
}  // namespace tally::test_finetune_plan
