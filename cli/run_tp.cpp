// `tally run tp`: the text and JSON reporters of engine::run_tp (tally/engine/experiments/tp.hpp).
// Every rank runs and checks its own figures (exit 1 naming the first failed check); rank 0 prints
// the report (its figures: the TP ranks are symmetric), so under `tally launch` only "[rank 0] "
// lines carry it. Bad flags exit 2. One progress line per fp32 step on stderr (rank 0).
#include <fmt/core.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>

#include "common.hpp"
#include "experiment_report.hpp"
#include "html_engine.hpp"
#include "html_report.hpp"
#include "run_registry.hpp"
#include "tally/core/comm.hpp"
#include "tally/engine/experiments/tp.hpp"

namespace tally::cli::run_tp {

namespace {

struct Flags {
  engine::TpOptions run;
  bool sp = false, compare_sp = false, recompute = false, compare_recompute = false, json = false;
  std::optional<std::string> html;  // --html FILE, written by rank 0
};



nlohmann::json collectives_json(const std::vector<engine::TpCollectiveMeasure>& ms) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& m : ms)
    j.push_back({{"collective", std::string(to_string(m.collective))},
                 {"calls", m.calls},
                 {"bytes_sent", m.bytes_sent},
                 {"seconds", m.seconds}});
  return j;
}

nlohmann::json to_json(const engine::TpResult& r, const std::vector<engine::TpCheck>& checks) {
  nlohmann::json j = {{"experiment", "tp"},
                      {"rank", r.rank},
                      {"world_size", r.world_size},
                      {"tp", r.options.tp},
                      {"model",
                       {{"hidden", r.options.model.hidden}, {"layers", r.options.model.layers},
                        {"heads", r.options.model.heads}, {"vocab", r.options.model.vocab},
                        {"seq", r.options.model.seq}, {"micro_batch", r.options.model.micro_batch},
                        {"params", r.n_params}}},
                      {"steps", r.options.steps}};
  for (const engine::TpVariant& v : r.variants) {
    const TrafficItem& t = v.predicted.tp;
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& l : v.per_layer) layers.push_back(collectives_json(l));
    nlohmann::json per_call = nlohmann::json::object();
    for (const auto& m : v.per_layer.empty() ? std::vector<engine::TpCollectiveMeasure>{}
                                             : v.per_layer[0])
      per_call[std::string(to_string(m.collective))] =
          measured_json(m.bytes_sent / double(m.calls), t.bytes_per_call);
    j["variants"].push_back(
        {{"sequence_parallel", v.sequence_parallel},
         {"full_recompute", v.full_recompute},
         {"activation_bytes_per_layer",
          measured_json(v.activation_bytes_per_layer - v.layer_norm_stat_bytes,
                        v.predicted_activation_bytes_per_layer)},
         {"allocated_bytes_per_layer", v.activation_bytes_per_layer},
         {"layer_norm_stat_bytes_per_layer", v.layer_norm_stat_bytes},
         {"loss_f64", measured_json(v.loss_f64, v.reference_loss_f64)},
         {"max_grad_rel_diff_f64", v.max_grad_rel_diff},
         {"worst_grad", v.worst_grad},
         {"losses_fp32", v.losses},
         {"reference_losses_fp32", v.reference_losses},
         {"max_loss_rel_diff_fp32", v.max_loss_rel_diff},
         {"step_seconds", v.step_seconds},
         {"bytes_per_layer", measured_json(v.measured_bytes_per_layer(), v.predicted_bytes_per_layer())},
         {"calls_per_layer",
          measured_json(v.per_layer.empty() ? 0.0 : [&] {
            double c = 0;
            for (const auto& m : v.per_layer[0]) c += double(m.calls);
            return c;
          }(), v.predicted_calls_per_layer())},
         {"bytes_per_call", per_call},
         {"layers", layers},
         {"sp_edges", collectives_json(v.edges)},
         {"sp_grad_reduce", collectives_json(v.sp_grad_reduce)},
         {"sp_edge_bytes_per_step",
          measured_json(engine::bytes_sent(v.edges), v.predicted_sp.edges.bytes_per_rank)},
         {"sp_grad_reduce_bytes_per_step",
          measured_json(engine::bytes_sent(v.sp_grad_reduce), v.predicted_sp.grads.bytes_per_rank)},
         {"sp_regather", collectives_json(v.sp_regather)},
         {"sp_regather_bytes_per_step",
          measured_json(engine::bytes_sent(v.sp_regather), v.predicted.tp_regather.bytes_per_rank)},
         {"tp_comm_bytes_per_step", v.tp_comm_bytes},
         {"predicted_tp", {{"collective", std::string(to_string(t.collective))},
                           {"calls_per_step", t.calls},
                           {"bytes_per_call", t.bytes_per_call},
                           {"bytes_per_step", t.bytes_per_rank},
                           {"formula", t.formula}}},
         {"convention", v.predicted.convention()}});
  }
  add_checks_json(j, checks);
  return j;
}

