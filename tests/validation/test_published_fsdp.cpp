// The operator time model judged on a second set of runs kept aside (issue 10: "Other published
// runs are kept aside to judge the model"): MosaicML llm-foundry's MPT training benchmarks
// (scripts/train/benchmarking/README.md at 061f2c7ce64e655100286584a7629e2a09f827ba), tables
// "H100 80GB BF16", "A100 80GB with 1600 Gbps node-node interconnect (RoCE)" and "A100 40GB …":
// 191 runs of PyTorch FSDP (FULL_SHARD) alone — MPT 125M to 70B, sequence 512 to 65536, 8 to 128
// GPUs, activation checkpointing on and off — each with its micro-batch and accumulation
// published. Unlike torchtitan's tables these include A100s, the GPU of the development set
// (Megatron-LM runs), so they judge the model on FSDP where the dev set judged it on TP/PP.
// Each row is predicted with its layout fixed (llm_foundry_rows.hpp) and tally's defaults;
// no constant, preset or switch was chosen by looking at these rows' throughput.
//
// Tokens/s per GPU: the table's Throughput (T/s/GPU) = Throughput (T/s) / #GPUs (the README's
// collect_results.py); tally's = global_batch · seq / (step · G).
//
// The goal, written down before the first prediction of these rows: per GPU type (A100 80GB,
// A100 40GB, H100), median |error| of tokens/s per GPU ≤ 25 % and every row within a factor 2
// either way. MPT's attention is its own Triton flash-attention kernel (attn_impl triton, 2023),
// FlashAttention 1's class, not FlashAttention-2 whose fractions the presets take: modelled since
// 2026-12-06 (FlashKernel::fa1, Note [flash kernel generations]; before it the miss grew with the
// sequence). Known confounders, not modelled:
//   - the H100 rows ran torch 2.0.1 / CUDA 11.8 (sweep.sh) on early H100 software; the presets'
//     GEMM constants come from 2024 XLA tables (fast bias);
//   - Composer's FSDP "DEFAULT" mixed precision (the H100 and A100 80GB rows but its 70B ones)
//     all-gathered fp32 parameters in mid-2023 Composer where tally gathers the compute precision
//     (fast bias where exposed);
//   - Composer's low_precision_layernorm casts and autocast's per-op weight casts, which tally
//     does not count as kernels (fast bias).
// This test prints the judgement and asserts only what guards a broken model (every row finite
// and within a factor 3), the parameter counts (exact: an independent check of the architecture
// read from the yamls) and the fixture's completeness; the goal is reported, not asserted, so
// that a miss cannot be "fixed" by tuning to the rows (README and docs/ledgers.md §5 give it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "llm_foundry_rows.hpp"
#include "tally/core/model.hpp"
#include "tally/core/operators.hpp"

