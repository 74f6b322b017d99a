// Activation ledger: Korthikanti et al. 2022 closed forms, the seed's figures (seed §9.1.5 / plan 2),
// and DESIGN.md erratum 3.
#include "tally/core/activations.hpp"

#include <gtest/gtest.h>

#include <utility>

#include "tally/core/presets.hpp"

namespace tally::test_activations {
namespace {

// A Korthikanti-shaped model: 4h GeLU MLP, a_kv = a, with dropout (his convention).
ModelSpec gpt_like(std::int64_t h, std::int64_t L, std::int64_t a, std::int64_t V = 32000) {
  return ModelSpec{.name = "gpt-like", .hidden = h, .layers = L, .heads = a, .kv_heads = a,
                   .ffn = 4 * h, .vocab = V, .mlp = MlpKind::gelu, .norm = NormKind::layernorm};
}

// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", the
// closed forms of activation bytes per layer (2-byte activations, dropout, 4h GeLU MLP, a_kv = a),
// written here from the paper so the inventory is checked against the source, not against itself:
//   Eq. 1  no parallelism                 sbh (34 + 5as/h)
//   Eq. 2  tensor parallel over t         sbh (10 + 24/t + 5as/(ht))
//   Eq. 4  tensor + sequence parallel     sbh/t (34 + 5as/h)
//   §5     selective recompute            the 5as/h term is recomputed: drops out of the forms
//   Table 2 full recompute                2sbh (the layer input only; /t with sequence parallelism)
double korthikanti_paper_bytes(double s, double b, double h, double a, int t, bool sp, Recompute r) {
  const double sbh = s * b * h;
  if (r == Recompute::full) return 2 * sbh / (sp ? t : 1);
  const double scores = r == Recompute::selective ? 0.0 : 5 * a * s / h;
  if (sp) return sbh / t * (34 + scores);
  return sbh * (10 + 24.0 / t + scores / t);
}

double term_bytes(const ActivationResult& r, const std::string& prefix) {
  for (const auto& t : r.layer_terms)
    if (t.name.rfind(prefix, 0) == 0) return t.bytes;
  return -1;
}

// Σ of every term whose name starts with prefix.
double terms_bytes(const ActivationResult& r, const std::string& prefix) {
  double sum = 0;
  for (const auto& t : r.layer_terms)
    if (t.name.rfind(prefix, 0) == 0) sum += t.bytes;
  return sum;
}

// The inventory reproduces Korthikanti's closed forms for every TP / SP / recompute combination.
TEST(Activations, InventoryMatchesKorthikantiClosedForms) {
  const auto m = gpt_like(4096, 32, 32);
  for (int t : {1, 2, 4, 8})
    for (bool sp : {false, true})
      for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
        for (std::int64_t s : {512, 2048}) {
          if (sp && t == 1) continue;
          const auto res = activations(m, {.seq = s, .micro_batch = 2, .tp = t,
                                           .sequence_parallel = sp, .recompute = r,
                                           .attention = Attention::materialized});
          const double want = korthikanti_paper_bytes(double(s), 2, 4096, 32, t, sp, r);
          EXPECT_NEAR(res.per_layer_bytes / want, 1.0, 1e-12)
              << "t=" << t << " sp=" << sp << " r=" << to_string(r) << " s=" << s;
        }
}

// Seed (plan 2, ①): materialised attention at T=2048, B=4, 32 heads ≈ 1.07 GB per layer
// (2-byte scores) and ≈34 GB over 32 layers.
TEST(Activations, SeedMaterialisedScores) {
  const auto m = gpt_like(4096, 32, 32);
  const auto r = activations(m, {.seq = 2048, .micro_batch = 4,
                                 .attention = Attention::materialized});
  const double scores = term_bytes(r, "attention scores");
  EXPECT_NEAR(scores / kGB, 1.07, 0.005);
  EXPECT_NEAR(scores * 32 / kGB, 34.4, 0.1);
  // Flash attention never materialises them.
  const auto f = activations(m, {.seq = 2048, .micro_batch = 4, .attention = Attention::flash});
  EXPECT_LT(term_bytes(f, "attention scores"), 0);
}

// Seed (plan 2, ②): the two LayerNorm inputs, 4·s·b·h per layer, 32 layers, h 4096, b 1:
// ≈4.3 GB at T=8192, ≈0.54 GB with sequence parallelism over 8, ≈17 GB at T=32768.
TEST(Activations, SeedLayerNormInputs) {
  const auto m = gpt_like(4096, 32, 32);
  auto ln = [&](std::int64_t s, int t, bool sp) {
    return 32 * terms_bytes(activations(m, {.seq = s, .micro_batch = 1, .tp = t,
                                            .sequence_parallel = sp}),
                            "LayerNorm") / kGB;
  };
  EXPECT_NEAR(ln(8192, 1, false), 4.3, 0.05);
  EXPECT_NEAR(ln(8192, 8, true), 0.54, 0.005);
  EXPECT_NEAR(ln(8192, 8, false), 4.3, 0.05);  // pure TP replicates them
  EXPECT_NEAR(ln(32768, 1, false), 17.2, 0.1);
}

// DESIGN.md erratum 3: the seed's "7B, B_micro=4, T=2048 → ≈9 GB" is Korthikanti's 34·s·b·h per
// layer at b = 1 (≈9.1 GB); at b = 4 it is ≈36.5 GB before the logits.
TEST(Activations, Erratum3SeedNineGigabytesIsMicroBatchOne) {
  const auto m = *model_preset("seed-7b");
  auto body = [&](std::int64_t b) {
    const auto r = activations(m, {.seq = 2048, .micro_batch = b, .attention = Attention::flash});
    // flash adds only the fp32 log-sum-exp (4·a·s·b per layer, 0.1 % here); compare the 34sbh part.
    return (r.per_layer_bytes - term_bytes(r, "flash")) * 32 / kGB;
  };
  EXPECT_NEAR(body(4), 36.5, 0.1);
  EXPECT_NEAR(body(1), 9.1, 0.05);
  EXPECT_GT(body(4), 4 * 9.0 * 0.99);  // the seed's ≈9 GB cannot be b = 4 under this convention
}

TEST(Activations, FullRecomputeKeepsTwoSbhPerLayer) {
  const auto m = gpt_like(4096, 32, 32);
  const auto r = activations(m, {.seq = 2048, .micro_batch = 1, .recompute = Recompute::full});
  EXPECT_DOUBLE_EQ(r.per_layer_bytes, 2.0 * 2048 * 4096);
  // 34 → 2 bytes per s·b·h (seed plan 2 ③).
  const auto none = activations(m, {.seq = 2048, .micro_batch = 1});
  EXPECT_NEAR((none.per_layer_bytes - term_bytes(none, "flash")) / (2048.0 * 4096), 34.0, 1e-9);
}

TEST(Activations, PipelineFirstStageHoldsMinPMMicroBatches) {
  const auto m = gpt_like(4096, 32, 32);
  const auto one = activations(m, {.seq = 2048, .micro_batch = 1});
  const auto pp4 = activations(m, {.seq = 2048, .micro_batch = 1, .pp = 4, .micro_batches = 16});
  EXPECT_DOUBLE_EQ(pp4.in_flight_micro_batches, 4);
  EXPECT_DOUBLE_EQ(pp4.transformer_bytes, one.transformer_bytes);  // p × L/p layers = L layers
  const auto few = activations(m, {.seq = 2048, .micro_batch = 1, .pp = 4, .micro_batches = 2});
  EXPECT_DOUBLE_EQ(few.in_flight_micro_batches, 2);
  // Interleaved with v = 2: × (1 + (p−1)/(p·v)) = 1 + 3/8.
  const auto il = activations(m, {.seq = 2048, .micro_batch = 1, .pp = 4, .interleave = 2,
                                  .micro_batches = 16});
  EXPECT_DOUBLE_EQ(il.in_flight_micro_batches, 4 * (1 + 3.0 / 8));
}

TEST(Activations, ContextParallelDividesTokens) {
  const auto m = gpt_like(4096, 32, 32);
  const auto c1 = activations(m, {.seq = 8192, .micro_batch = 1});
  const auto c4 = activations(m, {.seq = 8192, .micro_batch = 1, .cp = 4});
  EXPECT_NEAR(c4.per_layer_bytes * 4 / c1.per_layer_bytes, 1.0, 1e-12);
}

TEST(Activations, OutputLogitsAreFp32AndVocabParallel) {
  const auto m = gpt_like(4096, 32, 32, 32000);
  const auto r = activations(m, {.seq = 2048, .micro_batch = 1});
  EXPECT_DOUBLE_EQ(r.output_bytes, 2 * 2.0 * 2048 * 4096 + 4.0 * 2048 * 32000);
  const auto t = activations(m, {.seq = 2048, .micro_batch = 1, .tp = 4, .sequence_parallel = true});
  EXPECT_DOUBLE_EQ(t.output_bytes, r.output_bytes / 4);
}

// Properties: linear in b; quadratic in s only with materialised attention.
TEST(Activations, PropertyLinearInBatchQuadraticInSeq) {
  const auto m = *model_preset("llama-2-7b");
  for (Attention att : {Attention::flash, Attention::materialized}) {
    const double b1 = activations(m, {.seq = 1024, .micro_batch = 1, .attention = att}).per_layer_bytes;
    const double b3 = activations(m, {.seq = 1024, .micro_batch = 3, .attention = att}).per_layer_bytes;
    EXPECT_NEAR(b3 / b1, 3.0, 1e-12);
    const double s2 = activations(m, {.seq = 2048, .micro_batch = 1, .attention = att}).per_layer_bytes;
    const double s4 = activations(m, {.seq = 4096, .micro_batch = 1, .attention = att}).per_layer_bytes;
    if (att == Attention::flash) {
      EXPECT_NEAR(s4 / s2, 2.0, 1e-12);  // linear in s
    } else {
      EXPECT_GT(s4 / s2, 2.5);           // the a·s² terms dominate
      const double s8 = activations(m, {.seq = 8192, .micro_batch = 1, .attention = att}).per_layer_bytes;
      EXPECT_GT(s8 / s4, s4 / s2);       // ratio approaches 4 as s grows
    }
  }
}

// A DeepSeek-V3 MoE layer (HF config.json, the preset), no parallelism, flash attention, no
// dropout, 2-byte activations, by hand per token: two norm inputs, the QKV-block input and the MLP
// input (4h); MLA's latents and their norms (2·1536 + 2·512 + 64); Q 128·192; K 128·192 and V
// 128·128; the attention output 128·128; SwiGLU's three f-wide tensors with f = 8 routed × 2048 +
// 1 shared × 2048; flash's fp32 log-sum-exp per head; and the MoE block's own tensors: the
// router's fp32 probabilities over 256 experts, the 8 dispatched copies of the token, h wide each,
// and their 8 fp32 routing weights (the experts' activation applies them, so the combine keeps no
// expert output: Megatron-Core's TEGroupedMLP).
TEST(Activations, DeepSeekV3MoeLayerByHand) {
  const ModelSpec m = *model_preset("deepseek-v3");
  const ActivationSetup a{.seq = 4096, .dropout = false};
  const double T = 4096, h = 7168, e = 2;
  const double moe_block = 4.0 * 256 + e * 8 * h + 4.0 * 8;
  const double per_token = e * (4 * h + (2 * 1536 + 2 * 512 + 64) + 128 * 192 +
                                128 * (192 + 128) + 128 * 128 + 3 * (8 + 1) * 2048.0) +
                           4.0 * 128 + moe_block;
  const ActivationResult r = activations(m, a);
  EXPECT_DOUBLE_EQ(r.per_layer_bytes, T * per_token);
  // Its dense layers' FFN (18432) equals the active MoE width, 9 × 2048: the same MLP bytes, less
  // the router's, the dispatch's and the weights' tensors.
  EXPECT_DOUBLE_EQ(r.dense_layer_bytes, r.per_layer_bytes - T * moe_block);
  // A capacity factor of 1.25 pads the routed tensors: the 8 routed experts' SwiGLU hidden, the
  // dispatched copies and their weights grow by a quarter; the router's probabilities do not.
  const ActivationResult padded = activations(m, {.seq = 4096, .dropout = false,
                                                  .capacity_factor = 1.25});
  EXPECT_DOUBLE_EQ(padded.per_layer_bytes - r.per_layer_bytes,
                   T * 0.25 * (e * (3 * 8 * 2048.0 + 8 * h) + 4.0 * 8));
  // A narrower dense FFN lowers the first stage by 3 layers × 3·e·T·(18432 − 4096).
  ModelSpec narrow = m;
  narrow.dense_ffn = 4096;
  const ActivationResult n = activations(narrow, a);
  EXPECT_DOUBLE_EQ(r.peak_stage_bytes - n.peak_stage_bytes, 3 * 3 * e * T * (18432.0 - 4096));
}

// The dispatched copies as the expert-TP group gathers them (Note [expert tensor parallelism]):
// DeepSeek-V3 at s 4096 on TP 2 + SP. Each rank routes its 2048 tokens; with ETP = TP = 2 the
// grouped GEMM saves both halves' 8 copies, 4096·8·7168·2 B; with ETP 1 its own, 2048·8·7168·2 B;
// their fp32 weights likewise 4096·8·4 and 2048·8·4 B. The routed MLP hidden is 2048·8 tokens ×
// 2048 (ETP 1) or 4096·8 × 1024 (ETP 2): the same bytes.
TEST(Activations, DispatchedTokensAsTheExpertTpGroupGathersThem) {
  const ModelSpec m = *model_preset("deepseek-v3");
  ActivationSetup a{.seq = 4096, .tp = 2, .sequence_parallel = true, .dropout = false};
  const ActivationResult two = activations(m, a);
  a.etp = 1;
  const ActivationResult one = activations(m, a);
  EXPECT_DOUBLE_EQ(term_bytes(two, "dispatched tokens (expert input)"), 4096.0 * 8 * 7168 * 2);
  EXPECT_DOUBLE_EQ(term_bytes(one, "dispatched tokens (expert input)"), 2048.0 * 8 * 7168 * 2);
  EXPECT_DOUBLE_EQ(two.per_layer_bytes - one.per_layer_bytes, 2048.0 * 8 * (7168 * 2 + 4));
  // Without SP (ETP = TP) each TP rank routes all 4096 tokens already: 4096·8·7168·2 B, no gather.
  const ActivationResult no_sp = activations(m, {.seq = 4096, .tp = 2, .dropout = false});
  EXPECT_DOUBLE_EQ(term_bytes(no_sp, "dispatched tokens (expert input)"), 4096.0 * 8 * 7168 * 2);
  EXPECT_NE(one.convention().find("ETP 1"), std::string::npos) << one.convention();
  EXPECT_THROW(activations(m, {.seq = 4096, .tp = 2, .etp = 1}), InvalidInput);  // needs SP
}

// Note [activation inventory], low precision (Transformer Engine v2.8 saves each low-precision
// linear's input quantized; Megatron-Core's TE layer spec fuses the norms into qkv and fc1). A
// Llama 3 8B layer (h 4096, f 14336), flash, no dropout, per token: bf16 keeps the QKV input 2h,
// the attention output 2h, the MLP input 2h and SwiGLU's 3 · 2f. Under a recipe with q bytes per
// saved input: the QKV and MLP inputs q·h each (the norm outputs exist only quantized), the
// attention output 2h for flash plus the projection's q·h copy, and gate, up 2 · 2f plus the
// down projection's q·f — so bf16 − recipe = 2(2 − q)h − q·h + (2 − q)f: h + f at fp8 (q = 1).
TEST(Activations, LowPrecisionRecipesSaveQuantizedLinearInputs) {
  const ModelSpec m = *model_preset("llama-3-8b");
  const double T = 4096, h = 4096, f = 14336;
  const ActivationSetup bf16{.seq = 4096, .dropout = false};
  const double base = activations(m, bf16).per_layer_bytes;
  for (const auto& [p, q] : {std::pair{Precision::fp8, 1.0},
                             std::pair{Precision::mxfp8, 1.0 + 1.0 / 32},
                             std::pair{Precision::nvfp4, 0.5 + 1.0 / 16}}) {
    ActivationSetup a = bf16;
    a.linear_input_bytes = saved_linear_input_bytes(p);
    const ActivationResult r = activations(m, a);
    EXPECT_DOUBLE_EQ(base - r.per_layer_bytes, T * (2 * (2 - q) * h - q * h + (2 - q) * f))
        << to_string(p);
    EXPECT_DOUBLE_EQ(term_bytes(r, "projection input (low-precision copy)"), T * q * h);
    EXPECT_NE(r.convention().find("saved inputs at q"), std::string::npos);
  }
  // Materialised attention keeps no bf16 output, only the projection's fp8 copy: the attention
  // output saves h more, 3h + f in all.
  ActivationSetup mat = bf16;
  mat.attention = Attention::materialized;
  const double mat_bf16 = activations(m, mat).per_layer_bytes;
  mat.linear_input_bytes = 1;
  EXPECT_DOUBLE_EQ(mat_bf16 - activations(m, mat).per_layer_bytes, T * (3 * h + f));
  // Full recompute keeps the bf16 layer input; only the replayed layer's transient shrinks.
  ActivationSetup full = bf16;
  full.recompute = Recompute::full;
  const ActivationResult fb = activations(m, full);
  full.linear_input_bytes = 1;
  const ActivationResult f8 = activations(m, full);
  EXPECT_DOUBLE_EQ(fb.per_layer_bytes, f8.per_layer_bytes);
  EXPECT_DOUBLE_EQ(fb.recompute_transient_bytes - f8.recompute_transient_bytes, T * (h + f));
}

// A DeepSeek-V3 MoE layer under fp8 (q = 1), flash, no dropout, per token (compare
// DeepSeekV3MoeLayerByHand): MLA's unfused input norm feeds q-down and kv-down, each saving its fp8
// copy, 2·1·h; the latents stay bf16 (1536 + 512 + 64) and their fused norms' outputs are fp8 (1536
// + 512); the attention output 128·128 bf16 plus its fp8 copy; the MoE layer's MLP input stays bf16
// for the router, the shared expert adding its fp8 copy h; SwiGLU's gate and up bf16 and the down
// input fp8, (2·2 + 1)·9·2048; the router's fp32 probabilities; the 8 dispatched copies fp8, 8h;
// their 8 fp32 weights.
TEST(Activations, DeepSeekV3MoeLayerInFp8ByHand) {
  const ModelSpec m = *model_preset("deepseek-v3");
  const ActivationSetup a{.seq = 4096, .dropout = false, .linear_input_bytes = 1};
  const double T = 4096, h = 7168, e = 2;
  const double per_token = e * 2 * h + 2 * h + e * (1536 + 512 + 64) + (1536 + 512) +
                           e * 128 * 192 + e * 128 * (192 + 128) + 4.0 * 128 + e * 128 * 128 +
                           128 * 128 + e * h + h + (2 * e + 1) * 9 * 2048.0 + 4.0 * 256 + 8 * h +
                           4.0 * 8;
  EXPECT_DOUBLE_EQ(activations(m, a).per_layer_bytes, T * per_token);
}

TEST(Activations, GqaShrinksKeyValueTerm) {
  const auto mha = *model_preset("llama-2-7b");   // a_kv = 32
  const auto gqa = *model_preset("mistral-7b");   // a_kv = 8
  const ActivationSetup s{.seq = 2048, .micro_batch = 1};
  EXPECT_DOUBLE_EQ(term_bytes(activations(gqa, s), "K, V") * 4, term_bytes(activations(mha, s), "K, V"));
}

TEST(Activations, ConventionNamesPolicy) {
  const auto m = gpt_like(4096, 32, 32);
  const auto r = activations(m, {.seq = 2048, .micro_batch = 4, .tp = 8, .sequence_parallel = true,
                                 .recompute = Recompute::selective});
  const auto c = r.convention();
  for (const char* part : {"Korthikanti", "flash", "selective", "TP 8 +SP", "micro-batch 4"})
    EXPECT_NE(c.find(part), std::string::npos) << c;
}

// The planner's allocation-free path gives exactly the report's figure.
TEST(Activations, FastPathEqualsReport) {
  const auto m = *model_preset("llama-3-8b");
  for (int t : {1, 2, 8})
    for (int pp : {1, 4})
      for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
        for (Attention att : {Attention::flash, Attention::materialized}) {
          const ActivationSetup a{.seq = 4096, .micro_batch = 2, .tp = t,
                                  .sequence_parallel = t > 1, .pp = pp, .micro_batches = 8,
                                  .recompute = r, .attention = att};
          EXPECT_DOUBLE_EQ(activation_peak_bytes_unchecked(m, a), activations(m, a).peak_stage_bytes);
        }
}

TEST(Activations, RejectsBadInput) {
  const auto m = gpt_like(4096, 32, 32);
  EXPECT_THROW(activations(m, {.seq = 0}), InvalidInput);
  EXPECT_THROW(activations(m, {.seq = 2048, .micro_batch = 0}), InvalidInput);
  EXPECT_THROW(activations(m, {.seq = 2048, .tp = 3}), InvalidInput);       // 32 heads
  EXPECT_THROW(activations(m, {.seq = 2048, .pp = 5}), InvalidInput);       // 32 layers
  EXPECT_THROW(activations(m, {.seq = 2047, .cp = 2}), InvalidInput);
  EXPECT_THROW(activations(m, {.seq = 2048, .sequence_parallel = true}), InvalidInput);
  EXPECT_THROW(activations(model_from_params(7e9), {.seq = 2048}), InvalidInput);
}

}  // namespace
}  // namespace tally::test_activations