void print_text(const engine::TpResult& r, const std::vector<engine::TpCheck>& checks) {
  const auto& m = r.options.model;
  fmt::print("tp: t = {} ranks (Gloo, CPU); GPT h {} L {} a {} V {} T {} B {} (N = {}); rank 0's "
             "figures\n",
             r.world_size, m.hidden, m.layers, m.heads, m.vocab, m.seq, m.micro_batch, r.n_params);
  for (const engine::TpVariant& v : r.variants) {
    const TrafficItem& t = v.predicted.tp;
    fmt::print("{}{}:\n", v.sequence_parallel ? "TP + SP" : "TP",
               v.full_recompute ? ", full recompute" : "");
    fmt::print("  float64 vs single-process: loss {:.12g} vs {:.12g}; max gradient difference "
               "{:.2e} relative ({})\n",
               v.loss_f64, v.reference_loss_f64, v.max_grad_rel_diff, v.worst_grad);
    fmt::print("  fp32, {} SGD steps: loss {:.6f} → {:.6f}, max difference {:.2e} relative\n",
               v.losses.size(), v.losses.front(), v.losses.back(), v.max_loss_rel_diff);
    fmt::print("  {:<38} {:>14} {:>14} {:>8}\n", "per layer, one step (bytes sent)", "measured",
               "predicted", "ratio");
    fmt::print("  {:<38} {:>14.0f} {:>14.0f} {:>8.4f}\n", "bytes per layer",
               v.measured_bytes_per_layer(), v.predicted_bytes_per_layer(),
               ratio(v.measured_bytes_per_layer(), v.predicted_bytes_per_layer()));
    if (!v.per_layer.empty())
      for (const auto& c : v.per_layer[0])
        fmt::print("  {:<38} {:>14.0f} {:>14.0f} {:>8.4f}\n",
                   fmt::format("{} x{} per layer, per call", to_string(c.collective), c.calls),
                   c.bytes_sent / double(c.calls), t.bytes_per_call,
                   ratio(c.bytes_sent / double(c.calls), t.bytes_per_call));
    fmt::print("  core: {}\n", t.formula);
    const double acts = v.activation_bytes_per_layer - v.layer_norm_stat_bytes;
    fmt::print("  {:<38} {:>14.0f} {:>14.0f} {:>8.4f}\n", "activation bytes per layer (fp32)",
               acts, v.predicted_activation_bytes_per_layer,
               ratio(acts, v.predicted_activation_bytes_per_layer));
    if (v.layer_norm_stat_bytes > 0)
      fmt::print("  (allocated {:.0f} bytes per layer, with LayerNorm's mean and rstd, {:.0f} bytes, "
                 "which Korthikanti's inventory omits)\n",
                 v.activation_bytes_per_layer, v.layer_norm_stat_bytes);
    if (v.sequence_parallel) {
      const double edge = engine::bytes_sent(v.edges), grads = engine::bytes_sent(v.sp_grad_reduce);
      const double regather = engine::bytes_sent(v.sp_regather);
      fmt::print("  {:<38} {:>14.0f} {:>14.0f} {:>8.4f}\n",
                 "backward re-gather bytes per step", regather,
                 v.predicted.tp_regather.bytes_per_rank,
                 ratio(regather, v.predicted.tp_regather.bytes_per_rank));
      fmt::print("  (core's tp_regather: the column-parallel inputs' shards gathered again for the "
                 "weight gradients, as Megatron does, overlapped)\n");
      fmt::print("  {:<38} {:>14.0f} {:>14.0f} {:>8.4f}\n", "SP edge bytes per step", edge,
                 v.predicted_sp.edges.bytes_per_rank,
                 ratio(edge, v.predicted_sp.edges.bytes_per_rank));
      fmt::print("  {:<38} {:>14.0f} {:>14.0f} {:>8.4f}\n", "SP gradient all-reduce bytes per step",
                 grads, v.predicted_sp.grads.bytes_per_rank,
                 ratio(grads, v.predicted_sp.grads.bytes_per_rank));
      fmt::print("  (core's engine_sp_traffic: the embedding split's backward all-gather and the "
                 "final gather, and the sequence-sharded parameters' gradients all-reduced once "
                 "per step, as this engine's replicated embedding and head need them)\n");
    }
  }
  for (const auto& c : checks)
    if (c.what.starts_with("SP-on / SP-off"))
      fmt::print("{}: measured {:.4f}, core {:.4f} (seed plan 2: the saving SP buys)\n", c.what,
                 c.measured, c.predicted);
  int failed = 0;
  for (const auto& c : checks) failed += c.ok ? 0 : 1;
  fmt::print("checks: {} of {} passed\n", int(checks.size()) - failed, int(checks.size()));
}

