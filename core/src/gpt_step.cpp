#include "tally/core/gpt_step.hpp"

#include <algorithm>
#include <cmath>

#include "tally/core/mlp_step.hpp"
#include "tally/core/pipeline.hpp"
#include "tally/core/roofline.hpp"

namespace tally {

namespace {

using i64 = std::int64_t;

Op memory_op(std::string_view name, Pass pass, double bytes) {
  return Op{.name = name, .kind = OpKind::memory, .pass = pass, .bytes = bytes};
}

}  // namespace

void GptStageSetup::validate() const {
  model.validate();
  require_int(seq >= 1, "seq", seq, "must be >= 1 token");
  require_int(micro_batch >= 1, "micro_batch", micro_batch, "must be >= 1");
  require_int(stage_layers >= 1 && stage_layers <= model.layers, "stage_layers", stage_layers,
              "must be in [1, the model's layers]");
  require_int(micro_batches >= 1, "micro_batches", micro_batches, "must be >= 1");
  require_real(std::isfinite(own_params) && own_params >= 0, "own_params", own_params,
               "must be >= 0 elements");
  require_int(ranks >= 1 && ranks <= 4096, "ranks", ranks, "must be in [1, 4096]");
  require_int(threads_per_rank >= 1 && threads_per_rank <= 1024, "threads_per_rank",
              threads_per_rank, "must be in [1, 1024]");
  require_int(cores >= 1 && cores <= 65536, "cores", cores, "must be in [1, 65536]");
}

GptSpTraffic engine_sp_traffic(const GptStageSetup& s, bool per_micro_batch) {
  s.validate();
  GptSpTraffic r;
  for (TrafficItem* it : {&r.edges, &r.grads}) {
    it->kind = TrafficKind::tp;
    it->group = s.tp;
    it->stride = 1;
  }
  r.edges.collective = Collective::all_gather;
  r.grads.collective = Collective::all_reduce;
  if (!s.sequence_parallel || s.tp <= 1) return r;
  const double fp32 = 4, h = double(s.model.hidden);
  const double edge = double(s.micro_batch) * double(s.seq / s.cp) * h * fp32;
  r.edges.calls = double(s.micro_batches) * ((s.first_stage ? 1 : 0) + (s.last_stage ? 1 : 0));
  r.edges.bytes_per_call = collective_bytes_per_rank(Collective::all_gather, edge, s.tp);
  r.edges.bytes_per_rank = r.edges.calls * r.edges.bytes_per_call;
  r.edges.formula = "all-gather S(t-1)/t per micro-batch at each end of the model the stage holds "
                    "(first: the embedding split's backward; last: the gather before ln_f), "
                    "S = B*(T/cp)*C*4";
  r.grads.calls = per_micro_batch ? double(s.micro_batches) : 1.0;
  const double sharded = 6 * h * double(s.stage_layers) * fp32;  // ln_1, ln_2, two biases
  r.grads.bytes_per_call = collective_bytes_per_rank(Collective::all_reduce, sharded, s.tp);
  r.grads.bytes_per_rank = r.grads.calls * r.grads.bytes_per_call;
  r.grads.formula = std::string("all-reduce 2S(t-1)/t ") +
                    (per_micro_batch ? "per micro-batch" : "once per step") +
                    ", S = 6*C*stage_layers*4 (ln_1, ln_2, out-proj and W2 biases)";
  return r;
}

OperatorSetup engine_gpt_setup(const GptStageSetup& s) {
  return OperatorSetup{.seq = s.seq, .micro_batch = s.micro_batch, .tp = s.tp,
                       .sequence_parallel = s.sequence_parallel, .cp = s.cp,
                       .recompute = s.recompute, .attention = Attention::materialized,
                       .causal = false, .dropout = false, .act_bytes = 4,
                       .kernels = Kernels::eager, .loss = Loss::eager,
                       .recipe = Precision::fp32};
}

void add_engine_gpt_kernels(const ModelSpec& m, const OperatorSetup& s, std::vector<Op>& ops) {
  const double e = s.act_bytes;
  const double sq = double(s.seq / s.cp);                // this rank's query rows
  const double T = double(s.micro_batch) * sq;           // tokens of a micro-batch on this rank
  const double Tn = s.sequence_parallel ? T / s.tp : T;  // ... in the norm / residual kernels
  const double h = double(m.hidden);
  const double heads = double(m.heads / s.tp);
  const double hq = heads * double(m.qk_dim()), hv = heads * double(m.value_dim());
  const double f = double(m.ffn / s.tp);
  const double scores = double(s.micro_batch) * heads * sq * double(s.seq);
  std::vector<Op> forward = {memory_op("qk-copies", Pass::forward, 2 * 2 * e * T * hq),
                             memory_op("scale", Pass::forward, 2 * e * scores),
                             memory_op("mask", Pass::forward, 2 * e * scores),
                             memory_op("v-copy", Pass::forward, 2 * e * T * hv),
                             memory_op("out-proj-bias", Pass::forward, 2 * e * Tn * h),
                             memory_op("mlp-down-bias", Pass::forward, 2 * e * Tn * h)};
  for (const Op& op : forward) ops.push_back(op);
  ops.push_back(memory_op("scale.backward", Pass::backward, 2 * e * scores));
  ops.push_back(memory_op("mask.backward", Pass::backward, 2 * e * scores));
  ops.push_back(memory_op("bias-grads.backward", Pass::backward,
                          e * (T * (3 * hq + f) + 2 * Tn * h)));
  switch (s.recompute) {
    case Recompute::none:
      break;
    case Recompute::full:  // the block's forward again
      for (Op op : forward) {
        op.pass = Pass::recompute;
        ops.push_back(op);
      }
      break;
    default:  // the softmax chain's replay: scale and mask with the softmax
      for (Op op : forward)
        if (op.name == "scale" || op.name == "mask") {
          op.pass = Pass::recompute;
          ops.push_back(op);
        }
  }
}

std::vector<Op> gpt_stage_ops(const GptStageSetup& s) {
  s.validate();
  const OperatorSetup os = engine_gpt_setup(s);
  std::vector<Op> layer = layer_ops(s.model, os);
  add_engine_gpt_kernels(s.model, os, layer);
  std::vector<Op> ops;
  for (int l = 0; l < s.stage_layers; ++l) ops.insert(ops.end(), layer.begin(), layer.end());
  if (s.first_stage)
    for (const Op& op : embedding_ops(s.model, os)) ops.push_back(op);
  if (s.last_stage)
    for (const Op& op : output_ops(s.model, os)) ops.push_back(op);
  return ops;
}

GptStageTime predict_gpt_stage(const GptStageSetup& s, const ClusterSpec& host) {
  GptStageTime t;
  t.contention = std::max(1.0, double(s.ranks) * s.threads_per_rank / s.cores);
  for (const Op& op : gpt_stage_ops(s)) {
    const double sec = t.contention * op_seconds(op, host.gpu, Precision::fp32);
    (op.pass == Pass::forward ? t.forward_s : t.backward_s) += sec;
  }
  t.compute_s = double(s.micro_batches) * (t.forward_s + t.backward_s);
  std::vector<Op> adam;
  host_optimizer_ops(Optimizer::adam, i64(std::ceil(s.own_params)), adam);
  t.optimizer_s = t.contention * host_ops_seconds(adam, host.gpu);
  return t;
}

GptStepTime predict_gpt_step(const GptStageTime& stage, int micro_batches, const GptStepComm& c) {
  require_int(micro_batches >= 1, "micro_batches", micro_batches, "must be >= 1");
  for (double t : {stage.forward_s, stage.backward_s, stage.optimizer_s, c.tp_cp_s, c.pp_send_s,
                   c.dp_s})
    require_real(std::isfinite(t) && t >= 0, "seconds", t, "must be finite and >= 0");
  const double kernels = stage.forward_s + stage.backward_s;
  require_real(kernels > 0, "forward + backward seconds", kernels, "must be > 0");
  const int M = micro_batches;
  GptStepTime t;
  const double comm_per_mb = c.tp_cp_s / M;
  t.forward_s = stage.forward_s + comm_per_mb * stage.forward_s / kernels;
  t.backward_s = stage.backward_s + comm_per_mb * stage.backward_s / kernels;
  if (c.stages > 1)
    t.bubble_s = *bubble({.stages = c.stages, .micro_batches = M, .interleave = c.interleave,
                          .backward_forward_ratio = t.backward_s / t.forward_s,
                          .forward_time_s = t.forward_s})
                      .bubble_time_s;
  t.step_s = M * (t.forward_s + t.backward_s) + t.bubble_s + c.pp_send_s + c.dp_s +
             stage.optimizer_s;
  return t;
}

std::string GptStageTime::convention() const {
  return "operator model on the calibrated host (Note [host GPT step]): contention " +
         format_number(contention) +
         " x (layer_ops + the engine's kernels + embedding / head per micro-batch; Adam on the "
         "rank's own parameters)";
}

}  // namespace tally
