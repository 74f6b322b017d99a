// `tally run 3d`: the text and JSON reporters of engine::run_3d (tally/engine/experiments/
// three_d.hpp), and `--plan FILE`, which takes the layout from `tally plan --json`'s output (its
// `best` plan object, or a plan object alone: docs/json.md). Every rank checks the gathered
// figures (exit 1 naming the first failed check); rank 0 prints every rank's figures, so under
// `tally launch` only "[rank 0] " lines carry the report. Bad flags or plans exit 2 with one line.
// One progress line per fp32 step on stderr (rank 0).
#include <fmt/core.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "experiment_report.hpp"
#include "html_engine.hpp"
#include "html_report.hpp"
#include "host_prediction.hpp"
#include "run_registry.hpp"
#include "tally/core/pipeline.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/experiments/three_d.hpp"

namespace tally::cli::run_3d {

namespace {

struct Flags {
  engine::ThreeDOptions run;
  std::string schedule = "1f1b";
  std::string recompute = "none";
  std::string plan, calibration;
  bool json = false;
  std::optional<std::string> html;  // --html FILE, written by rank 0
  // Whether a layout flag was given (--plan takes the layout, so it refuses them).
  std::vector<CLI::Option*> layout_flags;
  CLI::Option* schedule_flag = nullptr;
  CLI::Option* layers_flag = nullptr;
};


nlohmann::json vs(double measured, double predicted) {
  return {{"measured", measured}, {"predicted", predicted}, {"ratio", ratio(measured, predicted)}};
}
// A time whose prediction needs a host calibration (-1 without one): predicted and ratio null.
nlohmann::json vs_time(double measured, double predicted) {
  if (predicted < 0)
    return {{"measured", measured}, {"predicted", nullptr}, {"ratio", nullptr}};
  return vs(measured, predicted);
}

// The plan's `stage_layers` (when it has them): an even split is the run's own even split at its
// depth; an uneven one (the planner's lighter end stages, compare --pp-layers) runs as planned, at
// the planned depth: --layers then defaults to the plan's and must equal it when given.
// Interleaved with uneven virtual stages, the plan's `virtual_stage_layers` (pp·v entries, Note
// [uneven virtual stages]) runs as planned instead.
void apply_plan_stages(Flags& f, const nlohmann::json& j, const std::string& flag) {
  const bool chunks = f.run.interleave > 1 && j.contains("virtual_stage_layers");
  const char* key = chunks ? "virtual_stage_layers" : "stage_layers";
  if (!j.contains(key)) return;
  const nlohmann::json& list = j[key];
  const int entries = f.run.pp * (chunks ? f.run.interleave : 1);
  const std::int64_t least = chunks ? 0 : 1;  // a virtual stage may hold none (the slot split)
  std::vector<int> stages;
  if (list.is_array())
    for (const auto& x : list)
      if (x.is_number_integer() && x.get<std::int64_t>() >= least &&
          x.get<std::int64_t>() <= 100000)
        stages.push_back(x.get<int>());
  if (!list.is_array() || stages.size() != list.size() || int(stages.size()) != entries)
    throw InvalidInput(flag + ": plan field `" + key + "` must list " +
                       (chunks ? "pp x interleave = " : "pp = ") + std::to_string(entries) +
                       " layer counts, each in [" + std::to_string(least) + ", 100000]");
  const int planned = std::accumulate(stages.begin(), stages.end(), 0);
  if (!chunks && stages == stage_layers(planned, f.run.pp)) return;  // even: the run's own split
  std::string list_text;
  for (int l : stages) list_text += (list_text.empty() ? "" : ",") + std::to_string(l);
  if (f.layers_flag->count() == 0) {
    f.run.model.layers = planned;
  } else if (f.run.model.layers != planned) {
    throw InvalidInput(fmt::format("{}: the plan's uneven stages {} hold {} layers, but --layers = "
                                   "{} (leave --layers out to run the planned depth)",
                                   flag, list_text, planned, f.run.model.layers));
  }
  f.run.pp_layers = stages;
}

// The layout of a `tally plan --json` output (its "best") or of one plan object.
void apply_plan(Flags& f, int world_size) {
  const std::string flag = "--plan = " + f.plan;
  std::ifstream in(f.plan);
  if (!in) throw InvalidInput(flag + ": cannot read the file");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw InvalidInput(flag + ": not a JSON object (expected `tally plan --json` output)");
  if (j.contains("best")) {
    if (j["best"].is_null())
      throw InvalidInput(flag + ": the plan has no best layout (nothing fit); pick one of its "
                                "near_misses into a file of its own");
    j = j["best"];
  }
  auto integer = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_number_integer())
      throw InvalidInput(flag + ": plan field `" + key + "` missing or not an integer");
    return j[key].get<std::int64_t>();
  };
  const std::int64_t dp = integer("dp"), tp = integer("tp"), pp = integer("pp"),
                     cp = integer("cp"), zero = integer("zero"), v = integer("interleave"),
                     b = integer("micro_batch"), m = integer("grad_accum");
  const std::int64_t ep = j.contains("ep") ? integer("ep") : 1;
  if (!j.contains("sp") || !j["sp"].is_boolean())
    throw InvalidInput(flag + ": plan field `sp` missing or not a boolean");
  const std::string recompute = j.value("recompute", std::string("none"));
  if (ep != 1)
    throw InvalidInput(flag + ": ep = " + std::to_string(ep) +
                       ": tally run 3d runs dense layouts (expert parallelism: tally run moe)");
  std::string policy_name = recompute;
  if (const std::string why = one_of(allowed_recomputes())(policy_name); !why.empty())
    throw InvalidInput(flag + ": recompute: " + why);
  const std::optional<Recompute> policy = parse_recompute(recompute);
  if (dp * tp * pp * cp != world_size)
    throw InvalidInput(fmt::format("{}: dp x tp x pp x cp = {} x {} x {} x {} = {} ranks, but the "
                                   "world size is {} (tally launch --nproc {})",
                                   flag, dp, tp, pp, cp, dp * tp * pp * cp, world_size,
                                   dp * tp * pp * cp));
  auto small = [&](const char* key, std::int64_t x, std::int64_t hi) {
    if (x < 1 || x > hi)
      throw InvalidInput(fmt::format("{}: {} = {}: must be in [1, {}]", flag, key, x, hi));
    return int(x);
  };
  f.run.dp = small("dp", dp, 4096);
  f.run.tp = small("tp", tp, 4096);
  f.run.pp = small("pp", pp, 4096);
  f.run.cp = small("cp", cp, 4096);
  f.run.zero = int(std::clamp<std::int64_t>(zero, -1, 99));
  f.run.interleave = small("interleave", v, 64);
  f.run.sp = j["sp"].get<bool>();
  f.run.model.micro_batch = small("micro_batch", b, 4096);
  f.run.micro_batches = small("grad_accum", m, 4096);
  f.run.recompute = *policy;
  if (f.run.interleave > 1) f.run.schedule = PipelineSchedule::interleaved;
  apply_plan_stages(f, j, flag);
}