void run(Flags& f) {
  if (f.sp && f.compare_sp) throw InvalidInput("--sp with --compare-sp: give one of them");
  if (f.recompute && f.compare_recompute)
    throw InvalidInput("--recompute with --compare-recompute: give one of them");
  f.run.recompute = f.compare_recompute ? engine::RecomputeMode::both
                    : f.recompute       ? engine::RecomputeMode::full
                                        : engine::RecomputeMode::none;
  f.run.sp = f.compare_sp ? engine::SpMode::both : f.sp ? engine::SpMode::on : engine::SpMode::off;
  const engine::DistEnv env = engine::DistEnv::from_environment();
  if (f.html && env.rank == 0) html::check_writable("--html", *f.html);  // before the run
  const engine::TpResult r = engine::run_tp(env, f.run);
  const auto checks = engine::tp_checks(r);
  if (f.html && r.rank == 0)  // before a failed check ends the run: the page shows it
    html::write_file("--html", *f.html, html::page(tp_page(to_json(r, checks))));
  report_and_check("tp", r, checks, f.json, to_json, print_text);
}

const RegisterRun reg{[](CLI::App& run_cmd) {
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = run_cmd.add_subcommand(
      "tp",
      "Megatron tensor parallelism (column/row-parallel linears, --sp: sequence parallelism) on "
      "the engine's GPT over every rank: float64 loss and gradients vs the single-process model, "
      "fp32 loss trajectory, bytes per TP collective and per layer vs core's TP ledger, "
      "activation bytes per layer vs core's activation ledger; start it "
      "with `tally launch --nproc T -- tally run tp --tp T`");
  cmd->footer("Exit 1 when a check fails: float64 ≤ 1e-10 relative, fp32 losses ≤ 1e-5, bytes "
              "exact, activations ±1 %. Rank 0 prints.");
  cmd->add_option("--tp", f->run.tp, "TP ranks; must equal the world size (0 = the world size)")
      ->capture_default_str();
  cmd->add_flag("--sp", f->sp, "sequence parallelism (Korthikanti 2022 §4.2.2)");
  cmd->add_flag("--compare-sp", f->compare_sp, "run without and then with SP");
  cmd->add_flag("--recompute", f->recompute,
                "full activation recompute of every block (replays its forward collectives)");
  cmd->add_flag("--compare-recompute", f->compare_recompute, "run without and then with --recompute");
  cmd->add_option("--hidden", f->run.model.hidden, "C")->capture_default_str();
  cmd->add_option("--layers", f->run.model.layers, "L")->capture_default_str();
  cmd->add_option("--heads", f->run.model.heads, "a")->capture_default_str();
  cmd->add_option("--vocab", f->run.model.vocab, "V")->capture_default_str();
  cmd->add_option("--seq", f->run.model.seq, "T")->capture_default_str();
  cmd->add_option("--micro-batch", f->run.model.micro_batch, "B")->capture_default_str();
  cmd->add_option("--steps", f->run.steps, "fp32 SGD steps")->capture_default_str();
  cmd->add_option("--lr", f->run.lr, "SGD learning rate")
      ->check(finite_in(0, 1e6, Ends::open_lo))
      ->capture_default_str();
  cmd->add_option("--seed", f->run.seed, "seed of the weights and tokens")->capture_default_str();
  add_rank_run_flags(cmd, f->run.timeout_s, f->run.threads, f->json, "collective");
  cmd->add_option("--html", f->html,
                  "also write the report as a self-contained HTML page to FILE (rank 0): bytes "
                  "per layer by collective and activation bytes per layer beside core, the loss "
                  "against the single-process model");
  cmd->callback([f] { run(*f); });
}};

}  // namespace

}  // namespace tally::cli::run_tp
