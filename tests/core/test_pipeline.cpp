// The pipeline bubble against the seed's figures (seed §A3), the 1F1B simulator, and properties.
#include "tally/core/pipeline.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tally/core/types.hpp"

namespace tally::test_pipeline {
namespace {

double frac(int P, int M, int v = 1) {
  return bubble(PipelineSetup{.stages = P, .micro_batches = M, .interleave = v}).bubble_fraction;
}

// seed §A3 (iii): P = 8, M = 16 → 7/23 = 30.4 %; M = 64 → 7/71 = 9.9 %.
TEST(Pipeline, SeedA3_BubbleAtP8) {
  EXPECT_DOUBLE_EQ(frac(8, 16), 7.0 / 23.0);
  EXPECT_NEAR(100 * frac(8, 16), 30.4, 0.05);
  EXPECT_DOUBLE_EQ(frac(8, 64), 7.0 / 71.0);
  EXPECT_NEAR(100 * frac(8, 64), 9.9, 0.05);
  const auto r = bubble(PipelineSetup{.stages = 8, .micro_batches = 16});
  EXPECT_EQ(r.ideal_slots, 16);
  EXPECT_EQ(r.total_slots, 23);
  EXPECT_NE(r.convention().find("(P-1)/(M+P-1)"), std::string::npos) << r.convention();
}

// seed §A3: 7/(M+7) <= 0.1 ⇔ M >= 63 (the boundary is exact: 7/70 = 0.1).
TEST(Pipeline, SeedA3_SixtyThreeMicroBatchesForTenPercent) {
  EXPECT_EQ(min_micro_batches_for_bubble(8, 0.10), 63);
  EXPECT_LE(frac(8, 63), 0.10);
  EXPECT_GT(frac(8, 62), 0.10);
  EXPECT_EQ(min_micro_batches_for_bubble(1, 0.01), 1);
  // Sweep: the answer is always the boundary of bubble() itself.
  for (int P = 2; P <= 16; ++P)
    for (double f : {0.5, 0.3, 0.25, 0.2, 0.1, 0.05, 0.01})
      for (int v : {1, 2, 4}) {
        const int M = min_micro_batches_for_bubble(P, f, v);
        EXPECT_LE(frac(P, M, v), f) << P << " " << f << " " << v;
        const int step = v == 1 ? 1 : P;
        if (M > step) {
          EXPECT_GT(frac(P, M - step, v), f) << P << " " << f << " " << v;
        }
        if (v > 1) {
          EXPECT_EQ(M % P, 0);
        }
      }
}

// Narayanan et al. 2021 §2.2.2: interleaving v chunks divides the bubble time by v.
TEST(Pipeline, InterleavedBubbleAndTimes) {
  EXPECT_DOUBLE_EQ(frac(8, 16, 2), 7.0 / 39.0);
  const auto r = bubble(PipelineSetup{.stages = 4, .micro_batches = 8, .interleave = 2,
                                      .backward_forward_ratio = 2.0, .forward_time_s = 0.1});
  EXPECT_NEAR(*r.ideal_time_s, 8 * 0.3, 1e-12);
  EXPECT_NEAR(*r.bubble_time_s, 3 * 0.3 / 2, 1e-12);
  EXPECT_NEAR(*r.bubble_time_s / *r.total_time_s, r.bubble_fraction, 1e-12);
  EXPECT_FALSE(bubble(PipelineSetup{.stages = 4, .micro_batches = 8}).bubble_time_s.has_value());
}

TEST(Pipeline, SingleStageHasNoBubble) {
  EXPECT_EQ(frac(1, 1), 0.0);
  EXPECT_EQ(frac(1, 100), 0.0);
  EXPECT_EQ(simulate_1f1b_bubble(1, 5, 1.0, 2.0), 0.0);
}

// Properties: bubble in [0, 1), decreasing in M, increasing in P, lowered by interleaving.
TEST(Pipeline, PropertyMonotone) {
  for (int P = 1; P <= 64; P *= 2)
    for (int M = 1; M <= 256; M *= 2) {
      const double b = frac(P, M);
      EXPECT_GE(b, 0.0);
      EXPECT_LT(b, 1.0);
      if (P > 1) {
        EXPECT_LT(frac(P, M + 1), b);
        EXPECT_GT(frac(P + 1, M), b);
        if (M % P == 0) {
          EXPECT_LT(frac(P, M, 2), b);
        }
      }
    }
}

// The closed form (P−1)/(M+P−1) is what a real 1F1B schedule does, whatever t_b/t_f.
TEST(Pipeline, SimulatedOneFOneBMatchesClosedForm) {
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 32; ++M)
      for (double ratio : {1.0, 2.0}) {
        EXPECT_NEAR(simulate_1f1b_bubble(P, M, 1.0, ratio), frac(P, M), 1e-9)
            << "P=" << P << " M=" << M << " t_b/t_f=" << ratio;
      }
}

TEST(Pipeline, RejectsBadInput) {
  EXPECT_THROW(bubble(PipelineSetup{.stages = 0, .micro_batches = 4}), InvalidInput);
  EXPECT_THROW(bubble(PipelineSetup{.stages = 4, .micro_batches = 0}), InvalidInput);
  EXPECT_THROW(bubble(PipelineSetup{.stages = 4, .micro_batches = 4, .interleave = 0}),
               InvalidInput);
  try {
    bubble(PipelineSetup{.stages = 4, .micro_batches = 6, .interleave = 2});
    ADD_FAILURE();
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("micro_batches = 6"), std::string::npos) << e.what();
  }
  EXPECT_THROW(min_micro_batches_for_bubble(8, 0.0), InvalidInput);
  EXPECT_THROW(simulate_1f1b_bubble(4, 4, 0.0, 1.0), InvalidInput);
}

}  // namespace
}  // namespace tally::test_pipeline

