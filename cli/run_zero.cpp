// `tally run zero`: the text and JSON reporters of engine::run_zero (tally/engine/experiments/zero.hpp). Every
// rank runs the stages; rank 0 prints the report for all ranks (the figures are gathered), so under
// `tally launch` only "[rank 0] " lines carry it. Bad flags exit 2; a failed check exits 1 on every
// rank.
#include <fmt/core.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.hpp"
#include "experiment_report.hpp"
#include "host_prediction.hpp"
#include "html_engine.hpp"
#include "html_report.hpp"
#include "run_registry.hpp"
#include "tally/core/comm.hpp"
#include "tally/engine/bench/harness.hpp"
#include "tally/engine/experiments/zero.hpp"

namespace tally::cli::run_zero {

namespace {

// One line settling the seed's claims from the measured ratios (engine::zero_seed_claims; without
// stage 0: against core's DP all-reduce, labelled); empty for k = 1.
std::string zero_conclusion(const engine::ZeroResult& r) {
  const engine::ZeroSeedClaims claims = engine::zero_seed_claims(r);
  if (claims.claims.empty()) return "";
  std::string out = claims.against_measured_dp
                        ? "measured bytes per step ÷ DP's (rank 0):"
                        : "measured bytes per step ÷ core's DP all-reduce 2S(k-1)/k (DP not run; "
                          "add --stage 0), rank 0:";
  for (const engine::ZeroSeedClaim& c : claims.claims) {
    const char* verdict = c.holds ? "holds" : "does not hold";
    if (c.stage == 1)
      out += fmt::format(" ZeRO-1 {:.3f} (seed: \"unchanged\" — {});", c.measured_ratio, verdict);
    else if (c.stage == 2)
      out += fmt::format(
          " ZeRO-2 {:.3f} (seed: \"halves\" — {}: its reduce-scatter alone is {:.3f}, the seed's "
          "figure, but the updated parameters must then be all-gathered);",
          c.measured_ratio, verdict, c.reduce_scatter_ratio);
    else
      out += fmt::format(
          " ZeRO-3 {:.3f} (seed: \"≈1.5×\" — {}: two all-gathers and a reduce-scatter per unit).",
          c.measured_ratio, verdict);
  }
  return out;
}

struct Flags {
  engine::ZeroOptions run;
  std::vector<std::string> stages = {"all"};
  std::string precision = "fp32";
  bool json = false;
  std::string calibration;
  std::optional<std::string> html;  // --html FILE, written by rank 0
};

constexpr const char* kMemoryConvention =
    "bytes per rank after the last step; held = Σ nbytes of the strategy's own tensors; allocator "
    "= tracking allocator's allocated bytes − those before the model was built";
constexpr const char* kMemoryPhasesConvention =
    "tracking allocator's allocated bytes per rank − those before the model was built: after "
    "setup (settled; bf16 DP's gradients appear at the first step's end), the peak from a "
    "step's start to its optimizer update (forward, backward, gradient reduction), the peak of "
    "the update (Adam; ZeRO-1/2: and the all-gather), both max over the steps, and after the last "
    "step; core predicts the states (model_states) only";
constexpr const char* kTrafficConvention =
    "bytes this rank sent per optimizer step; Comm counters = core formula on the real S of each "
    "call (ring all-reduce: its actual sends); wire = what the algorithms put on the wire (chunk "
    "arithmetic, all-gather chunks padded)";

// 25239280 → "25,239,280".
std::string bytes_str(double b) {
  std::string s = fmt::format("{:.0f}", b);
  for (int i = int(s.size()) - 3; i > 0 && s[std::size_t(i) - 1] != '-'; i -= 3)
    s.insert(std::size_t(i), ",");
  return s;
}

std::string calls_str(const engine::RankTraffic& t) {
  std::vector<std::string> parts;
  if (t.all_reduce.calls > 0)
    parts.push_back(fmt::format("ring all-reduce ×{}", t.all_reduce.calls));
  if (t.reduce_scatter.calls > 0)
    parts.push_back(fmt::format("reduce-scatter ×{}", t.reduce_scatter.calls));
  if (t.all_gather.calls > 0) parts.push_back(fmt::format("all-gather ×{}", t.all_gather.calls));
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "" : " + ") + p;
  return s.empty() ? "none" : s;
}


// Rank 0's phases of each step, in step order: the same four as zero_phases below (arrival_wait
// only where measured) and the step's CPU time, unreduced, so a reader can see their spread.
nlohmann::json per_step_phases_json(const engine::StageResult& st) {
  nlohmann::json fb = nlohmann::json::array(), wait = fb, coll = fb, opt = fb, cpu = fb,
                 queued = fb, queued_in_collectives = fb;
  for (const engine::ZeroStepPhases& p : st.step_phases) {
    fb.push_back(p.forward_backward_s);
    wait.push_back(p.arrival_wait_s);
    coll.push_back(p.collectives_s - p.arrival_wait_s);
    opt.push_back(p.optimizer_s);
    cpu.push_back(p.cpu_s);
    queued.push_back(p.runqueue_wait_s);
    queued_in_collectives.push_back(p.runqueue_in_collectives_s);
  }
  nlohmann::json out{{"forward_backward", fb}, {"collectives", coll}, {"optimizer", opt},
                     {"cpu", cpu}};
  if (st.arrival_measured) out["arrival_wait"] = wait;
  if (st.runqueue_measured) out["runqueue_wait"] = queued;
  if (st.runqueue_measured && st.arrival_measured)
    out["runqueue_wait_in_collectives"] = queued_in_collectives;
  return out;
}

// One rank's phase medians (engine::ZeroRankMedians, Note [every rank's phases] in zero.cpp), the
// step's four phases in order; with the arrival measured, collectives is what is left of them once
// every rank had arrived.
StepPhases zero_phases(const engine::StageResult& st, int rank = 0) {
  const engine::ZeroRankMedians& m = st.rank_medians[std::size_t(rank)];
  StepPhases out{.median_s = {{"forward_backward", m.forward_backward_s}}};
  if (st.arrival_measured) out.median_s.push_back({"arrival_wait", m.arrival_wait_s});
  out.median_s.push_back({"collectives", m.collectives_s});
  out.median_s.push_back({"optimizer", m.optimizer_s});
  out.convention = fmt::format("rank {}'s own phases of each step, medians over the steps; ",
                               rank) +
                   (st.arrival_measured
                        ? "arrival_wait = time inside the Comm's collectives before the last "
                          "rank entered each (every rank's entry times on this host's clock), "
                          "collectives = the rest of that time (gradient reduction, parameter "
                          "gathers)"
                        : "collectives = time inside the Comm's collectives (gradient "
                          "reduction, parameter gathers)") +
                   ", optimizer = the Adam update, forward_backward = the rest of the step "
                   "(forward, backward, passes over gradient buffers)";
  return out;
}

// "step 27.10-29.50; forward_backward 3.80-6.40 + … ; CPU 10.30-12.50": each figure's min and max
// over the ranks' own medians, ms.
std::string ranks_spread_line(const engine::StageResult& st) {
  const auto span = [](const std::vector<double>& v) {
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    return fmt::format("{:.2f}-{:.2f}", *lo * 1e3, *hi * 1e3);
  };
  std::vector<double> step, cpu, queued, queued_in_collectives;
  std::vector<std::pair<std::string, std::vector<double>>> phases;  // per phase, by rank
  for (int q = 0; q < int(st.rank_medians.size()); ++q) {
    step.push_back(st.rank_medians[std::size_t(q)].step_s);
    cpu.push_back(st.rank_medians[std::size_t(q)].cpu_s);
    queued.push_back(st.rank_medians[std::size_t(q)].runqueue_wait_mean_s);
    queued_in_collectives.push_back(st.rank_medians[std::size_t(q)].runqueue_in_collectives_mean_s);
    const StepPhases p = zero_phases(st, q);
    phases.resize(p.median_s.size());
    for (std::size_t i = 0; i < p.median_s.size(); ++i) {
      phases[i].first = p.median_s[i].first;
      phases[i].second.push_back(p.median_s[i].second);
    }
  }
  std::string parts;
  for (const auto& [name, v] : phases) parts += (parts.empty() ? "" : " + ") + name + " " + span(v);
  return fmt::format("step {}; {}; CPU {}", span(step), parts, span(cpu)) +
         (st.runqueue_measured ? "; run-queue wait (mean) " + span(queued) : "") +
         (st.runqueue_measured && st.arrival_measured
              ? ", in collectives " + span(queued_in_collectives)
              : "");
}

// Rank q's phase medians without the convention (the stage's phase_seconds_median states it).
nlohmann::json rank_phases_json(const engine::StageResult& st, int q) {
  StepPhases p = zero_phases(st, q);
  p.convention.clear();
  return phases_json(p);
}

std::string widths_str(const std::vector<std::int64_t>& w) {
  std::string s;
  for (auto x : w) s += (s.empty() ? "" : "-") + std::to_string(x);
  return s;
}

// A check in words: the stage, the rank and what was compared (engine::ZeroCheck).
std::string check_what(const engine::ZeroResult& r, const engine::ZeroCheck& c) {
  const engine::StageResult* st = r.find(c.stage);
  const std::string stage = st != nullptr ? st->name : fmt::format("stage {}", c.stage);
  const std::string who = fmt::format("{} rank {}: ", stage, c.rank);
  switch (c.kind) {
    case engine::ZeroCheckKind::allocator_vs_model_states:
      return who + fmt::format(
                       "allocator bytes after the last step vs core model_states (±{:.0f} %)",
                       100 * c.tolerance);
    case engine::ZeroCheckKind::held_vs_model_states:
      return who + fmt::format("held state bytes vs core model_states (±{:.0f} %)",
                               100 * c.tolerance);
    case engine::ZeroCheckKind::bytes_vs_step_traffic:
      return who + "bytes sent per step vs core step_traffic dp_grad + zero_param_gather";
    case engine::ZeroCheckKind::collective_calls:
      return who + "collective calls per step (ZeRO-3: 3 per unit)";
    case engine::ZeroCheckKind::steady_bytes:
      return who + "the same bytes every step";
    case engine::ZeroCheckKind::loss_vs_dp:
      return stage + ": max relative loss difference vs DP, every rank and step";
  }
  return who;
}

void print_text(const engine::ZeroResult& r, const std::vector<engine::ZeroCheck>& checks) {
  const auto& o = r.options;
  const int k = r.world_size;
  std::string units;
  for (auto n : r.unit_params) units += (units.empty() ? "" : " + ") + bytes_str(double(n));
  fmt::print(
      "zero: MLP {}, N = {} parameters (units {}; N mod k = {}), k = {} ranks, {} ({} "
      "params, {} on the wire), Adam lr {}, {} steps of {} rows ({} per rank)\n",
      widths_str(o.widths), bytes_str(double(r.n_params)), units, r.n_params % k, k,
      o.precision == Precision::fp32 ? "fp32" : "bf16 mixed", r.param_dtype, r.wire_dtype, o.lr,
      o.steps, o.batch, o.batch / k);
  fmt::print("memory: {}\n", kMemoryConvention);
  fmt::print("  {:<12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>7} {:>7} {:>9} {:>12}\n",
             "stage", "params", "grads", "m+v", "master", "held", "allocator", "core", "alloc/",
             "held/", "worst", "peak");
  fmt::print("  {:<12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>7} {:>7} {:>9} {:>12}\n",
             "(rank 0)", "", "", "", "", "", "", "predicted", "core", "core", "rank", "");
  for (const auto& st : r.stages) {
    const auto& m = st.memory[0];
    const double pred = st.predicted_states.bytes.total();
    double worst = 0;  // max |allocator/core − 1| over ranks
    for (const auto& q : st.memory)
      worst = std::max(worst, std::abs(ratio(q.allocator_bytes, pred) - 1));
    fmt::print(
        "  {:<12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>7.4f} {:>7.4f} {:>8.2f}% "
        "{:>12}\n",
        st.name, bytes_str(m.held.params), bytes_str(m.held.grads), bytes_str(m.held.m + m.held.v),
        bytes_str(m.held.master), bytes_str(m.held.total()), bytes_str(m.allocator_bytes),
        bytes_str(pred), ratio(m.allocator_bytes, pred), ratio(m.held.total(), pred), 100 * worst,
        bytes_str(m.peak_bytes));
    fmt::print("  {:<12} core items: params {} grads {} m+v {} master {} | {}\n", "",
               bytes_str(st.predicted_states.bytes.params),
               bytes_str(st.predicted_states.bytes.grads),
               bytes_str(st.predicted_states.bytes.m + st.predicted_states.bytes.v),
               bytes_str(st.predicted_states.bytes.master), st.predicted_states.convention());
  }
  fmt::print("communication: {}\n", kTrafficConvention);
  fmt::print("  {:<12} {:<34} {:>12} {:>12} {:>10} {:>12} {:>7}\n", "stage (rank 0)",
             "collectives per step", "measured", "core", "measured/", "wire", "÷ DP");
  fmt::print("  {:<12} {:<34} {:>12} {:>12} {:>10} {:>12} {:>7}\n", "", "", "", "step_traffic",
             "core", "", "");
  for (const auto& st : r.stages) {
    const auto& t = st.traffic[0];
    const double pred = st.predicted_bytes_per_step();
    const double vs_dp = engine::traffic_ratio_vs_dp(r, st.stage);
    fmt::print("  {:<12} {:<34} {:>12} {:>12} {:>10.6f} {:>12} {:>7}\n", st.name, calls_str(t),
               bytes_str(t.total_bytes()), bytes_str(pred), ratio(t.total_bytes(), pred),
               bytes_str(t.wire_bytes), vs_dp > 0 ? fmt::format("{:.4f}", vs_dp) : "-");
    for (const auto& item : {st.predicted_traffic.dp_grad, st.predicted_traffic.zero_param_gather})
      if (item.bytes_per_rank > 0)
        fmt::print("  {:<12}   core {}: {} = {} B\n", "", to_string(item.kind), item.formula,
                   bytes_str(item.bytes_per_rank));
    if (o.precision != Precision::fp32)
      fmt::print(
          "  {:<12}   at the ledger's 2 B/element: {} B (measured/ledger = {:.3f}: bf16 "
          "travels as float32, Note [bf16 on Gloo])\n",
          "", bytes_str(st.ledger_traffic.dp_total_bytes()),
          ratio(t.total_bytes(), st.ledger_traffic.dp_total_bytes()));
  }
  if (const auto* z = r.find(2); z != nullptr && k > 1)
    fmt::print(
        "  seed's ZeRO-2 figure, reduce-scatter only S(k-1)/k: core {} B; measured "
        "reduce-scatter {} B\n",
        bytes_str(z->predicted_traffic.reduce_scatter_only_bytes),
        bytes_str(z->traffic[0].reduce_scatter.bytes_sent));
  fmt::print("loss (mean over ranks):\n");
  for (const auto& st : r.stages) {
    fmt::print("  {:<12} step 1 {:.6f} → step {} {:.6f}", st.name, st.mean_losses.front(), o.steps,
               st.mean_losses.back());
    if (st.compared_to_dp)
      fmt::print("; vs DP: max relative loss difference {:.3g}, max |θ − θ_DP| {:.3g}",
                 st.max_rel_loss_diff_vs_dp, st.max_param_diff_vs_dp);
    fmt::print(" ({:.2f} s)\n", st.seconds);
  }
  fmt::print("phases (rank 0, median over the {} steps):\n", o.steps);
  for (const auto& st : r.stages)
    fmt::print("  {:<12} step {:.2f} ms; {}\n", st.name,
               engine::time_stats(st.step_seconds).median_s * 1e3, phases_line(zero_phases(st)));
  if (r.world_size > 1) {
    fmt::print("every rank's medians, min-max over the {} ranks, ms (CPU: each rank's process, "
               "all its threads; Note [every rank's phases]):\n",
               r.world_size);
    for (const auto& st : r.stages) fmt::print("  {:<12} {}\n", st.name, ranks_spread_line(st));
  }
  if (const std::string c = zero_conclusion(r); !c.empty())
    fmt::print("conclusion: {}\n", c);
  std::size_t failed = 0;
  for (const auto& c : checks) failed += c.ok ? 0 : 1;
  fmt::print(
      "checks: {} of {} ok (memory ±{:.0f} %, counters vs core exact, fp32 losses vs DP "
      "≤ {:g})\n",
      checks.size() - failed, checks.size(), 100 * engine::kZeroMemoryTolerance,
      engine::kZeroLossTolerance);
  for (const auto& c : checks)
    if (!c.ok)
      fmt::print("  FAILED {}: measured {} vs {} (tolerance {})\n", check_what(r, c), c.measured,
                 c.predicted, c.tolerance);
}

nlohmann::json items_json(const StateItems& s) {
  return {{"params", s.params}, {"grads", s.grads},   {"m", s.m},
          {"v", s.v},           {"master", s.master}, {"total", s.total()}};
}

nlohmann::json counter_json(const engine::CollectiveCounter& c) {
  return {{"calls", c.calls}, {"bytes", c.bytes_sent}};
}

nlohmann::json to_json(const engine::ZeroResult& r, const std::vector<engine::ZeroCheck>& checks) {
  const auto& o = r.options;
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& st : r.stages) {
    const double mem_pred = st.predicted_states.bytes.total();
    const double bytes_pred = st.predicted_bytes_per_step();
    nlohmann::json ranks = nlohmann::json::array();
    for (int q = 0; q < r.world_size; ++q) {
      const auto& m = st.memory[q];
      const auto& t = st.traffic[q];
      ranks.push_back({{"rank", q},
                       {"step_seconds_median", st.rank_medians[q].step_s},
                       {"phase_seconds_median", rank_phases_json(st, q)},
                       {"cpu_seconds_median", st.rank_medians[q].cpu_s},
                       {"held_bytes", items_json(m.held)},
                       {"allocator_bytes", m.allocator_bytes},
                       {"allocator_ratio", ratio(m.allocator_bytes, mem_pred)},
                       {"held_ratio", ratio(m.held.total(), mem_pred)},
                       {"peak_bytes", m.peak_bytes},
                       {"setup_allocator_bytes", m.setup_bytes},
                       {"peak_forward_backward_bytes", m.peak_forward_backward_bytes},
                       {"peak_update_bytes", m.peak_update_bytes},
                       {"bytes_per_step", t.total_bytes()},
                       {"bytes_ratio", ratio(t.total_bytes(), bytes_pred)},
                       {"wire_bytes_per_step", t.wire_bytes},
                       {"ring_all_reduce", counter_json(t.all_reduce)},
                       {"reduce_scatter", counter_json(t.reduce_scatter)},
                       {"all_gather", counter_json(t.all_gather)},
                       {"steady", t.steady}});
      if (st.runqueue_measured)
        ranks.back()["runqueue_wait_seconds_mean"] = st.rank_medians[q].runqueue_wait_mean_s;
      if (st.runqueue_measured && st.arrival_measured)
        ranks.back()["runqueue_wait_in_collectives_seconds_mean"] =
            st.rank_medians[q].runqueue_in_collectives_mean_s;
    }
    nlohmann::json items = nlohmann::json::array();
    for (const auto& it : {st.predicted_traffic.dp_grad, st.predicted_traffic.zero_param_gather})
      items.push_back({{"kind", to_string(it.kind)},
                       {"collective", to_string(it.collective)},
                       {"calls", it.calls},
                       {"bytes_per_call", it.bytes_per_call},
                       {"bytes_per_rank", it.bytes_per_rank},
                       {"formula", it.formula}});
    nlohmann::json s = {
        {"stage", st.stage},
        {"name", st.name},
        {"states_convention", st.predicted_states.convention()},
        {"traffic_convention", st.predicted_traffic.convention()},
        {"predicted_state_bytes", items_json(st.predicted_states.bytes)},
        {"predicted_bytes_per_step", bytes_pred},
        {"predicted_items", items},
        {"ledger_bytes_per_step", st.ledger_traffic.dp_total_bytes()},
        {"seed_reduce_scatter_only_bytes", st.predicted_traffic.reduce_scatter_only_bytes},
        {"ratio_vs_dp", engine::traffic_ratio_vs_dp(r, st.stage)},
        {"ranks", ranks},
        {"mean_losses", st.mean_losses},
        {"rank0_losses", st.rank0_losses},
        {"seconds", st.seconds},
        {"step_seconds_median", engine::time_stats(st.step_seconds).median_s},
        {"phase_seconds_median", phases_json(zero_phases(st))},
        {"ranks_time_convention",
         "ranks[q]: step_seconds_median, phase_seconds_median (phase_seconds_median's phases on "
         "rank q) and cpu_seconds_median (the CPU time of rank q's process in a step, all its "
         "threads), each rank's own medians over the steps, which need not sum; "
         "runqueue_wait_seconds_mean (where the kernel exposes it): the mean over the steps of "
         "the time rank q's main thread was runnable but off a CPU, and "
         "runqueue_wait_in_collectives_seconds_mean (ranks on one host) its part inside the "
         "collectives"},
        {"step_seconds", st.step_seconds},
        {"phase_seconds", per_step_phases_json(st)}};
    if (st.compared_to_dp) {
      s["max_rel_loss_diff_vs_dp"] = st.max_rel_loss_diff_vs_dp;
      s["max_param_diff_vs_dp"] = st.max_param_diff_vs_dp;
    }
    stages.push_back(std::move(s));
  }
  nlohmann::json cj = nlohmann::json::array();
  bool ok = true;
  for (const auto& c : checks) {
    ok = ok && c.ok;
    cj.push_back({{"what", check_what(r, c)},
                  {"stage", c.stage},
                  {"rank", c.rank >= 0 ? nlohmann::json(c.rank) : nlohmann::json(nullptr)},
                  {"measured", c.measured},
                  {"predicted", c.predicted},
                  {"tolerance", c.tolerance},
                  {"ok", c.ok}});
  }
  return {{"experiment", "zero"},
          {"world_size", r.world_size},
          {"precision", to_string(o.precision)},
          {"param_dtype", r.param_dtype},
          {"wire_dtype", r.wire_dtype},
          {"model", {{"kind", "mlp"}, {"widths", o.widths}}},
          {"n_params", r.n_params},
          {"unit_params", r.unit_params},
          {"batch", o.batch},
          {"steps", o.steps},
          {"lr", o.lr},
          {"memory_convention", kMemoryConvention},
          {"memory_phases_convention", kMemoryPhasesConvention},
          {"traffic_convention", kTrafficConvention},
          {"stages", stages},
          {"conclusion", zero_conclusion(r)},
          {"checks", cj},
          {"ok", ok}};
}