namespace tally::test_activations {
namespace {

// Issue 10, corrected by issue 12 (Note [backward phases]): full recompute's blocks' backward holds
// one replayed layer — its inventory without recompute, less the checkpointed input that the
// replay reuses — on top of the kept inputs; the logits are gone by then, so the stage peak is the
// larger phase, not the sum. By hand in units of sbh = 2048·4096 (2-byte activations, flash,
// Korthikanti's dropout masks, fused loss): 32 kept inputs 64, the embedding-dropout mask 1;
// the replay 34 − 2 = 32 (+ flash's fp32 log-sum-exp 4·a·s·b); the loss phase adds the final-norm
// and head inputs 4 and the fp32 logits 4·s·V.
TEST(Activations, FullRecomputePeakIsTheLargerPhase) {
  const double sbh = 2048.0 * 4096, lse = 4.0 * 32 * 2048;
  for (const std::int64_t V : {32000, 8000}) {
    const auto m = gpt_like(4096, 32, 32, V);
    const auto none = activations(m, {.seq = 2048, .micro_batch = 1});
    const auto full = activations(m, {.seq = 2048, .micro_batch = 1,
                                      .recompute = Recompute::full});
    EXPECT_DOUBLE_EQ(full.recompute_transient_bytes, 32 * sbh + lse);
    EXPECT_DOUBLE_EQ(full.recompute_transient_bytes, none.per_layer_bytes - 2 * sbh);
    EXPECT_DOUBLE_EQ(full.score_gradient_bytes, 0);  // flash
    // The attention point (8sbh + lse: QKV input, Q, K, V) is below the MLP point (the replay).
    EXPECT_DOUBLE_EQ(full.layer_backward_bytes, 32 * sbh + lse);
    const double loss = 69 * sbh + 4.0 * 2048 * double(V);
    const double blocks = 97 * sbh + lse;
    EXPECT_DOUBLE_EQ(full.loss_phase_bytes, loss);
    EXPECT_DOUBLE_EQ(full.blocks_phase_bytes, blocks);
    EXPECT_DOUBLE_EQ(full.peak_stage_bytes, std::max(loss, blocks));
    // V 32000: 4sV = 31.25 sbh, the loss phase (100.25 sbh) holds the peak; V 8000: 7.8 sbh, the
    // blocks' (97 sbh).
    EXPECT_EQ(full.peak_phase,
              V == 32000 ? BackwardPhase::loss_and_head : BackwardPhase::blocks);
    EXPECT_LT(full.peak_stage_bytes, loss + blocks - 65 * sbh);  // the old sum over-counted
    EXPECT_DOUBLE_EQ(none.recompute_transient_bytes, 0);
    // Without recompute and with flash, a layer's backward adds nothing: the loss phase.
    EXPECT_DOUBLE_EQ(none.layer_backward_bytes, 0);
    EXPECT_DOUBLE_EQ(none.peak_stage_bytes, none.loss_phase_bytes);
  }
}

// Issue 12 (b), Note [backward phases]: with materialised attention softmax's backward holds dP and
// dS, 2·2·a·s²·b beyond the inventory, after the MLP block's and output projection's saved tensors
// are freed. gpt_like(4096, 32, 32): a·s²·b = 16 sbh at s = 2048, b = 1 (a·s/h = 16). By hand,
// in sbh, 2-byte activations with dropout:
//   the layer without recompute 34 + 5·16 = 114: attention part 90 (norm-1 and QKV inputs 2 + 2,
//   Q 2, K, V 4, softmax output 32, its mask 16, dropout output 32), MLP part 24 (projection input
//   2, its mask 1, norm-2 and MLP inputs 2 + 2, GeLU hidden 16, mask 1); score gradients 64;
//   none:      attention point −24 + 64 = 40 (the MLP point adds nothing)
//   full:      MLP point 114 − 2 = 112; attention point 90 − 2 + 64 = 152
//   selective: kept 34 (10 + 24); the a·s² terms rebuilt: 80 − 24 + 64 = 120
TEST(Activations, MaterialisedBackwardHoldsScoreGradients) {
  const auto m = gpt_like(4096, 32, 32);
  const double sbh = 2048.0 * 4096, logits = 4.0 * 2048 * 32000;
  const auto at = [&](Recompute r) {
    return activations(m, {.seq = 2048, .micro_batch = 1, .recompute = r,
                           .attention = Attention::materialized});
  };
  const auto none = at(Recompute::none), full = at(Recompute::full);
  const auto sel = at(Recompute::selective);
  for (const auto* r : {&none, &full, &sel}) EXPECT_DOUBLE_EQ(r->score_gradient_bytes, 64 * sbh);
  EXPECT_DOUBLE_EQ(none.layer_backward_bytes, 40 * sbh);
  EXPECT_DOUBLE_EQ(full.recompute_transient_bytes, 112 * sbh);
  EXPECT_DOUBLE_EQ(full.layer_backward_bytes, 152 * sbh);
  EXPECT_DOUBLE_EQ(sel.layer_backward_bytes, 120 * sbh);
  // Phases: 32 layers' saved tensors + the embedding mask (1) + the output terms (4 + logits) or
  // the layer's backward.
  EXPECT_DOUBLE_EQ(none.loss_phase_bytes, (32 * 114 + 1 + 4) * sbh + logits);
  EXPECT_DOUBLE_EQ(none.blocks_phase_bytes, (32 * 114 + 1 + 40) * sbh);
  EXPECT_EQ(none.peak_phase, BackwardPhase::blocks);  // 40 > 4 + 31.25
  EXPECT_DOUBLE_EQ(full.peak_stage_bytes, (32 * 2 + 1 + 152) * sbh);
  EXPECT_EQ(full.peak_phase, BackwardPhase::blocks);
  EXPECT_DOUBLE_EQ(sel.peak_stage_bytes, (32 * 34 + 1 + 120) * sbh);
  // Context and tensor parallelism: s/c queries × s keys, ÷ t. s = 4096, c = 2, t = 2.
  const auto split = activations(m, {.seq = 4096, .micro_batch = 1, .tp = 2, .cp = 2,
                                     .attention = Attention::materialized});
  EXPECT_DOUBLE_EQ(split.score_gradient_bytes, 2 * 2.0 * 32 * 2048 * 4096 / 2);
}

// Pipeline (Note [backward phases]): the blocks' phase is reached on the fullest stage, the loss's
// on the last. p = 4, m = 8, 8 layers per stage, full recompute, flash, V 32000, in sbh: stage 0
// keeps 4 micro-batches × 8 × 2 = 64 and 4 embedding masks; the last 8 × 2 = 16.
TEST(Activations, PipelinePhasesOnTheirStages) {
  const auto m = gpt_like(4096, 32, 32);
  const double sbh = 2048.0 * 4096, lse = 4.0 * 32 * 2048;
  const auto r = activations(m, {.seq = 2048, .micro_batch = 1, .pp = 4, .micro_batches = 8,
                                 .recompute = Recompute::full});
  EXPECT_DOUBLE_EQ(r.blocks_phase_bytes, 68 * sbh + 32 * sbh + lse);
  EXPECT_DOUBLE_EQ(r.loss_phase_bytes, 16 * sbh + 4 * sbh + 4.0 * 2048 * 32000);
  EXPECT_EQ(r.peak_phase, BackwardPhase::blocks);
  EXPECT_EQ(r.peak_stage, 0);
  EXPECT_DOUBLE_EQ(r.peak_stage_bytes, r.blocks_phase_bytes);
  // Uneven stages (20 of 32 layers on the last) move both phases to the last stage.
  const auto u = activations(m, {.seq = 2048, .micro_batch = 1, .pp = 4, .micro_batches = 8,
                                 .recompute = Recompute::full, .first_stage_layers = 4,
                                 .last_stage_layers = 20});
  // Stage 0: 4 × 4 × 2 + 4 = 36; stages 1, 2: 4 layers × 3 and 2 micro-batches; the last 20 × 2 = 40.
  EXPECT_DOUBLE_EQ(u.blocks_phase_bytes, 40 * sbh + 32 * sbh + lse);
  EXPECT_DOUBLE_EQ(u.loss_phase_bytes, 44 * sbh + 4.0 * 2048 * 32000);
  EXPECT_EQ(u.peak_stage, 3);
  EXPECT_EQ(to_string(u.peak_phase), "loss + LM-head backward");
}

}  // namespace
}  // namespace tally::test_activations

