#include "tally/core/model.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "tally/core/types.hpp"

namespace tally {

namespace {
void require(bool ok, const std::string& field, std::int64_t value, const std::string& allowed) {
  if (!ok)
    throw InvalidInput("model field " + field + " = " + std::to_string(value) + ": " + allowed);
}

// MoE and MLA fields (model.hpp legend).
void validate_moe_and_mla(const ModelSpec& m) {
  const std::string dense_hint = "needs num_local_experts > 1 (a MoE model)";
  require(m.shared_experts >= 0, "n_shared_experts", m.shared_experts, "must be >= 0");
  require(m.shared_experts == 0 || m.is_moe(), "n_shared_experts", m.shared_experts, dense_hint);
  require(m.shared_experts == 0 || m.shared_expert_ffn > 0, "shared_expert_intermediate_size",
          m.shared_expert_ffn, "must be > 0 with shared experts");
  require(m.dense_layers >= 0 && m.dense_layers < m.layers, "first_k_dense_replace", m.dense_layers,
          "must be in [0, num_hidden_layers = " + std::to_string(m.layers) + ")");
  require(m.dense_layers == 0 || m.is_moe(), "first_k_dense_replace", m.dense_layers, dense_hint);
  require(m.dense_layers == 0 || m.dense_ffn > 0, "intermediate_size", m.dense_ffn,
          "must be > 0 for the dense leading layers");
  require(!m.router_bias || m.is_moe(), "router_bias", 1, dense_hint);
  require(m.kv_lora_rank >= 0, "kv_lora_rank", m.kv_lora_rank, "must be >= 0 (0 = no MLA)");
  if (!m.is_mla()) {
    require(!m.q_lora_rank, "q_lora_rank", m.q_lora_rank.value_or(0), "needs kv_lora_rank > 0 (MLA)");
    return;
  }
  require(!m.q_lora_rank || *m.q_lora_rank > 0, "q_lora_rank", m.q_lora_rank.value_or(0),
          "must be > 0 (or absent: no q compression)");
  require(m.qk_nope_head_dim > 0, "qk_nope_head_dim", m.qk_nope_head_dim, "must be > 0 with MLA");
  require(m.qk_rope_head_dim > 0, "qk_rope_head_dim", m.qk_rope_head_dim, "must be > 0 with MLA");
  require(m.v_head_dim > 0, "v_head_dim", m.v_head_dim, "must be > 0 with MLA");
  require(m.kv_heads == m.heads, "num_key_value_heads", m.kv_heads,
          "must equal num_attention_heads with MLA (every head has its own k, v)");
  require(!m.linear_bias && !m.qkv_bias && !m.attention_sinks && !m.qk_norm, "attention_bias", 1,
          "biases, sinks and q/k norms are not modelled with MLA");
}

}  // namespace

void ModelSpec::validate() const {
  if (params_only) {
    if (!nominal_params || !(*nominal_params > 0))
      throw InvalidInput("params must be positive");
    return;
  }
  require(hidden > 0, "hidden_size", hidden, "must be > 0");
  require(layers > 0, "num_hidden_layers", layers, "must be > 0");
  require(heads > 0, "num_attention_heads", heads, "must be > 0");
  require(attn_head_dim >= 0, "head_dim", attn_head_dim, "must be >= 0 (0 = hidden_size / heads)");
  require(attn_head_dim > 0 || hidden % heads == 0, "hidden_size", hidden,
          "must be divisible by num_attention_heads = " + std::to_string(heads));
  require(kv_heads > 0 && kv_heads <= heads && heads % kv_heads == 0, "num_key_value_heads",
          kv_heads, "must divide num_attention_heads = " + std::to_string(heads));
  require(ffn > 0, "intermediate_size", ffn, "must be > 0");
  require(vocab > 0, "vocab_size", vocab, "must be > 0");
  require(experts >= 1, "num_local_experts", experts, "must be >= 1");
  require(experts_per_token >= 1 && experts_per_token <= experts, "num_experts_per_tok",
          experts_per_token, "must be in [1, num_local_experts = " + std::to_string(experts) + "]");
  validate_moe_and_mla(*this);
  require(attention_window >= 0, "sliding_window", attention_window, "must be >= 0 (0 = none)");
  require(window_layers >= 0 && window_layers <= layers, "sliding-window layers", window_layers,
          "must be in [0, num_hidden_layers = " + std::to_string(layers) + "]");
  require((attention_window > 0) == (window_layers > 0), "sliding-window layers", window_layers,
          "must be > 0 exactly when sliding_window is (it is " + std::to_string(attention_window) +
              ")");
  require(mtp_layers >= 0 && mtp_layers <= layers, "mtp_num_layers", mtp_layers,
          "must be in [0, num_hidden_layers = " + std::to_string(layers) + "]");
  require(position != PositionKind::learned || max_positions > 0, "max_position_embeddings",
          max_positions, "must be > 0 for learned position embeddings");
  require_real(std::isfinite(rotary_attention_scale) && rotary_attention_scale > 0 &&
                   rotary_attention_scale <= 100,
               "rope_scaling attention_factor", rotary_attention_scale, "must be in (0, 100]");
  require_real(rotary_attention_scale == 1.0 || position == PositionKind::rotary,
               "rope_scaling attention_factor", rotary_attention_scale,
               "must be 1 without rotary embeddings");
  require_real(std::isfinite(glu_clamp) && glu_clamp >= 0 && glu_clamp <= 1e6, "swiglu_limit",
               glu_clamp, "must be in [0, 1e6] (0 = none)");
  require_real(glu_clamp == 0 || mlp == MlpKind::swiglu, "swiglu_limit", glu_clamp,
               "must be 0 without a gated MLP");
}

namespace {

// Attention of one layer, its parameters outside the norms.
double attention_params(const ModelSpec& m) {
  const double h = double(m.hidden), a = double(m.heads);
  if (m.is_mla()) {
    const double dn = double(m.qk_nope_head_dim), dr = double(m.qk_rope_head_dim);
    const double dv = double(m.v_head_dim), rkv = double(m.kv_lora_rank);
    const double q = m.q_lora_rank ? h * double(*m.q_lora_rank) + double(*m.q_lora_rank) * a * (dn + dr)
                                   : h * a * (dn + dr);
    return q + h * (rkv + dr) + rkv * a * (dn + dv) + a * dv * h;
  }
  const double hq = double(m.heads * m.head_dim()), kv = double(m.kv_heads * m.head_dim());
  const double bias = m.linear_bias ? 1.0 : 0.0;
  const double qkv_bias = m.qkv_bias && !m.linear_bias ? hq + 2 * kv : 0.0;  // Qwen2
  const double sinks = m.attention_sinks ? a : 0.0;
  return 2 * h * hq + 2 * h * kv + bias * (hq + h + 2 * kv) + qkv_bias + sinks;
}

// One MLP of width f (an expert, a shared expert or a dense layer's FFN).
double mlp_params(const ModelSpec& m, double f, bool biased) {
  const double h = double(m.hidden), bias = biased ? 1.0 : 0.0;
  return m.mlp == MlpKind::swiglu ? 3 * h * f + bias * (2 * f + h) : 2 * h * f + bias * (f + h);
}

// Norm vectors of one layer: the two block norms, q/k norms, MLA's low-rank norms.
double layer_norm_params(const ModelSpec& m) {
  const double h = double(m.hidden);
  double n = m.norm == NormKind::layernorm ? 2 * (2 * h) : 2 * h;
  if (m.qk_norm) n += 2 * double(m.head_dim());
  if (m.is_mla()) n += double(m.kv_lora_rank) + double(m.q_lora_rank.value_or(0));
  return n;
}

}  // namespace

// Counting follows the layer definitions of the Llama / Mistral / Mixtral / GPT-3 reference code:
//   attention: W_q h×(a·d), W_k and W_v h×(a_kv·d), W_o (a·d)×h (+ biases when linear_bias; q, k,
//              v biases only when qkv_bias; a sink logit per head with attention_sinks); MLA as
//              in model.hpp
//   mlp:       gelu 2·h·f (+ f + h biases); swiglu 3·h·f (+ 2f + h biases); MoE: L_d dense layers
//              of width f_d, then per MoE layer E experts + E_s shared experts + router h×E (+ E)
//   norms:     2 per layer + 1 final, h each (×2 for LayerNorm's bias); q/k norms d each; MLA's
//              r_q and r_kv norms
ParamCount count_params(const ModelSpec& m) {
  m.validate();
  ParamCount c;
  if (m.params_only) {
    c.embedding = 0;
    c.mlp = c.mlp_active = *m.nominal_params;  // unknown split: all counted in one item
    return c;
  }
  const double h = double(m.hidden), L = double(m.layers);

  c.embedding = double(m.vocab) * h;
  if (m.position == PositionKind::learned) c.embedding += double(m.max_positions) * h;

  c.attention = L * attention_params(m);

  const double expert = mlp_params(m, double(m.ffn), m.linear_bias || m.expert_bias);
  // One layer's MLP of the model's last kind: all of it, what a token uses, the routed experts.
  double layer_mlp = expert, layer_mlp_active = expert, layer_routed = 0;
  if (!m.is_moe()) {
    c.mlp = c.mlp_active = L * expert;
  } else {
    const double E = double(m.experts), moe_L = double(m.moe_layers());
    const double router = h * E + (m.router_bias ? E : 0.0);
    const double shared = double(m.shared_experts) *
                          mlp_params(m, double(m.shared_expert_ffn), m.linear_bias || m.expert_bias);
    const double dense = double(m.dense_layers) * mlp_params(m, double(m.dense_ffn), m.linear_bias);
    layer_routed = E * expert;
    layer_mlp = layer_routed + shared + router;
    layer_mlp_active = double(m.experts_per_token) * expert + shared + router;
    c.routed_experts = moe_L * layer_routed;
    c.mlp = dense + moe_L * layer_mlp;
    c.mlp_active = dense + moe_L * layer_mlp_active;
  }

  c.norms = L * layer_norm_params(m) + (m.norm == NormKind::layernorm ? 2 * h : h);

  c.output_head = m.tied_embeddings ? 0.0 : double(m.vocab) * h;

  // Note [multi-token prediction]: DeepSeek-V3 §2.2 (Liu et al. 2024, Fig. 3) — module k takes the
  // main model's (or module k−1's) final hidden state and the embedding of token i + k, normalises
  // each (RMSNorm), concatenates them, projects 2h → h (M_k, no bias), runs one transformer block
  // and, through its own final norm, the shared output head; the embedding and head are the main
  // model's. DeepSeek-V3's block is a MoE layer (its checkpoint's layer 61: 256 experts); Megatron-
  // Core builds MTP layers with the decoder's last layer spec (multi_token_prediction.py), so here
  // the block is the model's last kind: MoE when the model has MoE layers. README_WEIGHTS.md: "MTP
  // Modules: 11.5B unique parameters" (test_model.cpp checks the count).
  if (m.mtp_layers > 0) {
    const double D = double(m.mtp_layers), norm = m.norm == NormKind::layernorm ? 2 * h : h;
    // The block's norms, the norms of h and of the embedding, and the module's final norm.
    const double norms = layer_norm_params(m) + 3 * norm;
    const double own = attention_params(m) + 2 * h * h + norms;  // + the projection M_k
    c.mtp = D * (own + layer_mlp);
    c.mtp_active = D * (own + layer_mlp_active);
    c.mtp_norms = D * norms;
    c.routed_experts += D * layer_routed;
  }
  return c;
}

double state_params(const ModelSpec& m) {
  if (m.nominal_params) return *m.nominal_params;
  return count_params(m).total();
}

double gemm_weight_share(const ModelSpec& m) {
  if (m.params_only) return 1.0;
  const ParamCount c = count_params(m);
  return (c.attention + c.mlp + c.mtp - c.mtp_norms) / c.total();
}

double yarn_attention_factor(double factor) {
  require_real(std::isfinite(factor) && factor > 0 && factor <= 1e6, "rope_scaling factor",
               factor, "must be in (0, 1e6]");
  return factor <= 1 ? 1.0 : 0.1 * std::log(factor) + 1.0;
}

double routed_expert_share(const ModelSpec& m) {
  if (m.params_only || !m.is_moe()) return 0.0;
  const ParamCount c = count_params(m);
  return c.routed_experts / c.total();
}

double float8_gather_share(const ModelSpec& m) {
  return gemm_weight_share(m) - routed_expert_share(m);
}

std::int64_t expert_capacity(double tokens, std::int64_t top_k, std::int64_t experts,
                             double capacity_factor) {
  require_real(std::isfinite(tokens) && tokens >= 0, "tokens", tokens, "must be >= 0");
  require_int(top_k >= 1 && top_k <= experts, "top_k", top_k,
              [&] { return "must be in [1, experts = " + std::to_string(experts) + "]"; });
  require_real(std::isfinite(capacity_factor) && capacity_factor >= 1 && capacity_factor <= 64,
               "capacity_factor", capacity_factor, "must be in [1, 64]");
  const double slots = std::ceil(capacity_factor * tokens * double(top_k) / double(experts));
  return std::max<std::int64_t>(1, std::int64_t(slots));
}

void require_expert_split(const ModelSpec& m, int ep, int etp, int tp) {
  const bool moe = !m.params_only && m.is_moe();
  require_int(ep >= 1, "--ep", ep, "must be >= 1");
  require_int(etp >= 1, "--etp", etp, "must be >= 1");
  require_int(ep == 1 || moe, "--ep", ep,
              [&] { return m.name + " is not a mixture-of-experts model"; });
  require_int(etp == tp || moe, "--etp", etp,
              [&] {
                return m.name + " is not a mixture-of-experts model (expert TP is the MLP's TP)";
              });
  if (!moe) return;
  require_int(m.experts % ep == 0, "--ep", ep,
              [&] { return "must divide the routed experts (" + std::to_string(m.experts) + ")"; });
  require_int(m.ffn % etp == 0, "--etp", etp,
              [&] {
                return "must divide the experts' FFN width (moe_intermediate_size " +
                       std::to_string(m.ffn) + ")";
              });
}

bool recompute_applies(Recompute r, const ModelSpec& m) {
  return r != Recompute::op_sac || (!m.params_only && !m.is_moe() && !m.is_mla());
}

void require_recompute_applies(Recompute r, const ModelSpec& m) {
  if (!recompute_applies(r, m))
    throw InvalidInput("--recompute op-sac: torchtitan's op-level selective AC is defined here for "
                       "dense layers with ordinary attention; " + m.name +
                       " has " + (m.is_moe() ? "experts" : m.is_mla() ? "MLA" : "no architecture") +
                       " (use full, selective or save-matmuls)");
}

ModelSpec model_from_params(double n) {
  if (!(n > 0)) throw InvalidInput("params = " + std::to_string(n) + ": must be positive");
  ModelSpec m;
  m.name = "params-only";
  m.params_only = true;
  m.nominal_params = n;
  return m;
}

}  // namespace tally