void run(Flags& f) {
  f.run.stages.clear();
  for (const auto& s : f.stages) {
    if (s == "all") {
      f.run.stages.insert(f.run.stages.end(), {0, 1, 2, 3});
    } else {
      f.run.stages.push_back(std::stoi(s));  // one_of() admitted only 0..3
    }
  }
  f.run.precision = precision_from(f.precision);
  const engine::DistEnv env = engine::DistEnv::from_environment();
  if (f.html && env.rank == 0) html::check_writable("--html", *f.html);  // before a long run
  std::optional<HostModel> model;
  if (!f.calibration.empty()) {
    if (f.run.precision != Precision::fp32)
      throw InvalidInput("--calibration with --precision " + f.precision +
                         ": the host step model covers float32 runs only");
    model = load_host_model("--calibration", f.calibration, env.world_size);
  }
  const engine::ZeroResult r = engine::run_zero(env, f.run);
  const auto checks = engine::zero_checks(r);
  if (r.rank == 0) {
    nlohmann::json j;
    if (f.json || f.html) j = to_json(r, checks);
    if (!f.json) print_text(r, checks);
    if (model) {
      if (!f.json) fmt::print("step time (rank 0, median over the {} steps):\n", f.run.steps);
      for (std::size_t i = 0; i < r.stages.size(); ++i) {
        const engine::StageResult& st = r.stages[i];
        const double measured = engine::time_stats(st.step_seconds).median_s;
        const MlpStepTime t = predict_step(
            *model, {.widths = f.run.widths, .rows = f.run.batch / r.world_size,
                     .ranks = r.world_size, .zero_stage = st.stage,
                     .optimizer = Optimizer::adam,
                     // --threads 0: libtorch's default, one per hardware thread
                     .threads_per_rank = f.run.threads > 0 ? f.run.threads : host_cores(),
                     // Note [per-implementation links]: its all-reduce and reduce-scatter are
                     // tally's ring, its all-gathers Gloo's (engine/runtime/comm.cpp); the halves
                     // on their own fits where the calibration timed them (Note [sharded
                     // collectives], engine/bench/allreduce.cpp).
                     .reduce_link = model->ring_link,
                     .reduce_scatter_link = model->ring_reduce_scatter_link,  // unset: the ring's
                     .all_gather_link = model->gloo_all_gather_link ? model->gloo_all_gather_link
                                                                    : model->gloo_link});
        if (f.json || f.html) add_prediction_json(j["stages"][i], *model, t, measured);
        if (!f.json) {
          fmt::print("  {:<12} measured {:.2f} ms\n  {:<12} {}\n", st.name, measured * 1e3, "",
                     prediction_line(*model, t, measured).substr(2));
        }
      }
    }
    if (f.html) html::write_file("--html", *f.html, html::page(zero_page(j)));
    if (f.json) std::cout << j.dump() << std::endl;  // one line: `tally launch` prefixes it
    std::fflush(stdout);
  }
  for (const auto& c : checks)
    if (!c.ok)
      throw std::runtime_error("zero: rank " + std::to_string(r.rank) +
                               ": check failed: " + check_what(r, c));
}

