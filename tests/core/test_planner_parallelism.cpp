// The planner's overlap switches and its expert-parallel (MoE) dimensions: each switch follows the
// framework behaviour it names (Note [planner overlap]); EP and ETP are searched and checked like
// every other dimension; DeepSeek-V3 fits with EP. (Split from test_planner.cpp at the file-size
// limit.)
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "tally/core/comm.hpp"
#include "tally/core/operators.hpp"
#include "tally/core/planner.hpp"
#include "tally/core/presets.hpp"

namespace tally::test_planner {
namespace {

// Note [planner overlap]: each switch can only hide time; off, the whole collective is exposed;
// on, at least the last 25 MiB bucket stays exposed.
TEST(Planner, OverlapSwitchesFollowTheFrameworks) {
  PlanRequest r{.model = *model_preset("llama-2-7b"), .cluster = *cluster_preset("a100-80g"),
                .gpus = 32, .global_batch = 256, .seq = 4096, .overlap_dp = false,
                .overlap_param_gather = false};
  const Layout L{.dp = 16, .tp = 2, .zero = 1, .micro_batch = 1, .grad_accum = 16};
  const PlanEval exposed = evaluate_layout(r, L);
  EXPECT_NEAR(exposed.dp_exposed_s, exposed.dp_s, 1e-12);
  r.overlap_dp = true;
  const PlanEval grads = evaluate_layout(r, L);
  r.overlap_param_gather = true;
  const PlanEval both = evaluate_layout(r, L);
  EXPECT_LT(grads.dp_exposed_s, exposed.dp_exposed_s);
  EXPECT_LT(both.dp_exposed_s, grads.dp_exposed_s);
  EXPECT_GT(both.dp_exposed_s, 0);  // the last buckets
  EXPECT_LT(both.step_s, exposed.step_s);
  // TP overlap hides TP collectives behind the layer's kernels.
  r.tp_overlap = true;
  const PlanEval tp = evaluate_layout(r, L);
  EXPECT_LT(tp.tp_s, both.tp_s);
  EXPECT_LE(tp.step_s, both.step_s);
}

// Note [overlap contention]: kernels of w seconds beside a collective of c run σ slower while it
// runs, so the step grows by max(c − w, c·σ/(1 + σ)). Checked by hand: c = 1, w = 10, σ = 0.189
// leaves 0.189/1.189 = 0.158957; c = 10, w = 1 leaves 9 (the kernels end inside the collective);
// at c = w·(1 + σ) the two terms meet; σ = 0 is the ideal overlap, max(c − w, 0).
TEST(Planner, HiddenCollectivesSlowTheKernelsBesideThem) {
  EXPECT_NEAR(overlap_exposed_s(1, 10, 0.189), 0.1589571, 1e-7);
  EXPECT_DOUBLE_EQ(overlap_exposed_s(10, 1, 0.189), 9);
  EXPECT_NEAR(overlap_exposed_s(1.189, 1, 0.189), 0.189, 1e-12);
  EXPECT_DOUBLE_EQ(overlap_exposed_s(1, 10, 0), 0);
  EXPECT_DOUBLE_EQ(overlap_exposed_s(3, 1, 0), 2);
  EXPECT_DOUBLE_EQ(overlap_exposed_s(0, 1, 0.189), 0);
  EXPECT_DOUBLE_EQ(kOverlapSlowdown, 0.189);  // Lee et al. 2025, arXiv 2507.03114
  // ZeRO-3 with the gradient reduction exposed: the per-layer gathers hide behind the compute, so
  // with σ = 0 what is exposed is the gradients alone and the gathers are dp_s − that; with σ,
  // σ/(1 + σ) of the gathers comes back.
  PlanRequest r{.model = *model_preset("llama-2-7b"), .cluster = *cluster_preset("a100-80g"),
                .gpus = 32, .global_batch = 256, .seq = 4096, .overlap_dp = false,
                .overlap_slowdown = 0};
  const Layout L{.dp = 32, .zero = 3, .micro_batch = 1, .grad_accum = 8};
  const PlanEval ideal = evaluate_layout(r, L);
  const double gathers = ideal.dp_s - ideal.dp_exposed_s;
  ASSERT_GT(gathers, 0);
  r.overlap_slowdown = 0.189;
  const PlanEval slowed = evaluate_layout(r, L);
  EXPECT_NEAR(slowed.dp_exposed_s - ideal.dp_exposed_s, gathers * 0.189 / 1.189,
              1e-9 * slowed.step_s);
  EXPECT_NEAR(slowed.step_s - ideal.step_s, gathers * 0.189 / 1.189, 1e-9 * slowed.step_s);
  // DDP with the gradient buckets overlapped: with σ = 0 only the last bucket is exposed (the
  // rest hides in the backward), and σ/(1 + σ) of the rest comes back.
  PlanRequest d{.model = *model_preset("llama-2-7b"), .cluster = *cluster_preset("a100-80g"),
                .gpus = 32, .global_batch = 256, .seq = 4096, .overlap_slowdown = 0};
  const Layout D{.dp = 16, .tp = 2, .micro_batch = 1, .grad_accum = 16};
  const PlanEval d0 = evaluate_layout(d, D);
  const double rest = d0.dp_s - d0.dp_exposed_s;
  ASSERT_GT(rest, 0);
  ASSERT_GT(d0.dp_exposed_s, 0);  // the last bucket
  d.overlap_slowdown = 0.189;
  EXPECT_NEAR(evaluate_layout(d, D).dp_exposed_s - d0.dp_exposed_s, rest * 0.189 / 1.189,
              1e-9 * d0.step_s);
  // The seed's utilisation model takes u end to end: nothing changes there.
  r.time_model = TimeModel::utilisation;
  const double util = evaluate_layout(r, L).step_s;
  r.overlap_slowdown = 0;
  EXPECT_DOUBLE_EQ(evaluate_layout(r, L).step_s, util);
  // Outside [0, 1] the request names the flag.
  r.overlap_slowdown = 1.5;
  try {
    r.validate();
    ADD_FAILURE() << "accepted 1.5";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("--overlap-slowdown"), std::string::npos);
  }
}

// Note [TP gradient overlap]: Megatron's f all-reduces 4 times per layer per micro-batch without
// SP (forward g twice, backward f twice: Shoeybi 2019 §3); 2 of those are QKV's and the MLP up's
// input gradients, each hidden behind its weight-gradient GEMM up to that GEMM's time. Under SP
// the 8 calls are all-gather/reduce-scatter pairs and 2 are those reduce-scatters; full recompute
// replays the forward's 2 (or 4) exposed. The GEMMs' times are the layer's own kernels, picked
// here by name. The one stage also runs the model's ends (Note [TP edges]: 2 calls per micro-
// batch, SP 4), of which the output layer's input-gradient one (1) is hidden too, behind the LM
// head's weight gradient, and the loss's two small all-reduces, which nothing hides.
TEST(Planner, TpGradientOverlapHidesTheInputGradientCollectives) {
  const ModelSpec model = *model_preset("llama-2-7b");
  const ClusterSpec c = *cluster_preset("a100-80g");
  const double L32 = double(model.layers), M = 4;
  struct Case { std::int64_t seq, b; bool sp; Recompute rc; double layer_calls, edge_calls;
                bool hidden; };  // calls per micro-batch
  const Case cases[] = {{4096, 2, false, Recompute::none, 4 * L32, 2, true},
                        {4096, 2, true, Recompute::none, 8 * L32, 4, true},
                        {4096, 2, false, Recompute::full, 6 * L32, 2, true},
                        {512, 1, false, Recompute::none, 4 * L32, 2, false}};
  for (const Case& k : cases) {
    SCOPED_TRACE(k.seq);
    PlanRequest r{.model = model, .cluster = c, .gpus = 8, .global_batch = 4 * k.b,
                  .seq = k.seq, .tp_grad_overlap = false};
    const Layout L{.dp = 1, .tp = 8, .sp = k.sp, .micro_batch = k.b, .grad_accum = 4,
                   .recompute = k.rc};
    const PlanEval off = evaluate_layout(r, L);
    r.tp_grad_overlap = true;
    const PlanEval on = evaluate_layout(r, L);
    const OperatorSetup os{.seq = k.seq, .micro_batch = k.b, .tp = 8, .sequence_parallel = k.sp,
                           .recompute = k.rc, .act_bytes = 2};
    double wgrad = 0;  // one layer, one micro-batch
    for (const Op& op : layer_ops(model, os))
      if (op.name == "qkv.wgrad" || op.name == "mlp-gate-up.wgrad")
        wgrad += op_seconds(op, c.gpu, Precision::bf16);
    ASSERT_GT(wgrad, 0);
    // The last stage's fused loss all-reduces (n, 2n of one fp32 per token): outside the overlap.
    const double n = double(k.b) * double(k.seq) * 4;
    auto small = [&](double bytes) {
      return collective_seconds(Collective::all_reduce,
                                collective_bytes_per_rank(Collective::all_reduce, bytes, 8), 8,
                                1, c);
    };
    // Under SP, once per step: the norms' gradients, 2h per Llama layer in bf16.
    const double sp_grads = k.sp ? small(2.0 * 4096 * L32 * 2) : 0.0;
    const double per_call = (off.tp_s - M * (small(n) + small(2 * n)) - sp_grads) /
                            (M * (k.layer_calls + k.edge_calls));
    const double async = per_call * M * 2 * L32, behind = M * L32 * wgrad;
    EXPECT_EQ(async <= behind, k.hidden);
    // Note [overlap contention]: the GEMMs beside a collective run σ = 18.9 % slower (Lee et al.
    // 2025), so of a hidden collective σ/(1 + σ) stays on the critical path; the output layer's
    // is hidden behind the LM head's weight gradient.
    const double kappa = 0.189 / 1.189;
    // Under SP the same linears' inputs are re-gathered beside their input-gradient GEMMs (Note
    // [SP re-gather]): one all-gather of S each, hidden like them, at the same cost.
    const double regather = k.sp ? async : 0.0;
    const double exposed = std::max(async - behind, kappa * async) + kappa * per_call * M +
                           (k.sp ? std::max(regather - behind, kappa * regather) : 0.0);
    const double saved = async + per_call * M - exposed;
    EXPECT_NEAR(off.tp_s - on.tp_s, saved, 1e-9 * off.tp_s);
    EXPECT_NEAR(off.step_s - on.step_s, saved, 1e-9 * off.step_s);
    // With no slowdown a hidden collective is free: up to the GEMMs' time.
    r.overlap_slowdown = 0;  // (the re-gathers free again)
    const double ideal = std::min(async, behind) + per_call * M;
    EXPECT_NEAR(off.tp_s - evaluate_layout(r, L).tp_s, ideal, 1e-9 * off.tp_s);
    r.overlap_slowdown = kOverlapSlowdown;
    // Transformer Engine's comm-GEMM overlap already hides every TP collective: nothing more.
    r.tp_overlap = true;
    const PlanEval both = evaluate_layout(r, L);
    r.tp_grad_overlap = false;
    EXPECT_DOUBLE_EQ(evaluate_layout(r, L).tp_s, both.tp_s);
  }
  // The plan says which it assumed.
  PlanRequest r{.model = model, .cluster = c, .gpus = 8, .global_batch = 8, .seq = 4096};
  EXPECT_NE(plan_convention(r).find("input-gradient collectives"), std::string::npos);
  r.tp_grad_overlap = false;
  EXPECT_EQ(plan_convention(r).find("input-gradient collectives"), std::string::npos);
  // The utilisation model has no weight-gradient GEMMs to hide them behind: it changes nothing.
  r.tp_grad_overlap = true;
  r.time_model = TimeModel::utilisation;
  EXPECT_EQ(plan_convention(r).find("input-gradient collectives"), std::string::npos);
  const Layout L{.dp = 1, .tp = 8, .micro_batch = 2, .grad_accum = 4};
  const double util_on = evaluate_layout(r, L).tp_s;
  r.tp_grad_overlap = false;
  EXPECT_DOUBLE_EQ(evaluate_layout(r, L).tp_s, util_on);
}

// What the input-gradient collectives hide behind (OpsTime::column_wgrad_s): in a MoE layer the
// routed experts' up projection runs on tokens that arrived by all-to-all and reduces nothing over
// TP, so only QKV's weight gradient counts for Mixtral (no shared experts), DeepSeek-V3's shared
// expert's up too (MLA with a q latent has no q-proj); a dense layer counts QKV's and the MLP up's.
TEST(Planner, ColumnWeightGradientsLeaveTheRoutedExpertsOut) {
  const GpuSpec gpu = cluster_preset("h100-80g")->gpu;
  const auto check = [&](const char* preset, std::vector<std::string_view> counted) {
    SCOPED_TRACE(preset);
    const ModelSpec m = *model_preset(preset);
    const OperatorSetup os{.seq = 4096, .micro_batch = 1, .tp = 2, .sequence_parallel = true,
                           .act_bytes = 2};
    const std::vector<Op> ops = layer_ops(m, os);
    double by_name = 0, routed = 0;
    for (const Op& op : ops) {
      if (op.pass != Pass::backward) continue;
      for (std::string_view n : counted)
        if (op.name == n && !op.routed_expert) by_name += op_seconds(op, gpu, Precision::bf16);
      if (op.routed_expert && op.name.ends_with("up.wgrad"))
        routed += op_seconds(op, gpu, Precision::bf16);
    }
    EXPECT_GT(by_name, 0);
    EXPECT_NEAR(time_ops(ops, gpu, Precision::bf16).column_wgrad_s, by_name, 1e-12 * by_name);
    if (m.is_moe()) {
      EXPECT_GT(routed, 0);  // present, and left out
    }
  };
  check("llama-2-7b", {"qkv.wgrad", "mlp-gate-up.wgrad"});
  check("mixtral-8x7b", {"qkv.wgrad"});
  check("deepseek-v3", {"shared-gate-up.wgrad"});
}

// Note [TP edges]: one stage (first and last at once), t = 8, M = 4, llama-2-7b (32 layers,
// h 4096) at b 2, s 4096: every TP call moves S = b·s·h·2 bytes, an all-reduce 2S·7/8 per rank and
// an all-gather or reduce-scatter S·7/8, timed here by the cluster's collective model directly.
// Exposed per micro-batch, with the overlap off: 4 all-reduces per layer and the embedding's and
// the output layer's (2); under SP 8 calls per layer and 2 + 2. With the overlap on (every input-
// gradient collective hidden at this shape): 2 per layer + the embedding's 1; SP 6 + 2 + 1, and
// of the hidden ones (2 per layer + the output layer's 1; under SP also the 2 re-gathers per
// layer, Note [SP re-gather]) σ/(1 + σ) each, σ = 18.9 % (Note [overlap contention], Lee et al.
// 2025). The
// last stage's loss adds its all-reduces of one fp32 per token, n = b·s·4 = 32,768 B: Megatron's
// fused loss 2 (n, then 2n), its unfused one 3 of n. Under SP, once per step, the norms' gradients
// (RMSNorm weights, no biases: 2h per layer, 2 · 4096 · 32 · 2 B = 524,288 B) are all-reduced.
TEST(Planner, TpEdgesRunOnTheEndStages) {
  const ModelSpec model = *model_preset("llama-2-7b");
  const ClusterSpec c = *cluster_preset("a100-80g");
  const double S = 2.0 * 4096 * 4096 * 2, L = 32, M = 4;
  const double ar = collective_seconds(Collective::all_reduce,
                                       collective_bytes_per_rank(Collective::all_reduce, S, 8),
                                       8, 1, c);
  const double ag = collective_seconds(Collective::all_gather,
                                       collective_bytes_per_rank(Collective::all_gather, S, 8),
                                       8, 1, c);
  const double n = 2.0 * 4096 * 4;
  auto small = [&](double bytes) {
    return collective_seconds(Collective::all_reduce,
                              collective_bytes_per_rank(Collective::all_reduce, bytes, 8), 8, 1, c);
  };
  const double fused_loss = small(n) + small(2 * n), unfused_loss = 3 * small(n);
  EXPECT_GT(unfused_loss, fused_loss);  // latency: three calls cost more than two
  const double kappa = 0.189 / 1.189, hidden = kappa * M * (2 * L + 1);
  const double regathers = kappa * M * 2 * L;
  struct Case { bool sp, overlap; double per_call, calls; };
  const Case cases[] = {{false, false, ar, M * (4 * L + 2)}, {true, false, ag, M * (8 * L + 4)},
                        {false, true, ar, M * (2 * L + 1) + hidden},
                        {true, true, ag, M * (6 * L + 3) + hidden + regathers}};
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(k.sp ? "SP" : "no SP") + (k.overlap ? ", overlap" : ""));
    PlanRequest r{.model = model, .cluster = c, .gpus = 8, .global_batch = 8, .seq = 4096,
                  .tp_grad_overlap = k.overlap};
    const Layout lay{.dp = 1, .tp = 8, .sp = k.sp, .micro_batch = 2, .grad_accum = 4};
    const PlanEval e = evaluate_layout(r, lay);
    const double sp_grads = k.sp ? small(524288) : 0.0;
    EXPECT_NEAR(e.tp_s, k.per_call * k.calls + M * fused_loss + sp_grads, 1e-9 * e.tp_s);
    r.loss = Loss::vocab_parallel;
    EXPECT_NEAR(evaluate_layout(r, lay).tp_s, k.per_call * k.calls + M * unfused_loss + sp_grads,
                1e-9 * e.tp_s);
  }
  // On two stages the first holds the embedding's, the last the output layer's: the slowest of
  // them (the last, with the LM head) carries its own, not both.
  const PlanRequest r{.model = model, .cluster = c, .gpus = 16, .global_batch = 8, .seq = 4096,
                      .tp_grad_overlap = false};
  const PlanEval two = evaluate_layout(r, Layout{.dp = 1, .tp = 8, .pp = 2, .micro_batch = 2,
                                                 .grad_accum = 4});
  EXPECT_NEAR(two.tp_s, ar * M * (4 * L / 2 + 1) + M * fused_loss, 1e-9 * two.tp_s);
}

