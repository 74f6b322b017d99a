// `tally run qlora`: the text and JSON reporters of engine::run_qlora
// (tally/engine/experiments/qlora.hpp). Bad flags exit 2; a failed check exits 1 after the report.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "run_registry.hpp"
#include "tally/engine/experiments/qlora.hpp"

namespace tally::cli::run_qlora {

namespace {

struct QloraFlags {
  engine::QloraOptions run;
  LoraOptions lora;
  std::string arch = "gpt";
  std::string precision = "fp32";
  std::optional<std::string> save_adapters;
  bool no_checkpoint = false;
  OutputOptions out;
};

constexpr const char* kAllocatorConvention =
    "tracking CPU allocator (the CPU stand-in for torch.cuda's counters): allocated = live "
    "storages' requested bytes (max_memory_allocated); reserved = bytes held from the system, "
    "live + cached freed blocks in 512 B rounding (memory_reserved); reserved − allocated = the "
    "cache and rounding, no CUDA context or fragmentation of a GPU";

// Sizes of a small model read better in MB than in GB: MB (1e6) or MiB by --unit.
std::string mb(double bytes, SizeUnit u) {
  return u == SizeUnit::GiB ? fmt::format("{:.3f} MiB", bytes / (1024.0 * 1024.0))
                            : fmt::format("{:.3f} MB", bytes / 1e6);
}

// The run's layout in words: GPT-2's, or Llama's with its attention heads.
std::string layout(const engine::QloraResult& r) {
  if (r.options.arch == engine::Arch::gpt)
    return "gpt layout (LayerNorm, GELU MLP, learned positions, tied head, biases)";
  return fmt::format("llama layout (RMSNorm, SwiGLU f {}, rotary, {}, untied head, no biases)",
                     r.spec.ffn,
                     r.spec.kv_heads == r.spec.heads
                         ? fmt::format("{} heads", r.spec.heads)
                         : fmt::format("GQA {} query / {} key-value heads", r.spec.heads,
                                       r.spec.kv_heads));
}

std::string convention(const engine::QloraResult& r) {
  return r.ledger.convention + " | CPU run: compute " +
         std::string(to_string(r.options.lora.compute)) + ", " + layout(r) + ", " +
         (r.options.checkpoint ? "gradient checkpointing per block" : "no checkpointing");
}

// PEFT's print_trainable_parameters(): all params counts the adapters too.
std::string peft_line(double trainable, double all) {
  return fmt::format("trainable params: {:.0f} || all params: {:.0f} || trainable%: {:.4f}",
                     trainable, all, 100 * trainable / all);
}

double static_measured(const engine::QloraResult& r) { return double(r.memory.after_step_bytes); }
double static_ledger(const engine::QloraResult& r) {
  return r.ledger.static_bytes() - r.ledger.dequant_transient_bytes;
}
// Core's phases (Note [backward phases], core/activations.hpp) over the ledger's persistent
// bytes: the loss + head backward (no weight dequantized: the tied head is not quantized) and the
// blocks' backward (one layer replayed, its weights dequantized); the predicted peak is the larger.
double predicted_head(const engine::QloraResult& r, const engine::SeqRun& s) {
  return static_ledger(r) + s.predicted_activations.loss_phase_bytes;
}
double predicted_blocks(const engine::QloraResult& r, const engine::SeqRun& s) {
  return static_ledger(r) + r.ledger.dequant_transient_bytes +
         s.predicted_activations.blocks_phase_bytes;
}
double predicted_peak(const engine::QloraResult& r, const engine::SeqRun& s) {
  return std::max(predicted_head(r, s), predicted_blocks(r, s));
}

// Measured peak over core's predicted peak at each T: its range over the sweep.
std::pair<double, double> peak_ratio_range(const engine::QloraResult& r) {
  double lo = 1e300, hi = 0;
  for (const auto& s : r.runs) {
    const double v = double(s.peak_allocated_bytes) / predicted_peak(r, s);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  return {lo, hi};
}

void print_text(const engine::QloraResult& r, SizeUnit u) {
  const auto M = [u](double b) { return mb(b, u); };
  const auto G = [u](double b) { return size_str(b, u, 3); };
  const auto& o = r.options;
  const bool qlora = o.lora.method == FineTune::qlora;
  const std::string compute(to_string(o.lora.compute));
  // The dtype the unquantized tensors are kept in (Note [compute dtype], lora_model.hpp).
  const std::string kept = qlora && o.lora.upcast_unquantized ? "fp32" : compute;
  fmt::print("qlora: {} | arch {} | compute {} | micro-batch {} | N = {:.0f} | method {} | {:.0f} "
             "s\n",
             r.spec.name, engine::to_string(o.arch), compute, r.model.micro_batch,
             r.ledger.total_params, to_string(o.lora.method), r.seconds);
  fmt::print("  [{}]\n", convention(r));
  fmt::print("  memory: {}\n", kAllocatorConvention);

  const auto& q = r.quant;
  if (q.ran) {
    fmt::print("quantization: NF4{}, block {}{}; {} matrices, {} weights in {} blocks\n",
               o.lora.double_quant ? " + double quant" : "", o.lora.block,
               o.lora.double_quant ? fmt::format("/{}", o.lora.block2) : "", q.matrices,
               q.elements, q.blocks);
    fmt::print("  every weight at its nearest code point: {} off; max |w − ŵ| / (a·gap/2 + |a − "
               "â|) = {:.4f} (≤ 1); ‖W − Ŵ‖/‖W‖ = {:.2f} %\n",
               q.not_nearest, q.max_error_over_bound, 100 * q.rel_rms_error);
    fmt::print("  code points × 1/8 round-trip: {}", q.code_points_exact ? "exact" : "NOT exact");
    if (o.lora.double_quant)
      fmt::print("; absmax codes: {} off the 8-bit map's nearest, max |a − â| / half step = "
                 "{:.4f} (≤ 1)",
                 q.constants_not_nearest, q.max_constant_error_over_step);
    fmt::print("\n  dequantized layer ({}, {}): {} measured vs the ledger's {}\n",
               q.dequantized_module, compute, M(q.dequantized_layer_bytes),
               M(r.ledger.dequant_transient_bytes));
  }
  fmt::print("  loss on one batch: fp32 {} {:.6f} vs converted ({}, compute {}) {:.6f}: |Δ|/loss = "
             "{:.2e} (≤ 1e-2)\n",
             o.arch == engine::Arch::gpt ? "GPT" : "Llama", q.loss_fp32,
             qlora ? "NF4 backbone" : "frozen " + compute + " backbone", compute,
             q.loss_converted, q.loss_rel_diff());

  fmt::print("① run's model:  {}   (PEFT's line: all = N + adapters)\n",
             peft_line(double(r.trainable_params), double(r.all_params())));
  fmt::print("   ledger:       {:.0f} trainable of N = {:.0f} ({:.4f} %)\n",
             r.ledger.trainable_params, r.ledger.total_params,
             100 * r.ledger.trainable_fraction());
  fmt::print("   Llama-2-7B by the ledger: {}   (seed: < 0.2 %)\n",
             peft_line(r.ledger_7b.trainable_params,
                       r.ledger_7b.total_params + r.ledger_7b.trainable_params));

  fmt::print("② static bytes, the model's tensors by item vs the ledger:\n");
  const auto row = [&](const char* item, double measured, double ledger) {
    fmt::print("   {:<36} {:>14} {:>14}  {}\n", item, M(measured), M(ledger),
               ledger > 0 ? fmt::format("{:.4f}", measured / ledger) : "-");
  };
  fmt::print("   {:<36} {:>14} {:>14}  {}\n", "item", "measured", "ledger", "ratio");
  if (qlora) {
    row("quantized weights (4-bit)", r.quantized_weight_bytes, r.ledger.quantized_weight_bytes);
    row("quantization constants", r.constant_bytes, r.ledger.quant_constant_bytes);
  }
  const std::string frozen_item =
      qlora ? "unquantized " + kept + " (emb, head, norms)" : "frozen backbone (" + compute + ")";
  row(frozen_item.c_str(), r.frozen_bytes, r.ledger.frozen_bytes);
  row("adapters", r.adapter_bytes, r.ledger.adapter_bytes);
  row("adapter gradients", r.adapter_grad_bytes, r.ledger.adapter_grad_bytes);
  row("adapter Adam m + v", r.adapter_optimizer_bytes, r.ledger.adapter_optimizer_bytes);
  row("sum of the tensors", r.memory.inventory_bytes, static_ledger(r));
  row("allocator after a step", static_measured(r), static_ledger(r));
  fmt::print("   (allocator after model init {}, after optimizer init {}{})\n",
             M(double(r.memory.after_model_bytes)), M(double(r.memory.after_optimizer_bytes)),
             qlora ? fmt::format("; the dequantized layer, {}, is transient: inside the peaks "
                                 "below",
                                 M(r.ledger.dequant_transient_bytes))
                   : std::string());
  if (qlora) {
    const double nq = double(r.quantized_params);
    fmt::print("   4-bit backbone: {:.4f} B per quantized parameter (indices) + {:.4f} (constants{}"
               ") = {:.4f} B = {:.3f} bits ≈ 0.5 N_q; the unquantized rest {} ({:.0f} params in "
               "{})\n",
               r.quantized_weight_bytes / nq, r.constant_bytes / nq,
               o.lora.double_quant ? ", double quantization" : "",
               (r.quantized_weight_bytes + r.constant_bytes) / nq,
               8 * (r.quantized_weight_bytes + r.constant_bytes) / nq, M(r.frozen_bytes),
               double(r.frozen_params), kept);
  }

  fmt::print("③ ④ sweep: {} steps at each T, compute {} (peak = max allocated over the steps; "
             "activations = peak − static; predicted = core's activations for this setup, {} "
             "activations, + the ledger's static; tokens/s over the median step)\n",
             o.steps, compute, compute);
  fmt::print("   {:>6} {:>13} {:>13} {:>13} {:>7} {:>9} {:>12} {:>12} {:>13}  {}\n", "T", "peak",
             "activations", "predicted", "ratio", "tokens/s", "peak/token", "act/token",
             "res − alloc", "peak phase");
  for (const auto& s : r.runs)
    fmt::print("   {:>6} {:>13} {:>13} {:>13} {:>7.3f} {:>9.1f} {:>12} {:>12} {:>13}  {}\n", s.seq,
               M(double(s.peak_allocated_bytes)),
               M(double(s.peak_allocated_bytes) - static_measured(r)), M(predicted_peak(r, s)),
               double(s.peak_allocated_bytes) / predicted_peak(r, s), s.tokens_per_s(),
               fmt::format("{:.0f} B", s.peak_bytes_per_token()),
               fmt::format("{:.0f} B", s.activation_bytes_per_token(static_measured(r))),
               M(double(s.end_reserved_bytes - s.end_allocated_bytes)),
               engine::to_string(s.peak_phase));
  // Each phase's measured peak beside core's phase (Note [backward phases]).
  fmt::print("   by phase, measured vs core's phases (head: static + checkpointed inputs + loss "
             "and head terms; blocks: static + dequantized layer + checkpointed inputs + the "
             "replayed layer's backward, its score gradients included):\n");
  for (const auto& s : r.runs) {
    const double head = double(s.phase_peak_bytes[std::size_t(engine::StepPhase::head_backward)]);
    const double blocks =
        double(s.phase_peak_bytes[std::size_t(engine::StepPhase::blocks_backward)]);
    fmt::print("   {:>6}  loss + LM head backward {} vs {} ({:.3f}); blocks' backward {} vs {} "
               "({:.3f})\n",
               s.seq, M(head), M(predicted_head(r, s)), head / predicted_head(r, s), M(blocks),
               M(predicted_blocks(r, s)), blocks / predicted_blocks(r, s));
  }
  fmt::print("   fit: peak = {} + {:.0f} B × T, R² = {:.5f}; reserved − allocated = the tracking "
             "allocator's cached free blocks after the steps (each T starts from an emptied cache)"
             "\n",
             M(r.peak_fit.intercept), r.peak_fit.slope, r.peak_fit.r_squared);

  const auto& l = r.learning;
  fmt::print("learning: {} steps at T = {} on the synthetic task: loss first 5 {:.4f} → last 5 "
             "{:.4f}; {} of {} frozen tensors changed (CRC-32C); {} of {} adapter tensors "
             "changed\n",
             l.losses.size(), o.learn_seq, l.first5_mean, l.last5_mean, l.frozen_changed,
             l.frozen_tensors, l.adapters_changed, l.adapter_tensors);
  fmt::print("  saved {} ({} tensors, {} bytes: {}); reloaded onto a fresh {} backbone: loss "
             "{:.9g} vs trained {:.9g}\n",
             l.adapter_file.string(), l.adapter_file_tensors, l.adapter_file_bytes,
             l.file_holds_only_adapters ? "the adapters only" : "NOT only the adapters",
             qlora ? "NF4" : compute, l.eval_loss_reloaded, l.eval_loss_trained);
  fmt::print("  lora_config: {}\n", l.lora_config);

  // The 7B convention.
  const auto& f7 = r.ledger_7b;
  fmt::print("7B convention (Llama-2-7B, the seed's program: compute bf16, {}):\n",
             f7.convention);
  if (qlora) {
    const double per = (r.quantized_weight_bytes + r.constant_bytes) / double(r.quantized_params);
    fmt::print("  4-bit backbone at the run's {:.4f} B per quantized parameter × N_q = {:.4g}: {} "
               "(ledger {} + {}); unquantized embeddings, head, norms {} ({}); adapters + grads + "
               "Adam {}\n",
               per, f7.quantized_params, G(per * f7.quantized_params),
               G(f7.quantized_weight_bytes), G(f7.quant_constant_bytes), G(f7.frozen_bytes),
               o.lora.upcast_unquantized ? "fp32, as PEFT upcasts them" : "bf16",
               G(f7.adapter_total_bytes()));
  } else {
    fmt::print("  frozen backbone in bf16 {}; adapters + grads + Adam {}\n", G(f7.frozen_bytes),
               G(f7.adapter_total_bytes()));
  }
  fmt::print("  activations by core (bf16, materialised attention, eager loss{}, the adapters' "
             "terms), loss + head backward | blocks' backward → the peak:",
             o.checkpoint ? ", full recompute" : "");
  for (std::size_t i = 0; i < r.runs.size(); ++i) {
    const ActivationResult& a = r.runs[i].predicted_activations_7b;
    fmt::print("{} T {}: {} | {} → {} ({})", i ? ";" : "", r.runs[i].seq,
               G(a.loss_phase_bytes), G(a.blocks_phase_bytes), G(a.peak_stage_bytes),
               to_string(a.peak_phase));
  }
  const auto [lo, hi] = peak_ratio_range(r);
  fmt::print("\n  static {}{}; this run measured its peak at {:.3f}–{:.3f} of core's prediction "
             "(static + the larger phase)\n",
             G(f7.static_bytes() - f7.dequant_transient_bytes),
             qlora ? fmt::format(" (+ the dequantized layer {} in the blocks' backward)",
                                 G(f7.dequant_transient_bytes))
                   : std::string(),
             lo, hi);

  const auto checks = engine::qlora_checks(r);
  const bool seed = engine::seed_setup(o.lora);
  fmt::print("checks (tally: tally's own, for every setup; seed: the seed's threshold for its "
             "setup, r 8 on q, v, NF4 + double quant, block 64/256 — this run's setup {} the "
             "seed's{}):\n",
             seed ? "is" : "is not",
             seed ? "" : ", so its thresholds are reported, not required");
  for (const auto& c : checks)
    fmt::print("  {:<5} [{}] {}: {:.10g} {} {:.10g}: {}\n", c.id, engine::to_string(c.scope),
               c.what, c.measured, c.relation, c.limit,
               c.ok ? "ok" : c.binds ? "FAILED" : "outside the seed's threshold (not required)");
  const auto& pk = r.runs.back();
  fmt::print("  the peak at T = {} ({}) occurs in the {}; peak reserved {}\n", pk.seq,
             M(double(pk.peak_allocated_bytes)), engine::to_string(pk.peak_phase),
             M(double(pk.peak_reserved_bytes)));
}

nlohmann::json to_json(const engine::QloraResult& r) {
  const auto& o = r.options;
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& s : r.runs) {
    nlohmann::json phases = nlohmann::json::object();
    for (engine::StepPhase p : engine::kStepPhases)
      phases[std::string(engine::to_string(p))] = s.phase_peak_bytes[std::size_t(p)];
    runs.push_back({{"seq", s.seq},
                    {"steps", s.step_seconds.size()},
                    {"step_seconds", s.step_seconds},
                    {"median_step_seconds", s.median_step_seconds()},
                    {"losses", s.losses},
                    {"peak_allocated_bytes", s.peak_allocated_bytes},
                    {"peak_reserved_bytes", s.peak_reserved_bytes},
                    {"reserved_minus_allocated_bytes", s.end_reserved_bytes - s.end_allocated_bytes},
                    {"cached_bytes", s.end_cached_bytes},
                    {"peak_phase", std::string(engine::to_string(s.peak_phase))},
                    {"phase_peak_bytes", phases},
                    {"tokens_per_s", s.tokens_per_s()},
                    {"peak_bytes_per_token", s.peak_bytes_per_token()},
                    {"activation_bytes_per_token", s.activation_bytes_per_token(static_measured(r))},
                    {"predicted_activation_bytes", s.predicted_activations.peak_stage_bytes},
                    {"predicted_activation_phase",
                     std::string(to_string(s.predicted_activations.peak_phase))},
                    {"predicted_peak_bytes", predicted_peak(r, s)},
                    {"predicted_replayed_layer_bytes",
                     s.predicted_activations.recompute_transient_bytes},
                    {"predicted_head_backward_bytes", predicted_head(r, s)},
                    {"predicted_blocks_backward_bytes", predicted_blocks(r, s)},
                    {"predicted_activation_bytes_7b", s.predicted_activations_7b.peak_stage_bytes},
                    {"predicted_head_backward_activation_bytes_7b",
                     s.predicted_activations_7b.loss_phase_bytes},
                    {"predicted_blocks_backward_activation_bytes_7b",
                     s.predicted_activations_7b.blocks_phase_bytes}});
  }
  nlohmann::json criteria = nlohmann::json::array();
  const auto checks = engine::qlora_checks(r);
  for (const auto& c : checks)
    criteria.push_back({{"id", c.id}, {"what", c.what}, {"measured", c.measured},
                        {"limit", c.limit}, {"relation", c.relation}, {"ok", c.ok},
                        {"scope", std::string(engine::to_string(c.scope))}, {"binds", c.binds}});
  const bool ok = engine::qlora_passed(checks);
  const auto& q = r.quant;
  const auto& l = r.learning;
  const auto& f = r.ledger;
  const auto& f7 = r.ledger_7b;
  nlohmann::json targets = nlohmann::json::array();
  for (LoraTarget t : o.lora.targets) targets.push_back(std::string(to_string(t)));
  return {
      {"command", "run qlora"},
      {"ok", ok},
      {"seed_setup", engine::seed_setup(o.lora)},
      {"convention", convention(r)},
      {"memory_convention", kAllocatorConvention},
      {"method", std::string(to_string(o.lora.method))},
      {"arch", std::string(engine::to_string(o.arch))},
      {"precision", std::string(to_string(o.lora.compute))},
      {"lora", {{"rank", o.lora.rank}, {"alpha", o.lora.alpha}, {"dropout", o.lora.dropout},
                {"targets", targets}, {"quant", std::string(to_string(o.lora.quant))},
                {"double_quant", o.lora.double_quant}, {"block", o.lora.block},
                {"block2", o.lora.block2}, {"checkpoint", o.checkpoint}}},
      {"model", {{"name", r.spec.name}, {"arch", std::string(engine::to_string(o.arch))},
                 {"hidden", r.spec.hidden}, {"layers", r.spec.layers}, {"heads", r.spec.heads},
                 {"kv_heads", r.spec.kv_heads}, {"ffn", r.spec.ffn},
                 {"mlp", r.spec.mlp == MlpKind::swiglu ? "swiglu" : "gelu"},
                 {"norm", r.spec.norm == NormKind::rmsnorm ? "rmsnorm" : "layernorm"},
                 {"position", r.spec.position == PositionKind::rotary ? "rotary" : "learned"},
                 {"tied_embeddings", r.spec.tied_embeddings},
                 {"vocab", r.spec.vocab}, {"seq", r.model.seq},
                 {"micro_batch", r.model.micro_batch}, {"params", count_json(f.total_params)}}},
      {"trainable_params", r.trainable_params},
      {"all_params", r.all_params()},
      {"trainable_fraction", double(r.trainable_params) / f.total_params},
      {"ledger", {{"trainable_params", count_json(f.trainable_params)},
                  {"trainable_fraction", f.trainable_fraction()},
                  {"bits_per_quantized_param", f.bits_per_quantized_param},
                  {"quantized_weight_bytes", f.quantized_weight_bytes},
                  {"quant_constant_bytes", f.quant_constant_bytes},
                  {"frozen_bytes", f.frozen_bytes}, {"adapter_bytes", f.adapter_bytes},
                  {"adapter_grad_bytes", f.adapter_grad_bytes},
                  {"adapter_optimizer_bytes", f.adapter_optimizer_bytes},
                  {"dequant_transient_bytes", f.dequant_transient_bytes},
                  {"static_bytes", f.static_bytes()}, {"convention", f.convention}}},
      {"quantization", {{"ran", q.ran}, {"matrices", q.matrices}, {"elements", q.elements},
                        {"blocks", q.blocks}, {"not_nearest", q.not_nearest},
                        {"max_error_over_bound", q.max_error_over_bound},
                        {"max_abs_error", q.max_abs_error}, {"rel_rms_error", q.rel_rms_error},
                        {"code_points_exact", q.code_points_exact},
                        {"constants_not_nearest", q.constants_not_nearest},
                        {"max_constant_error_over_step", q.max_constant_error_over_step},
                        {"dequantized_layer_bytes", q.dequantized_layer_bytes},
                        {"dequantized_module", q.dequantized_module},
                        {"loss_fp32", q.loss_fp32}, {"loss_converted", q.loss_converted},
                        {"loss_rel_diff", q.loss_rel_diff()}}},
      {"static", {{"quantized_weight_bytes", r.quantized_weight_bytes},
                  {"quant_constant_bytes", r.constant_bytes}, {"frozen_bytes", r.frozen_bytes},
                  {"adapter_bytes", r.adapter_bytes}, {"adapter_grad_bytes", r.adapter_grad_bytes},
                  {"adapter_optimizer_bytes", r.adapter_optimizer_bytes},
                  {"quantized_params", r.quantized_params}, {"frozen_params", r.frozen_params},
                  {"inventory_bytes", r.memory.inventory_bytes},
                  {"after_model_bytes", r.memory.after_model_bytes},
                  {"after_optimizer_bytes", r.memory.after_optimizer_bytes},
                  {"after_step_bytes", r.memory.after_step_bytes},
                  {"ledger_bytes", static_ledger(r)}}},
      {"runs", runs},
      {"fit", {{"slope_bytes_per_token", r.peak_fit.slope},
               {"intercept_bytes", r.peak_fit.intercept}, {"r_squared", r.peak_fit.r_squared}}},
      {"r_squared", r.peak_fit.r_squared},
      {"learning", {{"steps", l.losses.size()}, {"seq", o.learn_seq}, {"losses", l.losses},
                    {"first5_mean", l.first5_mean}, {"last5_mean", l.last5_mean},
                    {"frozen_tensors", l.frozen_tensors}, {"frozen_changed", l.frozen_changed},
                    {"adapter_tensors", l.adapter_tensors},
                    {"adapters_changed", l.adapters_changed},
                    {"adapter_file", l.adapter_file.string()},
                    {"adapter_file_bytes", l.adapter_file_bytes},
                    {"adapter_file_tensors", l.adapter_file_tensors},
                    {"file_holds_only_adapters", l.file_holds_only_adapters},
                    {"lora_config", nlohmann::json::parse(l.lora_config)},
                    {"eval_loss_trained", l.eval_loss_trained},
                    {"eval_loss_reloaded", l.eval_loss_reloaded}}},
      {"seven_b", {{"model", r.spec_7b.name}, {"convention", f7.convention},
                   {"trainable_params", count_json(f7.trainable_params)},
                   {"total_params", count_json(f7.total_params)},
                   {"trainable_fraction", f7.trainable_fraction()},
                   {"quantized_params", count_json(f7.quantized_params)},
                   {"backbone_bytes", f7.backbone_bytes()},
                   {"static_bytes", f7.static_bytes()}}},
      {"criteria", criteria},
      {"teardown_allocated_bytes", r.teardown_allocated_bytes},
      {"seconds", r.seconds}};
}

void run(QloraFlags& f) {
  engine::QloraOptions o = f.run;
  o.arch = *engine::parse_arch(f.arch);  // the flag's check admits gpt and llama only
  const std::optional<LoraSetup> s =
      lora_setup(f.lora, precision_from(f.precision), Optimizer::adam, /*fp32_qlora=*/true);
  if (!s) throw InvalidInput("--method full: tally run qlora runs lora or qlora");
  o.lora = *s;
  o.checkpoint = !f.no_checkpoint;
  if (f.save_adapters) o.save_adapters = *f.save_adapters;
  o.progress = [](const std::string& line) { std::cerr << line << std::endl; };
  o.validate();  // bad input exits 2 before anything runs
  const engine::QloraResult r = engine::run_qlora(o);
  const bool ok = engine::qlora_passed(engine::qlora_checks(r));
  if (f.out.json)
    print_json(to_json(r));
  else
    print_text(r, f.out.size_unit());
  std::fflush(stdout);
  if (!ok) throw std::runtime_error("qlora: a required check failed (see the report)");
}

const RegisterRun reg{[](CLI::App& run_cmd) {
  auto f = std::make_shared<QloraFlags>();
  f->lora.method = "qlora";
  CLI::App* cmd = run_cmd.add_subcommand(
      "qlora",
      "LoRA adapters on a frozen NF4 (qlora) or dense (lora) GPT- or Llama-layout backbone on the "
      "CPU, in fp32 or bf16 compute: quantization checks, the seed's criteria ①–④ against core's "
      "fine-tuning ledger under a tracking allocator, a learning run, adapters saved and "
      "reloaded");
  cmd->footer(
      "Default model: GPT-2 small's shape (h 768, L 12, a 12, V 50257) with positions up to the "
      "longest --seq: N = 125.2 M at T 2048; the sweep T = 512,1024,2048 × 5 steps takes minutes "
      "on 2 cores. --arch llama: RMSNorm, SwiGLU (gate, up, down; --ffn, default Meta's rule, "
      "2048 at h 768), rotary positions, --kv-heads for GQA, an untied head, no biases. "
      "--precision bf16: weights dequantized to bf16 on use, activations and the adapters' "
      "matmuls in bf16, the adapters' weights, gradients and Adam states fp32 (PEFT); the ledger "
      "is asked with the same layout and compute dtype. On a CPU without AVX-512 libtorch 1.13 "
      "multiplies bf16 matrices with a slow generic kernel: ≈50× fp32's time. Use "
      "--hidden/--layers/--vocab and a shorter --seq for a quick look. The criteria "
      "are the seed's: ① < 0.2 % (of Llama-2-7B), ② ≈ 0.5 bytes per quantized parameter and ③ "
      "are thresholds for its setup (r 8 on q, v; NF4 with double quantization, block 64/256); "
      "for another setup (all targets; --no-double-quant) they are reported, labelled [seed], "
      "and not required. Exit 1 if one of tally's own checks fails (or a seed threshold in the "
      "seed's setup), 2 for bad flags.");
  auto& m = f->run.model;
  cmd->add_option("--hidden", m.hidden, "hidden size C")->capture_default_str();
  cmd->add_option("--layers", m.layers, "transformer blocks L")->capture_default_str();
  cmd->add_option("--heads", m.heads, "attention heads a (must divide --hidden)")
      ->capture_default_str();
  cmd->add_option("--vocab", m.vocab, "vocabulary V")->capture_default_str();
  cmd->add_option("--micro-batch", m.micro_batch, "sequences per step B")->capture_default_str();
  cmd->add_option("--arch", f->arch,
                  "decoder layout: gpt (GPT-2: LayerNorm, GELU MLP, learned positions, tied head) "
                  "| llama (RMSNorm, SwiGLU, rotary, optional GQA, untied head)")
      ->check(one_of({"gpt", "llama"}))
      ->capture_default_str();
  cmd->add_option("--kv-heads", f->run.kv_heads,
                  "--arch llama: key/value heads a_kv (GQA), dividing --heads (default: --heads)");
  cmd->add_option("--ffn", f->run.ffn,
                  "--arch llama: SwiGLU width f (default: Meta's 256·⌈⌊8C/3⌋/256⌉)");
  cmd->add_option("--precision", f->precision,
                  "compute dtype: fp32 | bf16 (bnb_4bit_compute_dtype; adapters, their gradients "
                  "and Adam stay fp32)")
      ->check(one_of({"fp32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--seq", f->run.seqs, "sequence lengths of the sweep, rising (at least three)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--steps", f->run.steps, "training steps at each sequence length")
      ->capture_default_str();
  cmd->add_option("--learn-steps", f->run.learn_steps,
                  "steps of the learning check (first 5 vs last 5 losses)")
      ->capture_default_str();
  cmd->add_option("--learn-seq", f->run.learn_seq, "sequence length of the learning check")
      ->capture_default_str();
  cmd->add_option("--lr", f->run.lr, "the adapters' Adam learning rate")
      ->check(finite_in(0, 1, Ends::open_lo))
      ->capture_default_str();
  cmd->add_flag("--no-checkpoint", f->no_checkpoint,
                "keep every block's activations (default: gradient checkpointing per block)");
  cmd->add_option("--save-adapters", f->save_adapters,
                  "directory for adapter_model.safetensors (default: a temporary one, removed)");
  cmd->add_option("--seed", f->run.seed, "seed of the weights, adapters and data")
      ->capture_default_str();
  cmd->add_option("--threads", f->run.threads, "torch intra-op threads (0 = default)")
      ->capture_default_str();
  add_lora_flags(cmd, f->lora);
  add_output_flags(cmd, f->out);
  cmd->callback([f, cmd] {
    note_lora_flags(cmd, f->lora);
    run(*f);
  });
}};

}  // namespace

}  // namespace tally::cli::run_qlora
