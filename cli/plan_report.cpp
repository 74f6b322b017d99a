#include "plan_report.hpp"

#include <fmt/core.h>

#include "format.hpp"
#include "json_output.hpp"
#include "tally/core/model_states.hpp"

namespace tally::cli {

namespace {

// model_layers: the planned model's, for `stage_layers` (every stage's layers: the planner's split,
// lighter end stages or an explicit --pp-layers; `tally run 3d --plan` runs it).
nlohmann::json eval_json(const PlanEval& e, std::int64_t model_layers) {
  const Layout& l = e.layout;
  std::vector<int> stages;
  for (int s = 0; s < l.pp; ++s) stages.push_back(l.layers_on_stage(int(model_layers), s));
  nlohmann::json j = {{"dp", l.dp},
          {"tp", l.tp},
          {"pp", l.pp},
          {"cp", l.cp},
          {"ep", l.ep},
          {"etp", l.expert_tp()},
          {"sp", l.sp},
          {"interleave", l.interleave},
          {"zero", l.zero},
          {"micro_batch", l.micro_batch},
          {"grad_accum", l.grad_accum},
          {"recompute", std::string(to_string(l.recompute))},
          {"attention", std::string(to_string(l.attention))},
          {"stage_layers", stages},
          {"layout", l.describe()},
          {"fits", e.fits},
          {"per_gpu_gb", in_gb(e.total_bytes)},
          {"usable_gb", in_gb(e.usable_bytes)},
          {"states_gb", {{"params", in_gb(e.states.params)},
                         {"grads", in_gb(e.states.grads)},
                         {"m", in_gb(e.states.m)},
                         {"v", in_gb(e.states.v)},
                         {"master", in_gb(e.states.master)},
                         {"low_precision_copies", in_gb(e.states.low_precision)},
                         {"scaling_metadata", in_gb(e.states.scaling_metadata)},
                         {"total", in_gb(e.states.total())}}},
          {"activations_gb", in_gb(e.activation_bytes)},
          {"buffers_gb", in_gb(e.buffer_bytes)},
          {"allocated_gb", in_gb(e.allocated_bytes)},
          {"allocator_gb", in_gb(e.allocator_bytes)},
          {"runtime_gb", in_gb(e.runtime_bytes)},
          {"comm_gb_per_gpu", in_gb(e.comm_bytes_per_gpu)},
          {"compute_seconds", e.compute_s},
          {"optimizer_seconds", e.optimizer_s},
          {"tp_seconds", e.tp_s},
          {"cp_seconds", e.cp_s},
          {"ep_seconds", e.ep_s},
          {"pp_seconds", e.pp_s},
          {"dp_seconds", e.dp_s},
          {"dp_exposed_seconds", e.dp_exposed_s},
          {"bubble_fraction", e.bubble_fraction},
          {"bubble_seconds", e.bubble_s},
          {"step_seconds", e.step_s},
          {"tokens_per_s", e.tokens_per_s},
          {"mfu", e.mfu},
          {"scaling_efficiency", e.efficiency},
          {"wall", std::string(to_string(e.wall))}};
  // Interleaved with an explicit split: every virtual stage's layers as well, in model order
  // (Note [uneven virtual stages]); `stage_layers` keeps each stage's sum.
  if (l.interleave > 1 && l.stage_layer_list != nullptr)
    j["virtual_stage_layers"] = *l.stage_layer_list;
  return j;
}

std::string reason_text(const Reason& x, const PlanEval& chosen, SizeUnit u) {
  if (!x.eval) return "not possible here: " + x.invalid_reason;
  const PlanEval& v = *x.eval;
  if (!v.fits)
    return fmt::format("{}: does not fit — needs {} of {} usable", x.variant,
                       size_str(v.total_bytes, u), size_str(v.usable_bytes, u));
  return fmt::format("{}: step {:.3f} s ({:+.1f} %), {} per GPU", x.variant, v.step_s,
                     100 * (v.step_s / chosen.step_s - 1), size_str(v.total_bytes, u));
}

void print_reliability(const ReliabilityReport& r) {
  fmt::print("RELIABILITY  [{}]\n", r.convention());
  if (no_failures_expected(r))  // Note [zero failure rate]
    fmt::print("  {}; sharded checkpoint save {:.1f} s; overhead {} of wall-clock\n",
               kNoFailuresExpected, r.save_seconds, pct_str(r.overhead_at_recommended));
  else
    fmt::print("  MTBF {:.4g} h; sharded checkpoint save {:.1f} s; interval {:.2f} h (Daly; Young "
               "{:.2f} h); overhead {} of wall-clock\n",
               r.mtbf_hours, r.save_seconds, r.recommended_interval_hours, r.young_interval_hours,
               pct_str(r.overhead_at_recommended));
  if (r.expected_failures)
    fmt::print("  expected failures over the run ({:.0f} h): {:.1f}\n", *r.setup.run_hours,
               *r.expected_failures);
}

}  // namespace

nlohmann::json suggestions_json(const std::vector<Suggestion>& suggestions) {
  nlohmann::json out = nlohmann::json::array();
  for (const Suggestion& s : suggestions)
    out.push_back({{"change", s.change},
                   {"fits", s.fits},
                   {"per_gpu_gb", in_gb(s.per_gpu_bytes)},
                   {"usable_gb", in_gb(s.usable_bytes)},
                   {"step_seconds", s.step_s ? nlohmann::json(*s.step_s) : nlohmann::json(nullptr)},
                   {"layout", s.layout},
                   {"cost", s.cost}});
  return out;
}

nlohmann::json plan_json(const PlanResult& r, double search_s,
                         const std::vector<Suggestion>& suggestions) {
  const std::int64_t L = r.request.model.layers;
  nlohmann::json best = r.best.empty() ? nlohmann::json(nullptr) : eval_json(r.best.front(), L);
  nlohmann::json alts = nlohmann::json::array(), misses = nlohmann::json::array();
  for (std::size_t i = 1; i < r.best.size(); ++i) alts.push_back(eval_json(r.best[i], L));
  for (const auto& e : r.near_misses) misses.push_back(eval_json(e, L));
  nlohmann::json reasons = nlohmann::json::array();
  if (!r.best.empty())
    for (const auto& x : explain_plan(r.request, r.best.front()))
      reasons.push_back({{"dimension", x.dimension},
                         {"used", x.used},
                         {"variant", x.variant},
                         {"variant_eval", x.eval ? eval_json(*x.eval, L) : nlohmann::json(nullptr)},
                         {"invalid_reason", x.invalid_reason}});
  const auto& rel = r.reliability;
  nlohmann::json reliability = {{"convention", rel.convention()},
                                {"no_failures_expected", no_failures_expected(rel)},
                                {"mtbf_hours", unless_no_failures(rel, rel.mtbf_hours)},
                                {"save_seconds", rel.save_seconds},
                                {"interval_hours",
                                 unless_no_failures(rel, rel.recommended_interval_hours)},
                                {"young_interval_hours",
                                 unless_no_failures(rel, rel.young_interval_hours)},
                                {"daly_interval_hours",
                                 unless_no_failures(rel, rel.daly_interval_hours)},
                                {"overhead_fraction", rel.overhead_at_recommended},
                                {"expected_failures", rel.expected_failures
                                                          ? nlohmann::json(*rel.expected_failures)
                                                          : nlohmann::json(nullptr)}};
  const auto& q = r.request;
  return {{"command", "plan"},
          {"convention", r.convention},
          {"unit_of_gb_fields", "GB = 1e9 bytes"},
          {"request", {{"model", q.model.name},
                       {"gpu", q.cluster.gpu.name},
                       {"gpus", q.gpus},
                       {"gpus_per_node", q.cluster.gpus_per_node},
                       {"nvlink_domain", q.cluster.nvlink_domain_size()},
                       {"global_batch", q.global_batch},
                       {"seq", q.seq},
                       {"precision", std::string(to_string(q.precision))},
                       {"compute_capability", q.cluster.gpu.compute_capability},
                       {"weight_copy_bytes_per_param",
                        low_precision_copy_bytes(
                            q.precision, fp8_gemm_layouts(q.cluster.gpu.compute_capability))},
                       {"fsdp_float8_all_gather", q.fsdp_float8_all_gather},
                       {"fp8_param_gather", q.fp8_param_gather},
                       {"optimizer", std::string(to_string(q.optimizer))},
                       {"kernels", std::string(to_string(q.kernels))},
                       {"loss", std::string(to_string(q.loss))},
                       {"grad_accumulation", std::string(to_string(q.grad_accumulation))},
                       {"flash_kernel", std::string(to_string(q.flash_kernel))},
                       {"headroom", q.headroom},
                       {"allocator_allowance", q.allocator_allowance},
                       {"runtime_gb", in_gb(q.runtime_bytes)}}},
          {"feasible", r.feasible()},
          {"best", best},
          {"error_band", r.band ? nlohmann::json{{"measured_over_predicted_low", r.band->low},
                                                 {"measured_over_predicted_median", r.band->median},
                                                 {"measured_over_predicted_high", r.band->high},
                                                 {"rank_spread", r.band->rank_spread},
                                                 {"source", r.band->source}}
                                : nlohmann::json(nullptr)},
          {"indistinguishable_top_plans", r.indistinguishable},
          {"alternatives", alts},
          {"near_misses", misses},
          {"suggestions", suggestions_json(suggestions)},
          {"reasons", reasons},
          {"reliability", reliability},
          {"search", {{"evaluated", r.evaluated},
                      {"pruned", r.pruned},
                      {"seconds", search_s},
                      {"rejected", {{"topology", r.rejected.topology},
                                    {"tp_divisibility", r.rejected.tp_divisibility},
                                    {"pp_divisibility", r.rejected.pp_divisibility},
                                    {"cp_divisibility", r.rejected.cp_divisibility},
                                    {"batch_divisibility", r.rejected.batch_divisibility},
                                    {"interleave", r.rejected.interleave},
                                    {"memory", r.rejected.memory}}}}}};
}

void print_plan(const PlanResult& r, double search_s, SizeUnit u,
                const std::vector<Suggestion>& suggestions) {
  const auto& q = r.request;
  const int domain = q.cluster.nvlink_domain_size();
  const std::string topology =
      domain == q.cluster.gpus_per_node
          ? fmt::format("{} per node", q.cluster.gpus_per_node)
          : fmt::format("{} per host, NVLink domains of {}", q.cluster.gpus_per_node, domain);
  fmt::print("tally plan — {} on {} × {} ({}), global batch {} × {} tokens\n", q.model.name,
             q.gpus, q.cluster.gpu.name, topology, q.global_batch, q.seq);
  fmt::print("convention: {}\n\n", r.convention);
  if (!r.feasible()) {
    fmt::print("NO LAYOUT FITS. Closest layouts and the wall each hits:\n");
    for (const auto& e : r.near_misses)
      fmt::print("  {} — {}: needs {} of {} usable\n", e.layout.describe(), to_string(e.wall),
                 size_str(e.total_bytes, u), size_str(e.usable_bytes, u));
    if (!suggestions.empty()) {
      fmt::print("\nSMALLEST CHANGES (each costed with the same ledgers)\n");
      for (const Suggestion& s : suggestions) {
        fmt::print("  {:<58} {} — {} of {} per GPU", s.change, s.fits ? "fits" : "does not fit",
                   size_str(s.per_gpu_bytes, u), size_str(s.usable_bytes, u));
        if (s.step_s) fmt::print(", step {:.3f} s", *s.step_s);
        fmt::print("; {}\n", s.cost);
        if (!s.layout.empty()) fmt::print("      {}\n", s.layout);
      }
    }
    print_reliability(r.reliability);
    return;
  }
  const PlanEval& b = r.best.front();
  const StateSetup ss{.precision = q.precision, .optimizer = q.optimizer, .zero_stage = b.layout.zero,
                      .shard_degree = b.layout.dp * b.layout.cp, .ep = b.layout.ep,
                      .tp = b.layout.tp, .etp = b.layout.etp,
                      .expert_share = routed_expert_share(q.model),
                      .gemm_weight_share = gemm_weight_share(q.model),
                      .scaled_gemms = b.scaled_gemms, .amax_history = q.amax_history,
                      .compute_capability = q.cluster.gpu.compute_capability,
                      .fp8_param_gather = q.fp8_param_gather};
  const std::string state_conv =
      convention_with_unit(model_states(1.0, ss).convention(), u);
  fmt::print("PLAN  {}\n\n", b.layout.describe());
  fmt::print("ACCOUNTS (per GPU)\n");
  fmt::print("  model states  {:>12}  params {} + grads {} + m {} + v {} + master {}{}{}  [{}]\n",
             size_str(b.states.total(), u), size_str(b.states.params, u), size_str(b.states.grads, u),
             size_str(b.states.m, u), size_str(b.states.v, u), size_str(b.states.master, u),
             b.states.low_precision > 0
                 ? fmt::format(" + {} copies {}", to_string(q.precision),
                               size_str(b.states.low_precision, u))
                 : std::string(),
             b.states.scaling_metadata > 0
                 ? fmt::format(" + amax history {}", size_str(b.states.scaling_metadata, u, 4))
                 : std::string(),
             state_conv);
  fmt::print("  activations   {:>12}  (the peak stage's larger backward phase, Korthikanti "
             "inventory)\n",
             size_str(b.activation_bytes, u));
  fmt::print("  buffers       {:>12}  (gradient buckets / ZeRO-3 gathered layers)\n",
             size_str(b.buffer_bytes, u));
  fmt::print("  allocator     {:>12}  cached and fragmented blocks ({} of allocated)\n",
             size_str(b.allocator_bytes, u), pct_str(q.allocator_allowance));
  fmt::print("  CUDA runtime  {:>12}  context and libraries, outside the allocator\n",
             size_str(b.runtime_bytes, u));
  fmt::print("  total         {:>12}  held, of {} usable ({} headroom kept) → {} spare\n",
             size_str(b.total_bytes, u), size_str(b.usable_bytes, u), pct_str(q.headroom),
             size_str(b.usable_bytes - b.total_bytes, u));
  fmt::print("  communication {:>12}  sent per GPU per step; exposed: TP {:.3f} s, CP {:.3f} s, "
             "PP {:.3f} s, {}DP/ZeRO {:.3f} s (of {:.3f} s)\n",
             size_str(b.comm_bytes_per_gpu, u), b.tp_s, b.cp_s, b.pp_s,
             b.ep_s > 0 ? fmt::format("MoE dispatch/combine {:.3f} s, ", b.ep_s) : "",
             b.dp_exposed_s, b.dp_s);
  if (q.time_model == TimeModel::operators)
    fmt::print("  compute       {:>10.3f} s  kernels of the busiest stage (operator model), "
               "optimizer step {:.3f} s\n",
               b.compute_s, b.optimizer_s);
  else
    fmt::print("  compute       {:>10.3f} s  hardware FLOPs at u = {:.2f} of peak\n", b.compute_s,
               q.cluster.mfu);
  fmt::print("  bubble        {:>12}  {:.3f} s\n", pct_str(b.bubble_fraction), b.bubble_s);
  fmt::print("  step time     {:>10.3f} s  {:.0f} tokens/s, MFU {}, scaling efficiency E = {:.3f}, "
             "tightest wall: {}\n",
             b.step_s, b.tokens_per_s, pct_str(b.mfu), b.efficiency, to_string(b.wall));
  if (r.band) {  // Note [error band]
    fmt::print("  expect        {:.3f}–{:.3f} s  ({} took {:.3f}–{:.3f}× the operator model's "
               "prediction, median {:.2f}×)\n",
               b.step_s * r.band->low, b.step_s * r.band->high, r.band->runs, r.band->low,
               r.band->high, r.band->median);
    if (r.indistinguishable > 1)
      fmt::print("  note          the top {} plans are within {:.1f} % of each other, the model's "
                 "spread within one published system: it can't rank them — validate them on the "
                 "cluster\n",
                 r.indistinguishable, 100 * r.band->rank_spread);
  }
  fmt::print("\n");
  fmt::print("REASONS (each dimension flipped once, same ledgers)\n");
  for (const auto& x : explain_plan(q, b))
    fmt::print("  {:<11} {:<8} instead {}\n", x.dimension, x.used ? "used;" : "not used;",
               reason_text(x, b, u));
  fmt::print("\nFAILURE CRITERIA\n");
  fmt::print("  1. scaling efficiency E < 0.7 at the same global batch (predicted {:.3f})\n",
             b.efficiency);
  fmt::print("  2. peak reserved memory + CUDA runtime > {} of capacity, i.e. > {} (predicted {}), "
             "or OOM\n",
             pct_str(1 - q.headroom), size_str(b.usable_bytes, u), size_str(b.total_bytes, u));
  fmt::print("  3. loss spikes or NaN in the first 100 steps (learning-rate scaling too aggressive)\n");
  fmt::print("  4. step-time jitter > 10 % (data pipeline or communication)\n");
  fmt::print("\nVALIDATION PLAN\n");
  fmt::print("  1. 10 steps end to end on the full layout\n");
  fmt::print("  2. reconcile measured peak memory with the accounts: states {} + activations {} + "
             "buffers {}\n",
             size_str(b.states.total(), u), size_str(b.activation_bytes, u),
             size_str(b.buffer_bytes, u));
  fmt::print("  3. 20-step median step time vs {:.3f} s predicted; E against one GPU at the same "
             "global batch\n",
             b.step_s);
  fmt::print("  4. 500 steps: loss shape and grad-norm against a reference run\n");
  fmt::print("  5. record GPUs, precision, T, micro-batch, accumulation, recompute and sharding\n\n");
  print_reliability(r.reliability);
  if (r.best.size() > 1) {
    fmt::print("\nALTERNATIVES\n  {:>2}  {:<100} {:>10} {:>9} {:>7} {:>6}  {}\n", "#", "layout",
               "per GPU", "step s", "MFU", "E", "wall");
    for (std::size_t i = 1; i < r.best.size(); ++i) {
      const auto& e = r.best[i];
      fmt::print("  {:>2}  {:<100} {:>10} {:>9.3f} {:>7} {:>6.3f}  {}\n", i + 1,
                 e.layout.describe(), size_str(e.total_bytes, u), e.step_s, pct_str(e.mfu),
                 e.efficiency, to_string(e.wall));
    }
  }
  fmt::print("\nSEARCH  {} layouts costed, {} pruned (exact bounds), {:.1f} ms\n", r.evaluated,
             r.pruned, 1e3 * search_s);
}

nlohmann::json compare_json(const std::vector<Comparison>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : rows)
    out.push_back({{"name", c.name},
                   {"change", c.change},
                   {"gpus", c.request.gpus},
                   {"seq", c.request.seq},
                   {"eval", c.eval ? eval_json(*c.eval, c.request.model.layers)
                                   : nlohmann::json(nullptr)},
                   {"comm_share", c.comm_share()},
                   {"bubble_share", c.bubble_share()},
                   {"invalid_reason", c.invalid_reason}});
  return {{"command", "compare"}, {"unit_of_gb_fields", "GB = 1e9 bytes"}, {"options", out}};
}