namespace tally::test_published_fsdp {
namespace {

const nlohmann::json& data() { return fixture("llm_foundry_mpt.json"); }

struct Row {
  const nlohmann::json* run = nullptr;
  std::string label;
  double predicted = 0, published = 0;  // tokens per second per GPU
  PlanEval eval;
  double ratio() const { return predicted / published; }
};

std::vector<Row> all_rows() {
  std::vector<Row> out;
  for (const auto& run : data()["runs"]) {
    Row r{.run = &run, .published = run["tokens_per_s_per_gpu"].get<double>()};
    char label[96];
    std::snprintf(label, sizeof label, "%-4s s %-5d G %-3d b %-3d m %-2d %s",
                  run["model"].get<std::string>().c_str(), run["seq"].get<int>(),
                  run["gpus"].get<int>(), run["micro_batch"].get<int>(),
                  run["grad_accum"].get<int>(),
                  run["activation_checkpointing"].get<bool>() ? "AC" : "  ");
    r.label = label;
    const PlanRequest q = foundry_request(data()["architectures"], run);
    r.eval = evaluate_layout(q, foundry_layout(run));
    r.predicted = double(q.global_batch) * double(q.seq) / (r.eval.step_s * q.gpus);
    out.push_back(r);
  }
  return out;
}

// The fixture holds every row of the three tables (counted in the README: 52 H100 BF16 rows,
// 61 A100 80GB, 78 A100 40GB), each consistent with itself.
TEST(PublishedFsdp, FixtureIsComplete) {
  std::map<std::string, int> per_table;
  for (const auto& run : data()["runs"]) {
    ++per_table[run["cluster"].get<std::string>()];
    SCOPED_TRACE(run["model"].get<std::string>() + " s " + std::to_string(run["seq"].get<int>()));
    EXPECT_EQ(run["micro_batch"].get<std::int64_t>() * run["grad_accum"].get<std::int64_t>() *
                  run["gpus"].get<std::int64_t>(),
              run["global_batch"].get<std::int64_t>());
    EXPECT_EQ(run["global_batch"].get<std::int64_t>() * run["seq"].get<std::int64_t>(),
              run["global_batch_tokens"].get<std::int64_t>());
    EXPECT_EQ(run["sharding"], "FULL_SHARD");
    EXPECT_FALSE(run["activation_cpu_offload"].get<bool>());
    EXPECT_TRUE(data()["architectures"]["models"].contains(run["model"].get<std::string>()));
  }
  EXPECT_EQ(per_table["h100-80g"], 52);
  EXPECT_EQ(per_table["a100-80g"], 61);
  EXPECT_EQ(per_table["a100-40g"], 78);
  EXPECT_EQ(data()["source"]["commit"], "061f2c7ce64e655100286584a7629e2a09f827ba");
}

// NumParams as the tables print it (Composer's n_params: every parameter, the learned position
// table of max_seq_len = the row's sequence included) equals tally's count of the ModelSpec read
// from the yamls — exactly, for all 191 rows. 7b at 2048: 6658859008 (12h² + 13h per layer ×
// 32 + 50368·h + 2048·h + 2h, h = 4096).
TEST(PublishedFsdp, ParameterCountsAreTheTables) {
  for (const auto& run : data()["runs"]) {
    const ModelSpec m = mpt_model(data()["architectures"], run["model"], run["seq"]);
    EXPECT_EQ(std::int64_t(count_params(m).total()), run["num_params"].get<std::int64_t>())
        << m.name << " at " << run["seq"];
  }
}

TEST(PublishedFsdp, LlmFoundryTablesKeptAside) {
  const auto rows = all_rows();
  std::map<std::string, std::vector<double>> by_gpu;
  std::string table;
  for (const Row& r : rows) {
    const auto& run = *r.run;
    if (run["table"] != table) {
      table = run["table"];
      std::printf("  %s\n  %-30s %8s %9s %7s %6s %6s   step s = compute (optimizer) + DP exposed\n",
                  table.c_str(), "MPT run (published T/s/GPU)", "tally", "published", "ratio",
                  "MFU", "pub.");
    }
    const PlanEval& e = r.eval;
    std::printf("  %-30s %8.0f %9.0f %7.2f %5.1f%% %5.1f%%   %.3g = %.3g (%.2g) + %.2g\n",
                r.label.c_str(), r.predicted, r.published, r.ratio(), 100 * e.mfu,
                run["mfu_percent"].get<double>(), e.step_s, e.compute_s, e.optimizer_s,
                e.dp_exposed_s);
    EXPECT_TRUE(std::isfinite(r.predicted) && r.predicted > 0) << r.label;
    // The guard (header): a factor 3 either way means the model is broken, not merely off.
    EXPECT_LT(r.ratio(), 3.0) << r.label;
    EXPECT_GT(r.ratio(), 1 / 3.0) << r.label;
    by_gpu[run["cluster"].get<std::string>()].push_back(r.ratio());
  }
  std::printf("  predicted / published tokens/s per GPU; goal (stated first): median |error| "
              "<= 25 %%, every row within 2x\n");
  for (const auto& [gpu, ratios] : by_gpu) {
    const Spread s = spread(ratios);
    const bool met = s.met();
    std::printf("  %-9s %3zu rows: median ratio %.2f, median |error| %.1f %%, range %.2f-%.2f: "
                "%s\n", gpu.c_str(), s.n, s.median_ratio, 100 * s.median_abs_error, s.low,
                s.high, met ? "met" : "NOT met");
  }
}

// Note [error band]: an A100 plan of data parallelism alone prints exactly these rows' range of
// measured / predicted (the two A100 tables), its median, and the largest spread within one table;
// a model-parallel A100 plan keeps the Megatron dev set's band, and Hopper's bands do not split.
TEST(PublishedFsdp, A100DataParallelBandIsTheseRows) {
  std::vector<double> ratios;
  std::map<std::string, std::vector<double>> by_table;
  for (const Row& r : all_rows()) {
    if ((*r.run)["cluster"].get<std::string>().rfind("a100", 0) != 0) continue;
    ratios.push_back(r.ratio());
    by_table[(*r.run)["table"].get<std::string>()].push_back(r.ratio());
  }
  ASSERT_EQ(ratios.size(), 139u);
  double rank_spread = 0;
  for (const auto& [table, v] : by_table) {
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    rank_spread = std::max(rank_spread, *hi / *lo - 1);
  }
  const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
  std::printf("  A100 FSDP rows: %.4f-%.4f, median %.4f, rank spread %.4f\n", *lo, *hi,
              median(ratios), rank_spread);
  for (const char* gpu : {"a100-80g", "a100-40g"}) {
    SCOPED_TRACE(gpu);
    const GpuSpec g = cluster_preset(gpu)->gpu;
    const auto band = step_time_band(TimeModel::operators, g, LayoutFamily::data_parallel);
    ASSERT_TRUE(band.has_value());
    expect_band_is(*band, *lo, *hi, median(ratios), rank_spread);
    const auto megatron = step_time_band(TimeModel::operators, g, LayoutFamily::model_parallel);
    ASSERT_TRUE(megatron.has_value());
    EXPECT_NE(std::string(megatron->runs), std::string(band->runs));
  }
  const GpuSpec h100 = cluster_preset("h100-80g")->gpu;
  EXPECT_EQ(step_time_band(TimeModel::operators, h100, LayoutFamily::data_parallel)->high,
            step_time_band(TimeModel::operators, h100, LayoutFamily::model_parallel)->high);
  EXPECT_EQ(layout_family(Layout{.dp = 8, .zero = 3}), LayoutFamily::data_parallel);
  EXPECT_EQ(layout_family(Layout{.dp = 4, .tp = 2}), LayoutFamily::model_parallel);
  EXPECT_EQ(layout_family(Layout{.dp = 8, .ep = 8}), LayoutFamily::model_parallel);
}

// The trends, each a median of predicted / published over the rows sharing one value: sequence
// length, model size, activation checkpointing, GPU count — per GPU type.
TEST(PublishedFsdp, TrendsOfTheRatio) {
  const auto rows = all_rows();
  struct Key { const char* name; std::string (*of)(const nlohmann::json&); };
  const Key keys[] = {
      {"seq", [](const nlohmann::json& r) { return std::to_string(r["seq"].get<int>()); }},
      {"model", [](const nlohmann::json& r) { return r["model"].get<std::string>(); }},
      {"checkpointing",
       [](const nlohmann::json& r) {
         return std::string(r["activation_checkpointing"].get<bool>() ? "on" : "off");
       }},
      {"GPUs", [](const nlohmann::json& r) { return std::to_string(r["gpus"].get<int>()); }}};
  for (const char* gpu : {"a100-80g", "a100-40g", "h100-80g"}) {
    std::printf("  %s: median predicted/published (rows)\n", gpu);
    for (const Key& k : keys) {
      std::map<std::string, std::vector<double>> groups;
      std::vector<std::string> order;
      for (const Row& r : rows) {
        if ((*r.run)["cluster"] != gpu) continue;
        const std::string v = k.of(*r.run);
        if (!groups.contains(v)) order.push_back(v);
        groups[v].push_back(r.ratio());
      }
      std::sort(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
        const double x = std::atof(a.c_str()), y = std::atof(b.c_str());
        const double sx = a.back() == 'b' && x < 100 ? x * 1000 : x;  // "7b" after "760m"
        const double sy = b.back() == 'b' && y < 100 ? y * 1000 : y;
        return sx != sy ? sx < sy : a < b;
      });
      std::printf("    %-14s", k.name);
      for (const std::string& v : order) {
        const Spread s = spread(groups[v]);
        std::printf(" %s %.2f (%zu)", v.c_str(), s.median_ratio, s.n);
      }
      std::printf("\n");
      EXPECT_FALSE(order.empty());
    }
  }
}

// Which terms of tally's step the miss sits in: each row's layer time split by kernel kind (the
// operator inventory's GEMMs, flash attention, memory-bound kernels; layer_ops timed by
// op_seconds) and its FSDP traffic before overlap (dp_s) over its compute, then the median
// predicted / published of the rows one term dominates. Printed, not asserted (docs/ledgers.md §5).
TEST(PublishedFsdp, WhereTheMissSits) {
  const auto rows = all_rows();
  for (const char* gpu : {"a100-80g", "a100-40g", "h100-80g"}) {
    std::vector<double> gemm, attention, comm, rest;
    for (const Row& r : rows) {
      const auto& run = *r.run;
      if (run["cluster"] != gpu) continue;
      const PlanRequest q = foundry_request(data()["architectures"], run);
      const Layout L = foundry_layout(run);
      const OperatorSetup os{.seq = q.seq, .micro_batch = L.micro_batch,
                             .recompute = L.recompute, .attention = L.attention,
                             .dropout = q.uses_dropout(), .kernels = q.kernels,
                             .loss = q.loss, .recipe = q.precision};
      double by_kind[3] = {0, 0, 0};  // OpKind: gemm, attention, memory
      for (const Op& op : layer_ops(q.model, os))
        by_kind[int(op.kind)] += op_seconds(op, q.cluster.gpu, q.precision);
      const double layer = by_kind[0] + by_kind[1] + by_kind[2];
      const double traffic = r.eval.dp_s / r.eval.compute_s;
      if (traffic >= 0.2) comm.push_back(r.ratio());
      else if (traffic < 0.1 && by_kind[0] >= 0.85 * layer) gemm.push_back(r.ratio());
      else if (traffic < 0.1 && by_kind[1] >= 0.6 * layer) attention.push_back(r.ratio());
      else rest.push_back(r.ratio());
    }
    std::printf("  %s: median predicted/published (rows) — GEMMs >= 85 %% of the layer: %.2f (%zu); "
                "attention >= 60 %%: %.2f (%zu); FSDP traffic >= 20 %% of compute: %.2f (%zu); "
                "the rest: %.2f (%zu)\n", gpu, spread(gemm).median_ratio, gemm.size(),
                spread(attention).median_ratio, attention.size(), spread(comm).median_ratio,
                comm.size(), spread(rest).median_ratio, rest.size());
  }
}

}  // namespace
}  // namespace tally::test_published_fsdp
