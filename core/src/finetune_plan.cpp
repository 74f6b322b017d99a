#include "tally/core/finetune_plan.hpp"

#include <algorithm>
#include <string>

#include "tally/core/activations.hpp"
#include "tally/core/comm.hpp"
#include "tally/core/model_states.hpp"
#include "tally/core/operators.hpp"
#include "tally/core/roofline.hpp"

namespace tally {

namespace {

std::vector<Op> frozen(std::vector<Op> ops) {
  std::erase_if(ops, [](const Op& op) { return !runs_when_frozen(op); });
  return ops;
}

// The adapters and QLoRA's dequantization for one layer and one micro-batch of T tokens.
std::vector<Op> adapter_ops(const ModelSpec& m, const LoraSetup& s, const FineTuneLedger& f,
                            double tokens, double e, Recompute rc) {
  std::vector<Op> ops;
  const double L = double(m.layers);
  const double per_layer = f.trainable_params / L;
  const auto T = std::int64_t(tokens);
  const double gemm_bytes = e * tokens * double(m.hidden + s.rank);
  // forward 2 FLOPs per adapter parameter and token; backward 4 (dgrad and wgrad: they train)
  ops.push_back(Op{.name = "lora-adapters", .kind = OpKind::gemm, .pass = Pass::forward, .m = T,
                   .n = s.rank, .k = m.hidden, .flops = 2 * per_layer * tokens,
                   .bytes = gemm_bytes});
  ops.push_back(Op{.name = "lora-adapters.backward", .kind = OpKind::gemm, .pass = Pass::backward,
                   .m = T, .n = s.rank, .k = m.hidden, .flops = 4 * per_layer * tokens,
                   .bytes = 2 * gemm_bytes});
  if (rc == Recompute::full)
    ops.push_back(Op{.name = "lora-adapters", .kind = OpKind::gemm, .pass = Pass::recompute,
                     .m = T, .n = s.rank, .k = m.hidden, .flops = 2 * per_layer * tokens,
                     .bytes = gemm_bytes});
  if (s.method == FineTune::qlora) {
    // Read the quantized weights and constants, write the compute-dtype copy, once per use.
    const double pass = (f.quantized_weight_bytes + f.quant_constant_bytes) / L +
                        dtype_bytes(s.compute) * f.quantized_params / L;
    ops.push_back(Op{.name = "dequantize", .kind = OpKind::memory, .pass = Pass::forward,
                     .bytes = pass});
    ops.push_back(Op{.name = "dequantize.backward", .kind = OpKind::memory,
                     .pass = Pass::backward, .bytes = pass});
    if (rc == Recompute::full)
      ops.push_back(Op{.name = "dequantize", .kind = OpKind::memory, .pass = Pass::recompute,
                       .bytes = pass});
  }
  return ops;
}

double seconds_of(const std::vector<Op>& ops, const GpuSpec& gpu, Precision p,
                  double* dequant = nullptr) {
  double t = 0;
  for (const Op& op : ops) {
    const double s = op_seconds(op, gpu, p);
    t += s;
    if (dequant && op.name.starts_with("dequantize")) *dequant += s;
  }
  return t;
}

}  // namespace

// Note [fine-tuning step]: what a frozen backbone does not run — the weight gradient of a frozen
// weight, and the embedding's backward. The attention core's batched GEMMs (scores, context) have
// two activation operands: their ".wgrad" is an activation gradient and stays.
bool runs_when_frozen(const Op& op) {
  if (op.name == "embedding.backward") return false;
  if (!op.name.ends_with(".wgrad")) return true;
  return op.name.starts_with("scores") || op.name.starts_with("context");
}

std::string FineTuneEval::describe() const {
  return std::to_string(gpus) + " GPU" + (gpus > 1 ? "s" : "") + ", micro-batch " +
         std::to_string(micro_batch) + " × accum " + std::to_string(grad_accum) + ", " +
         (recompute == Recompute::full ? "gradient checkpointing" : "no recompute");
}

FineTuneEval evaluate_finetune(const PlanRequest& r, const LoraSetup& s, std::int64_t micro_batch,
                               Recompute recompute) {
  r.validate();
  s.validate(r.model);
  require_int(recompute == Recompute::none || recompute == Recompute::full, "recompute",
              int(recompute), "a fine-tune checkpoints gradients (full) or not (none)");
  const std::int64_t per_gpu = r.global_batch / r.gpus;
  if (r.global_batch % r.gpus != 0)
    throw InvalidInput("--global-batch = " + std::to_string(r.global_batch) +
                       ": must be a multiple of --gpus = " + std::to_string(r.gpus) +
                       " (each GPU trains on its share)");
  require_int(micro_batch >= 1 && per_gpu % micro_batch == 0, "micro-batch", micro_batch,
              [&] { return "must divide the global batch per GPU, " + std::to_string(per_gpu); });
  const ModelSpec& m = r.model;
  const GpuSpec& gpu = r.cluster.gpu;
  const Precision p = s.compute;
  const double e = dtype_bytes(p);

  FineTuneEval ev{.gpus = r.gpus, .micro_batch = micro_batch,
                  .grad_accum = per_gpu / micro_batch, .recompute = recompute};
  ev.ledger = finetune_ledger(m, s);
  ActivationSetup acts{.seq = r.seq, .micro_batch = micro_batch, .recompute = recompute,
                       .dropout = r.uses_dropout(), .act_bytes = e,
                       .eager_loss = r.loss == Loss::eager};
  add_lora_activations(m, s, acts);
  ev.activation_bytes = activations(m, acts).peak_stage_bytes;
  ev.fit = check_fit(ev.ledger.static_bytes(), ev.activation_bytes, 0, r.memory_budget());

  const OperatorSetup os{.seq = r.seq, .micro_batch = micro_batch, .recompute = recompute,
                         .flash_kernel = r.flash_kernel, .causal = r.causal,
                         .dropout = r.uses_dropout(), .act_bytes = e, .kernels = r.kernels,
                         .loss = r.loss};
  const double tokens = double(r.seq) * double(micro_batch);
  const std::vector<Op> adapters = adapter_ops(m, s, ev.ledger, tokens, e, recompute);
  double dequant_layer = 0;
  const double adapter_s = seconds_of(adapters, gpu, p, &dequant_layer);
  double layers_s = seconds_of(frozen(layer_ops(m, os)), gpu, p) * double(m.layers - m.dense_layers);
  if (m.dense_layers > 0) {
    OperatorSetup dense = os;
    dense.dense_layer = true;
    layers_s += seconds_of(frozen(layer_ops(m, dense)), gpu, p) * double(m.dense_layers);
  }
  const double micro_s = layers_s + adapter_s * double(m.layers) +
                         seconds_of(frozen(embedding_ops(m, os)), gpu, p) +
                         seconds_of(frozen(output_ops(m, os)), gpu, p);
  const double accum = double(ev.grad_accum);
  ev.compute_s = accum * micro_s;
  ev.dequant_s = accum * dequant_layer * double(m.layers);
  ev.optimizer_s = roofline_seconds(
      gpu, 0.0, 1.0, optimizer_update_bytes(Precision::fp32, s.optimizer) * ev.ledger.trainable_params);
  const double grads = 4.0 * ev.ledger.trainable_params;  // fp32
  ev.allreduce_s = collective_seconds(
      Collective::all_reduce, collective_bytes_per_rank(Collective::all_reduce, grads, r.gpus),
      r.gpus, 1, r.cluster);
  ev.step_s = ev.compute_s + ev.optimizer_s + ev.allreduce_s;
  ev.tokens_per_s = double(r.global_batch) * double(r.seq) / ev.step_s;
  return ev;
}

FineTunePlan plan_finetune(const PlanRequest& r, const LoraSetup& s, int top) {
  r.validate();
  s.validate(r.model);
  if (r.global_batch % r.gpus != 0)
    throw InvalidInput("--global-batch = " + std::to_string(r.global_batch) +
                       ": must be a multiple of --gpus = " + std::to_string(r.gpus) +
                       " (each GPU trains on its share)");
  FineTunePlan plan{.request = r, .lora = s};
  std::vector<FineTuneEval> fits, misses;
  const std::int64_t per_gpu = r.global_batch / r.gpus;
  for (const std::int64_t b : divisors(per_gpu)) {
    for (Recompute rc : {Recompute::none, Recompute::full}) {
      FineTuneEval ev = evaluate_finetune(r, s, b, rc);
      (ev.fit.fits ? fits : misses).push_back(std::move(ev));
    }
  }
  std::sort(fits.begin(), fits.end(), [](const FineTuneEval& a, const FineTuneEval& b) {
    if (a.step_s != b.step_s) return a.step_s < b.step_s;
    return a.fit.total_bytes < b.fit.total_bytes;
  });
  std::sort(misses.begin(), misses.end(), [](const FineTuneEval& a, const FineTuneEval& b) {
    return a.fit.total_bytes < b.fit.total_bytes;
  });
  const auto keep = [&](std::vector<FineTuneEval>& v) {
    if (v.size() > std::size_t(std::max(top, 1))) v.resize(std::size_t(std::max(top, 1)));
  };
  keep(fits);
  keep(misses);
  plan.best = std::move(fits);
  if (plan.best.empty()) plan.near_misses = std::move(misses);

  // The longest sequence at micro-batch 1 with gradient checkpointing.
  const FineTuneLedger ledger = finetune_ledger(r.model, s);
  std::int64_t cap = std::int64_t(1) << 24;
  if (r.model.position == PositionKind::learned) cap = std::min(cap, r.model.max_positions);
  plan.max_seq = longest_sequence(64, cap, [&](std::int64_t seq) {
    ActivationSetup acts{.seq = seq, .micro_batch = 1, .recompute = Recompute::full,
                         .dropout = r.uses_dropout(), .act_bytes = dtype_bytes(s.compute),
                         .eager_loss = r.loss == Loss::eager};
    add_lora_activations(r.model, s, acts);
    const double act = activations(r.model, acts).peak_stage_bytes;
    return check_fit(ledger.static_bytes(), act, 0, r.memory_budget()).fits;
  });
  plan.convention = ledger.convention + " | data parallel over " + std::to_string(r.gpus) +
                    " GPU(s), each with the whole backbone | time: operator model on the " +
                    r.cluster.gpu.name + " roofline, frozen weights without weight gradients" +
                    std::string(convention_words(r.flash_kernel)) +
                    (s.method == FineTune::qlora ? ", a dequantization pass per weight per use"
                                                 : "") +
                    " | memory held: allocated × " + format_number(1 + r.allocator_allowance) +
                    " + " + format_number(r.runtime_bytes / kMiB) + " MiB runtime";
  return plan;
}

}  // namespace tally