namespace tally::test_activations {
namespace {

// PyTorch selective checkpointing that saves matmul and attention outputs (issue 10: name each
// policy after its framework and model its saved set). GPT layer, flash, no SP, t = 1: layer input
// 2sbh, Q/K/V 6sbh, attention output 2sbh, MLP block input 2sbh, MLP up output 2sbf = 8sbh,
// dropout masks 2sbh, lse 4as·b → 22sbh + 4asb; no recompute keeps 34sbh + 4asb.
TEST(Activations, SaveMatmulsKeepsItsSavedSet) {
  const auto m = gpt_like(4096, 32, 32);
  const double sbh = 2048.0 * 4096, lse = 4.0 * 32 * 2048;
  const auto none = activations(m, {.seq = 2048, .micro_batch = 1});
  const auto sac = activations(m, {.seq = 2048, .micro_batch = 1,
                                   .recompute = Recompute::save_matmuls});
  EXPECT_DOUBLE_EQ(sac.per_layer_bytes, 22 * sbh + lse);
  EXPECT_DOUBLE_EQ(none.per_layer_bytes, 34 * sbh + lse);
  // Between full (2sbh) and none, and below Megatron's selective with flash (which saves nothing
  // beyond flash's own).
  const auto sel = activations(m, {.seq = 2048, .micro_batch = 1,
                                   .recompute = Recompute::selective});
  EXPECT_LT(sac.per_layer_bytes, sel.per_layer_bytes);
  EXPECT_EQ(parse_recompute("save-matmuls"), Recompute::save_matmuls);
}

// The loss's memory on the last stage: a fused vocabulary-parallel cross-entropy keeps one fp32
// logits tensor, 4·s·b·V/t bytes (Korthikanti §4.3); PyTorch's eager cross_entropy(logits.float())
// holds three of that size as backward starts (the saved fp32 log-softmax, the NLL's fp32 gradient,
// log-softmax's fp32 input gradient): 12·s·b·V/t. Llama 3 8B, V = 128256, s = 8192, b = 1, t = 2.
TEST(Activations, EagerLossHoldsThreeFp32Logits) {
  const auto m = *model_preset("llama-3-8b");
  ActivationSetup a{.seq = 8192, .tp = 2, .sequence_parallel = true, .dropout = false};
  const double fused = activations(m, a).output_bytes;
  a.eager_loss = true;
  const double eager = activations(m, a).output_bytes;
  EXPECT_DOUBLE_EQ(eager - fused, 8.0 * 8192 * 128256 / 2);
  EXPECT_NE(activations(m, a).convention().find("eager fp32 loss"), std::string::npos);
}

// torchtitan's op-level SAC (types.hpp op_sac) on a Llama 3 8B layer, flash, no dropout, b 1, by hand
// per token: the layer input 2h, q 2h, v 2·1024, the attention output 2h and its fp32 log-sum-exp
// 4·32, the gate (w1) output 2·14336 and the down (w2) output 2h — 15.5·h + 128 bytes, where
// save-matmuls keeps k, the MLP block input and w3's output too.
TEST(Activations, TorchtitanOpSacKeepsEveryOtherMatmul) {
  const auto m = *model_preset("llama-3-8b");
  const double T = 8192, h = 4096;
  const ActivationSetup a{.seq = 8192, .recompute = Recompute::op_sac, .dropout = false};
  EXPECT_DOUBLE_EQ(activations(m, a).per_layer_bytes,
                   T * (2 * h + 2 * h + 2 * 1024 + 2 * h + 4 * 32 + 2 * 14336 + 2 * h));
  ActivationSetup sm = a;
  sm.recompute = Recompute::save_matmuls;
  EXPECT_DOUBLE_EQ(activations(m, sm).per_layer_bytes - activations(m, a).per_layer_bytes,
                   T * 2 * 1024 /* k */ + T * (2 * h /* MLP input */ + 2 * 14336 /* w3 */ - 2 * h
                                                /* w2 output, not kept by save-matmuls */));
  // Defined for dense layers with ordinary attention only.
  EXPECT_THROW(activations(*model_preset("mixtral-8x7b"), {.seq = 4096, .recompute = Recompute::op_sac}),
               InvalidInput);
  EXPECT_THROW(activations(*model_preset("deepseek-v3"), {.seq = 4096, .recompute = Recompute::op_sac}),
               InvalidInput);
}

}  // namespace
}  // namespace tally::test_activations