nlohmann::json to_json(const engine::ThreeDResult& r, const std::vector<engine::ThreeDCheck>& checks) {
  const auto& o = r.options;
  const auto& m = o.model;
  nlohmann::json j = {{"experiment", "3d"},
                      {"rank", r.rank},
                      {"world_size", r.world_size},
                      {"dp", o.dp},
                      {"tp", o.tp},
                      {"pp", o.pp},
                      {"cp", o.cp},
                      {"sp", o.sp},
                      {"zero", o.zero},
                      {"recompute", std::string(to_string(o.recompute))},
                      {"schedule", std::string(to_string(o.schedule))},
                      {"interleave", o.interleave},
                      {"micro_batches", r.micro_batches},
                      {"stage_layers", r.stage_layers},
                      {"model",
                       {{"hidden", m.hidden}, {"layers", m.layers}, {"heads", m.heads},
                        {"vocab", m.vocab}, {"seq", m.seq}, {"micro_batch", m.micro_batch},
                        {"params", r.n_params}}},
                      {"steps", o.steps},
                      {"loss_f64", vs(r.loss_f64, r.reference_loss_f64)},
                      {"losses_fp32", r.losses_fp32}};
  nlohmann::json ranks = nlohmann::json::array();
  for (const engine::ThreeDRank& x : r.ranks) {
    nlohmann::json by_policy;
    for (int i = 0; i < kRecomputePolicies; ++i)
      by_policy[std::string(to_string(Recompute(i)))] =
          vs(x.layer_activation_bytes[i], x.layer_activation_predicted[i]);
    ranks.push_back(
        {{"rank", x.rank},
         {"dp_index", x.dp_index},
         {"tp_index", x.tp_index},
         {"pp_index", x.pp_index},
         {"cp_index", x.cp_index},
         {"stage_layers", x.stage_layers},
         {"own_params", x.own_params},
         {"max_grad_rel_diff_f64", x.max_grad_rel_diff},
         {"max_param_rel_diff_f64", x.max_param_rel_diff},
         {"state_bytes", vs(x.state_bytes, x.state_predicted_bytes)},
         {"state_bytes_layout", vs(x.state_bytes, x.state_layout_bytes)},
         {"peak_activation_bytes", vs(x.peak_activation_bytes, x.predicted_activation_bytes)},
         {"in_flight_predicted", x.in_flight},
         {"activation_bytes_per_layer", by_policy},
         {"layer_norm_stat_bytes_per_layer", x.layer_norm_stat_bytes},
         {"tp_bytes", vs(x.tp_layer_bytes, x.tp_predicted_bytes)},
         {"tp_bytes_layout", vs(x.tp_layer_bytes, x.tp_layout_bytes)},
         {"tp_calls", vs(x.tp_layer_calls, x.tp_predicted_calls)},
         {"tp_regather_bytes", vs(x.tp_regather_bytes, x.tp_regather_predicted_bytes)},
         {"tp_regather_calls", vs(x.tp_regather_calls, x.tp_regather_predicted_calls)},
         {"tp_other_bytes", x.tp_other_bytes},
         {"tp_other_predicted_bytes", x.tp_other_predicted_bytes},
         {"pp_bytes", vs(x.pp_send_bytes, x.pp_sends * x.pp_predicted_per_call)},
         {"pp_bytes_layout", vs(x.pp_send_bytes, x.pp_layout_bytes)},
         {"pp_sends", vs(x.pp_sends, x.pp_expected_sends)},
         {"pp_bytes_per_send", vs(x.pp_max_send, x.pp_predicted_per_call)},
         {"pp_embedding_bytes", x.pp_embedding_bytes},
         {"pp_embedding_predicted_bytes", x.pp_embedding_predicted_bytes},
         {"cp_bytes", vs(x.cp_bytes, x.cp_predicted_bytes)},
         {"cp_sends", vs(x.cp_sends, x.cp_predicted_sends)},
         {"dp_bytes", vs(x.dp_bytes, x.dp_predicted_bytes)},
         {"dp_bytes_layout", vs(x.dp_bytes, x.dp_layout_bytes)},
         {"dp_calls", x.dp_calls},
         {"step_s", x.step_s},
         {"step_seconds", x.step_seconds},
         {"compute_s", vs_time(x.compute_s, x.predicted_compute_s)},
         {"tp_comm_s", vs_time(x.tp_comm_s, x.predicted_tp_comm_s)},
         // Of tp_comm_s: waiting for the TP partners to arrive (Note [arrival wait]); null when
         // not measured (TP 1, or ranks on several hosts).
         {"tp_arrival_wait_s", x.tp_arrival_wait_s < 0 ? nlohmann::json(nullptr)
                                                       : nlohmann::json(x.tp_arrival_wait_s)},
         {"cp_comm_s", vs_time(x.cp_comm_s, x.predicted_cp_comm_s)},
         {"pp_wait_s", vs(x.pp_wait_s, x.predicted_pp_wait_s)},
         {"dp_comm_s", vs_time(x.dp_comm_s, x.predicted_dp_comm_s)},
         // Of dp_comm_s: the same for the gradient group (DP × CP); null when DP × CP = 1 or not
         // on one host.
         {"dp_arrival_wait_s", x.dp_arrival_wait_s < 0 ? nlohmann::json(nullptr)
                                                       : nlohmann::json(x.dp_arrival_wait_s)},
         // The main thread's run-queue wait per step (Note [run-queue wait]), median over the
         // timed steps, and its part inside the TP and gradient collectives; null where unread.
         {"runqueue_wait_s", x.runqueue_wait_s < 0 ? nlohmann::json(nullptr)
                                                   : nlohmann::json(x.runqueue_wait_s)},
         {"runqueue_wait_in_collectives_s",
          x.runqueue_wait_in_collectives_s < 0 ? nlohmann::json(nullptr)
                                               : nlohmann::json(x.runqueue_wait_in_collectives_s)},
         {"optimizer_s", x.optimizer_s},
         {"step_time_s", vs_time(x.step_s, x.predicted_step_s)},
         {"optimizer_time_s", vs_time(x.optimizer_s, x.predicted_optimizer_s)},
         {"pp_send_predicted_s", x.predicted_pp_send_s < 0 ? nlohmann::json(nullptr)
                                                           : nlohmann::json(x.predicted_pp_send_s)},
         {"forward_s_per_micro_batch", x.forward_s},
         {"backward_s_per_micro_batch", x.backward_s},
         {"forward_time_per_micro_batch_s", vs_time(x.forward_s, x.predicted_forward_s)},
         {"backward_time_per_micro_batch_s", vs_time(x.backward_s, x.predicted_backward_s)}});
  }
  j["ranks"] = ranks;
  // The run's step (issue 10's `predicted_step_seconds`, as bench ddp and run zero report it): the
  // slowest rank's measured step beside Note [predicted 3-D step]'s; null without --calibration.
  double measured = 0;
  for (const auto& x : r.ranks) measured = std::max(measured, x.step_s);
  const double predicted = r.ranks.empty() ? -1 : r.ranks.front().predicted_step_s;
  j["measured_step_seconds"] = measured;
  j["predicted_step_seconds"] = predicted < 0 ? nlohmann::json(nullptr) : nlohmann::json(predicted);
  j["measured_over_predicted"] =
      predicted < 0 ? nlohmann::json(nullptr) : nlohmann::json(ratio(measured, predicted));
  add_checks_json(j, checks);
  return j;
}

