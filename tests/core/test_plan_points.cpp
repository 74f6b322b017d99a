// Note [plan points]: the bounded sample of costed layouts and the feasible Pareto frontier that
// `tally plan --html` draws. Expected frontiers come from a brute-force O(n²) dominance check in the
// test; expected sample indices are worked out by hand below.
#include "tally/core/plan_points.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "tally/core/presets.hpp"

namespace tally::test_plan_points {
namespace {

PlanEval eval(double step_s, double bytes, bool fits) {
  PlanEval e;
  e.step_s = step_s;
  e.total_bytes = bytes;
  e.fits = fits;
  return e;
}

// The brute-force frontier: fitting points no other fitting point dominates (<= in both, < in one);
// of exact duplicates only the first offered.
std::set<std::uint64_t> brute_frontier(const std::vector<PlanEval>& es) {
  std::set<std::uint64_t> out;
  for (std::size_t i = 0; i < es.size(); ++i) {
    if (!es[i].fits) continue;
    bool dominated = false;
    for (std::size_t j = 0; j < es.size() && !dominated; ++j) {
      if (j == i || !es[j].fits) continue;
      const bool le = es[j].step_s <= es[i].step_s && es[j].total_bytes <= es[i].total_bytes;
      const bool lt = es[j].step_s < es[i].step_s || es[j].total_bytes < es[i].total_bytes;
      dominated = le && (lt || j < i);
    }
    if (!dominated) out.insert(i);
  }
  return out;
}

TEST(PlanPoints, FrontierMatchesBruteForce) {
  // A deterministic scatter with ties (steps and bytes on a coarse grid) and infeasible points.
  std::vector<PlanEval> es;
  std::uint64_t x = 12345;
  for (int i = 0; i < 400; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    // anti-correlated, as layouts trade memory for time: a long staircase
    const double step = double((x >> 33) % 50) + 1;
    const double bytes = (51 - step) + double((x >> 13) % 8);
    es.push_back(eval(step, bytes, ((x >> 7) % 5) != 0));
  }
  PointCollector c(1000);  // room for everything: no sampling
  for (const auto& e : es) c.add(e);
  const auto pts = c.points();
  ASSERT_EQ(pts.size(), es.size());
  EXPECT_FALSE(c.sampled());
  std::set<std::uint64_t> got;
  for (std::size_t i = 0; i < pts.size(); ++i) {
    EXPECT_EQ(pts[i].index, i);  // search order, each once
    if (pts[i].frontier) got.insert(pts[i].index);
  }
  EXPECT_EQ(got, brute_frontier(es));
  EXPECT_GE(got.size(), 2u);
}

// Reservoir sampling: cap distinct layouts, deterministic, and uniform over the search order —
// each of 100 000 offered is kept with probability 1000/100 000, so each tenth of the order holds
// ≈ 100 of the 1000 (binomial σ = √(1000 · 0.1 · 0.9) ≈ 9.5; ±5σ allowed) and the mean index is
// ≈ 50 000 (σ = 100 000 / √(12 · 1000) ≈ 913; ±5σ).
TEST(PlanPoints, SampleIsUniformAndDeterministic) {
  PointCollector a(1000), b(1000);
  for (int i = 0; i < 100000; ++i) {
    a.add(eval(1, 1, false));
    b.add(eval(1, 1, false));
  }
  const auto pa = a.points(), pb = b.points();
  ASSERT_EQ(pa.size(), 1000u);
  EXPECT_TRUE(a.sampled());
  EXPECT_EQ(a.seen(), 100000u);
  std::set<std::uint64_t> distinct;
  double mean = 0;
  int tenths[10] = {};
  for (std::size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].index, pb[i].index);  // the same search, the same sample
    if (i > 0) {
      EXPECT_LT(pa[i - 1].index, pa[i].index);  // search order
    }
    distinct.insert(pa[i].index);
    mean += double(pa[i].index) / 1000;
    ++tenths[pa[i].index / 10000];
  }
  EXPECT_EQ(distinct.size(), 1000u);
  EXPECT_NEAR(mean, 50000, 5 * 913);
  for (int t : tenths) EXPECT_NEAR(t, 100, 48);
}

