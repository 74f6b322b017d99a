// `tally explain`: where each ledger is itemised, and the seed's errata (DESIGN.md §1) with the
// seed's figure beside tally's, each of tally's computed here by the core function that the
// ledgers use (never typed), at the seed's own inputs.
#include <fmt/core.h>

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "common.hpp"
#include "tally/core/activations.hpp"
#include "tally/core/comm.hpp"
#include "tally/core/presets.hpp"
#include "tally/core/reliability.hpp"

namespace tally::cli {

namespace {

// One figure of an erratum: what tally computes, and what the seed says of the same quantity
// (empty where the seed gives none).
struct Figure {
  std::string what;
  double value = 0;
  std::string unit;
  std::string seed_says;
};

struct Erratum {
  int number = 0;
  std::string title, seed, correct, inputs;
  std::vector<Figure> figures;
  std::vector<std::string> pinned_by;  // the tests that hold the difference (tests/)
};

// Note [seed erratum inputs]
// Each erratum is evaluated at the seed's inputs, not tally's defaults: λ = 3e-6 failures per
// GPU-hour (seed §A4, "需核实"; tally's default is Llama 3's fleet figure), a 112 GB checkpoint at
// 2 GB/s (C = 56 s), 5 + 3 minutes lost per failure (R); the seed's 7B (h 4096, 32 layers) at
// micro-batch 4, T = 2048, TP 8; N = 7e9 in bf16 over 8 data-parallel ranks.
constexpr const char* kErrataConvention =
    "each figure at the seed's inputs (Note [seed erratum inputs]); GB = 1e9 B, MB = 1e6 B";
constexpr double kSeedLambda = 3e-6;
constexpr double kSeedRestartHours = 8.0 / 60;

Erratum checkpoint_interval() {
  const double save_hours = save_seconds(112e9, 2e9) / 3600;  // core's C, in hours
  const double mtbf = mtbf_hours(8192, kSeedLambda);
  const double daly = daly_interval_hours(save_hours, mtbf);
  // The seed's own optimum of E(T) = 4fT + 55.8/T is √(55.8 / 4f); at 8192 GPUs it rounds f to
  // 1/41 = 0.024 per hour.
  const auto seed_optimum = [](double f) { return std::sqrt(55.8 / (4 * f)); };
  return {
      .number = 1,
      .title = "checkpoint interval",
      .seed = "E(T) = 4fT + 55.8/T (half an interval times the restart cost, minutes mixed with "
              "hours), minimised at T* = √(55.8/4f)",
      .correct = "the lost fraction is C/T + (T/2 + R)/MTBF in one unit, minimised near Young's "
                 "√(2·C·MTBF) (Daly 2006 eq. 37 refines it)",
      .inputs = "C = 56 s (112 GB at 2 GB/s), R = 8 min, λ = 3e-6 per GPU-hour (the seed's)",
      .figures = {{"MTBF 2 h (f = 0.5/h): Young's interval",
                   60 * young_interval_hours(save_hours, 2), "min",
                   fmt::format("{:.2f} h", seed_optimum(0.5))},
                  {"8192 GPUs: MTBF", mtbf, "h", "≈41 h"},
                  {"8192 GPUs: Young's interval", young_interval_hours(save_hours, mtbf), "h",
                   fmt::format("{:.1f} h", seed_optimum(0.024))},
                  {"8192 GPUs: Daly's interval", daly, "h", ""},
                  {"8192 GPUs: time lost at Daly's interval",
                   100 * overhead_fraction(daly, save_hours, kSeedRestartHours, mtbf), "%",
                   ""},
                  {"8192 GPUs: time lost at the seed's 24 h",
                   100 * overhead_fraction(24, save_hours, kSeedRestartHours, mtbf), "%",
                   "≈7.7 %"}},
      .pinned_by = {"Reliability.Erratum1_SeedFormulaVersusYoungAtMtbfTwoHours",
                    "Reliability.Erratum1_EightThousandGpus"}};
}

Erratum tp_traffic() {
  const auto traffic = [](Recompute r) {
    return step_traffic({.params = 7e9, .hidden = 4096, .layers = 32, .seq_len = 2048,
                         .micro_batch = 4, .tp = 8, .recompute = r});
  };
  const StepTraffic none = traffic(Recompute::none), full = traffic(Recompute::full);
  const double layers = 32;
  return {
      .number = 2,
      .title = "TP traffic per layer",
      .seed = "≈234 MB per layer forward, \"with the symmetric backward ≈700 MB\", ≈22 GB a step",
      .correct = "2 forward + 2 backward all-reduces of b·s·h are ≈468 MB per layer; ≈700 MB "
                 "only when full recompute replays the forward two in backward",
      .inputs = "the seed's 7B (h 4096, 32 layers), micro-batch 4, T = 2048, bf16, TP 8; each "
                "all-reduce 2S(t−1)/t per rank",
      .figures = {{"per layer, no recompute", none.tp.bytes_per_rank / layers / 1e6, "MB",
                   "≈700 MB"},
                  {"per step, no recompute", none.tp.bytes_per_rank / 1e9, "GB", "≈22 GB"},
                  {"per layer, full recompute", full.tp.bytes_per_rank / layers / 1e6, "MB", ""},
                  {"per step, full recompute", full.tp.bytes_per_rank / 1e9, "GB", ""}},
      .pinned_by = {"StepTraffic.Erratum2_TpPerLayerAndPerStep"}};
}

Erratum activation_figure() {
  const ModelSpec m = *model_preset("seed-7b");
  const auto all_layers = [&](std::int64_t b) {
    return activations(m, {.seq = 2048, .micro_batch = b}).per_layer_bytes * double(m.layers);
  };
  return {
      .number = 3,
      .title = "activation figure",
      .seed = "\"7B, B_micro = 4, T = 2048 → ≈9 GB\" of activations, convention unstated",
      .correct = "Korthikanti et al. 2022's inventory, s·b·h·34 bytes per layer with flash "
                 "attention (+ its fp32 log-sum-exp): the seed's 9 GB is micro-batch 1",
      .inputs = "the seed's 7B, T = 2048, flash attention, dropout masks kept (Korthikanti's "
                "convention), no recompute; the transformer layers only, before the logits",
      .figures = {{"micro-batch 4", all_layers(4) / 1e9, "GB", "≈9 GB"},
                  {"micro-batch 1", all_layers(1) / 1e9, "GB", ""}},
      .pinned_by = {"Activations.Erratum3SeedNineGigabytesIsMicroBatchOne"}};
}

Erratum zero_traffic() {
  const auto dp_bytes = [](int zero) {
    return step_traffic({.params = 7e9, .param_bytes = 2, .grad_bytes = 2, .dp = 8,
                         .zero_stage = zero});
  };
  const StepTraffic zero2 = dp_bytes(2);
  return {
      .number = 4,
      .title = "\"ZeRO-2 halves communication\"",
      .seed = "replacing the gradient all-reduce by a reduce-scatter halves the traffic",
      .correct = "the reduce-scatter is half, but the updated parameters must then be "
                 "all-gathered: ZeRO-1 and ZeRO-2 move ≈2S a step as DP does, ZeRO-3 ≈3S "
                 "(Rajbhandari et al. 2020 §7)",
      .inputs = "N = 7e9 parameters and gradients in bf16 (S = 14 GB), 8 data-parallel ranks",
      .figures = {{"DP (all-reduce), per rank", dp_bytes(0).dp_total_bytes() / 1e9, "GB", ""},
                  {"ZeRO-2, per rank", zero2.dp_total_bytes() / 1e9, "GB",
                   fmt::format("{:.2f} GB, the reduce-scatter alone",
                               zero2.reduce_scatter_only_bytes / 1e9)},
                  {"ZeRO-3, per rank", dp_bytes(3).dp_total_bytes() / 1e9, "GB", ""}},
      .pinned_by = {"StepTraffic.Erratum4_ZeroOneAndTwoMoveAsMuchAsDp"}};
}

std::vector<Erratum> errata() {
  return {checkpoint_interval(), tp_traffic(), activation_figure(), zero_traffic()};
}

// Where each ledger is itemised (the index, `tally explain` with no topic).
struct Ledger {
  std::string name, formula, command, docs;
};

const std::vector<Ledger>& ledgers() {
  static const std::vector<Ledger> l = {
      {"model states", "mixed Adam 2+2+8+4 = 16 B/param; ZeRO-1 shards m, v, master, ZeRO-2 also "
       "grads, ZeRO-3 also params", "tally memory", "§1"},
      {"activations", "Korthikanti 2022: s·b·h·(34 + 5as/h) per layer, by tensor, under TP, SP, "
       "CP, PP and recompute", "tally memory --model M --seq T --micro-batch B", "§2"},
      {"communication", "ring all-reduce 2S(k−1)/k per rank; DP, ZeRO-1/2 ≈2S, ZeRO-3 ≈3S; TP, PP, "
       "CP, EP per step", "tally comm --model M …", "§3"},
      {"pipeline", "1F1B bubble (P−1)/(M+P−1), interleaved (P−1)/(v·M+P−1)", "tally bubble",
       "§4"},
      {"compute", "6N + 12·L·h·s FLOPs per token for MFU; time from an operator list (roofline, "
       "shape-aware GEMMs)", "tally plan", "§5"},
      {"reliability", "MTBF = 1/(G·λ); Young √(2·C·MTBF), Daly 2006; lost C/T + (T/2 + R)/MTBF",
       "tally reliability", "§6"},
  };
  return l;
}

const std::vector<std::string>& topic_names() {
  static const std::vector<std::string> t = {"errata", "erratum-1", "erratum-2", "erratum-3",
                                             "erratum-4"};
  return t;
}

nlohmann::json erratum_json(const Erratum& e) {
  nlohmann::json figures = nlohmann::json::array();
  for (const Figure& f : e.figures)
    figures.push_back({{"what", f.what}, {"value", f.value}, {"unit", f.unit},
                       {"seed_says", f.seed_says.empty() ? nlohmann::json()
                                                          : nlohmann::json(f.seed_says)}});
  return {{"number", e.number},     {"title", e.title},   {"seed", e.seed},
          {"correct", e.correct},   {"inputs", e.inputs}, {"figures", figures},
          {"pinned_by", e.pinned_by}};
}

void print_erratum(const Erratum& e) {
  fmt::print("\nerratum {} · {}\n", e.number, e.title);
  fmt::print("  seed:     {}\n", e.seed);
  fmt::print("  correct:  {}\n", e.correct);
  fmt::print("  inputs:   {}\n", e.inputs);
  for (const Figure& f : e.figures) {
    const std::string line = fmt::format("    {:<44} {:>8} {}", f.what, sig_str(f.value, 3), f.unit);
    fmt::print("{}\n", f.seed_says.empty()
                           ? line
                           : fmt::format("{:<58}   (seed: {})", line, f.seed_says));
  }
  std::string tests;
  for (const std::string& t : e.pinned_by) tests += (tests.empty() ? "" : ", ") + t;
  fmt::print("  pinned by: {}\n", tests);
}

struct ExplainOptions {
  OutputOptions out;
  std::string topic;  // empty: the index
};

void run_explain(const ExplainOptions& o) {
  if (o.topic.empty()) {
    nlohmann::json j = {{"command", "explain"},
                        {"convention", "the ledgers' index: formulas and where each is itemised"},
                        {"topic", nullptr}};
    for (const Ledger& l : ledgers())
      j["ledgers"].push_back(
          {{"ledger", l.name}, {"formula", l.formula}, {"shown_by", l.command}, {"docs", l.docs}});
    j["topics"] = topic_names();
    if (o.out.json) {
      print_json(j);
      return;
    }
    fmt::print("tally explain — each ledger, where tally itemises it, and the seed's errata\n");
    for (const Ledger& l : ledgers())
      fmt::print("  {:<14} {}\n  {:<14} itemised by `{}` (docs/ledgers.md {})\n", l.name, l.formula,
                 "", l.command, l.docs);
    fmt::print("topics: tally explain errata | erratum-1 … erratum-4 — the seed's errata "
               "(DESIGN.md §1), its figure beside tally's\n");
    return;
  }
  std::vector<Erratum> shown;
  for (Erratum& e : errata())
    if (o.topic == "errata" || o.topic == fmt::format("erratum-{}", e.number))
      shown.push_back(std::move(e));
  nlohmann::json j = {{"command", "explain"}, {"convention", kErrataConvention}, {"topic", o.topic}};
  j["errata"] = nlohmann::json::array();
  for (const Erratum& e : shown) j["errata"].push_back(erratum_json(e));
  require_finite(j);  // Note [no inf or nan in output], for the text report too
  if (o.out.json) {
    print_json(j);
    return;
  }
  fmt::print("tally explain {} — the seed's figure beside tally's, each of tally's computed by "
             "core at the seed's inputs (DESIGN.md §1; docs/ledgers.md §8)\n", o.topic);
  for (const Erratum& e : shown) print_erratum(e);
}

}  // namespace

void register_explain(CLI::App& app) {
  auto o = std::make_shared<ExplainOptions>();
  auto* cmd = app.add_subcommand(
      "explain", "where each ledger is itemised, and the seed's errata with its figure beside "
                 "tally's (topics: errata, erratum-1 … erratum-4)");
  cmd->add_option("topic", o->topic, "errata, or one of erratum-1 … erratum-4; none: the index")
      ->check(one_of(topic_names()));
  cmd->add_flag("--json", o->out.json, "print one JSON object instead of the text report");
  cmd->callback([o] { run_explain(*o); });
}

}  // namespace tally::cli