std::string cell(double measured, double predicted, int precision = 0) {
  return fmt::format("{:.{}f}/{:.{}f}={:.3f}", measured, precision, predicted, precision,
                     ratio(measured, predicted));
}
std::string ms_cell(double measured, double predicted) {
  if (predicted < 0) return fmt::format("{:.2f}/-", 1e3 * measured);
  return fmt::format("{:.2f}/{:.2f}={:.2f}", 1e3 * measured, 1e3 * predicted,
                     ratio(measured, predicted));
}

// Note [activations per recompute policy] (three_d.cpp): every policy, whatever the run's.
void print_policy_table(const engine::ThreeDResult& r) {
  fmt::print("activation bytes per layer by recompute policy (one forward of the rank's layers, "
             "less LayerNorm statistics), measured/core=ratio:\n  {:>4}", "rank");
  for (int i = 0; i < kRecomputePolicies; ++i) fmt::print(" {:>21}", to_string(Recompute(i)));
  fmt::print(" {:>9}\n", "LN stats");
  for (const auto& x : r.ranks) {
    fmt::print("  {:>4}", x.rank);
    for (int i = 0; i < kRecomputePolicies; ++i)
      fmt::print(" {:>21}", cell(x.layer_activation_bytes[i], x.layer_activation_predicted[i]));
    fmt::print(" {:>9.0f}\n", x.layer_norm_stat_bytes);
  }
}