void print_compare(const std::vector<Comparison>& rows, SizeUnit u) {
  fmt::print("tally compare — one change at a time, global batch held\n");
  fmt::print("  {:<22} {:>12} {:>6} {:>10} {:>7} {:>7} {:>7}  {:<14} {}\n", "option", "per GPU",
             "fits", "step s", "E", "comm", "bubble", "tightest wall", "change");
  for (const auto& c : rows) {
    if (!c.eval) {
      fmt::print("  {:<22} not a valid layout: {}\n", c.name, c.invalid_reason);
      continue;
    }
    const auto& e = *c.eval;
    fmt::print("  {:<22} {:>12} {:>6} {:>10.3f} {:>7.3f} {:>7} {:>7}  {:<14} {}\n", c.name,
               size_str(e.total_bytes, u), e.fits ? "yes" : "NO", e.step_s, e.efficiency,
               pct_str(c.comm_share()), pct_str(c.bubble_share()), to_string(e.wall), c.change);
  }
  if (!rows.empty() && rows.front().eval)
    fmt::print("  activations of the base: {} per GPU under Korthikanti's convention (the seed "
               "quotes ≈9 GB for its plan 1: DESIGN.md erratum 3)\n",
               size_str(rows.front().eval->activation_bytes, u));
}

namespace {

nlohmann::json finetune_eval_json(const FineTuneEval& e) {
  return {{"gpus", e.gpus},
          {"micro_batch", e.micro_batch},
          {"grad_accum", e.grad_accum},
          {"gradient_checkpointing", e.recompute == Recompute::full},
          {"layout", e.describe()},
          {"fits", e.fit.fits},
          {"static_gb", in_gb(e.ledger.static_bytes())},
          {"activations_gb", in_gb(e.activation_bytes)},
          {"allocated_gb", in_gb(e.fit.allocated_bytes)},
          {"allocator_gb", in_gb(e.fit.allocator_bytes)},
          {"runtime_gb", in_gb(e.fit.runtime_bytes)},
          {"per_gpu_gb", in_gb(e.fit.total_bytes)},
          {"usable_gb", in_gb(e.fit.usable_bytes)},
          {"compute_seconds", e.compute_s},
          {"dequant_seconds", e.dequant_s},
          {"optimizer_seconds", e.optimizer_s},
          {"allreduce_seconds", e.allreduce_s},
          {"step_seconds", e.step_s},
          {"tokens_per_s", e.tokens_per_s}};
}

}  // namespace