// With room for every layout, nothing is sampled away.
TEST(PlanPoints, SmallSearchesKeepEveryLayout) {
  PointCollector c(50);
  for (int i = 0; i < 50; ++i) c.add(eval(1, 1, false));
  EXPECT_EQ(c.points().size(), 50u);
  EXPECT_FALSE(c.sampled());
  c.add(eval(1, 1, false));
  EXPECT_EQ(c.points().size(), 50u);
  EXPECT_TRUE(c.sampled());
}

// A frontier layout outside the sample is still a point.
TEST(PlanPoints, FrontierSurvivesSampling) {
  PointCollector c(4);
  for (int i = 0; i < 40; ++i) c.add(eval(100 - i, 50, false));  // infeasible
  c.add(eval(7, 3, true));                                       // index 40
  // whether or not the reservoir took it, it is a point, flagged
  const auto pts = c.points();
  const auto it = std::find_if(pts.begin(), pts.end(), [](const PlanPoint& p) { return p.index == 40; });
  ASSERT_NE(it, pts.end());
  EXPECT_TRUE(it->frontier);
  EXPECT_TRUE(it->fits);
  EXPECT_LE(pts.size(), 4u + 1u);
  EXPECT_EQ(std::count_if(pts.begin(), pts.end(), [](const PlanPoint& p) { return p.frontier; }), 1);
}

TEST(PlanPoints, ZeroCapKeepsNothing) {
  PointCollector c(0);
  for (int i = 0; i < 5; ++i) c.add(eval(i + 1, 5 - i, true));
  EXPECT_TRUE(c.points().empty());
  EXPECT_EQ(c.seen(), 5u);
}

// The planner's points: bounded, the chosen plan on the frontier, and the ranking unchanged.
TEST(PlanPoints, PlannerKeepsTheCostedLayouts) {
  const PlanRequest r{.model = *model_preset("seed-7b"), .cluster = *cluster_preset("a100-80g"),
                      .gpus = 8, .global_batch = 256, .seq = 2048};
  const PlanResult none = plan(r);
  EXPECT_TRUE(none.points.empty());
  const PlanResult all = plan(r, SearchSpace{.max_points = 1'000'000});
  ASSERT_TRUE(all.feasible());
  EXPECT_EQ(all.points.size(), all.evaluated);  // room for every one
  EXPECT_FALSE(all.points_sampled);
  ASSERT_EQ(all.best.size(), none.best.size());
  for (std::size_t i = 0; i < all.best.size(); ++i)
    EXPECT_EQ(all.best[i].layout.describe(), none.best[i].layout.describe());
  const PlanEval& b = all.best.front();
  const auto chosen = std::find_if(all.points.begin(), all.points.end(), [&](const PlanPoint& p) {
    return p.frontier && p.step_s == b.step_s && p.total_bytes == b.total_bytes;
  });
  EXPECT_NE(chosen, all.points.end()) << "the fastest fitting layout is on the frontier";
  std::size_t fits = 0;
  for (const auto& p : all.points) fits += p.fits;
  EXPECT_GT(fits, 0u);
  EXPECT_LT(fits, all.points.size());  // the pruned search also costs the first misfit per loop

  const PlanResult few = plan(r, SearchSpace{.max_points = 64});
  EXPECT_TRUE(few.points_sampled);
  std::size_t sample = 0;
  for (const auto& p : few.points) sample += !p.frontier;
  EXPECT_LE(sample, 64u);
  EXPECT_LE(few.points.size(), 64u + 64u);
  EXPECT_EQ(few.best.front().layout.describe(), b.layout.describe());
}

}  // namespace
}  // namespace tally::test_plan_points
