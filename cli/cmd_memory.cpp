// `tally memory`: the model-state ledger (+ activations when an architecture is given).
#include <fmt/core.h>

#include <cmath>
#include <memory>
#include <optional>

#include "commands.hpp"
#include "common.hpp"
#include "tally/core/activations.hpp"
#include "tally/core/finetune.hpp"
#include "tally/core/model_states.hpp"
#include "tally/core/operators.hpp"
#include "tally/core/planner.hpp"
#include "tally/core/presets.hpp"

namespace tally::cli {

namespace {

struct MemoryOptions {
  ModelOptions model;
  OutputOptions out;
  std::string precision = "bf16", optimizer = "adam", recompute = "none", attention = "flash";
  std::vector<std::string> recompute_modules;  // Megatron-Core's, beside --recompute
  int zero = 0, dp = 1, tp = 1, pp = 1, cp = 1, ep = 1, interleave = 1;
  std::optional<int> etp;  // unset: --tp
  int amax_history = kTeAmaxHistory;  // fp8 delayed scaling
  double capacity_factor = 1;
  std::string loss = "fused";
  std::optional<int> micro_batches;  // unset: --pp in flight
  bool sp = false, no_dropout = false, dropout = false;
  bool fp8_param_gather = false;     // Note [fp8 parameters] (core/model_states.cpp)
  std::optional<std::int64_t> seq;   // unset: model states only, no activations
  std::int64_t micro_batch = 1;
  std::optional<std::string> gpu;    // unset: no capacity line
  MemoryBudgetOptions memory;        // with --gpu: Note [does it fit], as the planner
  LoraOptions lora;                  // --method and the LoRA flags (core/finetune.hpp)
  bool max_seq = false;              // with --gpu: the longest sequence that fits
};

// The LoRA / QLoRA ledger of the options; nullopt for full fine-tuning.
std::optional<FineTuneLedger> finetune_of(const MemoryOptions& o, const ModelSpec& model,
                                          Precision precision) {
  const std::optional<LoraSetup> s =
      lora_setup(o.lora, precision, optimizer_from(o.optimizer));
  if (!s) return std::nullopt;
  if (o.tp > 1 || o.pp > 1 || o.cp > 1 || o.dp > 1 || o.ep > 1 || o.etp.value_or(1) > 1 ||
      o.zero > 0)
    throw InvalidInput("--method " + o.lora.method +
                       ": the LoRA ledger is for one GPU (no --tp/--pp/--cp/--dp/--ep/--etp/"
                       "--zero)");
  return finetune_ledger(model, *s);
}

void print_finetune(const FineTuneLedger& f, const std::string& convention, SizeUnit unit) {
  fmt::print("fine-tuning state  [{}]\n", convention);
  // PEFT's print_trainable_parameters() line.
  fmt::print("  trainable params: {:.0f} || all params: {:.0f} || trainable%: {:.4f}\n",
             f.trainable_params, f.total_params, 100 * f.trainable_fraction());
  auto row = [&](const char* name, double bytes, const std::string& what) {
    fmt::print("  {:<18} {:>14}   {}\n", name, size_str(bytes, unit), what);
  };
  if (f.quantized_params > 0) {
    row("quantized weights", f.quantized_weight_bytes,
        fmt::format("({:.4g} params of the decoder layers' linears)", f.quantized_params));
    row("quant constants", f.quant_constant_bytes,
        fmt::format("({:.3f} bits per quantized param in all)", f.bits_per_quantized_param));
  }
  row("frozen", f.frozen_bytes,
      fmt::format("({:.4g} params: {})", f.frozen_params,
                  f.quantized_params > 0 ? "embeddings, head, norms, biases" : "the backbone"));
  row("adapters", f.adapter_bytes, "(fp32)");
  row("adapter grads", f.adapter_grad_bytes, "(fp32)");
  row("adapter optimizer", f.adapter_optimizer_bytes, "");
  if (f.dequant_transient_bytes > 0)
    row("dequantized layer", f.dequant_transient_bytes, "(the largest matrix, while it runs)");
  row("static", f.static_bytes(), "");
}

void run_memory(const MemoryOptions& o, const Answers& answers) {
  const ModelSpec model = *resolve_model(o.model);
  const SizeUnit unit = o.out.size_unit();
  const Precision precision = precision_from(o.precision);
  // Model parallelism splits the weights first; ZeRO then shards over the data-parallel group
  // (--dp here; the expert layout regroups --tp x --dp: Note [expert rank groups]).
  const int etp = o.etp.value_or(o.tp);
  check_expert_split(model, ParallelLayout{.dp = o.dp, .tp = o.tp}, o.ep, etp, o.sp);
  const double n_total = state_params(model);
  const double n_gpu = n_total / (double(o.tp) * o.pp);
  // fp8 delayed scaling: the metadata of a stage's GEMMs (Note [low precision]).
  const double scaled_gemms =
      precision == Precision::fp8 && !model.params_only
          ? low_precision_gemms(model, double(model.layers) / o.pp, o.ep)
          : 0.0;
  std::optional<ClusterSpec> gpu;
  if (o.gpu) gpu = resolve_cluster(ClusterOptions{.gpu = *o.gpu});
  const auto states = model_states(n_gpu, StateSetup{.precision = precision,
                                                     .optimizer = optimizer_from(o.optimizer),
                                                     .zero_stage = o.zero,
                                                     .shard_degree = o.dp, .ep = o.ep,
                                                     .tp = o.tp, .etp = etp,
                                                     .expert_share = routed_expert_share(model),
                                                     .gemm_weight_share = gemm_weight_share(model),
                                                     .scaled_gemms = scaled_gemms,
                                                     .amax_history = o.amax_history,
                                                     .compute_capability =
                                                         gpu ? gpu->gpu.compute_capability : 0,
                                                     .fp8_param_gather = o.fp8_param_gather});
  const std::optional<FineTuneLedger> ft = finetune_of(o, model, precision);
  const std::string convention =
      convention_with_unit(ft ? ft->convention : states.convention(), unit);

  const std::optional<LoraSetup> lora = lora_setup(o.lora, precision, optimizer_from(o.optimizer));
  auto activations_at = [&](std::int64_t seq) {
    ActivationSetup a{.seq = seq, .micro_batch = o.micro_batch, .tp = o.tp,
                      .sequence_parallel = o.sp, .cp = o.cp, .pp = o.pp,
                      .interleave = o.interleave,
                      .micro_batches = o.micro_batches.value_or(o.pp),
                      .recompute = recompute_from(o.recompute),
                      .recompute_modules = recompute_modules_from(o.recompute_modules),
                      .attention = attention_from(o.attention),
                      .dropout = o.dropout || (!o.no_dropout && model.dropout),
                      .linear_input_bytes = saved_linear_input_bytes(precision),
                      .etp = etp, .capacity_factor = o.capacity_factor,
                      .eager_loss = *parse_loss(o.loss) == Loss::eager};
    if (lora) add_lora_activations(model, *lora, a);
    return activations(model, a);
  };
  const double states_total = ft ? ft->static_bytes() : states.bytes.total();
  const bool layers_known = !model.params_only;
  const double buffers =
      ft || (o.zero == 3 && !layers_known)
          ? 0.0  // one GPU has no DDP buckets; ZeRO-3's gathered layers need the layer count
          : buffer_bytes(o.zero, states.local_params, layers_known ? model.layers / o.pp : 1,
                         dtype_bytes(precision), o.pp);
  auto fit_with = [&](double act_bytes) {
    return check_fit(states_total, act_bytes, buffers,
                     memory_budget(o.memory, gpu->gpu.memory_bytes));
  };

  // --max-seq: the largest multiple of --cp whose activations still fit (they never shrink as the
  // sequence grows), by bisection; none when the states alone overflow.
  std::optional<std::int64_t> seq = o.seq;
  std::optional<std::int64_t> max_seq;
  if (o.max_seq) {
    if (!gpu) throw InvalidInput("--max-seq needs --gpu (the capacity to fit)");
    if (o.seq) throw InvalidInput("--max-seq searches the sequence length: give it or --seq");
    std::int64_t hi = std::int64_t(1) << 24;
    if (layers_known && model.position == PositionKind::learned)  // the table caps the length
      hi = std::min<std::int64_t>(hi, model.max_positions);
    const std::int64_t longest = longest_sequence(o.cp, hi, [&](std::int64_t s) {
      return fit_with(activations_at(s).peak_stage_bytes).fits;
    });
    if (longest > 0) seq = max_seq = longest;
  }

  std::optional<ActivationResult> act;
  if (seq) {
    act = activations_at(*seq);
  } else if (!o.max_seq && (o.tp > 1 || o.sp || o.cp > 1 || o.micro_batch != 1)) {
    throw InvalidInput("--seq is required with --tp/--sp/--cp/--micro-batch (activations need a "
                       "sequence length)");
  }
  const double act_bytes = act ? act->peak_stage_bytes : 0.0;
  const double total = states_total + act_bytes;

  const auto& b = states.bytes;
  nlohmann::json items_gb = {{"params", in_gb(b.params)}, {"grads", in_gb(b.grads)},
                             {"m", in_gb(b.m)},           {"v", in_gb(b.v)},
                             {"master", in_gb(b.master)}};
  if (b.low_precision > 0) items_gb["low_precision_copies"] = in_gb(b.low_precision);
  if (b.scaling_metadata > 0) items_gb["scaling_metadata"] = in_gb(b.scaling_metadata);
  if (ft)
    items_gb = {{"quantized_weights", in_gb(ft->quantized_weight_bytes)},
                {"quant_constants", in_gb(ft->quant_constant_bytes)},
                {"frozen", in_gb(ft->frozen_bytes)},
                {"adapters", in_gb(ft->adapter_bytes)},
                {"adapter_grads", in_gb(ft->adapter_grad_bytes)},
                {"adapter_optimizer", in_gb(ft->adapter_optimizer_bytes)},
                {"dequant_transient", in_gb(ft->dequant_transient_bytes)}};
  nlohmann::json j = {{"command", "memory"},
                      {"model", model.name},
                      {"convention", convention},
                      {"unit_of_gb_fields", "GB = 1e9 bytes"},
                      {"n_params", count_json(n_total)},
                      {"params_per_gpu", states.local_params},
                      {"fp8_param_gather", o.fp8_param_gather},
                      {"bytes_per_param", {{"params", states.per_param.params},
                                           {"grads", states.per_param.grads},
                                           {"m", states.per_param.m},
                                           {"v", states.per_param.v},
                                           {"master", states.per_param.master},
                                           {"low_precision_copies",
                                            states.per_param.low_precision}}},
                      {"states_gb", in_gb(states_total)},
                      {"total_gb", in_gb(total)},
                      {"total_bytes", total}};
  if (act) {
    items_gb["activations"] = in_gb(act_bytes);
    nlohmann::json terms = nlohmann::json::array();
    for (const auto& t : act->layer_terms)
      terms.push_back({{"name", t.name}, {"formula", t.formula}, {"gb", in_gb(t.bytes)}});
    j["activations"] = {{"convention", act->convention()},
                        {"per_layer_gb", in_gb(act->per_layer_bytes)},
                        {"layers_on_stage", act->layers_on_stage},
                        {"in_flight_micro_batches", act->in_flight_micro_batches},
                        {"transformer_gb", in_gb(act->transformer_bytes)},
                        {"embedding_gb", in_gb(act->embedding_bytes)},
                        {"output_gb", in_gb(act->output_bytes)},
                        {"recompute_transient_gb", in_gb(act->recompute_transient_bytes)},
                        {"score_gradients_gb", in_gb(act->score_gradient_bytes)},
                        {"layer_backward_gb", in_gb(act->layer_backward_bytes)},
                        {"loss_phase_gb", in_gb(act->loss_phase_bytes)},
                        {"blocks_phase_gb", in_gb(act->blocks_phase_bytes)},
                        {"peak_phase", std::string(to_string(act->peak_phase))},
                        {"peak_stage", act->peak_stage},
                        {"peak_stage_gb", in_gb(act->peak_stage_bytes)},
                        {"layer_terms", terms}};
  }
  j["items_gb"] = items_gb;
  j["method"] = o.lora.method;
  if (ft)
    j["finetune"] = {{"trainable_params", count_json(ft->trainable_params)},
                     {"trainable_fraction", ft->trainable_fraction()},
                     {"quantized_params", count_json(ft->quantized_params)},
                     {"frozen_params", count_json(ft->frozen_params)},
                     {"bits_per_quantized_param", ft->bits_per_quantized_param},
                     {"backbone_gb", in_gb(ft->backbone_bytes())},
                     {"adapters_with_states_gb", in_gb(ft->adapter_total_bytes())}};
  // Note [does it fit] (core/planner.hpp): the planner's own check, buffers and headroom included.
  if (o.max_seq) j["max_seq"] = max_seq ? nlohmann::json(*max_seq) : nlohmann::json(nullptr);
  std::optional<FitCheck> fit;
  if (gpu) {
    fit = fit_with(act_bytes);
    j["capacity"] = {{"gpu", gpu->gpu.name},
                     {"memory_gb", in_gb(gpu->gpu.memory_bytes)},
                     {"headroom", o.memory.headroom},
                     {"allocator_allowance", o.memory.allocator_allowance},
                     {"usable_gb", in_gb(fit->usable_bytes)},
                     {"buffers_gb", in_gb(fit->buffer_bytes)},
                     {"allocated_gb", in_gb(fit->allocated_bytes)},
                     {"allocator_gb", in_gb(fit->allocator_bytes)},
                     {"runtime_gb", in_gb(fit->runtime_bytes)},
                     {"total_gb", in_gb(fit->total_bytes)},
                     {"used_fraction", fit->total_bytes / gpu->gpu.memory_bytes},
                     {"fits", fit->fits}};
  }
  require_finite(j);  // Note [no inf or nan in output], for the text report too
  if (o.out.json) {
    answers.json(j);
    return;
  }

  fmt::print("tally memory — {} (N = {:.4g}; {:.4g} per GPU after TP {} × PP {}{})\n", model.name,
             n_total, states.local_params, o.tp, o.pp,
             o.ep > 1 || etp != o.tp
                 ? fmt::format(" × EP {}{} of the routed experts", o.ep,
                               etp != o.tp ? fmt::format(" × ETP {} (instead of TP)", etp) : "")
                 : "");
  if (o.max_seq) {
    if (max_seq)
      fmt::print("longest sequence that fits on {}: {} tokens (micro-batch {}; the report below is "
                 "at that length)\n",
                 gpu->gpu.name, *max_seq, o.micro_batch);
    else
      fmt::print("no sequence length fits on {}: the states alone need {}\n", gpu->gpu.name,
                 size_str(states_total, unit));
  }
  if (ft) {
    print_finetune(*ft, convention, unit);
  } else {
    fmt::print("model states per GPU  [{}]\n", convention);
    const auto& pp = states.per_param;
    auto row = [&](const char* name, double bytes, double per_param) {
      fmt::print("  {:<12} {:>14}   ({} B/param before sharding)\n", name, size_str(bytes, unit),
                 per_param);
    };
    if (o.fp8_param_gather)  // Note [fp8 parameters]: no 16-bit copy of the linear weights
      fmt::print("  {:<12} {:>14}   ({} B/param before sharding, the {:.1f} % that are not "
                 "linear weights only)\n",
                 "params", size_str(b.params, unit), pp.params,
                 100 * (1 - gemm_weight_share(model)));
    else
      row("params", b.params, pp.params);
    row("grads", b.grads, pp.grads);
    row("m", b.m, pp.m);
    row("v", b.v, pp.v);
    row("master", b.master, pp.master);
    if (b.low_precision > 0)
      fmt::print("  {:<12} {:>14}   ({} B per linear weight: {:.1f} % of the params)\n",
                 fmt::format("{} copies", to_string(precision)), size_str(b.low_precision, unit),
                 pp.low_precision, 100 * gemm_weight_share(model));
    if (b.scaling_metadata > 0)
      fmt::print("  {:<12} {:>14}   (fp8 delayed scaling: {} GEMMs × 5 tensors × fp32 amax "
                 "history {} + scale)\n",
                 "amax history", size_str(b.scaling_metadata, unit, 6), format_number(scaled_gemms),
                 o.amax_history);
    fmt::print("  {:<12} {:>14}\n", "states", size_str(b.total(), unit));
  }
  if (act) {
    fmt::print("activations per GPU   [{}]\n", act->convention());
    for (const auto& t : act->layer_terms)
      fmt::print("    {:<44} {:<14} {:>12} / layer\n", t.name, t.formula, size_str(t.bytes, unit, 3));
    fmt::print("  {:<12} {:>14}   ({} / layer × {} layers × {} micro-batches in flight)\n",
               "transformer", size_str(act->transformer_bytes, unit),
               size_str(act->per_layer_bytes, unit, 3), act->layers_on_stage,
               act->in_flight_micro_batches);
    fmt::print("  {:<12} {:>14}\n", "embedding", size_str(act->embedding_bytes, unit, 3));
    fmt::print("  {:<12} {:>14}   (final norm, LM-head input, fp32 logits)\n", "output",
               size_str(act->output_bytes, unit, 3));
    if (act->recompute_transient_bytes > 0)
      fmt::print("  {:<12} {:>14}   (full recompute: the replayed layer's inventory less its "
                 "checkpointed input)\n",
                 "replay", size_str(act->recompute_transient_bytes, unit, 3));
    if (act->score_gradient_bytes > 0)
      fmt::print("  {:<12} {:>14}   (materialised attention: softmax's dP and dS in a layer's "
                 "backward)\n",
                 "score grads", size_str(act->score_gradient_bytes, unit, 3));
    // Note [backward phases] (core/activations.hpp): the peak is the larger phase, not the sum.
    fmt::print("  {:<12} {:>14}   (last stage's saved tensors + output)\n", "loss phase",
               size_str(act->loss_phase_bytes, unit));
    fmt::print("  {:<12} {:>14}   (fullest stage's saved tensors + one layer's backward, {})\n",
               "blocks phase", size_str(act->blocks_phase_bytes, unit),
               size_str(act->layer_backward_bytes, unit, 3));
    fmt::print("  {:<12} {:>14}   (the peak: the {}{})\n", "activations",
               size_str(act_bytes, unit), to_string(act->peak_phase),
               o.pp > 1 ? fmt::format(" on stage {}", act->peak_stage) : std::string());
  }
  fmt::print("total per GPU          {:>14}\n", size_str(total, unit));
  if (fit) {
    fmt::print("  + buffers            {:>14}   (DDP buckets / ZeRO-3 gathered layers)\n",
               size_str(fit->buffer_bytes, unit));
    fmt::print("  + allocator cache    {:>14}   ({:.1f} % of allocated: reserved − allocated)\n",
               size_str(fit->allocator_bytes, unit), 100 * o.memory.allocator_allowance);
    fmt::print("  + CUDA runtime       {:>14}   (context and libraries, outside the allocator)\n",
               size_str(fit->runtime_bytes, unit));
    fmt::print("capacity {}: {}, usable {} at {:.0f} % headroom → {} ({} held = {:.1f} % of "
               "capacity; the same check as tally plan)\n",
               gpu->gpu.name, size_str(gpu->gpu.memory_bytes, unit),
               size_str(fit->usable_bytes, unit), 100 * o.memory.headroom,
               fit->fits ? "fits" : "does not fit", size_str(fit->total_bytes, unit),
               100 * fit->total_bytes / gpu->gpu.memory_bytes);
  }
}

}  // namespace

void register_memory(CLI::App& app, const Answers& answers) {
  auto o = std::make_shared<MemoryOptions>();
  auto* cmd = app.add_subcommand("memory", "per-GPU memory: model states (+ activations)");
  add_model_flags(cmd, o->model);
  add_output_flags(cmd, o->out);
  cmd->add_option("--precision", o->precision, kPrecisionHelp)
      ->check(one_of(precision_names()))
      ->capture_default_str();
  cmd->add_option("--optimizer", o->optimizer, "adam | adamw | adam-8bit | sgd | sgd-momentum")
      ->check(one_of(allowed_optimizers()))
      ->capture_default_str();
  cmd->add_option("--zero", o->zero, "ZeRO stage 0-3")->check(CLI::Range(0, 3))->capture_default_str();
  cmd->add_option("--dp", o->dp, "data-parallel degree = ZeRO sharding degree k")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--tp", o->tp, "tensor-parallel degree")->check(CLI::Range(1, 1024));
  cmd->add_option("--pp", o->pp, "pipeline stages")->check(CLI::Range(1, 1024));
  cmd->add_option("--cp", o->cp, "context-parallel degree")->check(CLI::Range(1, 1024));
  cmd->add_option("--ep", o->ep,
                  "expert-parallel degree (MoE: routed experts split over EP x ETP, their ZeRO "
                  "shards over --tp x --dp / (EP x ETP); EP x ETP must divide --tp x --dp, EP the "
                  "experts)")
      ->check(CLI::Range(1, 1 << 20));
  add_etp_flag(cmd, o->etp);
  add_amax_history_flag(cmd, o->amax_history);
  add_fp8_param_gather_flag(cmd, o->fp8_param_gather);
  cmd->add_option("--capacity-factor", o->capacity_factor,
                  "MoE: expert slots as a multiple of the balanced share (1 = dropless, balanced)")
      ->check(finite_in(1, 64))
      ->capture_default_str();
  cmd->add_flag("--sp", o->sp, "sequence parallelism (with --tp > 1)");
  cmd->add_option("--seq", o->seq, "sequence length T (adds activations)")
      ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 24));
  cmd->add_option("--micro-batch", o->micro_batch, "micro-batch size b")
      ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 20));
  cmd->add_option("--micro-batches", o->micro_batches,
                  "micro-batches per step (pipeline in-flight; default = --pp)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--interleave", o->interleave, "virtual pipeline chunks per stage")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--recompute", o->recompute, "none | selective (Megatron: attention core) | full | save-matmuls (PyTorch "
                  "selective checkpointing: matmul outputs saved) | op-sac (torchtitan's op-level "
                  "SAC: every other matmul's output saved)")
      ->check(one_of(allowed_recomputes()))
      ->capture_default_str();
  add_recompute_modules_flag(cmd, o->recompute_modules);
  cmd->add_option("--attention", o->attention, "flash | materialized")
      ->check(one_of({"flash", "materialized", "materialised"}))
      ->capture_default_str();
  cmd->add_flag("--no-dropout", o->no_dropout,
                "do not count dropout masks (default: the model's config; Llama-family: none)")
      ->excludes(cmd->add_flag("--dropout", o->dropout,
                               "count dropout masks even if the model's config has none"));
  cmd->add_option("--gpu", o->gpu,
                  "GPU preset or cluster JSON: compare the total to its memory (and its compute "
                  "capability sets fp8's weight copies: one on Blackwell, two without --gpu)");
  add_memory_budget_flags(cmd, o->memory);  // with --gpu
  add_loss_flag(cmd, o->loss);
  add_lora_flags(cmd, o->lora);
  cmd->add_flag("--max-seq", o->max_seq,
                "with --gpu: the longest sequence (a multiple of --cp) whose activations fit, and "
                "the report at that length");
  cmd->callback([o, cmd, answers] {
    note_lora_flags(cmd, o->lora);
    run_memory(*o, answers);
  });
}

}  // namespace tally::cli
