#include "tally/core/activations.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "tally/core/parallel_groups.hpp"
#include "tally/core/pipeline.hpp"

namespace tally {

namespace {

void require_positive(std::int64_t v, const char* field, const char* what) {
  if (v < 1) throw InvalidInput(std::string(field) + " = " + std::to_string(v) + ": " + what);
}

std::string i2s(std::int64_t v) { return std::to_string(v); }

}  // namespace

int ActivationSetup::layers_on_stage(const ModelSpec& m, int s) const {
  if (stage_layer_list != nullptr) return stage_layer_total(*stage_layer_list, pp, s);
  return layers_of_stage(int(m.layers), pp, first_stage_layers, last_stage_layers, s);
}

void ActivationSetup::validate(const ModelSpec& m) const {
  if (m.params_only)
    throw InvalidInput("activations need an architecture: give --model PRESET|config.json, not "
                       "only --params");
  m.validate();
  require_positive(seq, "--seq", "must be >= 1 token");
  require_positive(micro_batch, "--micro-batch", "must be >= 1");
  require_positive(tp, "--tp", "must be >= 1");
  require_positive(cp, "--cp", "must be >= 1");
  require_positive(pp, "--pp", "must be >= 1");
  require_positive(interleave, "--interleave", "must be >= 1");
  require_positive(micro_batches, "--micro-batches", "must be >= 1");
  if (m.heads % tp != 0)
    throw InvalidInput("--tp = " + i2s(tp) + ": must divide num_attention_heads = " + i2s(m.heads));
  if (m.kv_heads % tp != 0 && tp % m.kv_heads != 0)
    throw InvalidInput("--tp = " + i2s(tp) + ": must divide (or be a multiple of) " +
                       "num_key_value_heads = " + i2s(m.kv_heads));
  if (m.ffn % tp != 0)
    throw InvalidInput("--tp = " + i2s(tp) + ": must divide intermediate_size = " + i2s(m.ffn));
  if (m.dense_ffn % tp != 0 || (m.shared_experts * m.shared_expert_ffn) % tp != 0)
    throw InvalidInput("--tp = " + i2s(tp) + ": must divide the dense layers' and the shared " +
                       "experts' FFN widths");
  if (seq % cp != 0)
    throw InvalidInput("--cp = " + i2s(cp) + ": must divide seq = " + i2s(seq));
  const bool uneven =
      first_stage_layers != 0 || last_stage_layers != 0 || stage_layer_list != nullptr;
  if (uneven) {
    if (interleave != 1 && stage_layer_list == nullptr)
      throw InvalidInput("--interleave = " + i2s(interleave) +
                         ": lightened end stages need interleave 1; interleaved, give every " +
                         "virtual stage's layers (--pp-layers)");
    if (interleave != 1 && micro_batches % pp != 0)
      throw InvalidInput("--micro-batches = " + i2s(micro_batches) +
                         ": the interleaved schedule needs a multiple of --pp = " + i2s(pp));
    if (stage_layer_list != nullptr)
      check_stage_list(*stage_layer_list, int(m.layers), pp, interleave);
    else
      (void)stage_layers(int(m.layers), pp, first_stage_layers, last_stage_layers);  // validates
  } else if (m.layers % (std::int64_t(pp) * interleave) != 0)
    throw InvalidInput("--pp = " + i2s(pp) + " × interleave = " + i2s(interleave) +
                       ": must divide num_hidden_layers = " + i2s(m.layers));
  if (sequence_parallel && tp == 1)
    throw InvalidInput("--sp: sequence parallelism needs --tp > 1");
  require_expert_split(m, 1, etp > 0 ? etp : tp, tp);
  require_expert_tp(tp, etp > 0 ? etp : tp, sequence_parallel);
  require_recompute_applies(recompute, m);
  if (!(act_bytes > 0)) throw InvalidInput("act_bytes must be > 0");
  if (!(std::isfinite(linear_input_bytes) && linear_input_bytes >= 0 && linear_input_bytes <= 8))
    throw InvalidInput("linear_input_bytes must be in [0, 8] (0 = no low-precision recipe)");
  if (!(std::isfinite(lora_input_width) && lora_input_width >= 0 &&
        std::isfinite(lora_rank_width) && lora_rank_width >= 0))
    throw InvalidInput("LoRA activation widths must be finite and >= 0");
  if ((lora_input_width > 0 || lora_rank_width > 0) && tp != 1)
    throw InvalidInput("--tp = " + i2s(tp) + ": LoRA fine-tuning plans run without TP (tp 1)");
  if (!(capacity_factor >= 1 && capacity_factor <= 64))
    throw InvalidInput("--capacity-factor = " + std::to_string(capacity_factor) +
                       ": must be in [1, 64]");
}

// Which part of a layer a saved term belongs to, for Note [backward phases]: the attention core's
// backward runs after the MLP block's and the output projection's, whose saved tensors are freed by
// then; the attention part (the norm-1 and QKV inputs, Q, K, V, the scores, the latents, and the
// LoRA adapters' terms, kept whatever their targets: an upper bound) is still alive.
namespace {
enum class Part { attention, mlp };
constexpr Part kAttn = Part::attention, kMlp = Part::mlp;
}  // namespace

// The per-layer inventory of Note [activation inventory] for one micro-batch. `add(name, formula,
// bytes, part)` receives each term; the planner's hot path sums bytes and ignores the names (no
// allocation), the report keeps them. One definition serves both.
// MoE layers hold the MLP hidden of each token's E_act routed experts plus the shared experts
// (width E_act·f + E_s·f_s per token); a dense leading layer, f_d. Q is a·d_qk wide, K and V
// a_kv·(d_qk + d_v), the attention output a·d_v (h, 2·h_kv and h without MLA or a stated head_dim).
// MLA also keeps its latents, replicated on every TP rank: q-down output and its norm (2·r_q), the
// kv-down output (r_kv + d_r) and its norm (r_kv).
template <class Sink>
static void layer_inventory(const ModelSpec& m, const ActivationSetup& a, bool dense_layer,
                            Sink&& add) {
  const double t = a.tp, sl = double(a.seq) / a.cp, s = double(a.seq), b = double(a.micro_batch);
  const double h = double(m.hidden), hkv = double(m.kv_heads * (m.qk_dim() + m.value_dim())) / 2;
  const double hq = double(m.heads * m.qk_dim()), ho = double(m.heads * m.value_dim());
  const bool moe = m.is_moe() && !dense_layer;
  const double routed = moe ? double(m.experts_per_token) * a.capacity_factor : 0.0;
  const double f = dense_layer ? double(m.dense_ffn)
                   : moe ? routed * double(m.ffn) + double(m.shared_experts * m.shared_expert_ffn)
                         : double(m.ffn);
  const double heads = double(m.heads), e = a.act_bytes;
  // Formula labels name the widths where they are not h (MLA, a stated head_dim); the MLP's f is
  // E_act·f + E_s·f_s in a MoE layer and f_d in a dense leading layer.
  const bool own_widths = m.is_mla() || m.heads * m.head_dim() != m.hidden;
  const char* q_label = own_widths ? "2sb·a·d_qk /t" : "2sbh /t";
  const char* kv_label = own_widths ? "2sb·a_kv·(d_qk + d_v) /t" : "2·2sb·h_kv /t";
  const char* o_label = own_widths ? "2sb·a·d_v /t" : "2sbh /t";
  const double tokens = sl * b;
  // Replicated-under-TP terms are divided by t only with sequence parallelism.
  const double rep = a.sequence_parallel ? t : 1.0;
  const double rq = double(m.q_lora_rank.value_or(0)), rkv = double(m.kv_lora_rank);
  const double dr = m.is_mla() ? double(m.qk_rope_head_dim) : 0.0;
  const double mla_latent = m.is_mla() ? rq + rkv + dr : 0.0;           // saved GEMM outputs
  const double mla_latents = m.is_mla() ? 2 * rq + 2 * rkv + dr : 0.0;  // + their norm outputs
  const double mask = a.dropout ? 1.0 : 0.0;
  // Megatron-Core's recompute modules (types.hpp RecomputeModules): q, k, v not kept; a dense
  // MLP's hidden not kept, its input is.
  const bool up_replayed = a.recompute_modules.mla_up_proj && m.is_mla();
  const bool mlp_replayed = a.recompute_modules.dense_mlp && !moe;
  // Low precision (Note [activation inventory]): q bytes per element of a saved linear input.
  const bool lowp = a.linear_input_bytes > 0;
  const double q = lowp ? a.linear_input_bytes : e;

  // Selective checkpointing keeps attention's outputs: the scores (materialised) or flash's fp32
  // log-sum-exp, and the attention-dropout mask.
  const auto sac_attention_core = [&] {
    if (a.attention == Attention::materialized) {
      const double scores = heads * sl * s * b / t;
      add("attention scores (QKᵀ output)", "2·a·s²·b /t", e * scores, kAttn);
      add("attention-dropout mask", "a·s²·b /t", mask * scores, kAttn);
    } else {
      add("flash softmax log-sum-exp (fp32)", "4·a·s·b /t", 4.0 * heads * tokens / t, kAttn);
    }
  };
  // Note [activation inventory], MoE layer: what the router, the dispatch and the combine keep.
  // The dispatched copies as the expert-TP group gathered them: g ranks' T/rep tokens each.
  const int etp = a.etp > 0 ? a.etp : a.tp;
  const double gathered = expert_gather_ranks(a.tp, etp, a.sequence_parallel) / rep;  // g/rep
  const char* dispatched_label =
      lowp ? (gathered == 1.0 ? "q·sb·E_act·c_f·h"
              : rep == 1.0    ? "q·sb·E_act·c_f·h ·e_t"
                              : "q·sb·E_act·c_f·h ·e_t/t")
           : (gathered == 1.0 ? "2sb·E_act·c_f·h"
              : rep == 1.0    ? "2sb·E_act·c_f·h ·e_t"
                              : "2sb·E_act·c_f·h ·e_t/t");
  const auto moe_terms = [&] {
    if (!moe) return;
    add("router probabilities (fp32)", "4sb·E", 4.0 * tokens * double(m.experts) / rep, kMlp);
    add(lowp ? "dispatched tokens (low-precision)" : "dispatched tokens (expert input)",
        dispatched_label, q * tokens * routed * h * gathered, kMlp);
    // The routing weights multiply inside the experts' activation (Megatron-Core's TEGroupedMLP
    // bias_act_func with permuted_probs; torchtitan scores the routed inputs before the
    // experts), so the combine is an unweighted scatter that keeps nothing; the weighted
    // activation keeps each routed copy's fp32 weight.
    add("routed copies' weights (fp32)",
        gathered == 1.0 ? "4sb·E_act·c_f"
        : rep == 1.0    ? "4sb·E_act·c_f ·e_t"
                        : "4sb·E_act·c_f ·e_t/t",
        4.0 * tokens * routed * gathered, kMlp);
  };
  // Note [activation inventory], LoRA adapters.
  const auto lora_terms = [&] {
    if (a.lora_rank_width > 0)
      add("LoRA A outputs (B inputs)", "2sb·Σr", e * tokens * a.lora_rank_width, kAttn);
    if (a.lora_dropout && a.lora_input_width > 0) {
      add("LoRA dropout outputs (A inputs)", "2sb·Σd_in", e * tokens * a.lora_input_width, kAttn);
      add("LoRA dropout masks", "sb·Σd_in", tokens * a.lora_input_width, kAttn);
    }
  };
  if (a.recompute == Recompute::full) {
    add("layer input (full-recompute checkpoint)", "2sbh", e * tokens * h / rep, kAttn);
    return;
  }
  if (a.recompute == Recompute::op_sac) {
    // torchtitan's op SAC (types.hpp): the layer input, q and v (matmuls 1 and 3), attention's
    // outputs, and of the MLP the gate w1 (5) and the down w2 (7) — GeLU: the up projection (5) —
    // saved; k, o and w3 (GeLU: down) and the cheap kernels replayed from them.
    add("layer input (checkpoint)", "2sbh", e * tokens * h / rep, kAttn);
    add("Q (wq output)", q_label, e * tokens * hq / t, kAttn);
    add("V (wv output)", "2sb·a_kv·d_v /t",
        e * tokens * double(m.kv_heads * m.value_dim()) / t, kAttn);
    sac_attention_core();
    add("attention output (projection input)", o_label, e * tokens * ho / t, kMlp);
    add("projection dropout mask", "sbh", mask * tokens * h / rep, kMlp);
    if (m.mlp == MlpKind::gelu) {
      add("MLP up output (fc1)", "2sbf /t", e * tokens * f / t, kMlp);
    } else {
      add("MLP gate output (w1)", "2sbf /t", e * tokens * f / t, kMlp);
      add("MLP down output (w2)", "2sbh", e * tokens * h / rep, kMlp);
    }
    add("MLP dropout mask", "sbh", mask * tokens * h / rep, kMlp);
    lora_terms();
    return;
  }
  if (a.recompute == Recompute::save_matmuls) {
    // PyTorch selective checkpointing, matmul and attention outputs saved: the norms, rotary and
    // the activation function are replayed from the layer input, the attention output and the MLP
    // block input (the residual sum), and the up-projection output.
    add("layer input (norm-1 replay)", "2sbh", e * tokens * h / rep, kAttn);
    add("MLA latents (q, kv down outputs)", "2sb·(r_q + r_kv + d_r)", e * tokens * mla_latent,
        kAttn);
    if (!up_replayed) {
      add("Q", q_label, e * tokens * hq / t, kAttn);
      add("K, V", kv_label, 2 * e * tokens * hkv / t, kAttn);
    }
    sac_attention_core();
    add("attention output (projection input)", o_label, e * tokens * ho / t, kMlp);
    add("projection dropout mask", "sbh", mask * tokens * h / rep, kMlp);
    add("MLP block input (norm-2 replay)", "2sbh", e * tokens * h / rep, kMlp);
    // A replayed dense MLP keeps none of its outputs: it reruns from the block input.
    if (!mlp_replayed && m.mlp == MlpKind::gelu)
      add("MLP up output (GeLU replay)", "2sbf /t", e * tokens * f / t, kMlp);
    else if (!mlp_replayed)
      add("MLP gate, up outputs (SwiGLU replay)", "2·2sbf /t", 2 * e * tokens * f / t, kMlp);
    moe_terms();
    add("MLP dropout mask", "sbh", mask * tokens * h / rep, kMlp);
    lora_terms();
    return;
  }
  add("LayerNorm 1 input (the layer input)", "2sbh", e * tokens * h / rep, kAttn);
  add("LayerNorm 2 input", "2sbh", e * tokens * h / rep, kMlp);
  if (!lowp)
    add("QKV input (norm output)", "2sbh", e * tokens * h / rep, kAttn);
  else if (m.is_mla())  // an unfused norm: q-down and kv-down quantize and save it each
    add("QKV input (low-precision, q/kv-down)", "2·q·sbh", 2 * q * tokens * h / rep, kAttn);
  else
    add("QKV input (low-precision norm output)", "q·sbh", q * tokens * h / rep, kAttn);
  add("MLA latents and their norms", lowp ? "2sb·(r_q + r_kv + d_r) + q·sb·(r_q + r_kv)"
                                          : "2sb·(2r_q + 2r_kv + d_r)",
      e * tokens * mla_latent + q * tokens * (mla_latents - mla_latent), kAttn);
  if (!up_replayed) {
    add("Q", q_label, e * tokens * hq / t, kAttn);
    add("K, V", kv_label, 2 * e * tokens * hkv / t, kAttn);
  }
  if (a.attention == Attention::materialized && a.recompute != Recompute::selective) {
    const double scores = heads * sl * s * b / t;  // each rank holds its s/c queries × all s keys
    add("attention scores (softmax output)", "2·a·s²·b /t", e * scores, kAttn);
    add("attention-dropout mask", "a·s²·b /t", mask * scores, kAttn);
    add("attention-dropout output", "2·a·s²·b /t", mask * e * scores, kAttn);
  }
  if (a.attention == Attention::flash)
    add("flash softmax log-sum-exp (fp32)", "4·a·s·b /t", 4.0 * heads * tokens / t, kAttn);
  // Flash attention keeps its output for its own backward; a low-precision projection saves its
  // quantized copy beside it (materialised attention keeps none: the copy alone).
  const bool flash = a.attention == Attention::flash;
  if (!lowp || flash)
    add("attention output (projection input)", o_label, e * tokens * ho / t, kMlp);
  if (lowp)
    add("projection input (low-precision copy)", own_widths ? "q·sb·a·d_v /t" : "q·sbh /t",
        q * tokens * ho / t, kMlp);
  add("projection dropout mask", "sbh", mask * tokens * h / rep, kMlp);
  if (!lowp || moe || mlp_replayed)
    add(mlp_replayed ? "MLP input (the dense MLP's checkpoint)" : "MLP input (norm output)",
        "2sbh", e * tokens * h / rep, kMlp);
  if (lowp && !mlp_replayed && (!moe || m.shared_experts > 0))
    add(moe ? "shared experts' input (low-precision copy)"
            : "MLP input (low-precision norm output)",
        "q·sbh", q * tokens * h / rep, kMlp);
  // A replayed dense MLP's hidden is rebuilt in its backward (Note [backward phases]).
  if (!mlp_replayed && m.mlp == MlpKind::gelu)
    add("MLP hidden: GeLU input + W2 input", lowp ? "(2 + q)·sbf /t" : "2·2sbf /t",
        (e + q) * tokens * f / t, kMlp);
  else if (!mlp_replayed)  // fused SwiGLU (Megatron bias_swiglu): gate, up, the down input
    add("MLP hidden: gate, up, down input (SwiGLU)", lowp ? "(2·2 + q)·sbf /t" : "3·2sbf /t",
        (2 * e + q) * tokens * f / t, kMlp);
  moe_terms();
  add("MLP dropout mask", "sbh", mask * tokens * h / rep, kMlp);
  lora_terms();
}

namespace {

// One layer's saved bytes: all of them, and its attention part's (Part).
struct LayerBytes {
  double all = 0, attention = 0;
};

LayerBytes layer_bytes(const ModelSpec& m, const ActivationSetup& a, bool dense_layer) {
  LayerBytes r;
  layer_inventory(m, a, dense_layer, [&](const char*, const char*, double bytes, Part part) {
    r.all += bytes;
    if (part == Part::attention) r.attention += bytes;
  });
  return r;
}

// Note [backward phases]: what one layer's backward holds beyond the stage's saved tensors, which
// include this layer's own saved set under the policy (`kept`).
struct LayerBackward {
  double replay = 0;           // full recompute: the rebuilt inventory less the checkpointed input
  double score_gradients = 0;  // dP and dS
  double extra = 0;            // the larger of the MLP-backward and attention-core points, ≥ 0
};

LayerBackward layer_backward(const ModelSpec& m, const ActivationSetup& a, bool dense_layer) {
  const bool full = a.recompute == Recompute::full;
  const bool rebuilds_core = full || a.recompute == Recompute::selective;
  const LayerBytes kept = layer_bytes(m, a, dense_layer);
  // What the layer's backward rebuilds its saved set to: the inventory without recompute under
  // full and selective recompute; with recompute modules, without them (their q, k, v, or a dense
  // MLP's hidden, rebuilt one layer at a time); otherwise its own saved set (the cheap ops
  // save-matmuls and op-sac replay are not counted: Note [backward phases]).
  LayerBytes whole = kept;
  if (rebuilds_core || a.recompute_modules.any()) {
    ActivationSetup none = a;
    if (rebuilds_core) none.recompute = Recompute::none;
    none.recompute_modules = {};
    whole = layer_bytes(m, none, dense_layer);
  }
  LayerBackward r;
  if (a.attention == Attention::materialized)
    r.score_gradients = 2 * a.act_bytes * double(m.heads) * (double(a.seq) / a.cp) *
                        double(a.seq) * double(a.micro_batch) / a.tp;
  r.replay = full ? whole.all - kept.all : 0.0;
  // A replayed dense MLP rebuilds its hidden during its own backward.
  const double mlp_point =
      full ? r.replay : (whole.all - whole.attention) - (kept.all - kept.attention);
  const double attention_point = (whole.attention - kept.attention) - (kept.all - kept.attention) +
                                 r.score_gradients;
  r.extra = std::max({0.0, mlp_point, attention_point});
  return r;
}

}  // namespace

std::string_view to_string(BackwardPhase p) {
  switch (p) {
    case BackwardPhase::loss_and_head: return "loss + LM-head backward";
    case BackwardPhase::blocks: return "blocks' backward";
  }
  return "?";
}

LayerActivationBytes layer_activation_bytes_unchecked(const ModelSpec& m,
                                                      const ActivationSetup& a) {
  LayerActivationBytes l;
  l.per_layer = layer_bytes(m, a, /*dense_layer=*/false).all;
  if (m.dense_layers > 0) l.dense_layer = layer_bytes(m, a, /*dense_layer=*/true).all;
  for (const bool dense : {false, true}) {
    if (dense && m.dense_layers == 0) continue;
    const LayerBackward lb = layer_backward(m, a, dense);
    l.recompute_transient = std::max(l.recompute_transient, lb.replay);
    l.score_gradients = std::max(l.score_gradients, lb.score_gradients);
    l.layer_backward = std::max(l.layer_backward, lb.extra);
  }
  return l;
}

// Stage totals from one layer's bytes (shared by the report and the fast path), and the stage
// peak as the larger of the two backward phases (Note [backward phases]).
static void stage_totals(const ModelSpec& m, const ActivationSetup& a,
                         const LayerActivationBytes& l, ActivationResult& r) {
  r.per_layer_bytes = l.per_layer;
  r.dense_layer_bytes = l.dense_layer;
  r.recompute_transient_bytes = l.recompute_transient;
  r.score_gradient_bytes = l.score_gradients;
  r.layer_backward_bytes = l.layer_backward;
  // A MoE model's dense leading layers sit on the first stage(s); each differs from a MoE layer by
  // dense_extra. Stage s holds those of its layers with index < L_d.
  const double dense_extra = m.dense_layers > 0 ? r.dense_layer_bytes - r.per_layer_bytes : 0.0;
  const auto dense_on_first = [&](int n_first) {
    return double(std::min<std::int64_t>(m.dense_layers, n_first));
  };
  const double p = a.pp, v = a.interleave;
  r.layers_on_stage = double(m.layers) / p;
  // Korthikanti §4.2.3: the first 1F1B stage holds p micro-batches (fewer if m < p); interleaving
  // with v chunks multiplies that by 1 + (p−1)/(p·v): its warm-up's chunks and the steady
  // state's one more, never more than the v·m chunks there are (all of them at m = p, where
  // stage 0's warm-up reaches v·m; interleaved_peak_chunks).
  double in_flight = std::min<double>(p, a.micro_batches);
  if (a.pp > 1 && a.interleave > 1)
    in_flight = interleaved_peak_chunks(a.pp, a.micro_batches, a.interleave, 0) / v;
  r.in_flight_micro_batches = in_flight;
  r.transformer_bytes = (r.per_layer_bytes * r.layers_on_stage +
                         dense_extra * dense_on_first(int(r.layers_on_stage))) * in_flight;

  const double tokens = double(a.seq) / a.cp * double(a.micro_batch);
  const double rep = a.sequence_parallel ? a.tp : 1.0;
  const double h = double(m.hidden);
  r.embedding_bytes = (a.dropout ? 1.0 : 0.0) * tokens * h / rep * in_flight;
  // Korthikanti §4.3: final norm input + LM-head input (2-byte) and fp32 logits 4sbV / t.
  // Note [multi-token prediction] (model.cpp): each MTP module repeats this at the last stage's
  // loss, and holds its layer's tensors and its own inputs — the norms' inputs (h and the
  // shifted tokens' embedding) and the projection's 2h input — for the one micro-batch the last
  // (virtual) stage keeps in flight: its backward follows each forward at once under 1F1B and
  // interleaving alike.
  const double mtp = double(m.mtp_layers);
  r.output_bytes = (1 + mtp) * (2 * a.act_bytes * tokens * h / rep +
                                (a.eager_loss ? 12.0 : 4.0) * tokens * double(m.vocab) / a.tp);
  r.mtp_bytes = mtp * (r.per_layer_bytes + 4 * a.act_bytes * tokens * h / rep);

  // Each stage's saved tensors; the loss phase on the last, the blocks' phase on the fullest.
  const int last = a.pp - 1;
  double last_saved = 0, fullest = -1;
  int fullest_stage = 0;
  const auto stage = [&](int s, double saved) {
    if (s == last) saved += r.mtp_bytes;
    if (saved > fullest) fullest = saved, fullest_stage = s;
    if (s == last) last_saved = saved;
  };
  if (a.pp == 1) {
    stage(0, r.transformer_bytes + r.embedding_bytes);
  } else if (a.first_stage_layers != 0 || a.last_stage_layers != 0 ||
             a.stage_layer_list != nullptr) {
    // Uneven stages (core/pipeline.hpp stage_layers, validated): stage s holds min(p − s, m)
    // micro-batches of its n_s layers; the middle stages share the rest, extras toward the end.
    // Interleaved (Note [uneven virtual stages]): the chunks stage s holds at its peak, each
    // weighing its own layers' bytes (interleaved_peak_held).
    const bool chunked = a.interleave > 1 && a.stage_layer_list != nullptr;
    std::int64_t first_layer = 0;
    // The bytes of one micro-batch's `n` layers starting at model layer first_layer (the dense
    // leading layers of a MoE model counted where they sit).
    auto layer_bytes = [&](int n) {
      const double dense = double(std::clamp<std::int64_t>(m.dense_layers - first_layer, 0, n));
      first_layer += n;
      return r.per_layer_bytes * n + dense_extra * dense;
    };
    std::vector<double> chunk_bytes;  // per virtual stage, in model order
    if (chunked)
      for (const int n : *a.stage_layer_list) chunk_bytes.push_back(layer_bytes(n));
    // Interleaved, stage s holds at most its heaviest chunk × the chunks in flight at its peak,
    // exactly that when its chunks weigh the same (the planner's slot splits: every stage but the
    // end ones). Walking only stage 0, the last (its loss phase) and the stages whose bound
    // beats the fullest found keeps a search's cost apart from P.
    std::vector<double> mine;
    auto held_on = [&](int s) {
      mine.clear();
      for (std::size_t j = std::size_t(s); j < chunk_bytes.size(); j += std::size_t(a.pp))
        mine.push_back(chunk_bytes[j]);
      const auto [lo, hi] = std::minmax_element(mine.begin(), mine.end());
      return *lo == *hi ? *hi * interleaved_peak_chunks(a.pp, a.micro_batches, a.interleave, s)
                        : interleaved_peak_held(mine, a.pp, a.micro_batches, s);
    };
    auto bound_on = [&](int s) {
      double hi = 0;
      for (std::size_t j = std::size_t(s); j < chunk_bytes.size(); j += std::size_t(a.pp))
        hi = std::max(hi, chunk_bytes[j]);
      return hi * interleaved_peak_chunks(a.pp, a.micro_batches, a.interleave, s);
    };
    double stage0_held = 0;
    for (int s = 0; s < a.pp; ++s) {
      double held = 0;
      if (chunked) {
        if (s != 0 && s != last && bound_on(s) <= fullest) continue;  // can't be the fullest
        held = held_on(s);
      } else {
        held = layer_bytes(a.layers_on_stage(m, s)) * std::min<double>(a.pp - s, a.micro_batches);
      }
      if (s == 0) stage0_held = held;
      stage(s, held + (s == 0 ? r.embedding_bytes : 0.0));
    }
    r.layers_on_stage = a.layers_on_stage(m, 0);
    r.transformer_bytes = stage0_held;
  } else {
    stage(0, r.transformer_bytes + r.embedding_bytes);
    // The last stage: one micro-batch in flight under 1F1B; interleaved, its warm-up's (v − 1)·p
    // chunk-forwards and the steady state's one more (never more than the v·m there are).
    const double last_held =
        a.pp > 1 && a.interleave > 1
            ? interleaved_peak_chunks(a.pp, a.micro_batches, a.interleave, last) / v
            : 1.0;
    stage(last, r.per_layer_bytes * r.layers_on_stage * last_held);
  }
  r.loss_phase_bytes = last_saved + r.output_bytes;
  r.blocks_phase_bytes = fullest + r.layer_backward_bytes;
  const bool blocks = r.blocks_phase_bytes > r.loss_phase_bytes;
  r.peak_phase = blocks ? BackwardPhase::blocks : BackwardPhase::loss_and_head;
  r.peak_stage = blocks ? fullest_stage : last;
  r.peak_stage_bytes = std::max(r.loss_phase_bytes, r.blocks_phase_bytes);
}

ActivationResult activations(const ModelSpec& m, const ActivationSetup& a) {
  a.validate(m);
  ActivationResult r;
  r.setup = a;
  layer_inventory(m, a, /*dense_layer=*/false,
                  [&](const char* name, const char* formula, double bytes, Part) {
                    if (bytes > 0) r.layer_terms.push_back({name, formula, bytes});
                  });
  LayerActivationBytes layer = layer_activation_bytes_unchecked(m, a);
  layer.per_layer = 0;  // the itemized terms' sum
  for (const auto& term : r.layer_terms) layer.per_layer += term.bytes;
  stage_totals(m, a, layer, r);
  return r;
}

double activation_peak_bytes_unchecked(const ModelSpec& m, const ActivationSetup& a) {
  return activation_peak_bytes_unchecked(m, a, layer_activation_bytes_unchecked(m, a));
}

double activation_peak_bytes_unchecked(const ModelSpec& m, const ActivationSetup& a,
                                       const LayerActivationBytes& layer) {
  ActivationResult r;
  stage_totals(m, a, layer, r);
  return r.peak_stage_bytes;
}

std::int64_t longest_sequence(std::int64_t step, std::int64_t max_len,
                              const std::function<bool(std::int64_t)>& fits) {
  require_int(step >= 1, "sequence step", step, "must be >= 1");
  std::int64_t lo = 0, hi = max_len / step;  // in units of step
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid * step))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo * step;
}