// Note [PP scatter/gather]: on 4 stages of TP 8 the stage boundaries cross nodes (8 A100s per
// node, stride t = 8), so each send goes over one 25 GB/s HDR rail. With the switch each TP rank
// sends S/8 there and the next stage all-gathers 7S/8 over NVLink; the exposed PP time is
// 2m · (that send + that gather), costed by the cluster's own collectives, S = b·s·h·2.
TEST(Planner, PipelineScatterGatherSendsATpShareAcrossNodes) {
  const ModelSpec model = *model_preset("llama-2-7b");
  const ClusterSpec c = *cluster_preset("a100-80g");
  const double S = 2.0 * 4096 * 4096 * 2, M = 4;
  PlanRequest r{.model = model, .cluster = c, .gpus = 32, .global_batch = 8, .seq = 4096};
  const Layout lay{.dp = 1, .tp = 8, .pp = 4, .micro_batch = 2, .grad_accum = 4};
  const PlanEval whole = evaluate_layout(r, lay);
  EXPECT_NEAR(whole.pp_s, 2 * M * collective_seconds(Collective::send_recv, S, 2, 8, c),
              1e-9 * whole.pp_s);
  r.pp_scatter_gather = true;
  const PlanEval split = evaluate_layout(r, lay);
  const double send = collective_seconds(Collective::send_recv, S / 8, 2, 8, c);
  const double gather = collective_seconds(
      Collective::all_gather, collective_bytes_per_rank(Collective::all_gather, S, 8), 8, 1, c);
  EXPECT_NEAR(split.pp_s, 2 * M * (send + gather), 1e-9 * split.pp_s);
  EXPECT_LT(split.pp_s, whole.pp_s / 2);  // an HDR rail is ~10× slower than NVLink
  EXPECT_LT(split.step_s, whole.step_s);
  EXPECT_EQ(split.comm_bytes_per_gpu, whole.comm_bytes_per_gpu);  // the same bytes, elsewhere
  EXPECT_NE(plan_convention(r).find("scatter"), std::string::npos);
  // Under SP the activation is already a 1/t shard: the switch changes nothing.
  const Layout sp{.dp = 1, .tp = 8, .pp = 4, .sp = true, .micro_batch = 2, .grad_accum = 4};
  r.pp_scatter_gather = false;
  const double sp_off = evaluate_layout(r, sp).pp_s;
  r.pp_scatter_gather = true;
  EXPECT_EQ(evaluate_layout(r, sp).pp_s, sp_off);
}