const RegisterRun reg{[](CLI::App& run_cmd) {
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = run_cmd.add_subcommand(
      "zero",
      "DP and ZeRO stages 1, 2, 3 trained for real over Gloo: per-rank model-state bytes and bytes "
      "sent per step beside core's model_states() and step_traffic(), and the loss trajectory vs "
      "DP; start it with `tally launch --nproc K -- tally run zero --stage 2`");
  cmd->footer(
      "Model: an MLP (Linear + ReLU) with --widths d_0,...,d_U; default 512,1021,1021,10 "
      "(N = 1,577,455, odd, so shards are uneven). Rank 0 prints for every rank. Exit 1 when a "
      "check fails: memory ±5 %, counters vs core exact (ring all-reduce within 2 elements), fp32 "
      "losses vs DP ≤ 1e-5 relative.");
  cmd->add_option("--stage", f->stages,
                  "ZeRO stage(s) to run, in order: 0 (DP), 1, 2, 3 or all; "
                  "repeat the flag for several")
      ->check(one_of({"0", "1", "2", "3", "all"}))
      ->capture_default_str();
  cmd->add_option("--precision", f->precision,
                  "fp32, or bf16 (mixed: bf16 params/grads + fp32 master, m, v)")
      ->check(one_of({"fp32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--steps", f->run.steps, "optimizer steps per stage")->capture_default_str();
  cmd->add_option("--batch", f->run.batch, "global rows per step (divisible by the world size)")
      ->capture_default_str();
  cmd->add_option("--widths", f->run.widths, "MLP widths d_0,...,d_U")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--lr", f->run.lr, "Adam learning rate")
      ->check(finite_in(0, 1e6, Ends::open_lo))
      ->capture_default_str();
  cmd->add_option("--seed", f->run.seed, "seed of the weights and the batch")
      ->capture_default_str();
  add_rank_run_flags(cmd, f->run.timeout_s, f->run.threads, f->json, "collective");
  cmd->add_option("--html", f->html,
                  "also write the report as a self-contained HTML page to FILE (rank 0): state "
                  "bytes per rank and bytes per collective beside core, memory and time by "
                  "phase, loss curves");
  cmd->add_option("--calibration", f->calibration,
                  "predict each stage's step time from this host calibration (`tally bench "
                  "gemm|memory|allreduce --calibration-out`) and print measured/predicted");
  cmd->callback([f] { run(*f); });
}};

}  // namespace

}  // namespace tally::cli::run_zero
