// `tally run memory-profile`: the text and JSON reporters of engine::run_memory_profile
// (tally/engine/experiments/memory_profile.hpp). Bad flags exit 2; a failed acceptance check exits 1.
#include <fmt/core.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "html_engine.hpp"
#include "html_report.hpp"
#include "run_registry.hpp"
#include "tally/engine/experiments/memory_profile.hpp"

namespace tally::cli::run_memory_profile {

namespace {

struct ProfileFlags {
  engine::MemoryProfileOptions run;
  std::string precision = "both";
  bool no_cache = false;
  OutputOptions out;
  std::optional<std::string> html;  // --html FILE
};

constexpr const char* kAllocatorConvention =
    "tracking CPU allocator: allocated = live storages' requested bytes; reserved = bytes held "
    "from the system (live + cached freed blocks, 512 B rounding); reserved − allocated = cache "
    "+ rounding";

std::string ledger_item(engine::Phase p, Precision precision) {
  const bool fp32 = precision == Precision::fp32;
  switch (p) {
    case engine::Phase::model_init: return fp32 ? "params 4N" : "params 2N";
    case engine::Phase::optimizer_init: return fp32 ? "m+v 8N" : "m+v+master 12N";
    case engine::Phase::forward: return "activations";
    case engine::Phase::backward: return fp32 ? "grads 4N - act" : "grads 2N - act";
    case engine::Phase::step: return "(grads kept)";
  }
  return "";
}

// The phase that ends at a boundary, for "the peak occurs in ...".
std::string phase_span(engine::Phase p) {
  switch (p) {
    case engine::Phase::model_init: return "model init (start → after-model-init)";
    case engine::Phase::optimizer_init: return "optimizer init (→ after-optimizer-init)";
    case engine::Phase::forward: return "the forward pass (→ after-forward)";
    case engine::Phase::backward: return "the backward pass (after-forward → after-backward)";
    case engine::Phase::step: return "the optimizer step (after-backward → after-step)";
  }
  return "";
}

// A seed criterion's number and what it compares (engine::AcceptanceCheck).
struct CriterionWords {
  const char* id;
  const char* what;
};
CriterionWords words(engine::MemoryCriterion c) {
  switch (c) {
    case engine::MemoryCriterion::params:
      return {"①", "after-model-init allocated vs core params item"};
    case engine::MemoryCriterion::optimizer_states:
      return {"②", "optimizer-init increment vs core m + v + master"};
    case engine::MemoryCriterion::activations:
      return {"③", "forward increment vs core activations"};
  }
  return {"?", ""};
}

std::string ratio_str(double r) { return r == 0 ? "-" : fmt::format("{:.4f}", r); }

void print_text(const engine::MemoryProfileResult& r, SizeUnit u) {
  const auto sz = [u](double b) { return size_str(b, u, 3); };
  const auto& m = r.options.model;
  fmt::print("memory-profile: {} | micro-batch {} | N = {} (module) vs {:.0f} (core count_params)\n",
             r.model.name, m.micro_batch, r.module_params, r.core_params);
  fmt::print("  states:      {}\n", convention_with_unit(r.states.convention(), u));
  fmt::print("  {}\n", r.activations.convention());
  fmt::print("  memory: {}\n", kAllocatorConvention);
  fmt::print("  {:<21} {:>11} {:>11} {:>11} {:>7} {:>7}  {:<16} {:>11} {:>11} {:>11} {:>6}\n",
             "phase", "allocated", "increment", "predicted", "Δratio", "ratio", "ledger item",
             "phase peak", "reserved", "res-alloc", "time");
  for (const auto& p : r.phases)
    fmt::print("  {:<21} {:>11} {:>11} {:>11} {:>7} {:>7}  {:<16} {:>11} {:>11} {:>11} {:>5.1f}s\n",
               engine::to_string(p.phase), sz(double(p.measured.allocated_bytes)),
               sz(p.increment_bytes), sz(p.predicted_increment_bytes),
               ratio_str(p.increment_ratio()), ratio_str(p.allocated_ratio()),
               ledger_item(p.phase, r.options.precision),
               sz(double(p.measured.peak_allocated_bytes)), sz(double(p.measured.reserved_bytes)),
               sz(double(p.measured.unused_reserved_bytes())), p.seconds);
  for (const auto& c : engine::acceptance_checks(r)) {
    const CriterionWords w = words(c.criterion);
    fmt::print("  {} {}: {} vs {}: ratio {:.4f} (±{:.0f} %): {}\n", w.id, w.what,
               sz(c.measured_bytes), sz(c.predicted_bytes), c.ratio(), c.tolerance * 100,
               c.ok() ? "ok" : "FAILED");
  }
  const auto& fwd = r.at(engine::Phase::forward);
  fmt::print("    ③ residual {:+.0f} B: what eager PyTorch saves beyond Korthikanti's inventory "
             "(LayerNorm mean and rstd per token, the (T, T) causal mask, the loss scalars)\n",
             fwd.increment_bytes - fwd.predicted_increment_bytes);
  const auto& last = r.phases.back().measured;
  fmt::print("  ⑥ peak {} in {} (peak reserved {}); after the step reserved − allocated = {} "
             "({} cached for reuse); loss {:.4f}\n",
             sz(double(r.peak_allocated_bytes)), phase_span(r.peak_phase),
             sz(double(r.peak_reserved_bytes)), sz(double(last.unused_reserved_bytes())),
             sz(double(last.cached_bytes)), r.loss);
}

nlohmann::json to_json(const engine::MemoryProfileResult& r) {
  nlohmann::json phases = nlohmann::json::array();
  for (const auto& p : r.phases) {
    const auto& c = p.measured;
    phases.push_back({{"phase", engine::to_string(p.phase)},
                      {"allocated_bytes", c.allocated_bytes},
                      {"increment_bytes", p.increment_bytes},
                      {"predicted_increment_bytes", p.predicted_increment_bytes},
                      {"predicted_allocated_bytes", p.predicted_allocated_bytes},
                      {"increment_ratio", p.increment_ratio()},
                      {"allocated_ratio", p.allocated_ratio()},
                      {"peak_allocated_bytes", c.peak_allocated_bytes},
                      {"reserved_bytes", c.reserved_bytes},
                      {"peak_reserved_bytes", c.peak_reserved_bytes},
                      {"reserved_minus_allocated_bytes", c.unused_reserved_bytes()},
                      {"cached_bytes", c.cached_bytes},
                      {"seconds", p.seconds}});
  }
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& c : engine::acceptance_checks(r)) {
    const CriterionWords w = words(c.criterion);
    checks.push_back({{"id", w.id}, {"what", w.what}, {"measured_bytes", c.measured_bytes},
                      {"predicted_bytes", c.predicted_bytes}, {"ratio", c.ratio()},
                      {"tolerance", c.tolerance}, {"ok", c.ok()}});
  }
  const auto& m = r.options.model;
  return {{"model", {{"name", r.model.name}, {"hidden", m.hidden}, {"layers", m.layers},
                     {"heads", m.heads}, {"vocab", m.vocab}, {"seq", m.seq},
                     {"micro_batch", m.micro_batch}}},
          {"precision", to_string(r.options.precision)},
          {"n_params_module", r.module_params},
          {"n_params_core", r.core_params},
          {"states_convention", r.states.convention()},
          {"activations_convention", r.activations.convention()},
          {"memory_convention", kAllocatorConvention},
          {"phases", phases},
          {"checks", checks},
          {"peak_phase", engine::to_string(r.peak_phase)},
          {"peak_allocated_bytes", r.peak_allocated_bytes},
          {"peak_reserved_bytes", r.peak_reserved_bytes},
          {"teardown_allocated_bytes", r.teardown_allocated_bytes},
          {"loss", r.loss}};
}

void run(const ProfileFlags& f) {
  if (f.html) html::check_writable("--html", *f.html);  // before the run
  std::vector<Precision> precisions;
  if (f.precision == "both")
    precisions = {Precision::fp32, Precision::bf16};
  else
    precisions = {precision_from(f.precision)};
  std::vector<engine::MemoryProfileResult> results;
  bool ok = true;
  for (Precision p : precisions) {
    auto o = f.run;
    o.precision = p;
    o.allocator_cache = !f.no_cache;
    results.push_back(engine::run_memory_profile(o));
    for (const auto& c : engine::acceptance_checks(results.back())) ok = ok && c.ok();
    if (!f.out.json) {
      print_text(results.back(), f.out.size_unit());
      std::fflush(stdout);
    }
  }
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& r : results) runs.push_back(to_json(r));
  const nlohmann::json j = {{"command", "run memory-profile"}, {"ok", ok}, {"runs", runs}};
  if (f.html) html::write_file("--html", *f.html, html::page(memory_profile_page(j)));
  if (f.out.json) print_json(j);
  if (!ok) throw std::runtime_error("memory-profile: an acceptance check failed (see the report)");
}