nlohmann::json finetune_plan_json(const FineTunePlan& p, double search_s) {
  const auto& q = p.request;
  nlohmann::json best = p.best.empty() ? nlohmann::json(nullptr) : finetune_eval_json(p.best.front());
  nlohmann::json alts = nlohmann::json::array(), misses = nlohmann::json::array();
  for (std::size_t i = 1; i < p.best.size(); ++i) alts.push_back(finetune_eval_json(p.best[i]));
  for (const auto& e : p.near_misses) misses.push_back(finetune_eval_json(e));
  const FineTuneLedger ledger = finetune_ledger(q.model, p.lora);
  return {{"command", "plan"},
          {"method", std::string(to_string(p.lora.method))},
          {"model", q.model.name},
          {"gpu", q.cluster.gpu.name},
          {"gpus", q.gpus},
          {"global_batch", q.global_batch},
          {"seq", q.seq},
          {"convention", p.convention},
          {"unit_of_gb_fields", "GB = 1e9 bytes"},
          {"feasible", p.feasible()},
          {"trainable_params", count_json(ledger.trainable_params)},
          {"trainable_fraction", ledger.trainable_fraction()},
          {"best", best},
          {"alternatives", alts},
          {"near_misses", misses},
          {"max_seq", p.max_seq > 0 ? nlohmann::json(p.max_seq) : nlohmann::json(nullptr)},
          {"search_seconds", search_s}};
}

