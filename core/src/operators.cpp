#include "tally/core/operators.hpp"

#include <algorithm>
#include <cmath>

#include "tally/core/parallel_groups.hpp"
#include "tally/core/roofline.hpp"

namespace tally {

namespace {

using i64 = std::int64_t;

// Builds one pass's kernels and their backward (Note [operator inventory]).
class Builder {
 public:
  Builder(const OperatorSetup& s, std::vector<Op>& out) : s_(s), out_(out) {}

  std::size_t size() const { return out_.size(); }
  // The ops pushed since `from` are a routed expert MLP's (Op::routed_expert).
  void mark_routed(std::size_t from) {
    for (std::size_t i = from; i < out_.size(); ++i) out_[i].routed_expert = true;
  }

  // Forward GEMM C (m × n) = A (m × k) · B (k × n), B-batched, and its two backward GEMMs.
  void gemm(std::string_view name, std::string_view dgrad, std::string_view wgrad, i64 m, i64 n,
            i64 k, double batch = 1) {
    forward_gemm(name, m, n, k, batch);
    push(dgrad, OpKind::gemm, Pass::backward, m, k, n, batch);  // dA = dC·Bᵀ
    push(wgrad, OpKind::gemm, Pass::backward, k, n, m, batch);  // dB = Aᵀ·dC
  }
  // A streaming kernel moving `bytes` forward and 1.5× that backward.
  void memory(std::string_view name, std::string_view backward, double bytes) {
    memory(name, backward, bytes, 1.5 * bytes);
  }
  // Streaming kernels whose backward moves `backward_bytes` (Note [eager kernels]); 0 = the
  // gradient passes through as a view: no backward kernel (and no launch overhead) at all.
  void memory(std::string_view name, std::string_view backward, double bytes,
              double backward_bytes) {
    forward_memory(name, bytes);
    if (backward_bytes > 0) backward_memory(backward, backward_bytes);
  }
  // Fused attention: FLOPs executed forward; backward 2.5×.
  void flash(std::string_view name, std::string_view backward, i64 sq, i64 skv, i64 d,
             double batch, double flops, double bytes) {
    forward_flash(name, sq, skv, d, batch, flops, bytes);
    out_.push_back(Op{.name = backward, .kind = OpKind::attention, .pass = Pass::backward, .m = sq,
                      .n = skv, .k = d, .batch = batch, .flops = 2.5 * flops, .bytes = 2 * bytes,
                      .flash_kernel = s_.flash_kernel});
  }
  // The forward kernels alone, for a replay (recompute) or a kernel with no gradient.
  void forward_gemm(std::string_view name, i64 m, i64 n, i64 k, double batch = 1) {
    push(name, OpKind::gemm, pass_, m, n, k, batch);
  }
  void forward_memory(std::string_view name, double bytes) {
    out_.push_back(Op{.name = name, .kind = OpKind::memory, .pass = pass_, .bytes = bytes});
  }
  void forward_flash(std::string_view name, i64 sq, i64 skv, i64 d, double batch, double flops,
                     double bytes) {
    out_.push_back(Op{.name = name, .kind = OpKind::attention, .pass = pass_, .m = sq, .n = skv,
                      .k = d, .batch = batch, .flops = flops, .bytes = bytes,
                      .flash_kernel = s_.flash_kernel});
  }
  // A gradient kernel with no forward kernel of its own (Note [local kernels]: a bias's gradient
  // sum).
  void backward_memory(std::string_view name, double bytes) {
    out_.push_back(Op{.name = name, .kind = OpKind::memory, .pass = Pass::backward,
                      .bytes = bytes});
  }
  // Subsequent forward_* calls record a replay (recompute) instead of the forward.
  void replaying(bool r) { pass_ = r ? Pass::recompute : Pass::forward; }