// Note [tied embedding under PP]: a tied model's end stages all-reduce the word embedding's
// gradient once per step, after the schedule: V·h/t elements at the gradient's 2 B, over the two
// ranks (p − 1)·t = 24 apart. The same layout with the embedding untied sends the same PP
// activations, so the exposed PP time and the step differ by exactly that all-reduce.
TEST(Planner, TiedEmbeddingGradientIsAllReducedAfterTheSchedule) {
  ModelSpec model = *model_preset("gpt3-175b");
  ASSERT_TRUE(model.tied_embeddings);
  const ClusterSpec c = *cluster_preset("a100-80g");
  const Layout lay{.dp = 1, .tp = 8, .pp = 4, .micro_batch = 1, .grad_accum = 8,
                   .recompute = Recompute::full};
  const PlanRequest tied{.model = model, .cluster = c, .gpus = 32, .global_batch = 8, .seq = 2048};
  const double S = double(model.vocab) * double(model.hidden) / 8 * 2;
  const double allreduce = collective_seconds(
      Collective::all_reduce, collective_bytes_per_rank(Collective::all_reduce, S, 2), 2, 24, c);
  model.tied_embeddings = false;
  PlanRequest untied = tied;
  untied.model = model;
  const PlanEval a = evaluate_layout(tied, lay), b = evaluate_layout(untied, lay);
  EXPECT_NEAR(a.pp_s - b.pp_s, allreduce, 1e-9 * a.pp_s);
  EXPECT_GT(allreduce, 0);
  // No pipeline, one copy: nothing to exchange.
  const Layout one{.dp = 4, .tp = 8, .micro_batch = 1, .grad_accum = 2,
                   .recompute = Recompute::full};
  EXPECT_EQ(evaluate_layout(tied, one).pp_s, 0);
}