void print_finetune_plan(const FineTunePlan& p, double search_s, SizeUnit u) {
  const auto& q = p.request;
  const std::string method = p.lora.method == FineTune::qlora ? "QLoRA" : "LoRA";
  fmt::print("tally plan — {} fine-tune of {} on {} × {}, global batch {} × {} tokens\n", method,
             q.model.name, q.gpus, q.cluster.gpu.name, q.global_batch, q.seq);
  fmt::print("convention: {}\n\n", p.convention);
  const FineTuneLedger f = finetune_ledger(q.model, p.lora);
  fmt::print("  trainable params: {:.0f} || all params: {:.0f} || trainable%: {:.4f}\n\n",
             f.trainable_params, f.total_params, 100 * f.trainable_fraction());
  if (!p.feasible()) {
    fmt::print("NO CONFIGURATION FITS on {} ({} usable per GPU). Closest:\n", q.cluster.gpu.name,
               size_str(p.near_misses.empty() ? 0 : p.near_misses.front().fit.usable_bytes, u));
    for (const auto& e : p.near_misses)
      fmt::print("  {:<60} needs {}\n", e.describe(), size_str(e.fit.total_bytes, u));
  } else {
    const FineTuneEval& b = p.best.front();
    fmt::print("PLAN  {}\n\n", b.describe());
    fmt::print("ACCOUNTS (per GPU)\n");
    fmt::print("  backbone      {:>12}  {}\n", size_str(f.backbone_bytes(), u),
               f.quantized_params > 0
                   ? fmt::format("quantized weights {} + constants {} + unquantized {}",
                                 size_str(f.quantized_weight_bytes, u),
                                 size_str(f.quant_constant_bytes, u), size_str(f.frozen_bytes, u))
                   : "frozen, in the compute dtype");
    fmt::print("  adapters      {:>12}  weights + grads + optimizer states (fp32)\n",
               size_str(f.adapter_total_bytes(), u));
    if (f.dequant_transient_bytes > 0)
      fmt::print("  dequantized   {:>12}  the largest layer, while it runs\n",
                 size_str(f.dequant_transient_bytes, u));
    fmt::print("  activations   {:>12}  (Korthikanti inventory{})\n",
               size_str(b.activation_bytes, u),
               b.recompute == Recompute::full ? ", gradient checkpointing" : "");
    fmt::print("  allocator     {:>12}  cached and fragmented blocks\n",
               size_str(b.fit.allocator_bytes, u));
    fmt::print("  CUDA runtime  {:>12}\n", size_str(b.fit.runtime_bytes, u));
    fmt::print("  total         {:>12}  held, of {} usable → {} spare\n",
               size_str(b.fit.total_bytes, u), size_str(b.fit.usable_bytes, u),
               size_str(b.fit.usable_bytes - b.fit.total_bytes, u));
    fmt::print("  compute       {:>10.3f} s  frozen backbone without weight gradients{}\n",
               b.compute_s,
               b.dequant_s > 0 ? fmt::format(", of which dequantization {:.3f} s", b.dequant_s)
                               : std::string());
    fmt::print("  optimizer     {:>10.3f} s  adapters only; all-reduce {:.3f} s over {} GPU(s)\n",
               b.optimizer_s, b.allreduce_s, b.gpus);
    fmt::print("  step time     {:>10.3f} s  {:.0f} tokens/s\n", b.step_s, b.tokens_per_s);
    if (p.best.size() > 1) {
      fmt::print("\nALTERNATIVES\n");
      for (std::size_t i = 1; i < p.best.size(); ++i)
        fmt::print("  {:<60} step {:.3f} s, {} per GPU\n", p.best[i].describe(), p.best[i].step_s,
                   size_str(p.best[i].fit.total_bytes, u));
    }
  }
  if (p.max_seq > 0)
    fmt::print("\nLONGEST SEQUENCE that fits at micro-batch 1 with gradient checkpointing: {} tokens\n",
               p.max_seq);
  else
    fmt::print("\nLONGEST SEQUENCE: none fits even at 64 tokens (the static bytes alone overflow)\n");
  fmt::print("searched in {:.3f} s\n", search_s);
}

}  // namespace tally::cli
