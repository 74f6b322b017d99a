// `tally run fp8`: the text and JSON reporters of engine::run_fp8 (tally/engine/experiments/fp8.hpp).
// One process; exit 1 naming the first failed check, 2 for bad flags. One progress line per
// training step of each run on stderr.
#include <fmt/core.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common.hpp"
#include "experiment_report.hpp"
#include "run_registry.hpp"
#include "tally/engine/experiments/fp8.hpp"

namespace tally::cli::run_fp8 {

namespace {

struct Flags {
  engine::Fp8Options run;
  std::string format = "fp8";
  bool json = false;
};



nlohmann::json to_json(const engine::Fp8Result& r, const std::vector<engine::Fp8Check>& checks) {
  const engine::GptConfig& m = r.options.model;
  const StateItems &s = r.measured_states, &p = r.predicted_states.bytes;
  nlohmann::json j = {
      {"experiment", "fp8"},
      {"format", to_string(r.options.format)},
      {"model",
       {{"hidden", m.hidden}, {"layers", m.layers}, {"heads", m.heads}, {"vocab", m.vocab},
        {"seq", m.seq}, {"micro_batch", m.micro_batch}, {"params", r.n_params},
        {"linear_layers", r.linear_layers}, {"linear_weights", r.linear_weights},
        {"linear_biases", r.linear_biases}}},
      {"steps", r.options.steps},
      {"lr", r.options.lr},
      {"seed", r.options.seed},
      {"convention", r.convention()},
      {"memory",
       {{"copy_bytes", measured_json(r.copy_bytes, r.predicted_copy_bytes)},
        {"copy_bytes_per_weight",
         low_precision_copy_bytes(r.options.format, Fp8GemmLayouts::tn_only)},
        {"tensor_scales", r.tensor_scales},
        {"tensor_scale_bytes", r.scale_bytes},
        {"params_bytes", measured_json(s.params, p.params)},
        {"grads_bytes", measured_json(s.grads, p.grads)},
        {"optimizer_bytes", measured_json(s.master, p.m + p.v + p.master)},
        {"low_precision_bytes", measured_json(s.low_precision, p.low_precision)},
        {"model_state_bytes", measured_json(r.measured_state_bytes, p.total())},
        {"gemm_weight_share", r.predicted_states.setup.gemm_weight_share},
        {"model_states_convention", r.predicted_states.convention()}}},
      {"codes",
       {{"checked_elements", r.checked_elements},
        {"mismatches_initial", r.mismatches_initial},
        {"mismatches_final", r.mismatches_final}}},
      {"refresh",
       {{"mismatches", r.refresh_mismatches},
        {"codes_changed", r.codes_changed},
        {"weights_changed", r.weights_changed},
        {"unexplained_changes", r.unexplained_changes}}},
      {"training",
       {{"losses", r.losses},
        {"reference_losses", r.reference_losses},
        {"loss_gap", r.loss_gap},
        {"loss_tolerance", engine::fp8_loss_tolerance(r.options.format)},
        {"seconds", r.seconds},
        {"reference_seconds", r.reference_seconds}}}};
  add_checks_json(j, checks);
  return j;
}

void print_text(const engine::Fp8Result& r, const std::vector<engine::Fp8Check>& checks) {
  const engine::GptConfig& m = r.options.model;
  const StateItems &s = r.measured_states, &p = r.predicted_states.bytes;
  fmt::print("fp8: GPT h {} L {} a {} V {} T {} B {} (N = {}; {} linear weights, {} elements), "
             "{} steps of bf16 Adam at lr {}, copies in {}\n",
             m.hidden, m.layers, m.heads, m.vocab, m.seq, m.micro_batch, r.n_params,
             r.linear_layers, r.linear_weights, r.options.steps, format_number(r.options.lr),
             to_string(r.options.format));
  fmt::print("  {:<44} {:>12} {:>12} {:>8}\n", "memory, tracking allocator (B)", "measured",
             "predicted", "ratio");
  const auto row = [](const std::string& what, double a, double b) {
    fmt::print("  {:<44} {:>12.0f} {:>12.0f} {:>8.4f}\n", what, a, b, ratio(a, b));
  };
  row("copies: codes + block scales", r.copy_bytes, r.predicted_copy_bytes);
  fmt::print("    core: {} B x {} linear weights; plus {} fp32 tensor scales = {:.0f} B (metadata "
             "core leaves out)\n",
             format_number(low_precision_copy_bytes(r.options.format, Fp8GemmLayouts::tn_only)),
             r.linear_weights,
             r.tensor_scales, r.scale_bytes);
  row("parameters (bf16)", s.params, p.params);
  row("gradients (bf16, after step 1)", s.grads, p.grads);
  row("Adam m, v + fp32 master", s.master, p.m + p.v + p.master);
  row("low-precision copies", s.low_precision, p.low_precision);
  fmt::print("    core counts gemm_weight_share = {:.6f} of N, the {} linear biases included (not "
             "copied)\n",
             r.predicted_states.setup.gemm_weight_share, r.linear_biases);
  row("model states after step 1", r.measured_state_bytes, p.total());
  fmt::print("  codes: {} elements (both copies of every weight) vs core's scalar emulation: {} "
             "differ before step 1, {} after step {}\n",
             r.checked_elements, r.mismatches_initial, r.mismatches_final, r.options.steps);
  fmt::print("  refresh after step 1: {} differ from core's encoding of the updated weights; {} "
             "codes changed ({} element copies whose weight changed), {} unexplained\n",
             r.refresh_mismatches, r.codes_changed, r.weights_changed, r.unexplained_changes);
  if (!r.losses.empty() && !r.reference_losses.empty()) {
    fmt::print("  loss (nats)  step:");
    for (std::size_t i = 0; i < r.losses.size(); i += 5) fmt::print(" {:>7}", i + 1);
    fmt::print(" {:>7}\n", r.losses.size());
    const auto series = [&](const char* name, const std::vector<double>& v) {
      fmt::print("  {:<19}", name);
      for (std::size_t i = 0; i < v.size(); i += 5) fmt::print(" {:>7.4f}", v[i]);
      fmt::print(" {:>7.4f}\n", v.back());
    };
    series(to_string(r.options.format).data(), r.losses);
    series("without copies", r.reference_losses);
    fmt::print("  gap of the last-5-step mean loss: {:.3f} % (tolerance {:.0f} %); {:.2f} s with "
               "copies, {:.2f} s without\n",
               100 * r.loss_gap, 100 * engine::fp8_loss_tolerance(r.options.format), r.seconds,
               r.reference_seconds);
  }
  fmt::print("  convention: {}\n", r.convention());
  fmt::print("  states: {}\n", r.predicted_states.convention());
  int failed = 0;
  for (const auto& c : checks) failed += c.ok ? 0 : 1;
  fmt::print("checks: {} of {} passed\n", int(checks.size()) - failed, int(checks.size()));
}

void run(Flags& f) {
  f.run.format = *parse_precision(f.format);
  const engine::Fp8Result r = engine::run_fp8(f.run);
  report_and_check("fp8", r, engine::fp8_checks(r), f.json, to_json, print_text);
}

const RegisterRun reg{[](CLI::App& run_cmd) {
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = run_cmd.add_subcommand(
      "fp8",
      "a small GPT trained in bf16 mixed precision whose linear weights keep low-precision copies "
      "(fp8 per-tensor, MXFP8 or NVFP4, quantized by core and refreshed after every step; forward "
      "and dgrad GEMMs on the copies, emulated in fp32): the copies' bytes measured by the tracking "
      "allocator vs core's ledger, every stored code vs core's scalar emulation, the loss vs the "
      "same run without copies");
  cmd->footer("Default: h 128, L 2, a 4, V 256, T 64, B 8, 20 steps (4-10 s per format on 2 "
              "cores). Exit 1 when a check fails: copies' bytes exact, model states within 1 %, "
              "codes bit for bit, loss within 5 % (nvfp4: 12 %) of the run without copies.");
  cmd->add_option("--format", f->format, "the copies' recipe (core's --precision of that name)")
      ->check(one_of({"fp8", "mxfp8", "nvfp4"}))
      ->capture_default_str();
  auto& m = f->run.model;
  cmd->add_option("--hidden", m.hidden, "hidden size C (mxfp8: a multiple of 32, nvfp4: of 16)")
      ->capture_default_str();
  cmd->add_option("--layers", m.layers, "transformer blocks L")->capture_default_str();
  cmd->add_option("--heads", m.heads, "attention heads a (must divide --hidden)")
      ->capture_default_str();
  cmd->add_option("--vocab", m.vocab, "vocabulary V")->capture_default_str();
  cmd->add_option("--seq", m.seq, "sequence length T")->capture_default_str();
  cmd->add_option("--micro-batch", m.micro_batch, "sequences per step B")->capture_default_str();
  cmd->add_option("--steps", f->run.steps, "training steps of each run")->capture_default_str();
  cmd->add_option("--lr", f->run.lr, "Adam learning rate")
      ->check(finite_in(0, 1, Ends::open_lo))
      ->capture_default_str();
  cmd->add_option("--seed", f->run.seed, "seed of the weights and the batches")
      ->capture_default_str();
  cmd->add_option("--timeout", f->run.timeout_s, "seconds for both runs together")
      ->check(finite_in(0, 86400, Ends::open_lo))
      ->capture_default_str();
  cmd->add_option("--threads", f->run.threads, "torch intra-op threads (0 = default)")
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "one JSON object on one line");
  cmd->callback([f] { run(*f); });
}};

}  // namespace

}  // namespace tally::cli::run_fp8