void print_text(const engine::ThreeDResult& r, const std::vector<engine::ThreeDCheck>& checks) {
  const auto& o = r.options;
  const auto& m = o.model;
  std::string split;
  for (int l : r.stage_layers) split += (split.empty() ? "" : "+") + std::to_string(l);
  fmt::print("3d: DP {} x TP {}{} x PP {}{} = {} ranks (Gloo, CPU; Megatron order tp-cp-dp-pp), "
             "ZeRO-{} over DP{}{}, {}{} M = {}, layers {}; GPT h {} L {} a {} V {} T {} B {} "
             "(N = {})\n",
             o.dp, o.tp, o.sp ? " + SP" : "", o.pp,
             o.cp > 1 ? fmt::format(" x CP {} (zigzag ring attention)", o.cp) : "", r.world_size,
             o.zero, o.cp > 1 ? " x CP" : "",
             o.recompute == Recompute::none ? ""
                                            : fmt::format(", recompute {}", to_string(o.recompute)),
             to_string(o.schedule), o.interleave > 1 ? fmt::format(" v = {}", o.interleave) : "",
             r.micro_batches, split, m.hidden, m.layers, m.heads, m.vocab, m.seq, m.micro_batch,
             r.n_params);
  double worst_grad = 0, worst_param = 0;
  for (const auto& x : r.ranks) {
    worst_grad = std::max(worst_grad, x.max_grad_rel_diff);
    worst_param = std::max(worst_param, x.max_param_rel_diff);
  }
  fmt::print("float64 vs single-process on all {} micro-batches: loss {:.12g} vs {:.12g}; max "
             "gradient difference after the DP reduction {:.2e}, parameters after one Adam step "
             "{:.2e} (relative)\n",
             o.dp * r.micro_batches, r.loss_f64, r.reference_loss_f64, worst_grad, worst_param);
  fmt::print("fp32 Adam, {} steps: loss {:.6f} -> {:.6f}\n", r.losses_fp32.size(),
             r.losses_fp32.front(), r.losses_fp32.back());
  fmt::print("bytes per step, measured/core=ratio (core on the rank's own stage and parameters; "
             "TP: its layers' collectives, PP: the schedule's sends, DP: gradient reduction + "
             "ZeRO gather):\n");
  const bool cp = o.cp > 1;
  fmt::print("  {:>4} {:>9} {:>7} {:>23} {:>23} {:>23} {:>25} {:>23}{}\n", "rank",
             cp ? "dp,cp,tp,pp" : "dp,tp,pp", "layers", "states", "activations (peak)", "TP",
             "PP", "DP", cp ? fmt::format(" {:>23}", "CP") : "");
  for (const auto& x : r.ranks)
    fmt::print("  {:>4} {:>9} {:>7} {:>23} {:>23} {:>23} {:>25} {:>23}{}\n", x.rank,
               cp ? fmt::format("{},{},{},{}", x.dp_index, x.cp_index, x.tp_index, x.pp_index)
                  : fmt::format("{},{},{}", x.dp_index, x.tp_index, x.pp_index),
               x.stage_layers, cell(x.state_bytes, x.state_predicted_bytes),
               cell(x.peak_activation_bytes, x.predicted_activation_bytes),
               cell(x.tp_layer_bytes, x.tp_predicted_bytes),
               cell(x.pp_send_bytes, x.pp_sends * x.pp_predicted_per_call),
               cell(x.dp_bytes, x.dp_predicted_bytes),
               cp ? fmt::format(" {:>23}", cell(x.cp_bytes, x.cp_predicted_bytes)) : "");
  if (o.sp && o.tp > 1) {
    // One line per SP item: each rank's measured/core bytes.
    using Rank = engine::ThreeDRank;
    const auto per_rank = [&](const char* what, double Rank::*measured, double Rank::*predicted) {
      fmt::print("{}, bytes per step, measured/core=ratio:", what);
      for (const Rank& x : r.ranks)
        fmt::print(" rank {} {}", x.rank, cell(x.*measured, x.*predicted));
      fmt::print("\n");
    };
    per_rank("SP re-gathers in backward (core's tp_regather; Megatron overlaps them with the "
             "input-gradient GEMM, this engine runs them blocking)",
             &Rank::tp_regather_bytes, &Rank::tp_regather_predicted_bytes);
    per_rank("SP edges and the sequence-sharded gradients' all-reduce (core's engine_sp_traffic: "
             "this engine's replicated embedding and head; Megatron's edges differ)",
             &Rank::tp_other_bytes, &Rank::tp_other_predicted_bytes);
  }
  fmt::print("the layout's items (core at N/(t*p) parameters per rank, the busiest stage, 2vM "
             "sends), measured/core=ratio:\n");
  fmt::print("  {:>4} {:>23} {:>23} {:>25} {:>23}  outside the layout's items: TP (SP edges, "
             "SP grads); PP tied embedding, measured/core's pp_embedding\n",
             "rank", "states", "TP", "PP", "DP");
  for (const auto& x : r.ranks)
    fmt::print("  {:>4} {:>23} {:>23} {:>25} {:>23}  {:.0f}; {}\n", x.rank,
               cell(x.state_bytes, x.state_layout_bytes), cell(x.tp_layer_bytes, x.tp_layout_bytes),
               cell(x.pp_send_bytes, x.pp_layout_bytes), cell(x.dp_bytes, x.dp_layout_bytes),
               x.tp_other_bytes,
               x.pp_embedding_predicted_bytes > 0  // middle stages and P = 1 hold no copy
                   ? cell(x.pp_embedding_bytes, x.pp_embedding_predicted_bytes)
                   : fmt::format("{:.0f}", x.pp_embedding_bytes));
  fmt::print("step time, ms, {}, measured/core=ratio (PP wait: core's bubble "
             "(P-1)(t_f+t_b)/v on the measured t_f, t_b; {}):\n",
             o.steps > 1 ? fmt::format("medians over steps 2-{} (step 1 warms up)", o.steps)
                         : std::string("one step"),
             o.host ? "compute, optimizer and comm: the operator model (Note [host GPT "
                               "step]) and the alpha-beta items on the host calibration; step: "
                               "their sum with the bubble on the predicted t_f, t_b"
                             : "the rest need --calibration, '-' without");
  fmt::print("  {:>4} {:>22} {:>22} {:>22} {:>22} {:>22} {:>22}{}\n", "rank", "step", "compute",
             "TP comm", "PP wait", "DP comm", "optimizer",
             cp ? fmt::format(" {:>22}", "CP comm") : "");
  for (const auto& x : r.ranks)
    fmt::print("  {:>4} {:>22} {:>22} {:>22} {:>22} {:>22} {:>22}{}\n", x.rank,
               ms_cell(x.step_s, x.predicted_step_s), ms_cell(x.compute_s, x.predicted_compute_s),
               ms_cell(x.tp_comm_s, x.predicted_tp_comm_s),
               ms_cell(x.pp_wait_s, o.pp > 1 ? x.predicted_pp_wait_s : 0),
               ms_cell(x.dp_comm_s, x.predicted_dp_comm_s),
               ms_cell(x.optimizer_s, x.predicted_optimizer_s),
               cp ? fmt::format(" {:>22}", ms_cell(x.cp_comm_s, x.predicted_cp_comm_s)) : "");
  if (std::all_of(r.ranks.begin(), r.ranks.end(),
                  [](const auto& x) { return x.runqueue_wait_s >= 0; })) {
    fmt::print("run-queue wait of each rank's main thread (runnable, no core; Note [run-queue "
               "wait]), ms per step, {} (in the TP and DP collectives):",
               o.steps > 1 ? "median" : "one step");
    for (std::size_t i = 0; i < r.ranks.size(); ++i) {
      const auto& x = r.ranks[i];
      fmt::print("{} rank {} {:.2f} ({})", i == 0 ? "" : ",", x.rank, x.runqueue_wait_s * 1e3,
                 x.runqueue_wait_in_collectives_s < 0
                     ? std::string("-")
                     : fmt::format("{:.2f}", x.runqueue_wait_in_collectives_s * 1e3));
    }
    fmt::print("\n");
  }
  print_policy_table(r);
  int failed = 0;
  for (const auto& c : checks) failed += c.ok ? 0 : 1;
  fmt::print("checks: {} of {} passed\n", int(checks.size()) - failed, int(checks.size()));
}

