// The development set of the operator time model (issue 10): published Megatron-LM runs on A100
// 80 GB (Selene: 8 GPUs per node, NVSwitch, 8 × HDR 200 Gb/s per node), predicted with their
// published layouts fixed and nothing tuned to them. Sources:
//  - Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
//    Table 3 (configurations), Table 4 (one layer of the 22B model, ms), Table 5 (iteration s).
//  - Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
//    Megatron-LM", Table 1 (TFLOP/s per GPU by eq. 3), with micro-batch, interleaving and DDP from
//    Megatron-LM's examples/sc21/run_table_1.sh (commit de7dc40f88); every run uses full
//    recompute (--checkpoint-activations), fp16, sequence 2048, vocabulary 51200.
// Attention in both is materialised (Megatron's fused softmax; no flash attention in 2021–22), and
// both ran Megatron-LM's own modules and its unfused loss, no Transformer Engine: Kernels::local
// and Loss::vocab_parallel (Note [local kernels], Note [loss kernels] in core/operators.hpp).
// The goals: median |error| ≤ 10 % per table; the published trend (efficiency rising with size).
// Both papers' code scatters each PP send over the TP ranks (Note [PP scatter/gather], comm.cpp).
// Table 4 meets it (median 7.9 %); Table 5 (10.7 %) and Table 1 (13.0 %) do not yet, so their
// bounds here are 15 % and 20 %. Every one of the 28 points is predicted too fast (6.3–16.5 %):
// Korthikanti's code hides the backward input-gradient collectives behind the weight-gradient
// GEMMs and Narayanan's does not (Note [TP gradient overlap], planner.cpp), and with that counted
// both code bases' layers come out 9–15 % faster than published — a fast bias of the A100
// kernel constants (anchored on 2024 cuBLAS throughput, no measured A100 table) — see
// docs/ledgers.md §5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "tally/core/comm.hpp"
#include "tally/core/operators.hpp"
#include "tally/core/planner.hpp"
#include "tally/core/presets.hpp"