 private:
  void push(std::string_view name, OpKind kind, Pass pass, i64 m, i64 n, i64 k, double batch) {
    TALLY_INVARIANT(kind == OpKind::gemm);
    out_.push_back(gemm_kernel(name, pass, m, n, k, batch, s_.act_bytes));
  }
  const OperatorSetup& s_;
  std::vector<Op>& out_;
  Pass pass_ = Pass::forward;
};

// Bytes a memory kernel moves per element of its tensor, forward and backward.
struct ElementBytes {
  double forward = 0, backward = 0;
};

// A norm's bytes per element: one read and one write fused (LayerNorm is one native kernel eager
// too); torchtitan's fp32 RMSNorm in pieces eagerly (Note [eager kernels]). Backward, Note [norm
// backward passes]: 5e in two passes (PyTorch's native kernels, Megatron-LM's own), 3e in one
// (Transformer Engine).
ElementBytes norm_bytes(const ModelSpec& m, const OperatorSetup& s, double e) {
  if (s.kernels == Kernels::eager && m.norm == NormKind::rmsnorm) return {28 + 4 * e, 76 + 8 * e};
  return {2 * e, s.kernels == Kernels::fused ? 3 * e : 5 * e};
}

struct Dims {
  i64 T, h, hq, hkv, d, sq, s, f, heads_local, kv_local;
  i64 dv, hv;  // value head dim; v and attention-output width on a rank (= d, h_kv, h_q unless MLA)
  double Tn;  // tokens of the norm/dropout/residual kernels on one rank (T/t with SP)
  double e;
};

Dims dims(const ModelSpec& m, const OperatorSetup& s) {
  Dims d{};
  d.sq = s.seq / s.cp;
  d.s = s.seq;
  d.T = s.micro_batch * d.sq;
  d.Tn = s.sequence_parallel ? double(d.T) / s.tp : double(d.T);
  d.h = m.hidden;
  d.d = m.qk_dim();
  d.dv = m.value_dim();
  d.heads_local = m.heads / s.tp;
  d.hq = d.heads_local * d.d;
  d.kv_local = std::max<i64>(m.kv_heads / s.tp, 1);  // a_kv < t: each rank holds one
  d.hkv = d.kv_local * d.d;
  d.hv = d.kv_local * d.dv;
  d.f = (s.dense_layer ? m.dense_ffn : m.ffn) / s.tp;
  d.e = s.act_bytes;
  return d;
}

// The attention core: forward kernels (or their replay).
void attention_core(const ModelSpec& m, const OperatorSetup& s, const Dims& d, Builder& b,
                    bool with_backward) {
  const double batch = double(s.micro_batch) * double(d.heads_local);
  const double probs = batch * double(d.sq) * double(d.s);  // score elements
  if (s.attention == Attention::flash) {
    // QKᵀ over d_qk and PV over d_v: 2·(d_qk + d_v) FLOPs per score (4·d without MLA).
    // Causal: half the scores, on every CP rank alike (the zigzag split core assumes, Note
    // [causal load balancing] in context_parallel.hpp).
    const double out = double(d.heads_local * d.dv);
    const double bytes = d.e * double(d.T) * (d.hq + d.hkv + d.hv + out);  // q, k, v in; o out
    // `share` of the layers, computing `scores` of the s² (query, key) pairs per sequence.
    const auto emit = [&](std::string_view name, std::string_view backward, double share,
                          double scores) {
      const double flops = 2.0 * probs * share * double(d.d + d.dv) * scores;
      if (with_backward)
        b.flash(name, backward, d.sq, d.s, d.d, batch * share, flops, bytes * share);
      else
        b.forward_flash(name, d.sq, d.s, d.d, batch * share, flops, bytes * share);
    };
    const double full = s.causal ? 0.5 : 1.0;
    // Note [sliding window]
    // A causal window of w < s tokens (ModelSpec::attention_window) computes w·s − w²/2 of the s²
    // pairs (query i sees min(i + 1, w) keys; the continuous form, which is the causal half at
    // w = s), so a windowed layer's flash kernels run on w/s − (w/s)²/2 of the scores. The layer
    // stands for all L (the planner's average layer), so its attention is two kernels: the full
    // layers' share of it and the windowed layers' (flash-attention-window), each on its own
    // roofline — a short window is memory-bound where the full kernel is not; each is charged a
    // kernel's launch cost, one more than an average layer runs (≤ 2 µs a pass). Materialised
    // attention masks the window but computes every score: unchanged. A CP rank's queries are
    // taken to see the window's average, as its causal half is (Note [causal load balancing]).
    const bool windowed = s.causal && m.window_layers > 0 && m.attention_window < d.s;
    const double window_share = windowed ? double(m.window_layers) / double(m.layers) : 0.0;
    if (window_share < 1)
      emit("flash-attention", "flash-attention.backward", 1 - window_share, full);
    if (windowed) {
      const double r = double(m.attention_window) / double(d.s);
      emit("flash-attention-window", "flash-attention-window.backward", window_share,
           r - 0.5 * r * r);
    }
    return;
  }
  const double softmax_bytes = 2.0 * d.e * probs;
  const double dropout_bytes = s.dropout ? (2.0 * d.e + 1.0) * probs : 0.0;
  if (with_backward) {
    b.gemm("scores", "scores.dgrad", "scores.wgrad", d.sq, d.s, d.d, batch);
    b.memory("softmax", "softmax.backward", softmax_bytes);
    // Backward reads the output gradient and the 1-byte mask and writes the input gradient: the
    // forward's bytes (PyTorch's masked scale), not 1.5 × them.
    if (s.dropout)
      b.memory("attention-dropout", "attention-dropout.backward", dropout_bytes, dropout_bytes);
    b.gemm("context", "context.dgrad", "context.wgrad", d.sq, d.dv, d.s, batch);
  } else {
    b.forward_gemm("scores", d.sq, d.s, d.d, batch);
    b.forward_memory("softmax", softmax_bytes);
    if (s.dropout) b.forward_memory("attention-dropout", dropout_bytes);
    b.forward_gemm("context", d.sq, d.dv, d.s, batch);
  }
}

// MLA's projections (Note [operator inventory]): the down projections are replicated on every
// TP rank (Megatron-Core MLA: linear_q_down_proj, linear_kv_down_proj are not split), the up
// projections split by heads.
template <class Gemm, class Memory>
void mla_projections(const ModelSpec& m, const Dims& d, Gemm&& gemm, Memory&& memory) {
  const i64 rkv = m.kv_lora_rank, dr = m.qk_rope_head_dim;
  if (m.q_lora_rank) {
    const i64 rq = *m.q_lora_rank;
    gemm("q-down", "q-down.dgrad", "q-down.wgrad", d.T, rq, d.h);
    memory("q-norm", "q-norm.backward", 2.0 * d.e * double(d.T) * double(rq));
    gemm("q-up", "q-up.dgrad", "q-up.wgrad", d.T, d.hq, rq);
  } else {
    gemm("q-proj", "q-proj.dgrad", "q-proj.wgrad", d.T, d.hq, d.h);
  }
  gemm("kv-down", "kv-down.dgrad", "kv-down.wgrad", d.T, rkv + dr, d.h);
  memory("kv-norm", "kv-norm.backward", 2.0 * d.e * double(d.T) * double(rkv));
  gemm("kv-up", "kv-up.dgrad", "kv-up.wgrad", d.T,
       d.heads_local * (m.qk_nope_head_dim + m.v_head_dim), rkv);
}

// Kernel names of one MLP block (static strings: Op::name is a view).
struct MlpNames {
  std::string_view up, up_dgrad, up_wgrad, act, act_backward, down, down_dgrad, down_wgrad;
};
constexpr MlpNames kSwiglu{"mlp-gate-up", "mlp-gate-up.dgrad", "mlp-gate-up.wgrad", "swiglu",
                           "swiglu.backward", "mlp-down", "mlp-down.dgrad", "mlp-down.wgrad"};
constexpr MlpNames kGelu{"mlp-up", "mlp-up.dgrad", "mlp-up.wgrad", "gelu", "gelu.backward",
                         "mlp-down", "mlp-down.dgrad", "mlp-down.wgrad"};
constexpr MlpNames kSharedSwiglu{"shared-gate-up", "shared-gate-up.dgrad", "shared-gate-up.wgrad",
                                 "shared-swiglu", "shared-swiglu.backward", "shared-down",
                                 "shared-down.dgrad", "shared-down.wgrad"};
constexpr MlpNames kSharedGelu{"shared-up", "shared-up.dgrad", "shared-up.wgrad", "shared-gelu",
                               "shared-gelu.backward", "shared-down", "shared-down.dgrad",
                               "shared-down.wgrad"};

// One MLP (routed experts batched, the shared experts, or a dense FFN) of width f per rank on
// `rows` tokens per expert; `tokens` = rows summed over experts, the activation kernel's rows.
// megatron_routed: the routed experts as Megatron-Core's TEGroupedMLP runs them (kernels fused),
// whose clamp and fc2 bias run as kernels of their own (Note [GPT-OSS kernels]).
template <class Gemm, class Kernels, class Memory2>
void mlp_block(const ModelSpec& m, const Dims& d, Gemm&& gemm, Kernels&& kernels,
               Memory2&& memory2, i64 rows, i64 f, double experts, double tokens, bool shared,
               bool megatron_routed) {
  const bool gated = m.mlp == MlpKind::swiglu;
  const MlpNames& n = gated ? (shared ? kSharedSwiglu : kSwiglu) : (shared ? kSharedGelu : kGelu);
  gemm(n.up, n.up_dgrad, n.up_wgrad, rows, (gated ? 2 : 1) * f, d.h, experts);
  const double e = d.e;  // SwiGLU eager: silu and the product apart (Note [eager kernels])
  if (gated && megatron_routed && m.glu_clamp > 0)
    memory2("glu-clamp", "glu-clamp.backward", 8 * e * tokens * double(f),
            (11 * e + 8) * tokens * double(f));
  if (gated)
    kernels(n.act, n.act_backward, tokens * double(f), ElementBytes{3 * e, 4.5 * e},
            ElementBytes{5 * e, 9 * e});
  else
    kernels(n.act, n.act_backward, tokens * double(f), ElementBytes{2 * e, 3 * e},
            ElementBytes{2 * e, 3 * e});
  gemm(n.down, n.down_dgrad, n.down_wgrad, rows, d.h, f, experts);
  if (megatron_routed && (m.linear_bias || m.expert_bias))
    memory2("expert-bias", "expert-bias.backward", 6 * e * tokens * double(d.h),
            8 * e * tokens * double(d.h));
}

// Every forward kernel of a layer; with_backward adds their gradients.
void layer_forward(const ModelSpec& m, const OperatorSetup& s, const Dims& d, Builder& b,
                   bool with_backward) {
  const double residual_bytes =
      (3.0 * d.e + (s.dropout ? 1.0 : 0.0)) * d.Tn * double(d.h);
  auto gemm = [&](std::string_view n, std::string_view dg, std::string_view wg, i64 mm, i64 nn,
                  i64 kk, double batch = 1) {
    if (with_backward) b.gemm(n, dg, wg, mm, nn, kk, batch);
    else b.forward_gemm(n, mm, nn, kk, batch);
  };
  // Memory kernels: `memory` a fused one (backward 1.5× its bytes), `memory2` with its backward's
  // own bytes, `kernels` by bytes per element, fused or eager as the setup runs (Note [eager
  // kernels]).
  const bool eager = s.kernels == Kernels::eager;
  auto memory = [&](std::string_view n, std::string_view bw, double bytes) {
    if (with_backward) b.memory(n, bw, bytes);
    else b.forward_memory(n, bytes);
  };
  auto memory2 = [&](std::string_view n, std::string_view bw, double bytes, double bw_bytes) {
    if (with_backward) b.memory(n, bw, bytes, bw_bytes);
    else b.forward_memory(n, bytes);
  };
  auto kernels = [&](std::string_view n, std::string_view bw, double elements,
                     ElementBytes fused, ElementBytes unfused) {
    const ElementBytes& per = eager ? unfused : fused;
    memory2(n, bw, per.forward * elements, per.backward * elements);
  };
  auto norm = [&](std::string_view n, std::string_view bw) {
    const ElementBytes per = norm_bytes(m, s, d.e);
    memory2(n, bw, per.forward * d.Tn * double(d.h), per.backward * d.Tn * double(d.h));
  };
  norm("norm-1", "norm-1.backward");
  if (m.is_mla())
    mla_projections(m, d, gemm, memory);
  else
    gemm("qkv", "qkv.dgrad", "qkv.wgrad", d.T, d.hq + 2 * d.hkv, d.h);
  // Note [local kernels]: the biases' own kernels and the context copy.
  const bool local_bias = s.kernels == Kernels::local && m.linear_bias;
  if (local_bias && !m.is_mla()) {
    const double qkv = double(d.T) * double(d.hq + 2 * d.hkv);
    memory2("qkv-bias", "qkv-bias.backward", 2 * d.e * qkv, d.e * qkv);
  }
  if (m.position == PositionKind::rotary) {
    // MLA rotates only the d_r rope part of each q head and the one shared rope key.
    const double width = m.is_mla() ? double(d.heads_local + 1) * double(m.qk_rope_head_dim)
                                    : double(d.hq + d.hkv);
    if (s.kernels == Kernels::fused && !m.is_mla() &&
        m.rotary_attention_scale != 1.0)  // Note [GPT-OSS kernels]
      memory2("rotary", "rotary.backward", 12 * d.e * double(d.T) * width,
              14 * d.e * double(d.T) * width);
    else
      kernels("rotary", "rotary.backward", double(d.T) * width, {2 * d.e, 3 * d.e},
              {16 + 2 * d.e, 16 + 2 * d.e});
  }
  if (eager && !m.is_mla()) {
    // torchtitan's repeat_kv (GQA) and the attention output's transpose copy.
    const double T = double(d.T);
    if (d.heads_local > d.kv_local)  // k and v each
      memory2("repeat-kv", "repeat-kv.backward", 2 * d.e * T * double(d.hkv + d.hq),
              2 * d.e * T * double(3 * d.hq + d.hkv));
    memory2("attention-output-copy", "attention-output-copy.backward", 2 * d.e * T * double(d.hq),
            0);
  }
  attention_core(m, s, d, b, with_backward);
  if (s.kernels == Kernels::local && s.attention == Attention::materialized)
    memory2("context-copy", "context-copy.backward",
            2 * d.e * double(d.T) * double(d.heads_local * d.dv), 0);
  gemm("out-proj", "out-proj.dgrad", "out-proj.wgrad", d.T, d.h, d.heads_local * d.dv);
  memory("dropout-residual-1", "dropout-residual-1.backward", residual_bytes);
  norm("norm-2", "norm-2.backward");
  const bool moe = m.is_moe() && !s.dense_layer;
  // MoE: the tokens of ep ranks' expert-TP groups (g·T_r each, Note [expert tensor parallelism])
  // spread over E experts, E_act per token, padded to c_f times the balanced share; this rank's
  // E/ep experts, f/e_t wide, batched as a grouped GEMM.
  const int etp = s.etp > 0 ? s.etp : s.tp;
  const double expert_tokens =  // g·T_r
      double(d.T) / (s.sequence_parallel ? s.tp : 1) *
      expert_gather_ranks(s.tp, etp, s.sequence_parallel);
  const double experts = moe ? double(m.experts / s.ep) : 1.0;
  const i64 rows = moe ? expert_capacity(expert_tokens * s.ep, m.experts_per_token, m.experts,
                                         s.capacity_factor)
                       : d.T;
  // The router scores the MoE layer's input as the rank holds it: the sequence shard T/t under
  // SP (Megatron-Core's TopKRouter on the [s/t, b, h] hidden states), all T tokens otherwise.
  if (moe)
    gemm("router", "router.dgrad", "router.wgrad", i64(std::llround(d.Tn)), m.experts, d.h);
  // The token dispatcher's kernels around the all-to-alls (Note [MoE token dispatcher]).
  for (const detail::DispatchKernel& k : detail::moe_dispatch_kernels(m, s)) {
    if (with_backward && !k.backward.empty())
      b.memory(k.name, k.backward, k.bytes, k.backward_bytes);
    else
      b.forward_memory(k.name, k.bytes);
  }
  const double routed =
      moe ? expert_tokens * double(m.experts_per_token) * s.capacity_factor : double(d.T);
  const std::size_t routed_from = b.size();
  mlp_block(m, d, gemm, kernels, memory2, rows, moe ? m.ffn / etp : d.f, experts, routed,
            /*shared=*/false, /*megatron_routed=*/moe && s.kernels == Kernels::fused);
  if (moe) b.mark_routed(routed_from);
  // Shared experts: one always-active MLP of width E_s·f_s beside the routed ones (TP-split).
  if (moe && m.shared_experts > 0)
    mlp_block(m, d, gemm, kernels, memory2, d.T, m.shared_experts * m.shared_expert_ffn / s.tp,
              1.0, double(d.T), /*shared=*/true, /*megatron_routed=*/false);
  memory("dropout-residual-2", "dropout-residual-2.backward", residual_bytes);
  // The bias gradients of out-proj, MLP up and MLP down, summed over the tokens (dense MLP).
  if (local_bias && with_backward && !moe)
    b.backward_memory("bias-grads.backward",
                      d.e * (2 * d.Tn * double(d.h) + double(d.T) * double(d.f)));
}

// Note [low precision]: the kernels a low-precision recipe leaves in bf16 (Transformer Engine
// quantizes the linear layers; Megatron-Core keeps the attention core, the router and the output
// layer in bf16).
void mark_high_precision(std::vector<Op>& ops) {
  for (Op& op : ops)
    for (std::string_view prefix : {"scores", "context", "router", "lm-head", "flash-attention"})
      if (op.name.substr(0, prefix.size()) == prefix) op.high_precision = true;
}

}  // namespace


void OperatorSetup::validate(const ModelSpec& m) const {
  if (m.params_only)
    throw InvalidInput("the operator model needs an architecture (a preset or config.json), "
                       "not only --params");
  m.validate();
  require_int(seq >= 1, "seq", seq, "must be >= 1 token");
  require_int(micro_batch >= 1, "micro_batch", micro_batch, "must be >= 1");
  require_int(tp >= 1 && m.heads % tp == 0 && m.ffn % tp == 0 &&
                  (m.kv_heads % tp == 0 || tp % m.kv_heads == 0),
              "tp", tp, "must divide heads, ffn and kv heads (or be a multiple of kv heads)");
  require_int((m.shared_experts * m.shared_expert_ffn) % tp == 0 && m.dense_ffn % tp == 0, "tp",
              tp, "must divide the shared experts' and the dense layers' FFN widths");
  require_int(!dense_layer || m.dense_layers > 0, "dense_layer", 1,
              "the model has no dense leading layers (first_k_dense_replace = 0)");
  require_int(cp >= 1 && seq % cp == 0, "cp", cp, "must be >= 1 and divide seq");
  require_real(act_bytes > 0 && act_bytes <= 8, "act_bytes", act_bytes, "must be in (0, 8]");
  require_real(!is_low_precision(recipe) || act_bytes == 2, "act_bytes", act_bytes,
               "must be 2 (bf16) under a low-precision recipe (Note [low precision])");
  if (kernels == Kernels::local && is_low_precision(recipe))
    throw InvalidInput("kernels = local: Megatron-LM's own modules run no low-precision GEMMs "
                       "(fp8, MXFP8 and NVFP4 need Transformer Engine's: fused)");
  require_recompute_applies(recompute, m);
  require_expert_split(m, ep, etp > 0 ? etp : tp, tp);
  require_expert_tp(tp, etp > 0 ? etp : tp, sequence_parallel);
  require_real(std::isfinite(capacity_factor) && capacity_factor >= 1 && capacity_factor <= 64,
               "capacity_factor", capacity_factor, "must be in [1, 64]");
}

std::vector<Op> layer_ops(const ModelSpec& m, const OperatorSetup& s) {
  s.validate(m);
  const Dims d = dims(m, s);
  std::vector<Op> ops;
  ops.reserve(64);
  Builder b(s, ops);
  layer_forward(m, s, d, b, /*with_backward=*/true);
  b.replaying(true);
  if (s.recompute == Recompute::full) layer_forward(m, s, d, b, /*with_backward=*/false);
  if (s.recompute == Recompute::selective) attention_core(m, s, d, b, /*with_backward=*/false);
  if (s.recompute == Recompute::op_sac) {
    // torchtitan's op SAC replays every other matmul: k, the out-projection and the MLP's up (w3;
    // GeLU: the down projection), from the saved q, v, attention output and w1 outputs.
    b.forward_gemm("k-proj", d.T, std::max<i64>(m.kv_heads / s.tp, 1) * d.d, d.h);
    b.forward_gemm("out-proj", d.T, d.h, d.heads_local * d.dv);
    if (m.mlp == MlpKind::swiglu)
      b.forward_gemm("mlp-up", d.T, d.f, d.h);
    else
      b.forward_gemm("mlp-down", d.T, d.h, d.f);
  }
  if (s.recompute == Recompute::save_matmuls || s.recompute == Recompute::op_sac) {
    // PyTorch selective checkpointing: the saved matmul and attention outputs let backward replay
    // only the cheap kernels — the two norms, rotary, the activation function, and (materialised)
    // the softmax and its dropout. Their bytes are those of their forward.
    for (std::size_t i = 0, n = ops.size(); i < n; ++i) {
      const Op& op = ops[i];
      if (op.pass != Pass::forward || op.kind != OpKind::memory) continue;
      if (op.name == "dropout-residual-1" || op.name == "dropout-residual-2") continue;
      if (op.name.starts_with("moe-")) continue;  // the dispatcher's: Note [MoE token dispatcher]
      // Added after the down projection, outside the activation's checkpoint (Megatron-Core's
      // moe_act: experts.py checkpoints bias_act_func only): Note [GPT-OSS kernels].
      if (op.name == "expert-bias") continue;
      Op replay = op;
      replay.pass = Pass::recompute;
      ops.push_back(replay);
    }
  }
  // Megatron-Core's recompute modules (types.hpp RecomputeModules) beside none, selective or
  // save-matmuls: MLA's q-up, kv-up and rotary, a dense layer's MLP, replayed in backward (their
  // memory kernels once: save-matmuls replays those already).
  const bool up = s.recompute_modules.mla_up_proj && m.is_mla();
  const bool dense_mlp = s.recompute_modules.dense_mlp && (!m.is_moe() || s.dense_layer);
  if ((up || dense_mlp) && s.recompute != Recompute::full && s.recompute != Recompute::op_sac) {
    for (std::size_t i = 0, n = ops.size(); i < n; ++i) {
      const Op op = ops[i];
      if (op.pass != Pass::forward) continue;
      if (op.kind == OpKind::memory && s.recompute == Recompute::save_matmuls) continue;
      const std::string_view k = op.name;
      const bool of_up = k == "q-up" || k == "kv-up" || k == "rotary";
      const bool of_mlp = k == "mlp-gate-up" || k == "mlp-up" || k == "swiglu" || k == "gelu" ||
                          k == "mlp-down";
      if (!((up && of_up) || (dense_mlp && of_mlp))) continue;
      Op replay = op;
      replay.pass = Pass::recompute;
      ops.push_back(replay);
    }
  }
  mark_high_precision(ops);
  detail::add_quantize_ops(m, s, ops);  // Note [low-precision casts]
  return ops;
}

std::vector<Op> embedding_ops(const ModelSpec& m, const OperatorSetup& s) {
  s.validate(m);
  const Dims d = dims(m, s);
  std::vector<Op> ops;
  Builder b(s, ops);
  // Gather T rows of h (read + write); learned positions add a second gather and an add.
  const double rows = double(d.T) * double(d.h);
  const double gathers = m.position == PositionKind::learned ? 2.0 : 1.0;
  b.forward_memory("embedding", 2.0 * d.e * rows * gathers + (s.dropout ? 3.0 * d.e + 1 : 0) * rows);
  // Backward: scatter-add into the fp32 gradient (read the output gradient, read-modify-write).
  ops.push_back(Op{.name = "embedding.backward", .kind = OpKind::memory, .pass = Pass::backward,
                   .bytes = (d.e + 8.0) * rows * gathers});
  return ops;
}

std::vector<Op> output_ops(const ModelSpec& m, const OperatorSetup& s) {
  s.validate(m);
  const Dims d = dims(m, s);
  std::vector<Op> ops;
  Builder b(s, ops);
  const ElementBytes norm = norm_bytes(m, s, d.e);
  b.memory("final-norm", "final-norm.backward", norm.forward * d.Tn * double(d.h),
           norm.backward * d.Tn * double(d.h));
  const i64 v = (m.vocab + s.tp - 1) / s.tp;  // vocabulary-parallel head
  b.gemm("lm-head", "lm-head.dgrad", "lm-head.wgrad", d.T, v, d.h);
  const double logits = double(d.T) * double(v);
  // Cross-entropy in fp32, bytes per logit by Note [loss kernels]: {forward, backward} beside e.
  const auto [forward, backward] = s.loss == Loss::eager            ? std::pair{20.0, 24.0}
                                   : s.loss == Loss::vocab_parallel ? std::pair{36.0, 12.0}
                                                                    : std::pair{12.0, 8.0};
  ops.push_back(Op{.name = "cross-entropy", .kind = OpKind::memory, .pass = Pass::forward,
                   .bytes = logits * (d.e + forward)});
  ops.push_back(Op{.name = "cross-entropy.backward", .kind = OpKind::memory,
                   .pass = Pass::backward, .bytes = logits * (backward + d.e)});
  // Note [multi-token prediction] (model.cpp): each MTP module's kernels but its transformer
  // layer (which the planner times as one more layer on the last stage): the shifted tokens'
  // embedding lookup (the first stage's kernels again), the norms of h and of that embedding,
  // their concatenation (a copy of 2h per token, and its gradient split back), the 2h → h
  // projection (column-parallel over TP), then the final norm, the shared head and the loss again.
  const std::vector<Op> head(ops.begin(), ops.end());
  const double rows = double(d.T) * double(d.h);
  for (i64 k = 0; k < m.mtp_layers; ++k) {
    for (const Op& op : embedding_ops(m, s)) ops.push_back(op);
    b.memory("mtp-norms", "mtp-norms.backward", 2 * norm.forward * d.Tn * double(d.h),
             2 * norm.backward * d.Tn * double(d.h));
    b.memory("mtp-concat", "mtp-concat.backward", 4.0 * d.e * rows, 4.0 * d.e * rows);
    b.gemm("mtp-proj", "mtp-proj.dgrad", "mtp-proj.wgrad", d.T, d.h / s.tp, 2 * d.h);
    ops.insert(ops.end(), head.begin(), head.end());
  }
  mark_high_precision(ops);
  return ops;
}

double low_precision_gemms(const ModelSpec& m, double layers, int ep) {
  require_real(std::isfinite(layers) && layers >= 0, "layers", layers, "must be >= 0");
  require_int(ep >= 1, "ep", ep, "must be >= 1");
  if (m.params_only) return 0.0;
  const double attention = m.is_mla() ? 5.0 - (m.q_lora_rank ? 0.0 : 1.0) : 2.0;
  if (!m.is_moe()) return layers * (attention + 2.0);
  const double moe = attention + 2.0 * double(m.experts / ep) + (m.shared_experts > 0 ? 2.0 : 0.0);
  const double dense = double(m.dense_layers);
  return layers * (dense * (attention + 2.0) + (double(m.layers) - dense) * moe) / double(m.layers);
}

double optimizer_update_bytes(Precision p, Optimizer o) {
  const StateItems b = state_bytes_per_param(p, o);
  // Read the gradient, m, v and the weights it updates (master if kept, else the parameters);
  // write m, v and those weights, and the 16-bit parameters refreshed from the master.
  const double weights = b.master > 0 ? b.master : b.params;
  return b.grads + 2.0 * (b.m + b.v + weights) + (b.master > 0 ? b.params : 0.0);
}

Op gemm_kernel(std::string_view name, Pass pass, i64 m, i64 n, i64 k, double batch, double e) {
  return Op{.name = name, .kind = OpKind::gemm, .pass = pass, .m = m, .n = n, .k = k,
            .batch = batch, .flops = 2.0 * batch * double(m) * double(n) * double(k),
            .bytes = batch * e * (double(m) * double(k) + double(k) * double(n) +
                                  double(m) * double(n))};
}

double op_seconds(const Op& op, const GpuSpec& gpu, Precision p) {
  const KernelPerf& k = gpu.kernels;
  switch (op.kind) {
    case OpKind::gemm: {
      const Precision g = op.high_precision ? compute_precision(p) : p;
      const KernelPerf& gk = gpu.gemm_kernels(g);
      // Note [GEMM residuals]: a calibration's measured shapes
      return gemm_residual(gk, op.m, op.n, op.k, op.batch) *
             roofline_seconds(gpu, op.flops,
                              gpu.peak_flops(g) * gemm_efficiency(gk, op.m, op.n, op.k, op.batch) *
                                  gk.sustained_gemm,
                              op.bytes, gk.kernel_overhead_s);
    }
    case OpKind::attention: {
      const bool backward = op.pass == Pass::backward;
      // Note [cuDNN attention] (presets.cpp): cuDNN's measured table where the GPU has one; else
      // the GPU's attention figures, which a calibration has made the kernel its probe ran
      // (PlanRequest::validate refuses cudnn on a GPU with neither). Note [power cap]: at the
      // clock the GEMMs beside it run at.
      const double eta =
          op.flash_kernel == FlashKernel::cudnn && !k.cudnn_attention_table.empty()
              ? attention_table_fraction(k.cudnn_attention_table, backward, op.k, op.m)
              : attention_fraction(k, backward, op.k, op.m) *
                    (op.flash_kernel == FlashKernel::fa1 ? kFa1AttentionSpeed : 1.0);
      return roofline_seconds(gpu, op.flops,
                              gpu.peak_flops(compute_precision(p)) * eta * k.sustained_gemm,
                              op.bytes);
    }
    case OpKind::memory:
      // Note [memory kernel overhead]
      // A streaming kernel's fixed cost is not a GEMM's where the two were measured apart. On a
      // GPU both are the launch (the presets keep one figure). On a CPU, bench gemm's fit gives
      // the cold-cache GEMM's 10–20 µs (packing, BLAS dispatch, the flush's cold TLB), while
      // `tally bench memory` times a.add_ on 16 floats, warm, at 0.3 µs (2026-12-05, this VM):
      // charging Adam's 8 kernels per tensor the GEMM's figure priced `run zero`'s k = 1 Adam
      // at 2.7–3.1 ms where the engine measured 2.1–2.2 (the DRAM-rate bytes alone are 2.2).
      {
        const double overhead_s = k.memory_overhead_s.value_or(k.kernel_overhead_s);
        const double streaming_s = roofline_seconds(
            gpu, op.flops, gpu.peak_fp32_flops > 0 ? gpu.peak_fp32_flops : gpu.peak_tf32_flops,
            op.bytes, overhead_s);
        // Note [streaming kernel families]
        // A CPU's elementwise kernels do not all stream at its DRAM rate: libtorch's tanh GELU
        // evaluates a tanh per element (1.43 ms on the 512 Ki elements of the engine GPT's MLP,
        // 2026-12-05, this VM: 2.9 GB/s of core's 8 bytes per element, where a copy of the same
        // tensor streams 4 MiB in 0.05 ms, 80 GB/s); softmax, the causal mask's masked_fill
        // and LayerNorm run at 10–14 GB/s there. `tally bench memory` times each
        // family on the engine's kernels (engine/bench/kernels.hpp) and the calibration gives
        // its rate in core's own bytes of that kernel, so the figure prices exactly the bytes
        // core counts. A family's kernel runs no faster than its measured rate and no faster
        // than streaming (a rate measured in cache may exceed DRAM's). GPU presets list none:
        // there these kernels stream at the HBM rate (memory_fraction).
        const double rate = streaming_rate_bps(k, op.name);
        return rate > 0 ? std::max(streaming_s, op.bytes / rate + overhead_s) : streaming_s;
      }
  }
  TALLY_INVARIANT(false && "unknown operator kind");
  return 0;
}

std::string_view kernel_family(std::string_view op_name) {
  constexpr std::string_view kBackward = ".backward";
  const bool backward = op_name.ends_with(kBackward);
  const std::string_view base =
      backward ? op_name.substr(0, op_name.size() - kBackward.size()) : op_name;
  for (std::string_view norm : {"norm-1", "norm-2", "final-norm", "q-norm", "kv-norm"})
    if (base == norm) return backward ? "norm.backward" : "norm";
  if (base == "shared-gelu") return backward ? "gelu.backward" : "gelu";
  // Note [engine ring attention]: the ring masks its diagonal pairs with the forward's
  // masked_fill(−∞), in its backward too (the scores recomputed).
  if (base == "ring-mask") return "mask";
  return op_name;
}

double streaming_rate_bps(const KernelPerf& k, std::string_view op_name) {
  if (k.streaming_rates.empty()) return 0;
  const std::string_view family = kernel_family(op_name);
  for (const KernelPerf::StreamingRate& r : k.streaming_rates)
    if (r.family == family) return r.bytes_per_s;
  return 0;
}

bool is_column_wgrad(std::string_view name) {
  for (std::string_view w : {kGelu.up_wgrad, kSwiglu.up_wgrad, kSharedGelu.up_wgrad,
                             kSharedSwiglu.up_wgrad, std::string_view("qkv.wgrad"),
                             std::string_view("q-proj.wgrad")})
    if (name == w) return true;
  return false;
}

OpsTime time_ops(const std::vector<Op>& ops, const GpuSpec& gpu, Precision p) {
  OpsTime t;
  for (const Op& op : ops) {
    const double s = op_seconds(op, gpu, p);
    t.flops += op.flops;
    if (op.weight_cast) {
      t.weight_cast_s += s;
      if (op.pass == Pass::forward) t.weight_cast_forward_s += s;
    }
    switch (op.pass) {
      case Pass::forward: t.forward_s += s; break;
      case Pass::backward:
        t.backward_s += s;
        if (op.kind == OpKind::gemm && !op.routed_expert && is_column_wgrad(op.name))
          t.column_wgrad_s += s;
        break;
      case Pass::recompute: t.recompute_s += s; break;
    }
  }
  return t;
}

OpsTime average_layer_time(const ModelSpec& m, const OperatorSetup& s, const GpuSpec& gpu,
                           Precision p) {
  const OpsTime t = time_ops(layer_ops(m, s), gpu, p);
  if (m.dense_layers == 0) return t;
  OperatorSetup dense_setup = s;
  dense_setup.dense_layer = true;
  return mix_layer_times(m, t, time_ops(layer_ops(m, dense_setup), gpu, p));
}

OpsTime mix_layer_times(const ModelSpec& m, const OpsTime& moe_layer, const OpsTime& d) {
  OpsTime t = moe_layer;
  if (m.dense_layers == 0) return t;
  const double w = double(m.dense_layers) / double(m.layers);
  t.forward_s += w * (d.forward_s - t.forward_s);
  t.backward_s += w * (d.backward_s - t.backward_s);
  t.recompute_s += w * (d.recompute_s - t.recompute_s);
  t.weight_cast_forward_s += w * (d.weight_cast_forward_s - t.weight_cast_forward_s);
  t.weight_cast_s += w * (d.weight_cast_s - t.weight_cast_s);
  t.column_wgrad_s += w * (d.column_wgrad_s - t.column_wgrad_s);
  t.flops += w * (d.flops - t.flops);
  return t;
}

}  // namespace tally
