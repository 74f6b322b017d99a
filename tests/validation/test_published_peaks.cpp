// tally's per-GPU memory against published peaks (issue 10, "Memory peaks that real runs hit"):
// tests/data/published_memory_peaks.json holds training runs whose source prints their peak memory
// beside the layout that produced it — torchtitan's benchmark tables (Llama 3.1 8B / 70B / 405B on
// H100 with FSDP, TP, PP and CP; Llama 3.1 8B on H200), each row citing repository, path, commit and
// table. Every run is predicted with its published layout fixed (GPUs, FSDP/TP/PP/CP degrees, local
// batch, pipeline micro-batches and stage split, sequence, activation checkpointing, precision, and
// the loss as that commit runs it) and nothing fitted to it.
//
// What is compared: every source here publishes *reserved* memory (torch.cuda.max_memory_reserved,
// torchtitan's "memory" metric), which counts the caching allocator's cached and split blocks but not
// the CUDA context. tally's counterpart is its held memory minus the runtime (Note [reserved memory]
// in planner.hpp): allocated · (1 + allocator allowance) = total_bytes − runtime_bytes.
//
// How the published policies map onto tally's (docs/ledgers.md §2):
//   torchtitan full AC (one checkpoint_wrapper per block)  → full (layer inputs + the replayed layer)
//   torchtitan selective op AC (saves SDPA outputs and every other mm's)  → op-sac
//   torchtitan FSDP2 over dp_shard × cp                      → ZeRO-3 over dp·cp (under PP the stage
//     stays unsharded with fp32 gradients: buffer_bytes in planner.hpp)
//   cross_entropy(pred.float()) uncompiled (torchtitan 9dec370, the 2024 tables)  → --loss eager
//   the loss compiled (the 2025 tables)                      → --loss fused
//   Float8 (torchao Float8Linear)                            → --precision fp8
//   torch.compile of the blocks                              → not modelled (one prediction for a
//                                                              compiled row and its eager twin)
//
// The goal, stated before the rows were first predicted: the complaint was full recompute
// under-predicted by about half (a factor 2), which a planner deciding "does it fit" on an 80–96 GB
// card cannot live with. Irreducible spread the ledgers do not model: the allocator allowance
// (reserved / allocated − 1) ranges 0.02–0.115 across measured runs while tally takes the top of it;
// torch.compile alone moves a published peak by 6–8 % (Tables 1 and 3). So: median |error| ≤ 20 %
// (twice that spread), and every row within a factor 1.5 either way — tight enough that the
// factor-2 miss of the issue fails. At first (before the three gaps below were modelled) 19 rows
// gave median |error| 39 %, worst 0.42; the fixes, each a behaviour read from torchtitan's and
// PyTorch's code at the benchmarked commit (nothing fitted), brought it to 2.8 % and 0.82. Since
// the gaps were found by looking at these rows, they are now a development set, not a test of
// accuracy on runs kept aside:
//   eager loss     torchtitan 9dec370 runs cross-entropy uncompiled on pred.float(): the saved fp32
//                  log-softmax, the fp32 NLL gradient and log-softmax's fp32 input gradient are
//                  alive together, 12sbV/t (ActivationSetup::eager_loss) where a fused loss keeps
//                  4sbV/t.
//   FSDP under PP  torchtitan sets reshard_after_forward = False and torch.distributed.pipelining
//                  defers resharding and the gradient reduce-scatter to the last micro-batch: the
//                  stage's bf16 parameters and fp32 gradients stay unsharded.
//   op SAC         torchtitan's op-level SAC recomputes every second mm (wk, wo, w3): the op-sac
//                  policy (types.hpp) keeps ≈ 15.5·h bytes per token and layer where save-matmuls
//                  keeps 23·h.
// Left unexplained (tally_diagnosis in the fixture): the 70B TP rows (−12 … −18 %) and the 405B peak
// rising 13 % from CP 1 to CP 8.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "torchtitan_rows.hpp"
#include "tally/core/planner.hpp"
#include "tally/core/presets.hpp"
#include "tally/core/types.hpp"