void run(Flags& f) {
  const engine::DistEnv env = engine::DistEnv::from_environment();
  f.run.schedule = f.schedule == "gpipe"   ? PipelineSchedule::gpipe
                   : f.schedule == "1f1b" ? PipelineSchedule::one_f_one_b
                                          : PipelineSchedule::interleaved;
  if (!f.plan.empty()) {
    for (const CLI::Option* o : f.layout_flags)
      if (o->count() > 0)
        throw InvalidInput(o->get_name() + " with --plan: the plan gives the layout (dp, tp, pp, "
                           "cp, sp, zero, recompute, interleave, micro_batch, grad_accum, "
                           "stage_layers)");
    apply_plan(f, env.world_size);
  } else if (f.run.interleave > 1 && f.schedule_flag->count() == 0) {
    f.run.schedule = PipelineSchedule::interleaved;  // --interleave v alone means interleaved
  }
  if (f.plan.empty()) f.run.recompute = recompute_from(f.recompute);
  if (!f.calibration.empty()) {
    const HostModel m = load_host_model("--calibration", f.calibration, env.world_size);
    f.run.host = m.host;
    // SP's reduce-scatter is tally's ring (copying form), its all-gathers Gloo's: the halves
    // `bench allreduce --sharded` times (Note [sharded collectives]).
    f.run.host_links = {.reduce_scatter = m.ring_reduce_scatter_link,
                        .all_gather = m.gloo_all_gather_link};
    f.run.host_cores = host_cores();
  }
  if (f.html && env.rank == 0) html::check_writable("--html", *f.html);  // before the run
  const engine::ThreeDResult r = engine::run_3d(env, f.run);
  const auto checks = engine::three_d_checks(r);
  if (f.html && r.rank == 0)  // before a failed check ends the run: the page shows it
    html::write_file("--html", *f.html, html::page(three_d_page(to_json(r, checks))));
  report_and_check("3d", r, checks, f.json, to_json, print_text);
}

