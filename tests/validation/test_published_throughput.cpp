// The operator time model judged on runs kept aside (issue 10: "Other published runs are kept
// aside to judge the model"; issue 15: torchtitan's benchmark tables "are kept aside to judge it —
// do not fit to them"). The rows are those of tests/data/published_memory_peaks.json — torchtitan's
// Llama 3.1 8B / 70B / 405B on 8–512 H100s (Dec 2024) and 8B on 32–64 H200s (June 2025) — whose
// tables print TPS/GPU beside the peak memory. Each is predicted with its published layout fixed
// (torchtitan_rows.hpp, the same reading the memory test uses) and tally's defaults otherwise:
// overlap as the frameworks do it (FSDP's reduce-scatter behind backward, its all-gathers ahead of
// use), AsyncTP where the table names it (tp_overlap), Float8 as --precision fp8 with FSDP's
// float8 all-gather where the run's configuration or its documented launch sets it
// (fsdp_float8_all_gather_source on each row), flash attention.
// No constant, preset or switch was chosen by looking at these rows' throughput.
//
// TPS/GPU as torchtitan logs it: global tokens per second over all GPUs (train.py at 9dec370:
// labels.numel() / (time · cp · tp · pp) on each DP rank) = global_batch · seq / (step · G).
//
// The goal, written down before the first prediction of these rows: median |error| of TPS/GPU
// ≤ 25 % and every row within a factor 2 either way. Known confounders, none modelled:
//   - the Dec 2024 H100s run at 500 W with HBM2e; their tensor-core peak is unpublished ("between
//     SXM and NVL"), so the SXM preset's peak stands (fast bias); the published 2.4 TB/s is used;
//   - torch.compile's fusions (Tables 1 and 3 show it worth +16 %); compiled and eager twins get
//     one prediction;
//   - torchao's dynamic-scaling Float8 casts (extra passes over weights and activations) against
//     tally's fp8 recipe, whose GEMMs take bf16's efficiencies at the fp8 peak (fast bias).
// This test prints the judgement and guards only against a broken model (every row finite and
// within a factor 3); the goal is reported, not asserted, so that a miss cannot be "fixed" by
// tuning to the rows (README and docs/ledgers.md §5 give the result).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "torchtitan_rows.hpp"

namespace tally::test_published_throughput {
namespace {

struct Throughput {
  std::string label, why;
  double predicted = 0, published = 0;  // tokens per second per GPU
  PlanEval eval;
  double ratio() const { return predicted / published; }
};

std::vector<Throughput> all_rows() {
  std::vector<Throughput> out;
  for (const auto& run : fixture("published_memory_peaks.json")["runs"]) {
    Throughput t{.label = run["label"], .published = run["tps_per_gpu"].get<double>()};
    try {
      const PlanRequest q = published_request(run);
      t.eval = evaluate_layout(q, published_layout(run));
      t.predicted = double(q.global_batch) * double(q.seq) / (t.eval.step_s * q.gpus);
    } catch (const InvalidInput& err) {
      t.why = err.what();
    }
    out.push_back(t);
  }
  return out;
}

TEST(PublishedThroughput, TorchtitanTablesKeptAside) {
  const auto rows = all_rows();
  std::printf("  %-44s %8s %9s %8s   step s = compute + TP + CP + PP + DP exposed + bubble\n",
              "run (published TPS/GPU)", "tally", "published", "error");
  std::vector<double> errors;
  double worst = 1;
  std::size_t inexpressible = 0;
  for (const Throughput& t : rows) {
    if (!t.why.empty()) {
      std::printf("  %-44s not expressible: %s\n", t.label.c_str(), t.why.c_str());
      ++inexpressible;
      continue;
    }
    const PlanEval& e = t.eval;
    std::printf("  %-44s %8.0f %9.0f %+7.1f %%   %.2f = %.2f + %.2f + %.2f + %.2f + %.2f + %.2f\n",
                t.label.c_str(), t.predicted, t.published, 100 * (t.ratio() - 1), e.step_s,
                e.compute_s, e.tp_s, e.cp_s, e.pp_s, e.dp_exposed_s, e.bubble_s);
    EXPECT_TRUE(std::isfinite(t.predicted) && t.predicted > 0) << t.label;
    // The guard (header): a factor 3 either way means the model is broken, not merely off.
    EXPECT_LT(t.ratio(), 3.0) << t.label;
    EXPECT_GT(t.ratio(), 1 / 3.0) << t.label;
    errors.push_back(std::fabs(t.ratio() - 1));
    if (std::fabs(std::log(t.ratio())) > std::fabs(std::log(worst))) worst = t.ratio();
  }
  ASSERT_FALSE(errors.empty());
  const double med = median(errors);
  std::printf("  %zu rows, median |error| %.1f %%, worst predicted/published %.2f, %zu not "
              "expressible; goal (stated first): median <= 25 %%, every row within 2x: %s\n",
              errors.size(), 100 * med, worst, inexpressible,
              med <= 0.25 && std::fabs(std::log(worst)) <= std::log(2.0) ? "met" : "NOT met");
  EXPECT_LE(inexpressible, 1u);  // the interleaved 405B run (126 layers on 16 virtual stages)
}

// Note [error band] in planner.hpp: what a plan on an H100 or H200 prints as "expect" is exactly
// these rows' range of measured / predicted (published step / predicted step = predicted TPS /
// published TPS), and its rank spread the widest within one published table.
TEST(PublishedThroughput, HopperErrorBandIsTheseRows) {
  const auto rows = all_rows();
  const auto& runs = fixture("published_memory_peaks.json")["runs"];
  std::vector<double> ratios;
  std::map<std::string, std::vector<double>> by_table;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].why.empty()) continue;
    ratios.push_back(rows[i].ratio());
    const auto& src = runs[i]["source"];
    by_table[src["path"].get<std::string>() + " " + src["table"].get<std::string>()].push_back(
        rows[i].ratio());
  }
  double rank_spread = 0;
  for (const auto& [table, r] : by_table) {
    const auto [lo, hi] = std::minmax_element(r.begin(), r.end());
    rank_spread = std::max(rank_spread, *hi / *lo - 1);
  }
  const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
  for (const char* gpu : {"h100-80g", "h200"}) {
    SCOPED_TRACE(gpu);
    const auto band = step_time_band(TimeModel::operators, cluster_preset(gpu)->gpu);
    ASSERT_TRUE(band.has_value());
    expect_band_is(*band, *lo, *hi, median(ratios), rank_spread);
  }
  // A GPU no published run checks (a cluster file's) gets Hopper's band, and says so.
  GpuSpec own = cluster_preset("h100-80g")->gpu;
  own.name = "my-accelerator";
  const auto other = step_time_band(TimeModel::operators, own);
  ASSERT_TRUE(other.has_value());
  EXPECT_NEAR(other->high, *hi, 0.01);
  EXPECT_NE(std::string(other->source).find("no published run checks this GPU"), std::string::npos);
  EXPECT_NE(std::string(other->runs).find("no published run on this GPU"), std::string::npos);
}

}  // namespace
}  // namespace tally::test_published_throughput
