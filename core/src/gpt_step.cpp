#include "tally/core/gpt_step.hpp"

#include <algorithm>
#include <cmath>

#include "tally/core/context_parallel.hpp"
#include "tally/core/mlp_step.hpp"
#include "tally/core/pipeline.hpp"
#include "tally/core/roofline.hpp"

namespace tally {

namespace {

using i64 = std::int64_t;

Op memory_op(std::string_view name, Pass pass, double bytes) {
  return Op{.name = name, .kind = OpKind::memory, .pass = pass, .bytes = bytes};
}

// The shapes of Note [engine ring attention]: e, n = T/(2c), d, a', g', and per pair E = b·a'·n²
// scores, R = b·a'·n rows of a query chunk, KV = b·g'·2n·d elements of this rank's K (or V).
struct RingDims {
  double e, n, d, a, g, E, R, KV;
  double batch;  // b·a': the query heads one batched GEMM multiplies
  RingDims(const ModelSpec& m, const OperatorSetup& s)
      : e(s.act_bytes), n(double(s.seq / (2 * s.cp))), d(double(m.qk_dim())),
        a(double(m.heads / s.tp)), g(double(std::max<i64>(m.kv_heads / s.tp, 1))),
        E(double(s.micro_batch) * a * n * n), R(double(s.micro_batch) * a * n),
        KV(double(s.micro_batch) * g * 2 * n * d), batch(double(s.micro_batch) * a) {}
  Op gemm(std::string_view name, Pass pass, double rows, double cols, double inner) const {
    return gemm_kernel(name, pass, i64(rows), i64(cols), i64(inner), batch, e);
  }
};

// The ring's forward kernels on one micro-batch (Note [engine ring attention]), as `pass`.
void ring_forward(const RingDims& x, const RingBlocks& blocks, Pass pass, std::vector<Op>& ops) {
  const double e = x.e, E = x.E, R = x.R, Rd = x.R * x.d;
  ops.push_back(memory_op("ring-state-fill", pass, e * (4 * R + 2 * Rd)));
  ops.push_back(memory_op("ring-kv-stack", pass, 4 * e * x.KV));
  for (i64 p = 0; p < blocks.pairs; ++p) {
    if (x.a > x.g)  // repeat_interleave of K's and V's chunk to the query heads
      ops.push_back(memory_op("ring-kv-expand", pass, 2 * e * (x.KV / 2 + Rd)));
    ops.push_back(x.gemm("ring-scores", pass, x.n, x.n, x.d));
    ops.push_back(memory_op("ring-scale", pass, 2 * e * E));
    if (p < blocks.diagonal) ops.push_back(memory_op("ring-mask", pass, 2 * e * E));
    ops.push_back(memory_op("ring-max", pass, e * E + (e + 8) * R));
    ops.push_back(memory_op("ring-exp", pass, 4 * e * E + e * R));
    ops.push_back(memory_op("ring-row-sum", pass, e * E + e * R));
    ops.push_back(memory_op("ring-row-state", pass, 14 * e * R));
    ops.push_back(memory_op("ring-rescale", pass, 2 * e * Rd + e * R));
    ops.push_back(x.gemm("ring-context", pass, x.n, x.d, x.n));
    ops.push_back(memory_op("ring-accumulate", pass, 3 * e * Rd));
  }
  ops.push_back(memory_op("ring-normalise", pass, 8 * e * Rd + 16 * e * R));
}

// The ring's backward kernels on one micro-batch (Note [engine ring attention]).
void ring_backward(const RingDims& x, const RingBlocks& blocks, int cp, std::vector<Op>& ops) {
  const Pass b = Pass::backward;
  const double e = x.e, E = x.E, R = x.R, Rd = x.R * x.d;
  const double kv_chunk = x.KV / 2;  // one chunk of K (or V) on its home heads
  ops.push_back(memory_op("ring-delta.backward", b, 8 * e * Rd + 2 * e * R));
  ops.push_back(memory_op("ring-grad-fill.backward", b, e * (2 * Rd + 4 * x.KV)));
  ops.push_back(memory_op("ring-kv-stack.backward", b, 4 * e * x.KV));
  for (i64 p = 0; p < blocks.pairs; ++p) {
    if (x.a > x.g) {  // K and V expanded, dK and dV folded back (a sum over each group)
      ops.push_back(memory_op("ring-kv-expand.backward", b, 2 * e * (kv_chunk + Rd)));
      ops.push_back(memory_op("ring-kv-fold.backward", b, 2 * e * (kv_chunk + Rd)));
    }
    ops.push_back(x.gemm("ring-scores.backward", b, x.n, x.n, x.d));
    ops.push_back(memory_op("ring-scale.backward", b, 2 * e * E));
    if (p < blocks.diagonal) ops.push_back(memory_op("ring-mask.backward", b, 2 * e * E));
    ops.push_back(memory_op("ring-exp.backward", b, 4 * e * E + e * R));
    ops.push_back(x.gemm("ring-dp.backward", b, x.n, x.n, x.d));
    ops.push_back(memory_op("ring-ds.backward", b, 5 * e * E + e * R));
    ops.push_back(x.gemm("ring-dq.backward", b, x.n, x.d, x.n));
    ops.push_back(x.gemm("ring-dk.backward", b, x.n, x.d, x.n));
    ops.push_back(x.gemm("ring-dv.backward", b, x.n, x.d, x.n));
    ops.push_back(memory_op("ring-accumulate.backward", b, 3 * e * (Rd + 2 * kv_chunk)));
  }
  if (cp > 1) ops.push_back(memory_op("ring-own-add.backward", b, 3 * e * 2 * x.KV));
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
  // Under CP the ring scales and masks each block pair itself (ring_forward).
  const bool ring = s.cp > 1;
  std::vector<Op> forward = {memory_op("qk-copies", Pass::forward, 2 * 2 * e * T * hq),
                             memory_op("v-copy", Pass::forward, 2 * e * T * hv),
                             memory_op("out-proj-bias", Pass::forward, 2 * e * Tn * h),
                             memory_op("mlp-down-bias", Pass::forward, 2 * e * Tn * h)};
  if (!ring) {
    forward.push_back(memory_op("scale", Pass::forward, 2 * e * scores));
    forward.push_back(memory_op("mask", Pass::forward, 2 * e * scores));
  }
  for (const Op& op : forward) ops.push_back(op);
  if (!ring) {
    ops.push_back(memory_op("scale.backward", Pass::backward, 2 * e * scores));
    ops.push_back(memory_op("mask.backward", Pass::backward, 2 * e * scores));
  }
  ops.push_back(memory_op("bias-grads.backward", Pass::backward,
                          e * (T * (3 * hq + f) + 2 * Tn * h)));
  const RingBlocks blocks = ring ? ring_blocks(CpBalance::zigzag, s.cp, 0) : RingBlocks{};
  if (ring) {
    add_engine_ring_attention(m, s, blocks, ops);
    // The autograd wrapper's (tp_model.cpp): the output gradient arrives transposed and is made
    // contiguous for the ring, b·a'·(T/c)·d elements read and written.
    ops.push_back(memory_op("ring-dout-copy.backward", Pass::backward,
                            2 * e * double(s.micro_batch) * heads * sq * double(m.qk_dim())));
  }
  switch (s.recompute) {
    case Recompute::none:
      break;
    case Recompute::full:  // the block's forward again
      for (Op op : forward) {
        op.pass = Pass::recompute;
        ops.push_back(op);
      }
      if (ring) ring_forward(RingDims(m, s), blocks, Pass::recompute, ops);
      break;
    default:  // the softmax chain's replay: scale and mask with the softmax (not the ring's)
      for (Op op : forward)
        if (op.name == "scale" || op.name == "mask") {
          op.pass = Pass::recompute;
          ops.push_back(op);
        }
  }
}

RingBlocks ring_blocks(CpBalance balance, int cp, int rank) {
  return {.pairs = cp_causal_block_pairs(balance, cp, rank), .diagonal = 2};
}

void add_engine_ring_attention(const ModelSpec& m, const OperatorSetup& s,
                               const RingBlocks& blocks, std::vector<Op>& ops) {
  require_int(s.cp >= 1 && s.seq % (2 * s.cp) == 0, "cp", s.cp,
              "must be >= 1 with seq divisible by 2*cp (ring attention's 2c chunks)");
  require_int(blocks.diagonal >= 0 && blocks.diagonal <= blocks.pairs, "diagonal block pairs",
              int(blocks.diagonal), "must be in [0, pairs]");
  const RingDims x(m, s);
  ring_forward(x, blocks, Pass::forward, ops);
  ring_backward(x, blocks, s.cp, ops);
}

RingAttentionTime predict_ring_attention(const ModelSpec& m, const OperatorSetup& s,
                                         const RingBlocks& blocks, const ClusterSpec& host,
                                         double contention) {
  require_real(std::isfinite(contention) && contention >= 1, "contention", contention,
               "must be >= 1");
  std::vector<Op> ops;
  add_engine_ring_attention(m, s, blocks, ops);
  RingAttentionTime t;
  for (const Op& op : ops)
    (op.pass == Pass::forward ? t.forward_s : t.backward_s) +=
        contention * op_seconds(op, host.gpu, Precision::fp32);
  return t;
}

// The materialised attention core's kernels, which the ring replaces under CP.
static bool materialised_attention_core(std::string_view name) {
  for (std::string_view k : {"scores", "softmax", "context"})
    if (name == k || (name.starts_with(k) && name[k.size()] == '.')) return true;
  return false;
}

std::vector<Op> gpt_stage_ops(const GptStageSetup& s) {
  s.validate();
  const OperatorSetup os = engine_gpt_setup(s);
  std::vector<Op> layer = layer_ops(s.model, os);
  if (s.cp > 1)  // Note [engine ring attention]: the ring's kernels instead
    std::erase_if(layer, [&](const Op& op) {
      return materialised_attention_core(op.name) ||
             (op.pass == Pass::recompute && op.name == "k-proj");
    });
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