namespace tally::test_pipeline {
namespace {

// Note [uneven stages]: the closed form against the discrete-event 1F1B simulation, for stages of
// different speeds (uneven layer counts, an LM head on the last stage).
TEST(Pipeline, UnevenStagesMakespanMatchesTheSimulation) {
  const std::vector<std::vector<double>> cases = {
      {1, 1, 1, 1}, {1, 2, 1, 1}, {0.5, 1, 1, 1.5}, {2, 1, 1, 1}, {1, 1, 1, 3}, {1.2, 0.7, 2.0}};
  for (const auto& t : cases)
    for (int M : {1, 2, 4, 8, 16}) {
      std::vector<double> f, b;
      for (double x : t) {
        f.push_back(x / 3);      // t_b = 2 t_f
        b.push_back(2 * x / 3);
      }
      const double sim = simulate_1f1b_makespan(f, b, M);
      const double closed = pipeline_makespan(t, M);
      // A lower bound of the schedule, and close to it.
      EXPECT_LE(closed, sim * (1 + 1e-12)) << "M " << M;
      EXPECT_GT(closed / sim, 0.9) << "M " << M << " stages " << t.size();
    }
  // Equal stages: (M + P − 1)·t, Narayanan et al. 2021 eq. 1.
  EXPECT_DOUBLE_EQ(pipeline_makespan({2, 2, 2, 2}, 8), (8 + 3) * 2.0);
  EXPECT_DOUBLE_EQ(pipeline_makespan({2, 2, 2, 2}, 8, 2), 8 * 2.0 + 3 * 2.0 / 2);
  // Slowest stage last: exact.
  EXPECT_DOUBLE_EQ(pipeline_makespan({1, 1, 1, 3}, 8),
                   simulate_1f1b_makespan({1. / 3, 1. / 3, 1. / 3, 1}, {2. / 3, 2. / 3, 2. / 3, 2}, 8));
}

// The per-stage bounds of Note [uneven stages], stage by stage: the reference for the run form.
double makespan_stage_by_stage(const std::vector<double>& t, int M, int v, double beta) {
  double total = 0;
  for (double x : t) total += x;
  double before = 0, makespan = 0;
  for (double x : t) {
    makespan = std::max({makespan, before / v + M * x, (total - x) / v + (1 - beta) * x / v +
                                                           M * beta * x});
    before += x;
  }
  return makespan;
}

// The run form (the planner's) equals the bounds taken stage by stage on the expanded stages.
TEST(Pipeline, MakespanOverRunsOfEqualStages) {
  const std::vector<std::vector<StageRun>> cases = {
      {{2, 4}},
      {{1.5, 1}, {1, 14}, {2.5, 1}},
      {{1, 1}, {1, 3}, {1.2, 5}, {0.7, 1}},
      {{3, 1}, {0.5, 1}},
      {{0.25, 1}, {0.25, 94}, {0.3, 1}, {4, 1}}};
  for (const auto& runs : cases)
    for (int M : {1, 3, 16, 64})
      for (int v : {1, 2, 4})
        for (double beta : {0.0, 2.0 / 3.0, 1.0}) {
          std::vector<double> stages;
          for (const StageRun& r : runs)
            stages.insert(stages.end(), std::size_t(r.stages), r.seconds);
          const double want = makespan_stage_by_stage(stages, M, v, beta);
          EXPECT_NEAR(pipeline_makespan(runs, M, v, beta), want, 1e-12 * want);
          EXPECT_NEAR(pipeline_makespan(stages, M, v, beta), want, 1e-12 * want);
        }
  EXPECT_DOUBLE_EQ(pipeline_makespan(std::vector<StageRun>{{2, 4}}, 8), (8 + 3) * 2.0);
  EXPECT_THROW(pipeline_makespan(std::vector<StageRun>{}, 8), InvalidInput);
  EXPECT_THROW(pipeline_makespan(std::vector<StageRun>{{1, 0}}, 8), InvalidInput);
  EXPECT_THROW(pipeline_makespan(std::vector<StageRun>{{-1, 2}}, 8), InvalidInput);
}

// stage_layer_runs: the stage_layers split as runs, the end stages alone, at most four runs.
TEST(Pipeline, StageLayerRuns) {
  std::vector<LayerRun> runs;
  auto expand = [&] {
    std::vector<int> out;
    for (const LayerRun& r : runs) out.insert(out.end(), std::size_t(r.stages), r.layers);
    return out;
  };
  auto pairs = [&] {
    std::vector<std::pair<int, int>> out;
    for (const LayerRun& r : runs) out.emplace_back(r.layers, r.stages);
    return out;
  };
  using P = std::vector<std::pair<int, int>>;
  stage_layer_runs(126, 16, 7, 7, runs);  // Llama 3 405B
  EXPECT_EQ(pairs(), (P{{7, 1}, {8, 14}, {7, 1}}));
  stage_layer_runs(70, 12, 0, 0, runs);  // BLOOM: 5, 5, then ten stages of 6
  EXPECT_EQ(pairs(), (P{{5, 1}, {5, 1}, {6, 9}, {6, 1}}));
  stage_layer_runs(96, 8, 0, 0, runs);
  EXPECT_EQ(pairs(), (P{{12, 1}, {12, 6}, {12, 1}}));
  stage_layer_runs(24, 1, 0, 0, runs);
  EXPECT_EQ(pairs(), (P{{24, 1}}));
  stage_layer_runs(5, 2, 0, 0, runs);
  EXPECT_EQ(pairs(), (P{{2, 1}, {3, 1}}));
  stage_layer_runs(9, 2, 4, 5, runs);
  EXPECT_EQ(pairs(), (P{{4, 1}, {5, 1}}));
  for (int stages = 1; stages <= 40; ++stages)
    for (int layers = stages; layers <= 130; layers += 7) {
      stage_layer_runs(layers, stages, 0, 0, runs);
      EXPECT_EQ(expand(), stage_layers(layers, stages)) << layers << " on " << stages;
      EXPECT_LE(runs.size(), 4u);
      if (stages < 3) continue;
      for (int first : {1, layers / stages - 1, layers / stages})
        for (int last : {1, layers / stages - 1, layers / stages}) {
          if (first < 1 || last < 1 || layers - first - last < stages - 2) continue;
          stage_layer_runs(layers, stages, first, last, runs);
          EXPECT_EQ(expand(), stage_layers(layers, stages, first, last))
              << layers << " on " << stages << " first " << first << " last " << last;
          EXPECT_LE(runs.size(), 4u);
          EXPECT_EQ(runs.front().stages, 1);
          EXPECT_EQ(runs.back().stages, 1);
        }
    }
}

// Llama 3 405B: 126 layers on 16 stages, one fewer on the first and the last (Dubey et al. 2024
// §3.3.2); an even split puts the two extra layers on the last stages.
TEST(Pipeline, StageLayers) {
  const auto llama = stage_layers(126, 16, 7, 7);
  EXPECT_EQ(llama.front(), 7);
  EXPECT_EQ(llama.back(), 7);
  for (int s = 1; s < 15; ++s) EXPECT_EQ(llama[std::size_t(s)], 8) << s;
  EXPECT_EQ(stage_layers(70, 12), (std::vector<int>{5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6}));
  EXPECT_EQ(stage_layers(32, 4), (std::vector<int>{8, 8, 8, 8}));
  EXPECT_EQ(stage_layers(10, 4, 1, 1), (std::vector<int>{1, 4, 4, 1}));
  EXPECT_EQ(stage_layers(11, 4, 1, 1), (std::vector<int>{1, 4, 5, 1}));
  EXPECT_THROW(stage_layers(10, 4, 5, 5), InvalidInput);  // nothing left for the middle
  EXPECT_THROW(stage_layers(3, 4), InvalidInput);
}

// ---- schedules (Note [pipeline schedules]) ----

// "F0 F1 B0 …" → ops; "F1.1" is micro-batch 1's chunk 1.
std::vector<PipelineOp> ops(const std::string& text) {
  std::vector<PipelineOp> out;
  std::size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ') { ++i; continue; }
    PipelineOp op{.kind = text[i] == 'F' ? PipelineOpKind::forward : PipelineOpKind::backward};
    std::size_t used = 0;
    op.micro_batch = std::stoi(text.substr(i + 1), &used);
    i += 1 + used;
    if (i < text.size() && text[i] == '.') {
      op.chunk = std::stoi(text.substr(i + 1), &used);
      i += 1 + used;
    }
    out.push_back(op);
  }
  return out;
}

std::string str(const std::vector<PipelineOp>& list) {
  std::string s;
  for (const auto& op : list) s += (s.empty() ? "" : " ") + to_string(op);
  return s;
}

// Narayanan et al. 2021 Fig. 4 (top), 4 devices and 8 micro-batches, renumbered from 0: device 1
// runs 4 forwards before its first backward; device 4 alternates from the start.
TEST(PipelineSchedule, OneFOneBMatchesNarayananFigure4) {
  const auto s = pipeline_schedule(PipelineSchedule::one_f_one_b, 4, 8);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(str(s[0]), str(ops("F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7")));
  EXPECT_EQ(str(s[1]), str(ops("F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7")));
  EXPECT_EQ(str(s[2]), str(ops("F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7")));
  EXPECT_EQ(str(s[3]), str(ops("F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7")));
  // P = 2, M = 3 by the same rule (one warm-up forward on stage 0).
  const auto t = pipeline_schedule(PipelineSchedule::one_f_one_b, 2, 3);
  EXPECT_EQ(str(t[0]), "F0 F1 B0 F2 B1 B2");
  EXPECT_EQ(str(t[1]), "F0 B0 F1 B1 F2 B2");
  // M < P: the warm-up is cut to M.
  const auto u = pipeline_schedule(PipelineSchedule::one_f_one_b, 4, 2);
  EXPECT_EQ(str(u[0]), "F0 F1 B0 B1");
  EXPECT_EQ(str(u[3]), "F0 B0 F1 B1");
}

// GPipe (Narayanan et al. 2021 Fig. 3): all forwards, then all backwards.
TEST(PipelineSchedule, GPipeRunsAllForwardsFirst) {
  const auto s = pipeline_schedule(PipelineSchedule::gpipe, 2, 3);
  for (const auto& stage : s) EXPECT_EQ(str(stage), "F0 F1 F2 B0 B1 B2");
  EXPECT_EQ(peak_in_flight(s[0]), 3);
}

// Interleaved, P = 2, v = 2, M = 4, worked by hand from Megatron-LM's rules (Note [pipeline
// schedules]): stage 0 warms up (2−0−1)·2 + (2−1)·2 = 4 forwards, stage 1 (2−1−1)·2 + 2 = 2;
// forward k = 0…7 runs (micro-batch, chunk) (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1),
// backward k the same micro-batches with the chunk reversed.
TEST(PipelineSchedule, InterleavedMatchesMegatronByHand) {
  const auto s = pipeline_schedule(PipelineSchedule::interleaved, 2, 4, 2);
  EXPECT_EQ(str(s[0]), "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3");
  EXPECT_EQ(str(s[1]), "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3");
  // M = P: the warm-up rule holds as it is (Megatron-Core core_r0.17.0 and PyTorch's
  // ScheduleInterleaved1F1B): stage 1 warms up (2−1−1)·2 + 2 = 2 forwards; stage 0's
  // (2−0−1)·2 + 2 = 4 are all v·M = 4. (Megatron-LM of 2021 ran every forward first on every
  // stage when M = P: stage 1 would read F0 F1 F0.1 F1.1 B0.1 B1.1 B0 B1.)
  const auto t = pipeline_schedule(PipelineSchedule::interleaved, 2, 2, 2);
  EXPECT_EQ(str(t[0]), "F0 F1 F0.1 F1.1 B0.1 B1.1 B0 B1");
  EXPECT_EQ(str(t[1]), "F0 F1 F0.1 B0.1 F1.1 B1.1 B0 B1");
  // P = 4, v = 2, M = 8 (the shape of Narayanan et al. 2021 Fig. 4, bottom): stage 0 warms up
  // 3·2 + 4 = 10 forwards — chunk 0 of micro-batches 0–3, chunk 1 of 0–3, chunk 0 of 4 and 5 —
  // then the steady state's first forward (chunk 0 of 6) and its first backward (chunk 1 of 0).
  const auto f = pipeline_schedule(PipelineSchedule::interleaved, 4, 8, 2);
  EXPECT_EQ(str({f[0].begin(), f[0].begin() + 12}),
            "F0 F1 F2 F3 F0.1 F1.1 F2.1 F3.1 F4 F5 F6 B0.1");
}

TEST(PipelineSchedule, PropertiesOverManyShapes) {
  for (auto kind : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b,
                    PipelineSchedule::interleaved})
    for (int P = 1; P <= 6; ++P)
      for (int v : {1, 2, 3})
        for (int M = 1; M <= 13; ++M) {
          if (kind != PipelineSchedule::interleaved && v > 1) continue;
          if (kind == PipelineSchedule::interleaved && M % P != 0) continue;
          SCOPED_TRACE(std::string(to_string(kind)) + " P=" + std::to_string(P) +
                       " M=" + std::to_string(M) + " v=" + std::to_string(v));
          const auto s = pipeline_schedule(kind, P, M, v);
          ASSERT_EQ(int(s.size()), P);
          for (int st = 0; st < P; ++st) {
            const auto& list = s[std::size_t(st)];
            ASSERT_EQ(int(list.size()), 2 * v * M);
            // each (micro-batch, chunk) once forward, once backward, the forward first
            std::vector<int> state(std::size_t(M * v), 0);
            for (const auto& op : list) {
              ASSERT_GE(op.micro_batch, 0);
              ASSERT_LT(op.micro_batch, M);
              ASSERT_LT(op.chunk, v);
              int& x = state[std::size_t(op.micro_batch * v + op.chunk)];
              EXPECT_EQ(x, op.kind == PipelineOpKind::forward ? 0 : 1) << to_string(op);
              ++x;
            }
            for (int x : state) EXPECT_EQ(x, 2);
            // peak in flight: GPipe M; 1F1B min(P − s, M)
            if (kind == PipelineSchedule::gpipe) {
              EXPECT_EQ(peak_in_flight(list), M);
            }
            if (kind == PipelineSchedule::one_f_one_b) {
              EXPECT_EQ(peak_in_flight(list), std::min(P - st, M));
            }
          }
          // Deadlock-free: the simulation settles every operation (else an invariant fires).
          // Equal stages (t_b = 2 t_f) give the closed form (v·M + P − 1)·(t_f + t_b)/v of
          // bubble() (Narayanan et al. 2021 eq. 1 and §2.2.2), M = P included.
          const double makespan = simulate_pipeline_makespan(
              kind, std::vector<double>(std::size_t(P), 1.0), std::vector<double>(std::size_t(P), 2.0),
              M, v);
          EXPECT_NEAR(makespan, 3.0 * (v * M + P - 1) / v, 1e-9);
        }
  EXPECT_EQ(peak_in_flight(pipeline_schedule(PipelineSchedule::one_f_one_b, 8, 16)[0]), 8);
}