std::string ActivationResult::convention() const {
  const auto& a = setup;
  std::string c = "activations: Korthikanti 2022 inventory";
  c += " | " + std::string(a.act_bytes == 2.0 ? "16-bit" : a.act_bytes == 4.0 ? "fp32" : "custom") +
       " activations";
  c += " | attention " + std::string(to_string(a.attention));
  c += " | recompute " + std::string(to_string(a.recompute));
  if (a.recompute_modules.mla_up_proj) c += " + Megatron-Core's mla_up_proj";
  if (a.recompute_modules.dense_mlp) c += " + Megatron-Core's mlp";
  c += a.dropout ? " | dropout masks counted" : " | no dropout";
  c += " | TP " + std::to_string(a.tp) + (a.sequence_parallel ? " +SP" : "");
  c += " CP " + std::to_string(a.cp) + " PP " + std::to_string(a.pp);
  if (a.interleave > 1) c += "×" + std::to_string(a.interleave);
  if (a.etp > 0 && a.etp != a.tp) c += " ETP " + std::to_string(a.etp);
  c += " | micro-batch " + std::to_string(a.micro_batch) + " seq " + std::to_string(a.seq);
  if (a.capacity_factor != 1.0) c += " | MoE capacity factor " + format_number(a.capacity_factor);
  c += a.eager_loss ? " | eager fp32 loss (12sbV/t)" : " | one fp32 logits tensor (4sbV/t)";
  if (a.linear_input_bytes > 0)
    c += " | low-precision linears' saved inputs at q = " + format_number(a.linear_input_bytes) +
         " B per element (Transformer Engine), the rest bf16";
  return c;
}

}  // namespace tally
