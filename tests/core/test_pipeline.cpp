// The pipeline bubble against the seed's figures (seed §A3), the 1F1B simulator, and properties.
#include "tally/core/pipeline.hpp"

#include <gtest/gtest.h>

#include "tally/core/types.hpp"

namespace tally {
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
}  // namespace tally

namespace tally {
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

}  // namespace
}  // namespace tally