// Expert parallelism (Note [expert parallelism]): DeepSeek-V3 on 1024 H100s with Megatron's
// distributed optimizer (ZeRO-1) and no pipeline cannot hold 671B parameters' bf16 weights and
// gradients on TP ≤ 8 alone (4 B × 671e9 / 8 = 335 GB); with the routed experts split over EP it
// fits, and the plan names its EP.
TEST(Planner, ExpertParallelismMakesDeepSeekV3Fit) {
  PlanRequest req{.model = *model_preset("deepseek-v3"), .cluster = *cluster_preset("h100-80g"),
                  .gpus = 1024, .global_batch = 8192, .seq = 4096};
  const SearchSpace no_ep{.max_pp = 1, .max_cp = 1, .max_ep = 1, .zero_stages = {1}};
  EXPECT_FALSE(plan(req, no_ep).feasible());
  SearchSpace with_ep = no_ep;
  with_ep.max_ep = 0;
  const PlanResult r = plan(req, with_ep);
  ASSERT_TRUE(r.feasible());
  const PlanEval& best = r.best.front();
  EXPECT_GT(best.layout.ep, 1);
  EXPECT_NE(best.layout.describe().find("(EP "), std::string::npos);
  EXPECT_GT(best.ep_s, 0);
  // The same layout without EP holds the experts whole: more state, no all-to-all.
  Layout dense = best.layout;
  dense.ep = 1;
  const PlanEval e1 = evaluate_layout(req, dense);
  EXPECT_GT(e1.states.total(), best.states.total());
  EXPECT_EQ(e1.ep_s, 0);
  // Hiding the all-to-alls (Megatron-Core --overlap-moe-expert-parallel-comm) can only help.
  req.ep_overlap = true;
  const PlanEval hidden = evaluate_layout(req, best.layout);
  EXPECT_LT(hidden.ep_s, best.ep_s);
  EXPECT_LT(hidden.step_s, best.step_s);
  // The reasons flip EP like every other dimension.
  req.ep_overlap = false;
  bool has_ep = false;
  for (const Reason& x : explain_plan(req, best)) has_ep |= x.dimension == "EP";
  EXPECT_TRUE(has_ep);
}

