// core/gpt_step: the engine's GPT on a calibrated host (Note [host GPT step]). The engine's own
// kernels are counted by hand from the formulas of the Note; a stage's forward time is checked
// against a hand count of its GEMM FLOPs and streamed bytes on a host whose kernels run exactly
// at peak (η = 1, no overhead), so each kernel takes FLOPs / peak or bytes / bandwidth.
#include "tally/core/gpt_step.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <string>

#include "ideal_host.hpp"
#include "tally/core/types.hpp"

namespace tally::test_gpt_step {
namespace {

// The engine's default 3-D model (three_d.hpp Note [default 3-D model]): h 32, L 4, a 4, V 64,
// T 16, as engine::gpt_model_spec builds it.
ModelSpec engine_gpt() {
  return ModelSpec{.name = "tally-gpt", .hidden = 32, .layers = 4, .heads = 4, .kv_heads = 4,
                   .ffn = 128, .vocab = 64, .max_positions = 16, .tied_embeddings = true,
                   .linear_bias = true, .mlp = MlpKind::gelu, .norm = NormKind::layernorm,
                   .position = PositionKind::learned};
}

// No link: the stage model times kernels only.
ClusterSpec ideal_host(double peak, double W) { return test::ideal_host(peak, 0, 1e9, W); }

// Bytes of each engine kernel, by name and pass.
std::map<std::string, double> engine_kernels(const GptStageSetup& s) {
  std::vector<Op> ops;
  add_engine_gpt_kernels(s.model, engine_gpt_setup(s), ops);
  std::map<std::string, double> out;
  for (const Op& op : ops) {
    EXPECT_EQ(op.kind, OpKind::memory) << op.name;
    const char* pass = op.pass == Pass::forward ? "" : op.pass == Pass::backward ? "" : "@replay";
    out[std::string(op.name) + pass] += op.bytes;
  }
  return out;
}

// t = 2 with SP, B = 2, T = 16, e = 4: T_tok = 32 tokens, T_n = 16, a' = 2 heads of d = 8
// (h_q = 16), f/t = 64, scores B·a'·T² = 1024.
TEST(GptStep, EngineKernelsByHand) {
  GptStageSetup s{.model = engine_gpt(), .seq = 16, .micro_batch = 2, .tp = 2,
                  .sequence_parallel = true};
  const auto k = engine_kernels(s);
  const std::map<std::string, double> want = {
      {"qk-copies", 2 * 2 * 4 * 32 * 16},   // q and k, read + write
      {"scale", 2 * 4 * 1024},              {"mask", 2 * 4 * 1024},
      {"v-copy", 2 * 4 * 32 * 16},          {"out-proj-bias", 2 * 4 * 16 * 32},
      {"mlp-down-bias", 2 * 4 * 16 * 32},   {"scale.backward", 2 * 4 * 1024},
      {"mask.backward", 2 * 4 * 1024},
      // q/k/v and MLP-up biases over all 32 tokens (48 + 64 wide), the two row-parallel ones
      // over T_n = 16 (32 wide each)
      {"bias-grads.backward", 4 * (32 * (48 + 64) + 2 * 16 * 32)}};
  EXPECT_EQ(k, want);

  // Full recompute replays the six forward kernels; the selective policies the softmax chain's
  // scale and mask.
  s.recompute = Recompute::full;
  auto full = engine_kernels(s);
  for (const char* name : {"qk-copies", "scale", "mask", "v-copy", "out-proj-bias",
                           "mlp-down-bias"})
    EXPECT_EQ(full[std::string(name) + "@replay"], want.at(name)) << name;
  EXPECT_EQ(full.size(), want.size() + 6);
  for (Recompute r : {Recompute::selective, Recompute::save_matmuls, Recompute::op_sac}) {
    s.recompute = r;
    auto sel = engine_kernels(s);
    EXPECT_EQ(sel.size(), want.size() + 2) << int(r);
    EXPECT_EQ(sel["scale@replay"], want.at("scale")) << int(r);
    EXPECT_EQ(sel["mask@replay"], want.at("mask")) << int(r);
  }
}

// One stage holding the whole model (embedding, 4 layers, head and loss), B = 2, T = 16, t = 1:
// the forward by hand. GEMM FLOPs per layer 2·T_tok·h·(3h + h + 4h + 4h) + QKᵀ and PV
// 2·2·(B·a)·T²·d; the head 2·T_tok·V·h. Streamed bytes per layer (e = 4, T_tok·h = 1024
// elements, scores 2048): the two LayerNorms 2e each, the attention output's copy 2e, softmax 2e
// per score, two residual adds 3e, GeLU 2e on 4h, and the engine's kernels: q, k copies 4e,
// scale and mask 2e per score each, the v copy 2e, the two bias adds 2e. Embedding: two gathers
// (tokens, positions) 2e each; head: the final LayerNorm 2e; PyTorch's cross-entropy (e + 20) per
// logit (Note [loss kernels]).
TEST(GptStep, ForwardOnAnIdealHostByHand) {
  const double peak = 1e9, W = 2e9, e = 4, th = 32 * 32, scores = 2 * 4 * 16 * 16;
  const GptStageSetup s{.model = engine_gpt(), .seq = 16, .micro_batch = 2, .stage_layers = 4,
                        .micro_batches = 3, .own_params = 1000};
  const double gemm_flops = 2.0 * 32 * 32 * (12 * 32) + 2 * 2.0 * 8 * 16 * 16 * 8;
  const double layer_bytes = e * (2 * th + 2 * th + 2 * scores + 2 * 3 * th + 2 * th + 2 * 4 * th +
                                   4 * th + 2 * 2 * scores + 2 * th + 2 * 2 * th);
  const double head_flops = 2.0 * 32 * 64 * 32;
  const double ends_bytes = 2 * 2 * e * th + 2 * e * th + (e + 20) * 32 * 64;
  const GptStageTime t = predict_gpt_stage(s, ideal_host(peak, W));
  EXPECT_NEAR(t.forward_s,
              4 * (gemm_flops / peak + layer_bytes / W) + head_flops / peak + ends_bytes / W,
              1e-12);
  EXPECT_DOUBLE_EQ(t.compute_s, 3 * (t.forward_s + t.backward_s));
  EXPECT_EQ(t.contention, 1);
  // Adam on the rank's 1000 elements: 20 streams of 4 B each (Note [host step model]).
  EXPECT_NEAR(t.optimizer_s, 20 * 4 * 1000 / W, 1e-15);

  // The backward is the sum of the non-forward kernels' times; a middle stage has no ends.
  double backward = 0;
  for (const Op& op : gpt_stage_ops(s))
    if (op.pass != Pass::forward)
      backward += op_seconds(op, ideal_host(peak, W).gpu, Precision::fp32);
  EXPECT_NEAR(t.backward_s, backward, 1e-12);
  GptStageSetup middle = s;
  middle.first_stage = middle.last_stage = false;
  middle.stage_layers = 2;
  EXPECT_NEAR(predict_gpt_stage(middle, ideal_host(peak, W)).forward_s,
              2 * (gemm_flops / peak + layer_bytes / W), 1e-12);
}

// Four single-threaded ranks on two cores: every kernel stretches by 2 (Note [host step model]).
TEST(GptStep, OversubscribedCoresStretchEveryKernel) {
  GptStageSetup s{.model = engine_gpt(), .seq = 16, .micro_batch = 2, .stage_layers = 4,
                  .own_params = 5000, .ranks = 2, .cores = 2};
  const GptStageTime one = predict_gpt_stage(s, ideal_host(1e9, 2e9));
  s.ranks = 4;
  const GptStageTime two = predict_gpt_stage(s, ideal_host(1e9, 2e9));
  EXPECT_EQ(two.contention, 2);
  EXPECT_DOUBLE_EQ(two.forward_s, 2 * one.forward_s);
  EXPECT_DOUBLE_EQ(two.backward_s, 2 * one.backward_s);
  EXPECT_DOUBLE_EQ(two.optimizer_s, 2 * one.optimizer_s);
  EXPECT_NE(two.convention().find("contention 2"), std::string::npos) << two.convention();
}

// Note [predicted 3-D step] by hand: kernels t_f = 1, t_b = 2 s per micro-batch, M = 4, TP
// collectives 1.2 s a step → 0.3 s per micro-batch, split 1 : 2 → t_f 1.1, t_b 2.2; 1F1B over
// P = 2 stages idles (P − 1)(t_f + t_b) = 3.3 s (Narayanan 2021 §2.2.1), v = 2 halves it; then
// sends 0.5, DP 0.25 and Adam 0.125.
TEST(GptStep, StepAddsTheMicroBatchesTheBubbleAndTheRest) {
  const GptStageTime k{.forward_s = 1, .backward_s = 2, .compute_s = 12, .optimizer_s = 0.125};
  GptStepComm c{.tp_cp_s = 1.2, .pp_send_s = 0.5, .dp_s = 0.25, .stages = 2};
  GptStepTime t = predict_gpt_step(k, 4, c);
  EXPECT_DOUBLE_EQ(t.forward_s, 1.1);
  EXPECT_DOUBLE_EQ(t.backward_s, 2.2);
  EXPECT_NEAR(t.bubble_s, 3.3, 1e-12);
  EXPECT_NEAR(t.step_s, 4 * 3.3 + 3.3 + 0.5 + 0.25 + 0.125, 1e-12);
  c.interleave = 2;
  EXPECT_NEAR(predict_gpt_step(k, 4, c).bubble_s, 3.3 / 2, 1e-12);
  c.stages = 1;  // no pipeline, no bubble
  t = predict_gpt_step(k, 4, c);
  EXPECT_EQ(t.bubble_s, 0);
  EXPECT_NEAR(t.step_s, 4 * 3.3 + 0.5 + 0.25 + 0.125, 1e-12);
  // Never a negative, infinite or NaN time: bad inputs name what is wrong.
  EXPECT_THROW(predict_gpt_step(k, 0, c), InvalidInput);
  EXPECT_THROW(predict_gpt_step(GptStageTime{}, 4, c), InvalidInput);
  c.dp_s = -1;
  EXPECT_THROW(predict_gpt_step(k, 4, c), InvalidInput);
  c.dp_s = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(predict_gpt_step(k, 4, c), InvalidInput);
}

// Note [engine SP edges], against what the engine sent: `tally run 3d --tp 2 --sp` on the host
// report's GPT (h 256, L 4, T 128, B 4, M 2; bench/predict_vs_measured.sh) measured 1,073,152
// bytes of TP traffic outside its layers' sites per rank: two edge all-gathers per micro-batch of
// S = 4·128·256·4 = 524,288 B, S/2 each at t = 2 (4 × 262,144), and one all-reduce of
// 6·256·4 layers·4 B = 24,576 B, 2·S'/2 = 24,576.
TEST(GptStep, EngineSpEdgesAreWhatTheEngineSent) {
  const ModelSpec m{.name = "tally-gpt", .hidden = 256, .layers = 4, .heads = 4, .kv_heads = 4,
                    .ffn = 1024, .vocab = 512, .max_positions = 128, .tied_embeddings = true,
                    .linear_bias = true, .mlp = MlpKind::gelu, .norm = NormKind::layernorm,
                    .position = PositionKind::learned};
  GptStageSetup s{.model = m, .seq = 128, .micro_batch = 4, .tp = 2, .sequence_parallel = true,
                  .stage_layers = 4, .micro_batches = 2};
  GptSpTraffic r = engine_sp_traffic(s);
  EXPECT_EQ(r.edges.calls, 4);
  EXPECT_EQ(r.edges.bytes_per_call, 262144);
  EXPECT_EQ(r.grads.calls, 1);
  EXPECT_EQ(r.edges.bytes_per_rank + r.grads.bytes_per_rank, 1073152);
  EXPECT_EQ(r.edges.collective, Collective::all_gather);
  EXPECT_EQ(r.grads.collective, Collective::all_reduce);
  EXPECT_EQ(r.edges.group, 2);
  // The first of two stages (2 layers): its edge only, its layers' gradients; at t = 4 each rank
  // sends 3/4 of S per all-gather and 2·3/4 of S' per all-reduce; CP 2 halves S.
  s.last_stage = false;
  s.stage_layers = 2;
  s.tp = 4;
  s.cp = 2;
  r = engine_sp_traffic(s);
  EXPECT_EQ(r.edges.calls, 2);
  EXPECT_DOUBLE_EQ(r.edges.bytes_per_call, 0.75 * 4 * 64 * 256 * 4);
  EXPECT_DOUBLE_EQ(r.grads.bytes_per_rank, 1.5 * 6 * 256 * 2 * 4);
  // Reduced after every micro-batch (ZeRO-2/3 without PP: the engine sums the SP gradients
  // before each micro-batch's DP reduction): M calls.
  EXPECT_EQ(engine_sp_traffic(s, true).grads.calls, 2);
  EXPECT_DOUBLE_EQ(engine_sp_traffic(s, true).grads.bytes_per_rank,
                   2 * r.grads.bytes_per_rank);
  // Without SP, or alone, the group moves nothing outside its layers.
  s.sequence_parallel = false;
  r = engine_sp_traffic(s);
  EXPECT_EQ(r.edges.bytes_per_rank + r.grads.bytes_per_rank, 0);
  s.sequence_parallel = true;
  s.tp = 1;
  r = engine_sp_traffic(s);
  EXPECT_EQ(r.edges.calls + r.grads.calls, 0);
  s.stage_layers = 9;  // of 4
  EXPECT_THROW(engine_sp_traffic(s), InvalidInput);
}

// Note [engine ring attention], counted by hand from ring_attention.cpp: the engine GPT (a 4, g 4,
// d 8), T = 16, B = 2, c = 2 zigzag: n = T/(2c) = 4, P = 2c + 1 = 5 pairs, 2 diagonal; e = 4,
// E = B·a·n² = 128 scores a pair, R = B·a·n = 32 rows, Rd = 256, KV = B·g·2n·d = 512.
TEST(GptStep, RingAttentionKernelsByHand) {
  const ModelSpec m = engine_gpt();
  const OperatorSetup s{.seq = 16, .micro_batch = 2, .cp = 2, .act_bytes = 4};
  const RingBlocks zigzag = ring_blocks(CpBalance::zigzag, 2, 0);
  EXPECT_EQ(zigzag.pairs, 5);
  EXPECT_EQ(zigzag.diagonal, 2);
  EXPECT_EQ(ring_blocks(CpBalance::contiguous, 2, 1).pairs, 7);  // chunks 2, 3: 3 + 4
  std::vector<Op> ops;
  add_engine_ring_attention(m, s, zigzag, ops);
  std::map<std::string, double> bytes, calls;
  double forward_flops = 0, backward_flops = 0;
  for (const Op& op : ops) {
    bytes[std::string(op.name)] += op.bytes;
    calls[std::string(op.name)] += 1;
    if (op.kind == OpKind::gemm) {
      EXPECT_EQ(op.batch, 8) << op.name;  // B·a
      (op.pass == Pass::forward ? forward_flops : backward_flops) += op.flops;
    }
  }
  // One pair's GEMM: 2·(B·a)·n·n·d = 2·8·4·4·8 FLOPs; forward QKᵀ and PV, backward QKᵀ again, dP,
  // dQ, dK, dV.
  const double pair_gemm = 2.0 * 8 * 4 * 4 * 8;
  EXPECT_EQ(forward_flops, 5 * 2 * pair_gemm);
  EXPECT_EQ(backward_flops, 5 * 5 * pair_gemm);
  for (const char* g : {"ring-scores", "ring-context", "ring-scores.backward", "ring-dp.backward",
                        "ring-dq.backward", "ring-dk.backward", "ring-dv.backward"})
    EXPECT_EQ(calls[g], 5) << g;  // one call each per pair: each pays the GEMM overhead
  const std::map<std::string, double> streams = {
      {"ring-state-fill", 4 * (4 * 32 + 2 * 256)},       // m, ℓ (R each), acc (Rd), two chunks
      {"ring-kv-stack", 4 * 4 * 512},                    // K and V read, the stack written
      {"ring-scale", 5 * 2 * 4 * 128},                   // in place, every pair
      {"ring-mask", 2 * 2 * 4 * 128},                    // the two diagonal pairs
      {"ring-max", 5 * (4 * 128 + (4 + 8) * 32)},        // values and int64 indices
      {"ring-exp", 5 * (4 * 4 * 128 + 4 * 32)},          // s − m (broadcast), then exp
      {"ring-row-sum", 5 * (4 * 128 + 4 * 32)},
      {"ring-row-state", 5 * 14 * 4 * 32},               // max, sub, exp, ℓ·α, +
      {"ring-rescale", 5 * (2 * 4 * 256 + 4 * 32)},      // acc·α
      {"ring-accumulate", 5 * 3 * 4 * 256},              // + P·V
      {"ring-normalise", 8 * 4 * 256 + 16 * 4 * 32},     // /ℓ, cat; log ℓ, + m, cat
      {"ring-delta.backward", 8 * 4 * 256 + 2 * 4 * 32}, // dO∘O, its row sum
      {"ring-grad-fill.backward", 4 * (2 * 256 + 4 * 512)},  // dQ, own, travel
      {"ring-kv-stack.backward", 4 * 4 * 512},
      {"ring-scale.backward", 5 * 2 * 4 * 128},
      {"ring-mask.backward", 2 * 2 * 4 * 128},
      {"ring-exp.backward", 5 * (4 * 4 * 128 + 4 * 32)},  // s − lse, exp
      {"ring-ds.backward", 5 * (5 * 4 * 128 + 4 * 32)},   // dP − D, P∘(…)
      {"ring-accumulate.backward", 5 * 3 * 4 * (256 + 512)},  // dQ, dK, dV chunks (g = a)
      {"ring-own-add.backward", 3 * 4 * 2 * 512}};       // own += travel (K and V)
  for (const auto& [name, want] : streams) EXPECT_EQ(bytes[name], want) << name;
  EXPECT_EQ(bytes.count("ring-kv-expand"), 0u);  // g = a: no GQA copies

  // GQA (g = 2 of a = 4): per pair K and V expanded forward; expanded and folded in backward.
  ModelSpec gqa = m;
  gqa.kv_heads = 2;
  std::vector<Op> gqa_ops;
  add_engine_ring_attention(gqa, s, zigzag, gqa_ops);
  double expand = 0, fold = 0;
  for (const Op& op : gqa_ops) {
    if (op.name == "ring-kv-expand") expand += op.bytes;
    if (op.name == "ring-kv-fold.backward") fold += op.bytes;
  }
  // One chunk of K: B·g·n·d = 128 elements, expanded to Rd = 256: 2·e·(128 + 256) a pair.
  EXPECT_EQ(expand, 5 * 2 * 4 * (128 + 256));
  EXPECT_EQ(fold, 5 * 2 * 4 * (128 + 256));
}

// Under CP the stage's attention is the ring's: no materialised scores, softmax, context, scale
// or mask, and the wrapper's gradient copy (B·a·(T/c)·d = 2·4·8·8 = 512 elements read and
// written, e = 4) in each of the 4 layers; at c = 1 none of the ring's.
TEST(GptStep, CpStagesRunTheRingNotTheMaterialisedCore) {
  GptStageSetup s{.model = engine_gpt(), .seq = 16, .micro_batch = 2, .cp = 2,
                  .stage_layers = 4};
  const auto names = [](const GptStageSetup& x) {
    std::map<std::string, double> out;
    for (const Op& op : gpt_stage_ops(x)) out[std::string(op.name)] += op.bytes;
    return out;
  };
  const auto cp = names(s);
  for (const char* gone : {"scores", "scores.dgrad", "softmax", "softmax.backward", "context",
                           "context.wgrad", "scale", "mask", "mask.backward"})
    EXPECT_EQ(cp.count(gone), 0u) << gone;
  EXPECT_EQ(cp.at("ring-dout-copy.backward"), 4 * (2 * 4 * 512));  // 4 layers
  EXPECT_GT(cp.at("ring-scores"), 0);
  s.cp = 1;
  for (const auto& [name, b] : names(s)) EXPECT_FALSE(name.starts_with("ring-")) << name;
  // Full recompute replays the ring's forward too (each layer's 5 pairs' QKᵀ again).
  s.cp = 2;
  s.recompute = Recompute::full;
  int replayed = 0;
  for (const Op& op : gpt_stage_ops(s))
    replayed += op.pass == Pass::recompute && op.name == "ring-scores";
  EXPECT_EQ(replayed, 4 * 5);
}

TEST(GptStep, BadSetupsNameTheirField) {
  const auto field_of = [](GptStageSetup s) {
    try {
      predict_gpt_stage(s, ideal_host(1e9, 1e9));
    } catch (const InvalidInput& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const GptStageSetup ok{.model = engine_gpt(), .seq = 16, .micro_batch = 2};
  GptStageSetup s = ok;
  s.stage_layers = 5;  // of 4
  EXPECT_NE(field_of(s).find("stage_layers"), std::string::npos) << field_of(s);
  s = ok;
  s.own_params = -1;
  EXPECT_NE(field_of(s).find("own_params"), std::string::npos) << field_of(s);
  s = ok;
  s.micro_batches = 0;
  EXPECT_NE(field_of(s).find("micro_batches"), std::string::npos) << field_of(s);
  s = ok;
  s.tp = 3;  // does not divide the 4 heads
  EXPECT_NE(field_of(s).find("tp"), std::string::npos) << field_of(s);
  s = ok;
  s.cores = 0;
  EXPECT_NE(field_of(s).find("cores"), std::string::npos) << field_of(s);
}

}  // namespace
}  // namespace tally::test_gpt_step