namespace tally::test_activations {
namespace {

// Megatron-Core's recompute modules (types.hpp RecomputeModules), DeepSeek-V3, b = 1, s = 4096,
// bf16, t = 1. mla_up_proj drops the attention's q (a·d_qk = 128·192), k (128·192) and v
// (128·128) from every layer's saved set: 2·4096·65536 bytes, by hand; the layer's backward
// rebuilds them (its attention point grows). mlp drops a dense leading layer's SwiGLU hidden
// (gate, up and the down input, 3·2·4096·18432 bytes) and keeps its input; MoE layers keep theirs.
TEST(Activations, MegatronRecomputeModulesDropWhatTheyReplay) {
  const ModelSpec m = *model_preset("deepseek-v3");
  ActivationSetup a{.seq = 4096, .micro_batch = 1, .dropout = false};
  const ActivationResult base = activations(m, a);
  a.recompute_modules.mla_up_proj = true;
  const ActivationResult up = activations(m, a);
  EXPECT_DOUBLE_EQ(base.per_layer_bytes - up.per_layer_bytes, 2.0 * 4096 * 65536);
  EXPECT_DOUBLE_EQ(base.dense_layer_bytes - up.dense_layer_bytes, 2.0 * 4096 * 65536);
  EXPECT_GE(up.layer_backward_bytes, base.layer_backward_bytes);
  a.recompute_modules = {.dense_mlp = true};
  const ActivationResult mlp = activations(m, a);
  EXPECT_DOUBLE_EQ(mlp.per_layer_bytes, base.per_layer_bytes);
  EXPECT_DOUBLE_EQ(base.dense_layer_bytes - mlp.dense_layer_bytes, 3 * 2.0 * 4096 * 18432);
  // Full recompute keeps only the layer input: the modules change nothing there.
  a.recompute = Recompute::full;
  const double full = activations(m, a).per_layer_bytes;
  a.recompute_modules = {.mla_up_proj = true, .dense_mlp = true};
  EXPECT_DOUBLE_EQ(activations(m, a).per_layer_bytes, full);
}

}  // namespace
}  // namespace tally::test_activations