TEST(Planner, ExpertParallelismIsCheckedLikeEveryDimension) {
  const PlanRequest moe{.model = *model_preset("mixtral-8x7b"),
                        .cluster = *cluster_preset("h100-80g"), .gpus = 16, .global_batch = 64,
                        .seq = 4096};
  const Layout base{.dp = 16, .zero = 1, .micro_batch = 1, .grad_accum = 4,
                    .recompute = Recompute::full};
  EXPECT_NO_THROW(evaluate_layout(moe, Layout{base}));
  Layout l = base;
  l.ep = 8;
  EXPECT_NO_THROW(evaluate_layout(moe, l));
  l.ep = 16;  // 8 experts
  EXPECT_THROW(evaluate_layout(moe, l), InvalidInput);
  l.ep = 3;   // 16 DP ranks
  EXPECT_THROW(evaluate_layout(moe, l), InvalidInput);
  PlanRequest dense = moe;
  dense.model = *model_preset("llama-3-8b");
  l.ep = 2;
  EXPECT_THROW(evaluate_layout(dense, l), InvalidInput);
  // A dense model's search never tries EP.
  for (const PlanEval& e : plan(dense, SearchSpace{.top = 20}).best) EXPECT_EQ(e.layout.ep, 1);
}

// Expert TP in the search (SearchSpace::expert_tp: Megatron-Core's default ETP = TP, or 1 with SP).
// Mixtral on 16 H100s, TP 2 + SP × DP 8: ETP 1 × EP 8 and ETP 2 × EP 4 both leave each GPU an
// eighth of the routed experts (whole, or halves of two), with expert DP 16/8 = 2 — the same
// states; ETP 2's pair gathers both sequence halves' dispatched copies (more activations) and
// moves them (expert-TP gathers in the MoE dispatch/combine time).
TEST(Planner, ExpertTensorParallelismIsSearchedAndChecked) {
  const PlanRequest req{.model = *model_preset("mixtral-8x7b"),
                        .cluster = *cluster_preset("h100-80g"), .gpus = 16, .global_batch = 64,
                        .seq = 4096};
  const Layout base{.dp = 8, .tp = 2, .ep = 8, .etp = 1, .sp = true, .zero = 1,
                    .micro_batch = 1, .grad_accum = 8, .recompute = Recompute::full};
  const PlanEval one = evaluate_layout(req, base);
  Layout l = base;
  l.ep = 4;
  l.etp = 2;
  const PlanEval two = evaluate_layout(req, l);
  EXPECT_NE(one.layout.describe().find("ETP 1"), std::string::npos) << one.layout.describe();
  EXPECT_DOUBLE_EQ(one.states.total(), two.states.total());
  EXPECT_LT(one.activation_bytes, two.activation_bytes);
  l.ep = 8;  // ETP 2 × EP 8: all 16 ranks, the pair gathering besides the all-to-all
  EXPECT_GT(evaluate_layout(req, l).ep_s, 0);
  // Refused: ETP 1 under TP 2 without SP; ETP × EP beyond tp × dp; EP beyond the experts.
  l = base;
  l.sp = false;
  EXPECT_THROW(evaluate_layout(req, l), InvalidInput);
  l = base;
  l.etp = 2;
  l.ep = 16;
  EXPECT_THROW(evaluate_layout(req, l), InvalidInput);
  // The search: ETP = TP only, 1 only, or both — whose best is the better of the two.
  SearchSpace space{.max_pp = 1, .max_cp = 1, .zero_stages = {1}, .top = 30};
  space.expert_tp = SearchSpace::ExpertTp::tp;
  const PlanResult at_tp = plan(req, space);
  for (const PlanEval& e : at_tp.best) EXPECT_EQ(e.layout.expert_tp(), e.layout.tp);
  space.expert_tp = SearchSpace::ExpertTp::one;
  const PlanResult at_one = plan(req, space);
  for (const PlanEval& e : at_one.best) {
    EXPECT_EQ(e.layout.expert_tp(), 1);
    EXPECT_TRUE(e.layout.tp == 1 || e.layout.sp) << e.layout.describe();
  }
  space.expert_tp = SearchSpace::ExpertTp::both;
  const PlanResult any = plan(req, space);
  ASSERT_TRUE(at_tp.feasible() && at_one.feasible() && any.feasible());
  EXPECT_DOUBLE_EQ(any.best.front().step_s,
                   std::min(at_tp.best.front().step_s, at_one.best.front().step_s));
  EXPECT_GT(any.evaluated, at_tp.evaluated);
  // The reasons flip ETP too.
  bool has_etp = false;
  for (const Reason& x : explain_plan(req, two)) has_etp |= x.dimension == "ETP";
  EXPECT_TRUE(has_etp);
}