namespace tally::test_published_runs {
namespace {

ModelSpec gpt(std::int64_t h, std::int64_t L, std::int64_t a) {
  return ModelSpec{.name = "gpt", .hidden = h, .layers = L, .heads = a, .kv_heads = a,
                   .ffn = 4 * h, .vocab = 51200, .max_positions = 2048, .tied_embeddings = true,
                   .linear_bias = true, .mlp = MlpKind::gelu, .norm = NormKind::layernorm,
                   .position = PositionKind::learned};
}

// Table 4: one transformer layer of the 22B model (h 6144, 64 heads, t = 8, b = 4, s = 2048),
// forward and backward in ms. TP all-reduces (Shoeybi et al. 2019 §3): two in the forward, two in
// the backward, two more when full recompute replays the forward; with sequence parallelism each
// becomes an all-gather + reduce-scatter of the same bytes (core/comm.hpp step_traffic).
// One published figure and tally's prediction of it, both as times (seconds or ms).
struct Point {
  std::string label;
  double predicted = 0, published = 0;
  double memory_share = 0;  // of the layer's predicted kernel time, the memory-bound kernels'
  double error() const { return predicted / published - 1; }
};

// Of one layer's kernel time (layer_ops timed by op_seconds), the memory-bound kernels' share,
// over the passes `in` accepts.
template <class Passes>
double memory_share(const ModelSpec& m, const OperatorSetup& os, Precision p, Passes in) {
  const GpuSpec gpu = cluster_preset("a100-80g")->gpu;
  double memory = 0, all = 0;
  for (const Op& op : layer_ops(m, os)) {
    if (!in(op.pass)) continue;
    const double t = op_seconds(op, gpu, p);
    all += t;
    if (op.kind == OpKind::memory) memory += t;
  }
  return memory / all;
}
const auto kAllPasses = [](Pass) { return true; };

std::vector<Point> table4() {
  std::vector<Point> out;
  struct Row { const char* name; Recompute rc; bool sp; double fwd_ms, bwd_ms; };
  const Row rows[] = {{"baseline no recompute", Recompute::none, false, 7.7, 11.9},
                      {"sequence parallelism", Recompute::none, true, 7.2, 11.8},
                      {"baseline with recompute", Recompute::full, false, 7.7, 19.5},
                      {"selective recompute", Recompute::selective, false, 7.7, 13.2},
                      {"selective + sequence", Recompute::selective, true, 7.2, 13.1}};
  const ModelSpec m = gpt(6144, 48, 64);
  const ClusterSpec c = *cluster_preset("a100-80g");
  for (const Row& r : rows) {
    const OperatorSetup os{.seq = 2048, .micro_batch = 4, .tp = 8, .sequence_parallel = r.sp,
                           .recompute = r.rc, .attention = Attention::materialized,
                           .kernels = Kernels::local};
    const OpsTime t = time_ops(layer_ops(m, os), c.gpu, Precision::bf16);
    // One layer's TP traffic: step_traffic over a one-layer, one-micro-batch model.
    const StepTraffic tr = step_traffic(StepTrafficSetup{
        .params = 1, .hidden = 6144, .layers = 1, .seq_len = 2048, .micro_batch = 4, .tp = 8,
        .sequence_parallel = r.sp, .recompute = r.rc});
    const double per_call = traffic_seconds(tr.tp, c) / tr.tp.calls;
    const double calls_fwd = r.sp ? 4 : 2;  // SP: all-gather + reduce-scatter per all-reduce
    const double fwd = t.forward_s + calls_fwd * per_call;
    // Korthikanti's code (Megatron-LM 2022, LinearWithGradAccumulationAndAsyncCommunication)
    // issues QKV's and the MLP up's input-gradient all-reduce (SP: reduce-scatter) beside their
    // weight-gradient GEMMs: Note [TP gradient overlap]. Both calls here; the GEMMs' sum hides
    // them, and the GEMMs beside them run slower while they run (Note [overlap contention]).
    EXPECT_EQ(tr.tp_input_grad_calls, 2);
    const double async = tr.tp_input_grad_calls * per_call;
    // Under SP the same linears' inputs are re-gathered beside their input-gradient GEMMs (Note
    // [SP re-gather]; as many FLOPs as the weight-gradient ones): hidden too.
    const double regather = traffic_seconds(tr.tp_regather, c);
    EXPECT_EQ(regather > 0, r.sp);
    const double bwd = t.backward_s + t.recompute_s +
                       (tr.tp.calls - calls_fwd - tr.tp_input_grad_calls) * per_call +
                       overlap_exposed_s(async, t.column_wgrad_s, kOverlapSlowdown) +
                       overlap_exposed_s(regather, t.column_wgrad_s, kOverlapSlowdown);
    const auto forward = [](Pass p) { return p == Pass::forward; };
    const auto backward = [](Pass p) { return p != Pass::forward; };
    out.push_back({std::string(r.name) + " forward", fwd * 1e3, r.fwd_ms,
                   memory_share(m, os, Precision::bf16, forward)});
    out.push_back({std::string(r.name) + " backward", bwd * 1e3, r.bwd_ms,
                   memory_share(m, os, Precision::bf16, backward)});
  }
  return out;
}

// Prints each point and returns the median |error|.
double report(const std::vector<Point>& points, const char* unit) {
  std::vector<double> errors;
  for (const Point& p : points) {
    std::printf("  %-34s %8.2f %s vs %8.2f (%+5.1f %%)\n", p.label.c_str(), p.predicted, unit,
                p.published, 100 * p.error());
    errors.push_back(std::fabs(p.error()));
  }
  const double med = median(errors);
  std::printf("  median |error| %.1f %%\n", 100 * med);
  return med;
}

TEST(PublishedRuns, Korthikanti2022Table4_OneLayerOf22B) {
  const auto points = table4();
  for (const Point& p : points) EXPECT_LT(std::fabs(p.error()), 0.15) << p.label;
  EXPECT_LE(report(points, "ms"), 0.10);
}

// Table 5: end-to-end iteration time, no data parallelism, t = 8; full recompute vs "present work"
// (selective recompute + sequence parallelism); interleaving 3 for 175B and 530B (§6).
std::vector<Point> table5() {
  std::vector<Point> out;
  struct Row { const char* name; std::int64_t h, L, a; int pp, gpus; std::int64_t B; int v;
               double full_s, present_s; };
  const Row rows[] = {{"22B", 6144, 48, 64, 1, 8, 4, 1, 1.42, 1.10},
                      {"175B", 12288, 96, 96, 8, 64, 64, 3, 18.13, 13.75},
                      {"530B", 20480, 105, 128, 35, 280, 280, 3, 49.05, 37.83},
                      {"1T", 25600, 128, 160, 64, 512, 512, 1, 94.42, 71.49}};
  for (const Row& r : rows)
    for (bool present : {false, true}) {
      const PlanRequest q{.model = gpt(r.h, r.L, r.a), .cluster = *cluster_preset("a100-80g"),
                          .gpus = r.gpus, .global_batch = r.B, .seq = 2048,
                          // Megatron-LM 2022's default (SP rows skip it): Note [PP scatter/gather]
                          .pp_scatter_gather = true,
                          .loss = Loss::vocab_parallel, .kernels = Kernels::local};
      const std::int64_t b = r.pp == 1 ? r.B : 1;  // Table 3's micro-batch
      // Megatron-LM splits the layers evenly (explicit, so the planner's balancing stays out).
      const int even = r.pp > 1 && r.v == 1 ? int(r.L / r.pp) : 0;
      const Layout L{.dp = 1, .tp = 8, .pp = r.pp, .interleave = r.v, .sp = present,
                     .micro_batch = b, .grad_accum = r.B / b,
                     .recompute = present ? Recompute::selective : Recompute::full,
                     .attention = Attention::materialized, .first_stage_layers = even,
                     .last_stage_layers = even};
      const double step = evaluate_layout(q, L).step_s;
      const double published = present ? r.present_s : r.full_s;
      const OperatorSetup os{.seq = 2048, .micro_batch = b, .tp = 8, .sequence_parallel = present,
                             .recompute = L.recompute, .attention = Attention::materialized,
                             .kernels = Kernels::local};
      out.push_back({std::string(r.name) + (present ? " selective + SP" : " full recompute"),
                     step, published, memory_share(q.model, os, Precision::bf16, kAllPasses)});
    }
  return out;
}

TEST(PublishedRuns, Korthikanti2022Table5_IterationTime) {
  const auto points = table5();
  for (const Point& p : points) EXPECT_LT(std::fabs(p.error()), 0.15) << p.label;
  EXPECT_LE(report(points, "s"), 0.10);  // the goal (docs/ledgers.md §5)
}

// Table 1: weak scaling, 1.7B on 32 GPUs to 1T on 3072. TFLOP/s per GPU by the paper's eq. 3,
// F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)), over the predicted step. DDP: the script's
// DDP=torch rows (PyTorch DDP) overlap the gradient all-reduce with backward; DDP=local rows
// reduce after the backward. Both sum the micro-batches' fp16 gradients with PyTorch's
// AccumulateGrad (that commit's local DDP registers its main_grad hook only with
// --use-contiguous-buffers-in-ddp, which the script does not pass): Note [gradient accumulation].
// As times: the published step is F / (TFLOP/s · G).
std::vector<Point> table1() {
  std::vector<Point> out;
  struct Row { double billions; std::int64_t a, h, L; int tp, pp, gpus; std::int64_t B, mbs;
               int v; bool torch_ddp; double tflops; };
  const Row rows[] = {{1.7, 24, 2304, 24, 1, 1, 32, 512, 16, 1, true, 137},
                      {3.6, 32, 3072, 30, 2, 1, 64, 512, 16, 1, true, 138},
                      {7.5, 32, 4096, 36, 4, 1, 128, 512, 16, 1, true, 142},
                      {18.4, 48, 6144, 40, 8, 1, 256, 1024, 8, 1, true, 135},
                      {39.1, 64, 8192, 48, 8, 2, 512, 1536, 4, 1, false, 138},
                      {76.1, 80, 10240, 60, 8, 4, 1024, 1792, 2, 3, false, 140},
                      {145.6, 96, 12288, 80, 8, 8, 1536, 2304, 2, 2, false, 148},
                      {310.1, 128, 16384, 96, 8, 16, 1920, 2160, 1, 2, false, 155},
                      {529.6, 128, 20480, 105, 8, 35, 2520, 2520, 1, 3, false, 163},
                      {1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 1, 1, false, 163}};
  for (const Row& r : rows) {
    const PlanRequest q{.model = gpt(r.h, r.L, r.a), .cluster = *cluster_preset("a100-80g"),
                        .gpus = r.gpus, .global_batch = r.B, .seq = 2048,
                        .precision = Precision::fp16, .overlap_dp = r.torch_ddp,
                        // de7dc40f88 (2021-08-10) predates Megatron-LM's async TP all-reduce
                        // (cf7efd4f5a, 2021-08-30): Note [TP gradient overlap]
                        .tp_grad_overlap = false,
                        // on by default at de7dc40f88 (Note [PP scatter/gather], comm.cpp)
                        .pp_scatter_gather = true,
                        .loss = Loss::vocab_parallel, .kernels = Kernels::local,
                        .grad_accumulation = GradAccumulation::autograd};
    const int dp = r.gpus / (r.tp * r.pp);
    const int even = r.pp > 1 && r.v == 1 ? int(r.L / r.pp) : 0;  // Megatron's even split
    const Layout L{.dp = dp, .tp = r.tp, .pp = r.pp, .interleave = r.v, .micro_batch = r.mbs,
                   .grad_accum = r.B / (dp * r.mbs), .recompute = Recompute::full,
                   .attention = Attention::materialized, .first_stage_layers = even,
                   .last_stage_layers = even};
    const double step = evaluate_layout(q, L).step_s;
    const double s = 2048, h = double(r.h), l = double(r.L), V = 51200;
    const double F = 96 * double(r.B) * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
    const OperatorSetup os{.seq = 2048, .micro_batch = r.mbs, .tp = r.tp,
                           .recompute = Recompute::full, .attention = Attention::materialized,
                           .kernels = Kernels::local};
    out.push_back({format_number(r.billions) + "B", step, F / (r.tflops * 1e12 * r.gpus),
                   memory_share(q.model, os, Precision::fp16, kAllPasses)});
  }
  return out;
}

TEST(PublishedRuns, Narayanan2021Table1_WeakScaling) {
  const auto points = table1();
  std::printf("  (step seconds; the paper's TFLOP/s per GPU by eq. 3 turned into its step time)\n");
  EXPECT_LE(report(points, "s"), 0.10);  // the goal (docs/ledgers.md §5)
  // The published trend (issue 10: "efficiency rising from 1.7 B to 1 T"; 137 → 163 TFLOP/s per
  // GPU, +19 %). Predicted TFLOP/s ∝ published TFLOP/s · published step / predicted step; compare
  // the three smallest runs with the three largest. The predicted rise is far weaker (docs/
  // ledgers.md §5: the small models' steps are the ones predicted too fast).
  const double tf[10] = {137, 138, 142, 135, 138, 140, 148, 155, 163, 163};
  auto predicted_tflops = [&](int i) { return tf[i] * points[i].published / points[i].predicted; };
  const double small = (predicted_tflops(0) + predicted_tflops(1) + predicted_tflops(2)) / 3;
  const double large = (predicted_tflops(7) + predicted_tflops(8) + predicted_tflops(9)) / 3;
  std::printf("  predicted TFLOP/s per GPU: %.1f at 1.7-7.5B, %.1f at 310B-1T "
              "(published 139, 160)\n", small, large);
  EXPECT_GT(large, small);
}

// Where the miss sits (docs/ledgers.md §5). Little of it in the memory-bound kernels' share
// (softmax, dropout, norms, GELU, biases at 0.85 of HBM bandwidth): a least-squares line of
// measured / predicted over each point's memory-bound share of its layer, fitted here only to
// describe the 28 points (no constant of the model is set from it), rises from share 0 to the
// points' median share by less than a third of the miss at that share (it was flat, slope −0.006,
// until the A100's GEMMs took the power cap; since, 0.066: at the median share the memory-bound
// kernels carry an eighth of what is left). What the misses follow is the pass
// and the policy: every backward row of Table 4 is missed by more than every forward row, and in
// Table 5 every selective + SP row by more than the same model's full-recompute row — what an
// A100 measurement should time first (bench/gpu/probe.py's `megatron_layer` section times Table
// 4's kernels one by one; the docs say so; these checks keep the docs honest).
TEST(PublishedRuns, WhereTheMissSits) {
  std::vector<Point> points;
  for (const auto& t : {table4(), table5(), table1()})
    points.insert(points.end(), t.begin(), t.end());
  ASSERT_EQ(points.size(), 28u);
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const Point& p : points) {
    const double x = p.memory_share, y = p.published / p.predicted;
    std::printf("  %-34s memory-bound %4.1f %% of the layer, measured / predicted %.3f\n",
                p.label.c_str(), 100 * x, y);
    sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  const double n = double(points.size());
  const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx), at0 = (sy - slope * sx) / n;
  std::vector<double> shares;
  for (const Point& p : points) shares.push_back(p.memory_share);
  const double mid = median(shares), miss = at0 + slope * mid - 1;
  std::printf("  line: %.3f at share 0, %.3f at share 1; at the median share %.3f the miss is "
              "%.3f, %.3f of it the share's\n", at0, at0 + slope, mid, miss, slope * mid);
  EXPECT_GT(miss, 0);
  EXPECT_LT(std::fabs(slope * mid), miss / 3);
  const auto t4 = table4();
  double worst_forward = 0, best_backward = 1;
  for (const Point& p : t4) {
    const double miss = -p.error();
    if (p.label.ends_with("forward")) worst_forward = std::max(worst_forward, miss);
    else best_backward = std::min(best_backward, miss);
  }
  EXPECT_GT(best_backward, worst_forward);
  const auto t5 = table5();  // full recompute, then selective + SP, per model
  for (std::size_t i = 0; i + 1 < t5.size(); i += 2)
    EXPECT_LT(t5[i + 1].error(), t5[i].error()) << t5[i + 1].label;
}

// Note [error band] in planner.hpp: the band the planner prints is exactly the dev set's range of
// measured / predicted.
TEST(PublishedRuns, ErrorBandCoversTheDevSet) {
  const auto band = step_time_band(TimeModel::operators, cluster_preset("a100-80g")->gpu);
  ASSERT_TRUE(band.has_value());
  std::vector<double> ratios;
  double rank_spread = 0;
  for (const auto& points : {table4(), table5(), table1()}) {
    std::vector<double> table;
    for (const Point& p : points) table.push_back(p.published / p.predicted);
    const auto [tlo, thi] = std::minmax_element(table.begin(), table.end());
    rank_spread = std::max(rank_spread, *thi / *tlo - 1);
    ratios.insert(ratios.end(), table.begin(), table.end());
  }
  EXPECT_GE(band->rank_spread, rank_spread);
  EXPECT_LT(band->rank_spread, rank_spread + 0.005);
  ASSERT_EQ(ratios.size(), 28u);
  const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
  std::printf("  measured / predicted: %.4f to %.4f, median %.4f, rank spread %.4f\n", *lo, *hi,
              median(ratios), rank_spread);
  EXPECT_LE(band->low, *lo);
  EXPECT_GE(band->high, *hi);
  EXPECT_GT(band->low, *lo - 0.01);   // tight: moves with the model
  EXPECT_LT(band->high, *hi + 0.01);
  EXPECT_NEAR(band->median, median(ratios), 0.01);
  EXPECT_FALSE(step_time_band(TimeModel::utilisation, cluster_preset("a100-80g")->gpu).has_value());
}

}  // namespace
}  // namespace tally::test_published_runs