const RegisterRun reg{[](CLI::App& run_cmd) {
  auto f = std::make_shared<ProfileFlags>();
  CLI::App* cmd = run_cmd.add_subcommand(
      "memory-profile",
      "one training step of a GPT on the CPU under a tracking allocator: allocated, peak and "
      "reserved bytes after model init, optimizer init, forward, backward and step, beside the "
      "ledgers' predictions");
  cmd->footer(
      "Default model: h 768, L 12, a 12, V 50257, T 512, B 1 (124 M parameters, peak ≈2.3 GB). "
      "bf16 takes ≈5 s on 2 cores (oneDNN); fp32 takes minutes where libtorch's fp32 matrix "
      "products go to Debian's reference BLAS — use a smaller --layers/--seq for a quick look. "
      "Exit 1 if a check fails (① ±10 %, ② ±15 %, ③ ±2 %).");
  auto& m = f->run.model;
  cmd->add_option("--hidden", m.hidden, "hidden size C")->capture_default_str();
  cmd->add_option("--layers", m.layers, "transformer blocks L")->capture_default_str();
  cmd->add_option("--heads", m.heads, "attention heads a (must divide --hidden)")
      ->capture_default_str();
  cmd->add_option("--vocab", m.vocab, "vocabulary V")->capture_default_str();
  cmd->add_option("--seq", m.seq, "sequence length T (= the learned position table)")
      ->capture_default_str();
  cmd->add_option("--micro-batch", m.micro_batch, "sequences per step B")->capture_default_str();
  cmd->add_option("--precision", f->precision, "fp32, bf16 (mixed: bf16 params/grads + fp32 "
                                               "master, m, v) or both")
      ->check(one_of({"fp32", "bf16", "both"}))
      ->capture_default_str();
  cmd->add_flag("--no-cache", f->no_cache,
                "free blocks at once instead of caching them (reserved − allocated = rounding)");
  cmd->add_option("--seed", f->run.seed, "seed of the weights and the token batch")
      ->capture_default_str();
  cmd->add_option("--threads", f->run.threads, "torch intra-op threads (0 = default)")
      ->capture_default_str();
  add_output_flags(cmd, f->out);
  cmd->add_option("--html", f->html,
                  "also write allocated bytes after each phase beside the ledgers' prediction as "
                  "a self-contained HTML page to FILE");
  cmd->callback([f] { run(*f); });
}};

}  // namespace

}  // namespace tally::cli::run_memory_profile
