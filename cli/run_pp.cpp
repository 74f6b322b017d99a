// `tally run pp`: the text and JSON reporters of engine::run_pp (tally/engine/experiments/pp.hpp).
// Every rank runs and checks the gathered figures (exit 1 naming the first failed check); rank 0
// prints the report (every stage's figures), so under `tally launch` only "[rank 0] " lines carry
// it. Bad flags exit 2. One progress line per run on stderr (rank 0).
#include <fmt/core.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "common.hpp"
#include "experiment_report.hpp"
#include "run_registry.hpp"
#include "tally/engine/experiments/pp.hpp"

namespace tally::cli::run_pp {

namespace {

struct Flags {
  engine::PpOptions run;
  std::string schedule = "1f1b";
  bool json = false;
};



// The idle fraction core's simulator predicts for stage s: 1 − M(t_f + t_b) / makespan.
double simulated_idle(const engine::PpRun& run, const engine::PpStageMeasure& s) {
  const double busy = run.spec.micro_batches * (s.forward_s + s.backward_s);
  return run.simulated_makespan_s > 0 ? 1 - busy / run.simulated_makespan_s : 0;
}

nlohmann::json to_json(const engine::PpResult& r, const std::vector<engine::PpCheck>& checks) {
  const auto& m = r.options.model;
  nlohmann::json j = {{"experiment", "pp"},
                      {"rank", r.rank},
                      {"world_size", r.world_size},
                      {"pp", r.options.pp},
                      {"stage_layers", r.stage_layers},
                      {"model",
                       {{"hidden", m.hidden}, {"layers", m.layers}, {"heads", m.heads},
                        {"vocab", m.vocab}, {"seq", m.seq}, {"micro_batch", m.micro_batch},
                        {"params", r.n_params}}},
                      {"timed_steps", r.options.steps}};
  j["runs"] = nlohmann::json::array();
  for (const engine::PpRun& run : r.runs) {
    nlohmann::json stages = nlohmann::json::array();
    for (const auto& s : run.stages)
      stages.push_back({{"layers", s.layers},
                        {"max_grad_rel_diff_f64", s.max_grad_rel_diff},
                        {"order_matches_core", s.order_ok},
                        {"activation_sends", s.activation_sends},
                        {"gradient_sends", s.gradient_sends},
                        {"send_bytes", measured_json(s.max_send_bytes, run.predicted_send_bytes)},
                        {"compute_s", s.compute_s},
                        {"wait_s", s.wait_s},
                        {"elapsed_s", s.elapsed_s},
                        {"forward_s_per_micro_batch", s.forward_s},
                        {"backward_s_per_micro_batch", s.backward_s},
                        {"idle_fraction", measured_json(s.idle_fraction(), run.predicted_bubble)},
                        {"idle_fraction_simulated", simulated_idle(run, s)}});
    const auto& s0 = run.stages[0];
    j["runs"].push_back(
        {{"schedule", std::string(to_string(run.spec.schedule))},
         {"micro_batches", run.spec.micro_batches},
         {"interleave", run.spec.interleave},
         {"loss_f64", measured_json(run.loss_f64, run.reference_loss_f64)},
         {"stage0_idle_fraction", measured_json(s0.idle_fraction(), run.predicted_bubble)},
         {"makespan_s", measured_json(run.makespan_s(), run.simulated_makespan_s)},
         {"stage0_in_flight", measured_json(s0.in_flight(), run.predicted_in_flight)},
         {"stage0_peak_activation_bytes", s0.peak_held_bytes},
         {"stage0_bytes_per_forward", s0.bytes_per_forward},
         {"send_bytes_predicted", run.predicted_send_bytes},
         {"stages", stages}});
  }
  nlohmann::json failed = nlohmann::json::array();
  for (const auto& c : checks)
    if (!c.ok) failed.push_back(c.what);
  j["checks"] = checks.size();
  j["failed_checks"] = failed;
  j["ok"] = failed.empty();
  return j;
}

void print_text(const engine::PpResult& r, const std::vector<engine::PpCheck>& checks) {
  const auto& m = r.options.model;
  std::string split;
  for (int l : r.stage_layers) split += (split.empty() ? "" : "+") + std::to_string(l);
  fmt::print("pp: P = {} stages (Gloo, CPU), layers {}; GPT h {} L {} a {} V {} T {} B {} (N = {}); "
             "float64; times: mean of {} step(s)\n",
             r.world_size, split, m.hidden, m.layers, m.heads, m.vocab, m.seq, m.micro_batch,
             r.n_params, std::max(r.options.steps, 1));
  for (const engine::PpRun& run : r.runs) {
    fmt::print("{} M = {}{}: loss {:.12g} vs single-process {:.12g}\n", to_string(run.spec.schedule),
               run.spec.micro_batches,
               run.spec.interleave > 1 ? fmt::format(" v = {}", run.spec.interleave) : "",
               run.loss_f64, run.reference_loss_f64);
    fmt::print("  {:<6} {:>6} {:>10} {:>6} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}\n", "stage",
               "layers", "grad diff", "order", "send bytes", "t_f ms", "t_b ms", "wait ms", "idle",
               "core", "ratio");
    for (std::size_t s = 0; s < run.stages.size(); ++s) {
      const auto& st = run.stages[s];
      fmt::print("  {:<6} {:>6} {:>10.1e} {:>6} {:>11.0f} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} "
                 "{:>9.3f} {:>7.3f}\n",
                 s, st.layers, st.max_grad_rel_diff, st.order_ok ? "core" : "DIFF",
                 st.max_send_bytes, 1e3 * st.forward_s, 1e3 * st.backward_s, 1e3 * st.wait_s,
                 st.idle_fraction(), run.predicted_bubble,
                 ratio(st.idle_fraction(), run.predicted_bubble));
    }
    const auto& s0 = run.stages[0];
    fmt::print("  send bytes per micro-batch per boundary: core b*s*h*8 = {:.0f} bytes; makespan "
               "{:.4f} s vs {:.4f} s simulated from the measured t_f, t_b (ratio {:.3f}); stage 0 "
               "idle {:.3f} vs simulated {:.3f}\n",
               run.predicted_send_bytes, run.makespan_s(), run.simulated_makespan_s,
               ratio(run.makespan_s(), run.simulated_makespan_s), s0.idle_fraction(),
               simulated_idle(run, s0));
    fmt::print("  stage 0 activations held at peak: {:.0f} bytes = {:.2f} forwards' worth "
               "({:.0f} bytes each) vs core's in-flight {} (ratio {:.3f})\n",
               s0.peak_held_bytes, s0.in_flight(), s0.bytes_per_forward, run.predicted_in_flight,
               ratio(s0.in_flight(), run.predicted_in_flight));
  }
  int failed = 0;
  for (const auto& c : checks) failed += c.ok ? 0 : 1;
  fmt::print("checks: {} of {} passed\n", int(checks.size()) - failed, int(checks.size()));
}

void run(Flags& f) {
  f.run.schedule = f.schedule == "gpipe"   ? PipelineSchedule::gpipe
                   : f.schedule == "1f1b" ? PipelineSchedule::one_f_one_b
                                          : PipelineSchedule::interleaved;
  const engine::PpResult r = engine::run_pp(engine::DistEnv::from_environment(), f.run);
  const auto checks = engine::pp_checks(r);
  if (r.rank == 0) {
    if (f.json)
      std::cout << to_json(r, checks).dump() << std::endl;  // one line: `tally launch` prefixes it
    else
      print_text(r, checks);
    std::fflush(stdout);
  }
  for (const auto& c : checks)
    if (!c.ok)
      throw std::runtime_error(fmt::format("pp: rank {}: check failed: {}: {:.6g} vs {:.6g} "
                                           "(tolerance {:.1e})",
                                           r.rank, c.what, c.measured, c.predicted, c.tolerance));
}

const RegisterRun reg{[](CLI::App& run_cmd) {
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = run_cmd.add_subcommand(
      "pp",
      "pipeline parallelism (GPipe, 1F1B, interleaved 1F1B) on the engine's GPT split into stages "
      "over every rank: float64 loss and gradients vs the single-process model, executed order vs "
      "core's schedule, bytes per send vs core's PP ledger, idle fraction vs core's bubble; start "
      "it with `tally launch --nproc P -- tally run pp --pp P`");
  cmd->footer("Exit 1 when a check fails: float64 ≤ 1e-10 relative, order and bytes exact (the "
              "bubble and in-flight figures are reported, not checked). Rank 0 prints.");
  cmd->add_option("--pp", f->run.pp, "stages; must equal the world size (0 = the world size)")
      ->capture_default_str();
  cmd->add_option("--schedule", f->schedule,
                  "gpipe (all forwards, then all backwards) | 1f1b (PipeDream-Flush) | "
                  "interleaved (1F1B over --interleave chunks per stage, Megatron-LM's)")
      ->check(one_of({"gpipe", "1f1b", "interleaved"}))
      ->capture_default_str();
  cmd->add_option("--interleave", f->run.interleave,
                  "model chunks per stage for --schedule interleaved (0 = 2)")
      ->capture_default_str();
  cmd->add_option("--micro-batches", f->run.micro_batches, "M per step (0 = 2 x --pp)")
      ->capture_default_str();
  cmd->add_flag("--sweep", f->run.sweep,
                "every schedule at M = 1, P, 2P+1 (interleaved: P, 2P) in one launch");
  cmd->add_option("--hidden", f->run.model.hidden, "C")->capture_default_str();
  cmd->add_option("--layers", f->run.model.layers, "L")->capture_default_str();
  cmd->add_option("--heads", f->run.model.heads, "a")->capture_default_str();
  cmd->add_option("--vocab", f->run.model.vocab, "V")->capture_default_str();
  cmd->add_option("--seq", f->run.model.seq, "T")->capture_default_str();
  cmd->add_option("--micro-batch", f->run.model.micro_batch, "B")->capture_default_str();
  cmd->add_option("--steps", f->run.steps, "timed float64 steps after the checked one")
      ->capture_default_str();
  cmd->add_option("--seed", f->run.seed, "seed of the weights and tokens")->capture_default_str();
  add_rank_run_flags(cmd, f->run.timeout_s, f->run.threads, f->json, "send / recv");
  cmd->callback([f] { run(*f); });
}};

}  // namespace

}  // namespace tally::cli::run_pp
