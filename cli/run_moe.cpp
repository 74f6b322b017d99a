// `tally run moe`: the text and JSON reporters of engine::run_moe (tally/engine/experiments/moe.hpp).
// Every rank runs and checks its own figures (exit 1 naming the first failed check); rank 0 prints
// the report (its figures: the EP ranks are symmetric up to routing), so under `tally launch` only
// "[rank 0] " lines carry it. Bad flags exit 2. One progress line per EP degree on stderr (rank 0).
#include <fmt/core.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "common.hpp"
#include "run_registry.hpp"
#include "experiment_report.hpp"
#include "tally/core/comm.hpp"
#include "tally/engine/experiments/moe.hpp"

namespace tally::cli::run_moe {

namespace {

struct Flags {
  engine::MoeOptions run;
  std::string mlp = "swiglu";
  bool json = false;
};



double per_call(const engine::MoeVariant& v) {
  return v.all_to_all_calls == 0 ? 0 : v.all_to_all_bytes / double(v.all_to_all_calls);
}

nlohmann::json to_json(const engine::MoeResult& r, const std::vector<engine::MoeCheck>& checks) {
  const engine::MoeConfig& l = r.options.layer;
  nlohmann::json j = {{"experiment", "moe"},
                      {"rank", r.rank},
                      {"world_size", r.world_size},
                      {"layer",
                       {{"hidden", l.hidden}, {"ffn", l.ffn}, {"experts", l.experts},
                        {"top_k", l.top_k}, {"shared_ffn", l.shared_ffn},
                        {"mlp", l.mlp == MlpKind::gelu ? "gelu" : "swiglu"},
                        {"capacity_factor", l.capacity_factor}, {"params", r.n_params},
                        {"expert_share", r.expert_share}}},
                      {"tokens_per_rank", r.options.tokens}};
  j["variants"] = nlohmann::json::array();
  for (const engine::MoeVariant& v : r.variants) {
    const TrafficItem& e = v.predicted.ep;
    j["variants"].push_back(
        {{"ep", v.ep},
         {"group", v.group},
         {"capacity_slots", v.capacity},
         {"capacity_exact", v.capacity_exact},
         {"max_output_rel_diff_f64", v.max_output_rel_diff},
         {"max_grad_rel_diff_f64", v.max_grad_rel_diff},
         {"worst_grad", v.worst_grad},
         {"dropped", measured_json(double(v.dropped), double(v.reference_dropped))},
         {"step_seconds", v.step_seconds},
         {"all_to_all_calls", measured_json(double(v.all_to_all_calls), e.calls)},
         {"bytes_per_all_to_all", measured_json(per_call(v), e.bytes_per_call)},
         {"all_to_all_bytes_per_layer", measured_json(v.all_to_all_bytes, e.bytes_per_rank)},
         {"all_to_all_seconds", v.all_to_all_seconds},
         {"buffer_bytes", v.buffer_bytes},
         {"predicted_ep", {{"formula", e.formula}, {"convention", v.predicted.convention()}}},
         {"model_state_bytes_fp32", measured_json(v.state_bytes, v.predicted_states.bytes.total())},
         {"model_states_convention", v.predicted_states.convention()}});
  }
  add_checks_json(j, checks);
  return j;
}

void print_text(const engine::MoeResult& r, const std::vector<engine::MoeCheck>& checks) {
  const engine::MoeConfig& l = r.options.layer;
  fmt::print("moe: {} ranks (Gloo, CPU); layer h {} f {} E {} top-{} {}{}, capacity factor {}, "
             "T {} tokens per rank (N = {}, routed experts {:.1f} %); rank 0's figures\n",
             r.world_size, l.hidden, l.ffn, l.experts, l.top_k,
             l.mlp == MlpKind::gelu ? "GeLU" : "SwiGLU",
             l.shared_ffn > 0 ? fmt::format(" + shared expert f {}", l.shared_ffn) : "",
             format_number(l.capacity_factor), r.options.tokens, r.n_params,
             100 * r.expert_share);
  for (const engine::MoeVariant& v : r.variants) {
    const TrafficItem& e = v.predicted.ep;
    fmt::print("ep = {} (group {} of {}), C = {} slots per expert per rank:\n", v.ep, v.group,
               r.world_size / v.ep, v.capacity);
    fmt::print("  float64 vs single-process: output {:.2e}, gradients {:.2e} relative ({}); "
               "dropped {} of {} routed copies (single-process {})\n",
               v.max_output_rel_diff, v.max_grad_rel_diff, v.worst_grad, v.dropped,
               r.options.tokens * l.top_k, v.reference_dropped);
    fmt::print("  {:<40} {:>14} {:>14} {:>8}\n", "one layer, forward + backward", "measured",
               "predicted", "ratio");
    fmt::print("  {:<40} {:>14} {:>14.0f} {:>8.4f}\n", "all-to-all calls", v.all_to_all_calls,
               e.calls, ratio(double(v.all_to_all_calls), e.calls));
    fmt::print("  {:<40} {:>14.0f} {:>14.0f} {:>8.4f}\n", "bytes per all-to-all (B)", per_call(v),
               e.bytes_per_call, ratio(per_call(v), e.bytes_per_call));
    fmt::print("  {:<40} {:>14.0f} {:>14.0f} {:>8.4f}\n", "all-to-all bytes per layer (B)",
               v.all_to_all_bytes, e.bytes_per_rank, ratio(v.all_to_all_bytes, e.bytes_per_rank));
    fmt::print("  {:<40} {:>14.0f} {:>14.0f} {:>8.4f}\n", "fp32 model states per rank (B)",
               v.state_bytes, v.predicted_states.bytes.total(),
               ratio(v.state_bytes, v.predicted_states.bytes.total()));
    if (v.ep > 1) fmt::print("  core: {}\n", e.formula);
    if (!v.capacity_exact)
      fmt::print("  E*C = {} slots > T*k*c_f = {}: the padded buffer ({:.0f} B) is sent, core "
                 "counts the balanced expectation\n",
                 l.experts * v.capacity, format_number(double(r.options.tokens * l.top_k) * l.capacity_factor),
                 v.buffer_bytes);
    fmt::print("  states: {}\n", v.predicted_states.convention());
  }
  int failed = 0;
  for (const auto& c : checks) failed += c.ok ? 0 : 1;
  fmt::print("checks: {} of {} passed\n", int(checks.size()) - failed, int(checks.size()));
}

void run(Flags& f) {
  f.run.layer.mlp = f.mlp == "gelu" ? MlpKind::gelu : MlpKind::swiglu;
  const engine::MoeResult r = engine::run_moe(engine::DistEnv::from_environment(), f.run);
  report_and_check("moe", r, engine::moe_checks(r), f.json, to_json, print_text);
}

const RegisterRun reg{[](CLI::App& run_cmd) {
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = run_cmd.add_subcommand(
      "moe",
      "one mixture-of-experts layer (router, softmax, top-k, token dropping at capacity) with "
      "expert parallelism over Gloo all-to-all: float64 output and gradients vs the single-process "
      "layer, bytes per all-to-all and per layer vs core's EP ledger, fp32 model states per rank "
      "vs core's; start it with `tally launch --nproc W -- tally run moe --ep E`");
  cmd->footer("Exit 1 when a check fails: float64 <= 1e-10 relative, drops and bytes exact, model "
              "states to 1e-12 relative. Rank 0 prints.");
  cmd->add_option("--ep", f->run.ep,
                  "EP degrees, each dividing the world size and --experts, run one after another "
                  "(e.g. --ep 4,2; default: the world size)")
      ->delimiter(',');
  cmd->add_option("--hidden", f->run.layer.hidden, "h")->capture_default_str();
  cmd->add_option("--ffn", f->run.layer.ffn, "f, each routed expert's FFN width")->capture_default_str();
  cmd->add_option("--experts", f->run.layer.experts, "E, routed experts")->capture_default_str();
  cmd->add_option("--top-k", f->run.layer.top_k, "k, experts per token")->capture_default_str();
  cmd->add_option("--shared-ffn", f->run.layer.shared_ffn, "f_s, a shared expert's width (0 = none)")
      ->capture_default_str();
  cmd->add_option("--mlp", f->mlp, "expert MLP")->check(one_of({"gelu", "swiglu"}))->capture_default_str();
  cmd->add_option("--capacity-factor", f->run.layer.capacity_factor,
                  "slots per expert as a multiple of the balanced share T*k/E")
      ->check(finite_in(1, 64))
      ->capture_default_str();
  cmd->add_option("--tokens", f->run.tokens, "T, tokens per rank")->capture_default_str();
  cmd->add_option("--seed", f->run.seed, "seed of the weights and tokens")->capture_default_str();
  add_rank_run_flags(cmd, f->run.timeout_s, f->run.threads, f->json, "collective");
  cmd->callback([f] { run(*f); });
}};

}  // namespace

}  // namespace tally::cli::run_moe