const RegisterRun reg{[](CLI::App& run_cmd) {
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = run_cmd.add_subcommand(
      "3d",
      "data x tensor (+ sequence) x pipeline (x context) parallelism on the engine's GPT, every "
      "rank one TP shard of one pipeline stage (with --cp its zigzag share of the sequence, ring "
      "attention), ZeRO 0-3 over the DP (x CP) group, optionally a recompute policy and uneven "
      "stages: float64 loss, gradients and "
      "updated parameters vs the single-process model; per rank state, activation and per-group "
      "bytes and the step time split vs core; start it with `tally launch --nproc D*T*P -- tally "
      "run 3d --dp D --tp T --pp P`, or take the layout from `tally plan --json` with --plan");
  cmd->footer("Exit 1 when a check fails: float64 ≤ 1e-10 relative; TP, PP, CP and DP bytes exact, "
              "model-state bytes exact but for the shard's rounding (activations and times are "
              "reported, not checked). Rank 0 prints every rank's figures. A lost rank makes the "
              "others fail; `tally launch` names it.");
  auto layout = [&](CLI::Option* o) {
    f->layout_flags.push_back(o);
    return o;
  };
  layout(cmd->add_option("--dp", f->run.dp, "data-parallel ranks")->capture_default_str());
  layout(cmd->add_option("--tp", f->run.tp, "tensor-parallel ranks")->capture_default_str());
  layout(cmd->add_option("--pp", f->run.pp, "pipeline stages")->capture_default_str());
  layout(cmd->add_option("--cp", f->run.cp, "context-parallel ranks (zigzag ring attention)")
             ->capture_default_str());
  layout(cmd->add_flag("--sp", f->run.sp, "sequence parallelism in the TP groups"));
  layout(cmd->add_option("--zero", f->run.zero, "ZeRO stage over the DP (x CP) group: 0-3")
             ->capture_default_str());
  layout(cmd->add_option("--recompute", f->recompute,
                         "none | selective (attention core) | full (every block) | save-matmuls | "
                         "op-sac: the saved set core's ledger names for the policy")
             ->check(one_of(allowed_recomputes()))
             ->capture_default_str());
  layout(cmd->add_option("--pp-layers", f->run.pp_layers,
                         "layers of each stage, e.g. 3,5 (default: core's even split); with "
                         "--interleave v also pp·v entries, every virtual stage's in model order")
             ->delimiter(','));
  layout(cmd->add_option("--interleave", f->run.interleave,
                         "model chunks per stage (> 1: the interleaved schedule)")
             ->capture_default_str());
  layout(cmd->add_option("--micro-batches", f->run.micro_batches,
                         "M per DP rank per step (0 = 2 x --pp)")
             ->capture_default_str());
  layout(cmd->add_option("--micro-batch", f->run.model.micro_batch, "B")->capture_default_str());
  f->schedule_flag =
      cmd->add_option("--schedule", f->schedule,
                      "gpipe | 1f1b | interleaved (Megatron-LM's, over --interleave chunks)")
          ->check(one_of({"gpipe", "1f1b", "interleaved"}))
          ->capture_default_str();
  cmd->add_option("--plan", f->plan,
                  "a `tally plan --json` output (its best plan) or one plan object: dp, tp, pp, "
                  "cp, sp, zero, interleave, micro_batch, grad_accum taken from it; the model stays "
                  "the small one below unless given");
  cmd->add_option("--calibration", f->calibration,
                  "predict compute and comm times from this host calibration (`tally bench "
                  "gemm|memory|allreduce --calibration-out`)");
  cmd->add_option("--hidden", f->run.model.hidden, "C")->capture_default_str();
  f->layers_flag = cmd->add_option("--layers", f->run.model.layers,
                                   "L (with --plan of uneven stages: the plan's)")
                       ->capture_default_str();
  cmd->add_option("--heads", f->run.model.heads, "a")->capture_default_str();
  cmd->add_option("--vocab", f->run.model.vocab, "V")->capture_default_str();
  cmd->add_option("--seq", f->run.model.seq, "T")->capture_default_str();
  cmd->add_option("--steps", f->run.steps,
                  "fp32 Adam steps (times: medians over steps 2..N, step 1 warms up)")
      ->capture_default_str();
  cmd->add_option("--lr", f->run.lr, "Adam learning rate")
      ->check(finite_in(0, 1e6, Ends::open_lo))
      ->capture_default_str();
  cmd->add_option("--seed", f->run.seed, "seed of the weights and tokens")->capture_default_str();
  cmd->add_option("--timeout", f->run.timeout_s,
                  "seconds for the rendezvous and each collective, send and receive")
      ->check(finite_in(0, 86400, Ends::open_lo))
      ->capture_default_str();
  cmd->add_option("--threads", f->run.threads, "torch intra-op threads per rank (0 = default)")
      ->capture_default_str();
  cmd->add_option("--kill-rank", f->run.kill_rank,
                  "fault: this rank SIGKILLs itself during --kill-at-step (-1 = none)")
      ->capture_default_str();
  cmd->add_option("--kill-at-step", f->run.kill_at_step,
                  "fault: the fp32 step, after the rank's first pipeline operation")
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "one JSON object on one line (rank 0)");
  cmd->add_option("--html", f->html,
                  "also write the report as a self-contained HTML page to FILE (rank 0): every "
                  "rank's states, activations, bytes per group and step time beside core, "
                  "activations by recompute policy, the loss");
  cmd->callback([f] { run(*f); });
}};

}  // namespace

}  // namespace tally::cli::run_3d