namespace tally::test_published_peaks {
namespace {

const nlohmann::json& peaks() { return fixture("published_memory_peaks.json"); }

double unit_bytes(const std::string& unit) {
  if (unit == "GiB") return kGiB;
  if (unit == "GB") return 1e9;
  throw InvalidInput("published_memory_peaks.json: unit '" + unit + "' is neither GiB nor GB");
}

// One published peak and tally's prediction of it, in bytes; `why` is set when tally cannot express
// the layout (no prediction).
struct Peak {
  std::string label, kind, why;
  double predicted = 0, published = 0;
  double states = 0, activations = 0, buffers = 0;  // tally's allocated, itemised
  double ratio() const { return predicted / published; }
};

Peak predict(const nlohmann::json& run) {
  Peak p{.label = run["label"], .kind = run["kind"],
         .published = run["peak"].get<double>() * unit_bytes(run["unit"])};
  const PlanRequest q = published_request(run);
  const Layout L = published_layout(run);
  try {
    const PlanEval e = evaluate_layout(q, L);
    // Reserved ↔ held minus the CUDA runtime; allocated ↔ allocated.
    p.predicted = p.kind == "allocated" ? e.allocated_bytes : e.total_bytes - e.runtime_bytes;
    p.states = e.states.total();
    p.activations = e.activation_bytes;
    p.buffers = e.buffer_bytes;
  } catch (const InvalidInput& err) {
    p.why = err.what();
  }
  return p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<Peak> all_peaks() {
  std::vector<Peak> out;
  for (const auto& run : peaks()["runs"]) out.push_back(predict(run));
  return out;
}

// Every row has a source with a commit and a table, a known unit and kind, and a layout whose
// degrees multiply to its GPU count.
TEST(PublishedPeaks, FixtureRowsAreComplete) {
  ASSERT_GE(peaks()["runs"].size(), 14u);
  for (const auto& run : peaks()["runs"]) {
    const std::string label = run["label"];
    EXPECT_EQ(run["source"]["commit"].get<std::string>().size(), 40u) << label;
    EXPECT_FALSE(run["source"]["table"].get<std::string>().empty()) << label;
    EXPECT_TRUE(run["kind"] == "reserved" || run["kind"] == "allocated") << label;
    EXPECT_NO_THROW(unit_bytes(run["unit"])) << label;
    EXPECT_EQ(run["dp"].get<int>() * run["tp"].get<int>() * run["pp"].get<int>() *
                  run["cp"].get<int>(), run["gpus"].get<int>()) << label;
    EXPECT_EQ(run["dp"].get<std::int64_t>() * run["micro_batch"].get<std::int64_t>() *
                  run["grad_accum"].get<std::int64_t>(), run["global_batch"].get<std::int64_t>())
        << label;
  }
}

// Prints every row and returns the median |error| and the worst ratio (furthest from 1, either way).
struct Summary {
  double median_error = 0, worst = 1;
  std::size_t rows = 0, inexpressible = 0;
};
Summary report(const std::vector<Peak>& rows) {
  std::printf("  %-44s %9s %9s %8s   (tally GiB: states + activations + buffers)\n",
              "run (published reserved)", "tally GiB", "published", "error");
  Summary s;
  std::vector<double> errors;
  for (const Peak& p : rows) {
    if (!p.why.empty()) {
      std::printf("  %-44s not expressible: %s\n", p.label.c_str(), p.why.c_str());
      ++s.inexpressible;
      continue;
    }
    std::printf("  %-44s %9.1f %9.1f %+7.1f %%   (%.1f + %.1f + %.1f)\n", p.label.c_str(),
                p.predicted / kGiB, p.published / kGiB, 100 * (p.ratio() - 1), p.states / kGiB,
                p.activations / kGiB, p.buffers / kGiB);
    errors.push_back(std::fabs(p.ratio() - 1));
    if (std::fabs(std::log(p.ratio())) > std::fabs(std::log(s.worst))) s.worst = p.ratio();
  }
  s.rows = errors.size();
  if (!errors.empty()) s.median_error = median(errors);
  std::printf("  %zu rows, median |error| %.1f %%, worst predicted/published %.2f, %zu not expressible\n",
              s.rows, 100 * s.median_error, s.worst, s.inexpressible);
  return s;
}

TEST(PublishedPeaks, PredictionsAgainstPublishedPeaks) {
  const auto rows = all_peaks();
  const Summary s = report(rows);
  ASSERT_GT(s.rows, 0u);
  const auto& runs = peaks()["runs"];
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Peak& p = rows[i];
    if (!p.why.empty()) continue;
    EXPECT_TRUE(std::isfinite(p.predicted) && p.predicted > 0) << p.label;
    const std::string sign = runs[i]["tally_diagnosis"]["expected_sign"];
    if (sign == "under") {
      EXPECT_LT(p.ratio(), 1.0) << p.label << ": diagnosed as under-predicted";
    } else if (sign == "over") {
      EXPECT_GT(p.ratio(), 1.0) << p.label << ": diagnosed as over-predicted";
    }
    // The goal (header): every row within a factor 1.5 either way.
    EXPECT_LE(p.ratio(), 1.5) << p.label;
    EXPECT_GE(p.ratio(), 1 / 1.5) << p.label;
  }
  EXPECT_LE(s.median_error, 0.20);
  // Only the interleaved 405B run (126 layers on 16 virtual stages) is outside what tally's layouts
  // express today (uneven stages need interleave 1).
  EXPECT_LE(s.inexpressible, 1u);
}

}  // namespace
}  // namespace tally::test_published_peaks
