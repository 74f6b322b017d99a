// The operator time model judged on a third set of runs kept aside (issue 15: "NVIDIA's
// Megatron-Bridge / NeMo performance summaries and torchtitan's benchmark tables are kept aside to
// judge it — do not fit to them"): Megatron-Bridge's performance summary, 26.04.01 NeMo container
// (docs/performance-summary.md at v0.4.2, c810129341a84e58f4cbed3093f70668a088c028; the same rows
// in the archive page on main), all 47 pre-training rows: Llama 3 70B, Llama 3.1 405B,
// DeepSeek-V3, GPT-OSS 120B, Qwen3 30B-A3B and 235B-A22B, Kimi K2, Nemotron 3 Nano and Super on
// DGX-GB300, GB200, B300, B200 and H100, in BF16, FP8 (current scaling), MXFP8 and NVFP4 — the
// first published runs on Blackwell, on MoE models and in the block-scaled formats that judge
// tally. Each row tally can express is predicted with its layout fixed and the recipe it ran read
// from scripts/performance at the same commit (megatron_bridge_rows.hpp); the others are listed
// with the reason. No constant, preset or switch was chosen by looking at these rows' throughput.
//
// Tokens/s per GPU: the table's Tokens / sec / GPU; tally's = GBS · seq / (step · G).
//
// The goal, written down before the first prediction of these rows: per system × precision
// group, median |error| of tokens/s per GPU ≤ 25 % and every row within a factor 2 either way.
// Known confounders, none modelled (read from the recipes and tally's presets):
//   - Blackwell's kernel constants: B200's bf16 and fp8 GEMM fits to XLA's table, scaled to the
//     other parts' peaks (B300, GB200, GB300: no measured table); MXFP8 GEMMs take the fp8 fit,
//     NVFP4 GEMMs bf16's fractions at the fp4 peak (no measured fp4 table); attention at Hopper's
//     FlashAttention-2 fractions (cuDNN's Blackwell kernels unpublished here) — bias unknown;
//   - CUDA graphs (cuda_graph_impl transformer_engine on some MoE rows) against tally's 2 µs per
//     kernel launch (slow bias where the graphs run);
//   - HybridEP / DeepEP dispatchers (flex backend) against tally's NCCL all-to-all; Megatron's
//     TP comm overlap where the recipe sets it is tally's tp_overlap (hidden);
//   - activation offloading to the Grace CPU in the Llama 3 70B FSDP rows (cpu_offloading_num_layers
//     20 on GB300, 40 on GB200): tally times the layout without it (fast bias if not hidden);
//   - GPT-OSS's sliding-window attention (128 tokens) on every other layer and its learnable
//     softmax sinks: tally times full causal attention on all 36 layers (slow bias);
//   - fp8 current scaling takes each tensor's amax in a pass before its cast; tally's fp8 casts
//     are delayed scaling's, amax fused into the cast (fast bias, FP8 rows only);
//   - Hopper's fp8 GEMMs at bf16's efficiency fractions (fast bias, H100 FP8 rows).
// This test prints the judgement and asserts only what guards a broken model (every predicted row
// finite and within a factor 3), the fixture's completeness and which rows are predicted; the goal
// is reported, not asserted, so that a miss cannot be "fixed" by tuning to the rows (README and
// docs/ledgers.md §5 give the result). The table gives no parameter counts, so none is checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "megatron_bridge_rows.hpp"
#include "tally/core/compute.hpp"
#include "tally/core/planner.hpp"
#include "tally/core/presets.hpp"