// Node-limited routing (Note [node-limited routing]): DeepSeek-V3's EP 64 over 8 H100 hosts with
// each token sent to at most 4 nodes moves half the all-to-all bytes over the NICs, which pace it:
// the MoE dispatch and combine take less time, nothing else changes. A dense model has no routing.
TEST(Planner, NodeLimitedRoutingShortensTheAllToAlls) {
  PlanRequest req{.model = *model_preset("deepseek-v3"), .cluster = *cluster_preset("h100-80g"),
                  .gpus = 1024, .global_batch = 8192, .seq = 4096};
  const Layout l{.dp = 1024, .ep = 64, .zero = 1, .micro_batch = 1, .grad_accum = 8,
                 .recompute = Recompute::full};
  const PlanEval plain = evaluate_layout(req, l);
  req.max_route_nodes = 4;
  const PlanEval limited = evaluate_layout(req, l);
  EXPECT_LT(limited.ep_s, plain.ep_s);
  EXPECT_GT(limited.ep_s, 0.4 * plain.ep_s);  // half the NIC bytes, plus the latencies
  EXPECT_DOUBLE_EQ(limited.compute_s, plain.compute_s);
  EXPECT_DOUBLE_EQ(limited.total_bytes, plain.total_bytes);
  EXPECT_LT(limited.step_s, plain.step_s);
  PlanRequest dense{.model = *model_preset("llama-3-8b"), .cluster = *cluster_preset("h100-80g"),
                    .gpus = 8, .global_batch = 64, .seq = 4096, .max_route_nodes = 4};
  EXPECT_THROW(plan(dense), InvalidInput);
}