// Note [long pipelines]: beyond kSimulatedMicroBatches the makespan is extrapolated from shorter
// simulations. The reference is the full simulation, forced by simulate_up_to; the stages are
// random and uneven, with chunks of no work, for 1F1B (M any count) and interleaved (M a multiple
// of P). Equal stages are checked against Narayanan et al. 2021 eq. 1 / §2.2.2 too.
TEST(Pipeline, LongPipelinesExtrapolateTheSimulation) {
  std::mt19937 rng(20261207);
  std::uniform_real_distribution<double> time(0.1, 2.0);
  constexpr int kEveryOp = 1 << 30;
  for (int trial = 0; trial < 24; ++trial) {
    const int P = 2 + trial % 7, v = 1 + trial % 3;
    std::vector<double> f(std::size_t(P * v)), b(std::size_t(P * v));
    for (std::size_t j = 0; j < f.size(); ++j) {
      f[j] = time(rng);
      b[j] = rng() % 5 == 0 ? 0.0 : 2 * time(rng);
    }
    int M = kSimulatedMicroBatches + 1 + int(rng() % 3000);
    M -= v > 1 ? M % P : 0;
    const double full = simulate_virtual_stage_makespan(f, b, P, M, kEveryOp);
    EXPECT_NEAR(simulate_virtual_stage_makespan(f, b, P, M), full, 1e-9 * full)
        << "P " << P << " v " << v << " M " << M;
  }
  // A schedule of cyclicity 2: from M = 30·P on, each P more micro-batches add 171 and 173 s in
  // turn (found by simulating M = 30P … 44P in full); a slope taken over one period of P would
  // drift by 1 s every 2P micro-batches.
  const std::vector<double> f{4, 6, 6, 8, 8, 9, 2, 1, 3}, b{15, 10, 12, 0, 14, 13, 16, 14, 14};
  for (const int M : {3 * 1801, 3 * 2500}) {  // beyond kSimulatedMicroBatches
    const double full = simulate_virtual_stage_makespan(f, b, 3, M, kEveryOp);
    EXPECT_NEAR(simulate_virtual_stage_makespan(f, b, 3, M), full, 1e-9 * full) << "M " << M;
  }
  // 2^24 micro-batches of equal stages (t_f 1, t_b 2): (M + P − 1)·3 for 1F1B, M·3 + (P − 1)·3/v
  // interleaved; without the extrapolation this would be 2^24 · 2 · P·v simulated operations.
  const int M = 1 << 24;
  EXPECT_NEAR(simulate_pipeline_makespan(PipelineSchedule::one_f_one_b, {1, 1, 1, 1}, {2, 2, 2, 2},
                                         M),
              (M + 3) * 3.0, 1e-12 * M);
  EXPECT_NEAR(simulate_pipeline_makespan(PipelineSchedule::interleaved, {1, 1, 1, 1}, {2, 2, 2, 2},
                                         M, 2),
              M * 3.0 + 3 * 3.0 / 2, 1e-12 * M);
  // The shape rules still name the caller's count.
  try {
    simulate_pipeline_makespan(PipelineSchedule::interleaved, {1, 1, 1, 1}, {2, 2, 2, 2}, M + 2,
                               2);
    ADD_FAILURE();
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(M + 2)), std::string::npos) << e.what();
  }
}

TEST(PipelineSchedule, RejectsBadShapes) {
  EXPECT_THROW(pipeline_schedule(PipelineSchedule::interleaved, 4, 6, 2), InvalidInput);
  EXPECT_THROW(pipeline_schedule(PipelineSchedule::one_f_one_b, 4, 8, 2), InvalidInput);
  EXPECT_THROW(pipeline_schedule(PipelineSchedule::gpipe, 0, 8), InvalidInput);
  EXPECT_THROW(pipeline_schedule(PipelineSchedule::gpipe, 2, 0), InvalidInput);
}

}  // namespace
}  // namespace tally::test_pipeline