namespace tally::test_published_bridge {
namespace {

const nlohmann::json& data() { return fixture("megatron_bridge_perf.json"); }

struct Row {
  const nlohmann::json* run = nullptr;
  std::string label, group, why;  // why: the reason it is not predicted (empty: predicted)
  double predicted = 0, published = 0;  // tokens per second per GPU
  PlanEval eval;
  double ratio() const { return predicted / published; }
};

std::string short_system(const std::string& s) { return s.substr(s.find('-') + 1); }

std::vector<Row> all_rows() {
  std::vector<Row> out;
  for (const auto& run : data()["runs"]) {
    Row r{.run = &run, .published = run["tokens_per_s_per_gpu"].get<double>()};
    char label[112];
    std::snprintf(label, sizeof label, "%-15s %-5s %-5s G%-4d TP%d PP%-2d CP%d VP%-2d EP%-2d b%d",
                  run["model"].get<std::string>().c_str(),
                  short_system(run["system"]).c_str(), run["precision"].get<std::string>().c_str(),
                  run["gpus"].get<int>(), run["tp"].get<int>(), run["pp"].get<int>(),
                  run["cp"].get<int>(), bridge_int(run["vp"], 1), bridge_int(run["ep"], 1),
                  run["mbs"].get<int>());
    r.label = label;
    if (run["fsdp"].get<int>() > 0) r.label += " FSDP";
    r.group = short_system(run["system"]) + " " + run["precision"].get<std::string>();
    r.why = bridge_skip_reason(run);
    if (r.why.empty()) {
      try {
        const PlanRequest q = bridge_request(run);
        r.eval = evaluate_layout(q, bridge_layout(run, q.model));
        r.predicted = double(q.global_batch) * double(q.seq) / (r.eval.step_s * q.gpus);
      } catch (const InvalidInput& err) {
        r.why = err.what();
      }
    }
    out.push_back(r);
  }
  return out;
}

// The fixture holds every pre-training row of the 26.04.01 tables (counted on the page: 7 Llama
// 3 70B, 7 Llama 3.1 405B, 4 DeepSeek-V3, 5 GPT-OSS 120B, 5 Qwen3 30B, 5 Qwen3 235B, 1 Kimi K2,
// 5 Nemotron 3 Nano, 8 Nemotron 3 Super), each consistent with itself and with its recipe.
TEST(PublishedBridge, FixtureIsComplete) {
  EXPECT_EQ(data()["source"]["commit"], "c810129341a84e58f4cbed3093f70668a088c028");
  EXPECT_EQ(data()["container"], "26.04.01");
  std::map<std::string, int> per_model;
  for (const auto& run : data()["runs"]) {
    const std::string model = run["model"];
    ++per_model[model];
    SCOPED_TRACE(model + " on " + run["system"].get<std::string>() + " " +
                 run["precision"].get<std::string>());
    const int g = run["gpus"], tp = run["tp"], pp = run["pp"], cp = run["cp"];
    ASSERT_EQ(g % (tp * pp * cp), 0);
    const std::int64_t dp = bridge_dp(run), mbs = run["mbs"], gbs = run["gbs"];
    EXPECT_EQ(gbs % (dp * mbs), 0) << "GA = GBS / (MBS · DP) must be whole";
    const int fsdp = run["fsdp"];  // "sharding group size = #GPUs / (TP × PP)", or 0
    EXPECT_TRUE(fsdp == 0 || fsdp == g / (tp * pp)) << fsdp;
    EXPECT_FALSE(bridge_cluster(run["system"]).empty());
    EXPECT_TRUE(cluster_preset(bridge_cluster(run["system"])).has_value());
    EXPECT_NO_THROW(bridge_precision(run["precision"]));
    EXPECT_GT(run["tokens_per_s_per_gpu"].get<double>(), 0);
    EXPECT_GT(run["model_tflops_per_gpu"].get<double>(), 0);
    // A row tally may predict carries the recipe of its own system and precision.
    if (bridge_model_preset(model)) {
      ASSERT_TRUE(run.contains("recipe"));
      const std::string config = run["recipe"]["config"], p = run["precision"];
      const std::string code = p == "FP8" ? "FP8_CS" : p == "MXFP8" ? "FP8_MX" : p;
      EXPECT_NE(config.find("_" + std::string(run["system"]).substr(4) + "_" + code + "_"),
                std::string::npos) << config;
    }
  }
  const std::map<std::string, int> expected = {
      {"LLAMA3_70B", 7}, {"LLAMA3.1_405B", 7}, {"DeepSeekV3", 4}, {"GPT OSS 120B", 5},
      {"Qwen3_30B_a3B", 5}, {"Qwen3_235B_a22B", 5}, {"Kimi_K2", 1}, {"Nemotron_3_Nano", 5},
      {"Nemotron_3_Super", 8}};
  EXPECT_EQ(per_model, expected);
  EXPECT_EQ(data()["runs"].size(), 47u);
}

// What of the recipe tally does not model, in a few words per row (the header's confounders).
std::string recipe_notes(const nlohmann::json& run) {
  const auto& rc = run["recipe"];
  std::string n;
  auto add = [&](const std::string& s) { n += (n.empty() ? "" : ", ") + s; };
  if (rc.value("cuda_graph_impl", "none") != "none") add("CUDA graphs");
  if (!rc["cpu_offloading_num_layers"].is_null())
    add("offload " + std::to_string(rc["cpu_offloading_num_layers"].get<int>()) + " layers");
  if (rc.value("moe_a2a_overlap", false)) add("a2a overlap");
  if (rc["dispatcher"].is_string() && rc["dispatcher"] != "alltoall")
    add(rc["dispatcher"].get<std::string>());
  if (bridge_recompute(rc) == Recompute::save_matmuls) add("recompute ln+act");
  if (bridge_recompute_modules(rc).mla_up_proj) add("recompute mla_up_proj");
  if (bridge_recompute_modules(rc).dense_mlp) add("recompute mlp");
  return n.empty() ? "-" : n;
}

TEST(PublishedBridge, MegatronBridgeTablesKeptAside) {
  const auto rows = all_rows();
  std::printf("  %-62s %6s %9s %5s %5s %9s %7s  step s = compute + TP + CP + PP + EP + DP exposed "
              "+ bubble; recipe not modelled\n", "row (published tokens/s/GPU)", "tally",
              "published", "ratio", "MFU", "held/GB", "GF/tok");
  std::map<std::string, std::vector<double>> by_group;
  std::vector<double> all;
  std::vector<const Row*> skipped;
  for (const Row& r : rows) {
    if (!r.why.empty()) {
      skipped.push_back(&r);
      continue;
    }
    const PlanEval& e = r.eval;
    // held/GB: what tally says the layout holds per GPU over what the GPU offers (Note [does it
    // fit]). GF/tok: tally's model FLOPs per token (6N + 12·L·h·s, attention unmasked) over the
    // table's (Model TFLOP/s ÷ tokens/s) — NVIDIA's count is not tally's; printed, not asserted.
    const auto& run = *r.run;
    const double published_gf = run["model_tflops_per_gpu"].get<double>() * 1e3 / r.published;
    const double tally_gf =
        flops_per_token(*model_preset(*bridge_model_preset(run["model"])), run["seq"],
                        Recompute::none) / 1e9;
    std::printf("  %-62s %6.0f %9.0f %5.2f %4.1f%% %4.0f/%-4.0f %3.0f/%-3.0f  %.3g = %.3g + %.2g + "
                "%.2g + %.2g + %.2g + %.2g + %.2g; %s\n",
                r.label.c_str(), r.predicted, r.published, r.ratio(), 100 * e.mfu,
                e.total_bytes / 1e9, e.usable_bytes / 1e9, tally_gf, published_gf, e.step_s,
                e.compute_s, e.tp_s, e.cp_s, e.pp_s, e.ep_s, e.dp_exposed_s, e.bubble_s,
                recipe_notes(run).c_str());
    EXPECT_TRUE(std::isfinite(r.predicted) && r.predicted > 0) << r.label;
    // The guard (header): a factor 3 either way means the model is broken, not merely off.
    EXPECT_LT(r.ratio(), 3.0) << r.label;
    EXPECT_GT(r.ratio(), 1 / 3.0) << r.label;
    by_group[r.group].push_back(r.ratio());
    all.push_back(r.ratio());
  }
  std::printf("  not predicted (%zu rows):\n", skipped.size());
  for (const Row* r : skipped) std::printf("    %s: %s\n", r->label.c_str(), r->why.c_str());
  std::printf("  predicted / published tokens/s per GPU; goal (stated first): per system × "
              "precision, median |error| <= 25 %%, every row within 2x\n");
  for (const auto& [group, ratios] : by_group) {
    const Spread s = spread(ratios);
    std::printf("  %-12s %2zu rows: median ratio %.2f, median |error| %5.1f %%, range %.2f-%.2f: "
                "%s\n", group.c_str(), s.n, s.median_ratio, 100 * s.median_abs_error, s.low,
                s.high, s.met() ? "met" : "NOT met");
  }
  const Spread s = spread(all);
  std::printf("  all          %2zu rows: median ratio %.2f, median |error| %5.1f %%, range "
              "%.2f-%.2f\n", s.n, s.median_ratio, 100 * s.median_abs_error, s.low, s.high);
  // Which rows are predicted is part of the fixture's contract: 7 Llama 3 70B, 7 Llama 3.1 405B,
  // 4 DeepSeek-V3, 5 GPT-OSS, 5 Qwen3 30B and 5 Qwen3 235B (the 405B and three 235B rows since
  // their uneven virtual stages became expressible, Note [uneven virtual stages]; DeepSeek-V3's
  // since its MTP module and recompute modules did, 2026-12-07); a row that starts or stops being
  // expressible must be seen here, not dropped silently.
  EXPECT_EQ(all.size(), 33u);
  EXPECT_EQ(skipped.size(), 14u);
}

// Memory, a fact about every row: the layout ran, so what it allocated fit on the GPU. The table
// publishes no peak, so this is a one-sided check of the ledgers (states + activations + buffers
// as Note [does it fit] counts them, with the recipe's fp8 parameters, Note [fp8 parameters]):
// each predicted row's allocated bytes plus the CUDA runtime must not exceed the GPU's capacity —
// a ledger that says more cannot be right. Rows that offload activations to the Grace CPU
// (cpu_offloading_num_layers; not modelled) are left out. The planner's "does it fit" adds the
// caching allocator's 11.5 % allowance (Note [reserved memory]) and rejects some of these rows —
// the recipes run with PyTorch's expandable segments (scripts/performance/utils/executors.py and
// perf_plugins.py set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), whose reserved − allocated
// no published figure gives; printed, not asserted.
TEST(PublishedBridge, LayoutsThatRanFitTheirAllocatedBytes) {
  int checked = 0, rejected_with_allowance = 0;
  for (const Row& r : all_rows()) {
    if (!r.why.empty() || !(*r.run)["recipe"]["cpu_offloading_num_layers"].is_null()) continue;
    const PlanEval& e = r.eval;
    // Headroom 0 in these requests: usable = the GPU's capacity.
    EXPECT_LE(e.allocated_bytes + e.runtime_bytes, e.usable_bytes)
        << r.label << ": allocated " << e.allocated_bytes / 1e9 << " GB";
    ++checked;
    if (e.total_bytes > e.usable_bytes) {
      ++rejected_with_allowance;
      std::printf("  %s: allocated %.0f GB + runtime fits %.0f GB; held with the allowance %.0f GB "
                  "does not\n", r.label.c_str(), e.allocated_bytes / 1e9, e.usable_bytes / 1e9,
                  e.total_bytes / 1e9);
    }
  }
  std::printf("  %d rows checked; the planner's check with its %.1f %% allocator allowance rejects "
              "%d of them\n", checked, 100 * kAllocatorAllowance, rejected_with_allowance);
  EXPECT_EQ(checked, 31);
}

// Note [error band] in planner.hpp: a plan on a Blackwell GPU prints exactly these rows' band
// (measured / predicted step = tally's tokens/s over the published); the spread within one
// system's table is what can reorder two plans there. The tables' H100 rows are not Hopper's band
// (torchtitan's): they lie inside its range but for its low end, as the Note says.
TEST(PublishedBridge, BlackwellErrorBandIsTheseRows) {
  std::vector<double> ratios, hopper;
  std::map<std::string, std::vector<double>> by_system;
  for (const Row& r : all_rows()) {
    if (!r.why.empty()) continue;
    const std::string system = short_system((*r.run)["system"]);
    if (system == "H100") {
      hopper.push_back(r.ratio());
      continue;
    }
    ratios.push_back(r.ratio());
    by_system[system].push_back(r.ratio());
  }
  ASSERT_EQ(ratios.size(), 28u);
  ASSERT_EQ(by_system.size(), 4u);  // B200, B300, GB200, GB300
  double rank_spread = 0;
  for (const auto& [system, r] : by_system) {
    const auto [lo, hi] = std::minmax_element(r.begin(), r.end());
    rank_spread = std::max(rank_spread, *hi / *lo - 1);
  }
  const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
  std::printf("  Blackwell rows: measured / predicted %.4f to %.4f, median %.4f, within one system "
              "up to %.4f apart\n", *lo, *hi, median(ratios), rank_spread);
  for (const char* cluster : {"b200", "b300", "gb200-nvl72", "gb300-nvl72"}) {
    SCOPED_TRACE(cluster);
    const auto band = step_time_band(TimeModel::operators, cluster_preset(cluster)->gpu);
    ASSERT_TRUE(band.has_value());
    expect_band_is(*band, *lo, *hi, median(ratios), rank_spread);
    EXPECT_NE(std::string(band->runs).find("Megatron-Bridge"), std::string::npos);
  }
  const auto h100 = step_time_band(TimeModel::operators, cluster_preset("h100-80g")->gpu);
  ASSERT_TRUE(h100.has_value());
  ASSERT_EQ(hopper.size(), 5u);
  EXPECT_LE(*std::max_element(hopper.begin(), hopper.end()), h100->high);
  EXPECT_LT(*std::min_element(hopper.begin(), hopper.end()), h100->low);
}

}  // namespace
}  // namespace tally::test_published_bridge