// ZeRO-3's buffers: two gathered layers without PP; under PP the stage unsharded in the parameter
// dtype plus its fp32 gradients (planner.hpp buffer_bytes): 2 + 4 B per stage parameter.
TEST(Planner, ZeroThreeUnderPipelineKeepsTheStageUnsharded) {
  EXPECT_DOUBLE_EQ(buffer_bytes(3, 1e9, 10, 2.0), 2 * 1e9 / 10 * 2.0);
  EXPECT_DOUBLE_EQ(buffer_bytes(3, 1e9, 10, 2.0, 4), 6e9);
  EXPECT_DOUBLE_EQ(buffer_bytes(1, 1e9, 10, 2.0, 4), 2 * 25.0 * 1024 * 1024);
  // ZeRO-2 under PP: the stage's unsharded fp32 gradients, 4 B per stage parameter; without PP
  // two DDP buckets.
  EXPECT_DOUBLE_EQ(buffer_bytes(2, 1e9, 10, 2.0, 4), 4e9);
  EXPECT_DOUBLE_EQ(buffer_bytes(2, 1e9, 10, 2.0), 2 * 25.0 * 1024 * 1024);
}

// E compares a layout with G ideal GPUs running the same kernels, so it never exceeds 1 (a MoE
// ideal whose experts saw one micro-batch's b·s·k/E rows once gave DeepSeek-V3 at EP 8 E = 1.52).
TEST(Planner, MoeScalingEfficiencyStaysAtMostOne) {
  for (const Precision p : {Precision::bf16, Precision::mxfp8}) {
    const PlanRequest q{.model = *model_preset("deepseek-v3"),
                        .cluster = *cluster_preset("gb200-nvl72"), .gpus = 576,
                        .global_batch = 4608, .seq = 4096, .precision = p};
    const PlanEval e = evaluate_layout(
        q, Layout{.dp = 576, .ep = 8, .zero = 3, .micro_batch = 1, .grad_accum = 8,
                  .recompute = Recompute::save_matmuls});
    EXPECT_GT(e.efficiency, 0.0);
    EXPECT_LE(e.efficiency, 1.0) << int(p);
  }
}

}  // namespace
}  // namespace tally::test_planner
