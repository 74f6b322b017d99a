// Decoder-only transformer architecture and its parameter count.
//
// Legend: h = hidden size, L = layers, a = attention heads, a_kv = key/value heads (GQA), d = h/a head
// dim, f = FFN intermediate size, V = vocabulary, E = experts, E_act = experts routed per token.
// Mixture of experts (docs/ledgers.md § Mixture of experts): E_s = shared experts of width f_s,
// always active; L_d = dense leading layers (FFN width f_d) before the L − L_d MoE layers.
// Multi-head latent attention (DeepSeek-V2/V3, MLA): r_q = q_lora_rank (q compression, optional),
// r_kv = kv_lora_rank, d_n = qk_nope_head_dim, d_r = qk_rope_head_dim, d_v = v_head_dim.
// Multi-token prediction (DeepSeek-V3 §2.2, Megatron-Core's MTP): D = mtp_layers modules after the
// main model, each predicting one token further (Note [multi-token prediction] in model.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tally/core/types.hpp"

namespace tally {

enum class MlpKind { gelu, swiglu };          // gelu: 2 matrices h×f; swiglu: 3 (gate, up, down)
enum class NormKind { layernorm, rmsnorm };   // layernorm has a bias vector, rmsnorm does not
enum class PositionKind { rotary, learned };  // learned: a max_positions × h table

struct ModelSpec {
  std::string name;
  std::int64_t hidden = 0;           // h
  std::int64_t layers = 0;           // L
  std::int64_t heads = 0;            // a
  std::int64_t kv_heads = 0;         // a_kv (== heads without GQA)
  std::int64_t ffn = 0;              // f, per expert
  std::int64_t vocab = 0;            // V
  std::int64_t max_positions = 0;    // only for PositionKind::learned
  std::int64_t experts = 1;          // E (1 = dense)
  std::int64_t experts_per_token = 1;  // E_act
  // Attention head dim when the config states one that differs from h / a (Qwen3: 128 with
  // h 2048, a 32; GPT-OSS: 64 with h 2880, a 64); 0 = h / a.
  std::int64_t attn_head_dim = 0;
  std::int64_t shared_experts = 0;     // E_s: always-active experts beside the routed ones
  std::int64_t shared_expert_ffn = 0;  // f_s, per shared expert (DeepSeek: moe_intermediate_size)
  std::int64_t dense_layers = 0;       // L_d: first_k_dense_replace, dense FFN layers first
  std::int64_t dense_ffn = 0;          // f_d: their intermediate_size
  // Router: h×E weights always; router_bias adds E per MoE layer (GPT-OSS's router Linear bias,
  // DeepSeek-V3's e_score_correction_bias — a parameter in the checkpoint, so counted in both
  // total and active, as every token's routing reads it).
  bool router_bias = false;
  bool expert_bias = false;            // biases on each expert's linears (GPT-OSS: 2f + h)
  bool attention_sinks = false;        // a learned sink logit per head per layer (GPT-OSS)
  // Sliding-window attention (Note [sliding window] in operators.cpp): `window_layers` of the L
  // layers let each token attend only to the `attention_window` tokens ending at itself (HF config
  // sliding_window, layer_types; 0 = no window). GPT-OSS: every other layer, 128; Mistral 7B
  // v0.1: every layer, 4096. Counts and memory are unchanged; flash kernels compute fewer scores.
  std::int64_t attention_window = 0;
  std::int64_t window_layers = 0;
  bool qk_norm = false;                // RMSNorm over q and k per head (Qwen3): 2·d per layer
  // YaRN's attention factor on the rotary cos and sin (HF rope_scaling rope_type "yarn":
  // attention_factor, else 0.1·ln(factor) + 1; GPT-OSS 0.1·ln 32 + 1 = 1.3466); 1 = none. Not
  // 1, Megatron-Core rotates q and k with its unfused kernels (Note [GPT-OSS kernels]).
  double rotary_attention_scale = 1.0;
  // The gated MLP's clamp (HF swiglu_limit: GPT-OSS 7.0, the gate clamped above, the linear half
  // to ±limit); 0 = none. Counts nothing; its kernels: Note [GPT-OSS kernels].
  double glu_clamp = 0.0;
  // MLA (kv_lora_rank > 0): W_q h×(a·(d_n+d_r)) or, with r_q, W_qa h×r_q + norm r_q + W_qb
  // r_q×(a·(d_n+d_r)); W_kva h×(r_kv+d_r) + norm r_kv; W_kvb r_kv×(a·(d_n+d_v)); W_o (a·d_v)×h.
  // D: multi-token-prediction modules trained beside the main model (DeepSeek-V3: 1, HF
  // num_nextn_predict_layers; Megatron-Core --mtp-num-layers); 0 = none. Each holds two norms, a
  // 2h → h projection, one transformer layer of the model's last kind and a final norm, and
  // shares the main model's embedding and LM head.
  std::int64_t mtp_layers = 0;
  std::optional<std::int64_t> q_lora_rank;  // r_q; none = q projected directly
  std::int64_t kv_lora_rank = 0;             // r_kv; 0 = not MLA
  std::int64_t qk_nope_head_dim = 0;         // d_n
  std::int64_t qk_rope_head_dim = 0;         // d_r
  std::int64_t v_head_dim = 0;               // d_v
  bool tied_embeddings = false;
  bool linear_bias = false;          // GPT-2/3 style biases on every linear layer
  bool qkv_bias = false;             // biases on q, k, v only (Qwen2)
  // Trains with dropout (GPT-2/3, the seed's generic model, Korthikanti's inventory); Llama,
  // Mistral and Qwen configs set every dropout to 0, so their activations have no masks.
  bool dropout = true;
  MlpKind mlp = MlpKind::swiglu;
  NormKind norm = NormKind::rmsnorm;
  PositionKind position = PositionKind::rotary;
  // A model described only by a parameter count (--params): no architecture, so no activations.
  bool params_only = false;
  // The parameter count the state ledger uses when the source states a round figure (the seed's
  // N = 7e9 for its generic 7B); otherwise the counted total.
  std::optional<double> nominal_params;

  std::int64_t head_dim() const {
    return attn_head_dim > 0 ? attn_head_dim : heads > 0 ? hidden / heads : 0;
  }
  // Per-head widths of the attention core: q·k over d_qk, values d_v (MLA: d_n + d_r and d_v).
  std::int64_t qk_dim() const { return is_mla() ? qk_nope_head_dim + qk_rope_head_dim : head_dim(); }
  std::int64_t value_dim() const { return is_mla() ? v_head_dim : head_dim(); }
  bool is_moe() const { return experts > 1; }
  bool is_mla() const { return kv_lora_rank > 0; }
  std::int64_t moe_layers() const { return is_moe() ? layers - dense_layers : 0; }
  // Throws InvalidInput naming the first field out of range.
  void validate() const;
};

// YaRN's default attention factor for a context scaling factor s (HF transformers
// _compute_yarn_parameters, get_mscale): 0.1·ln(s) + 1 for s > 1, else 1.
double yarn_attention_factor(double factor);

// Itemized parameter count (elements, not bytes).
struct ParamCount {
  double embedding = 0;       // token (+ learned position) embedding
  double attention = 0;       // all layers: q, k, v, o (+ biases, sinks; MLA's projections)
  double mlp = 0;             // all layers, all experts (+ shared experts, dense layers, router)
  double mlp_active = 0;      // all layers, E_act routed experts (+ the rest of mlp)
  // Inside mlp (and mtp): the E routed experts of every MoE layer (weights and biases), the part
  // expert parallelism shards (shared experts, the router and dense layers are replicated like
  // attention).
  double routed_experts = 0;
  double norms = 0;           // all layers + final norm (+ q/k norms, MLA's low-rank norms)
  double output_head = 0;     // 0 when tied
  // The D multi-token-prediction modules' own parameters (their layers, projections and norms;
  // the embedding and head are shared), of which mtp_norms are norm vectors and mtp_active the
  // part a token uses (E_act routed experts). Not in DeepSeek-V3's "671B" (main_model()).
  double mtp = 0, mtp_norms = 0, mtp_active = 0;
  double total() const { return embedding + attention + mlp + norms + output_head + mtp; }
  double main_model() const { return total() - mtp; }  // without the MTP modules
  // Active per token, counting the input embedding (Mistral's 12.9B for Mixtral, Qwen's 3.3B).
  double active() const {
    return embedding + attention + mlp_active + norms + output_head + mtp_active;
  }
  // Active per token without the input embedding, a lookup rather than a matmul — the convention
  // of DeepSeek-V3 (36.6B incl. the output head, README_WEIGHTS.md) and OpenAI's gpt-oss card.
  // Tied embeddings are the output head, so they stay.
  double active_without_embedding() const {
    return output_head > 0 ? active() - embedding : active();
  }
};

ParamCount count_params(const ModelSpec& m);

// N used by the state ledger: nominal_params if set, else the counted total.
double state_params(const ModelSpec& m);

// (attention + mlp) / total: the transformer layers' linear weights (with their biases, sinks and
// the router, under 0.1 % of them), which a low-precision recipe copies into its format; 1 for a
// params-only model (conservative: every parameter).
double gemm_weight_share(const ModelSpec& m);

// routed_experts / total: the share of the state ledger's N that expert parallelism shards
// (0 for a dense or params-only model). One rule for the planner, `memory` and `comm`.
double routed_expert_share(const ModelSpec& m);

// gemm_weight_share − routed_expert_share: the share of N that torchao's FSDP float8 all-gather
// gathers in fp8, its Float8Linear weights — every linear of the layers but MoE's grouped routed
// experts (Note [fp8 all-gather], core/src/comm.cpp). One rule for the planner and `comm`.
double float8_gather_share(const ModelSpec& m);

// Note [expert capacity]
// Slots one expert holds for the routed copies of `tokens` tokens, top_k choices each, spread over
// `experts` experts at capacity factor c_f (token dropping: copies past the slots are dropped):
// ⌈c_f · tokens · top_k / experts⌉, at least 1 — GShard (Lepikhin et al. 2021 §2.2, per group)
// and Megatron-Core's get_capacity (moe_utils.py, per source rank, with pad_to_capacity filling
// every slot so the all-to-all splits are equal). The operator model sizes an expert's GEMM with
// it over the tokens of all ep ranks; the engine's MoE layer slots each rank's tokens with it.
std::int64_t expert_capacity(double tokens, std::int64_t top_k, std::int64_t experts,
                             double capacity_factor);

// The expert split of a layout (Note [expert parallelism], core/src/comm.cpp; Note [expert
// tensor parallelism], parallel_groups.hpp): ep > 1, or an expert TP etp other than tp, needs a
// mixture-of-experts model; ep must divide the routed experts and etp their FFN width f. Throws
// InvalidInput naming --ep or --etp. (The rank arithmetic, e_t·e_p | t·c·d, is expert_layout's.)
void require_expert_split(const ModelSpec& m, int ep, int etp, int tp);

// Whether a recompute policy is defined for the model's layers: op_sac (types.hpp) only for dense
// layers with ordinary attention (no MoE, no MLA, an architecture, not --params).
bool recompute_applies(Recompute r, const ModelSpec& m);
// Throws InvalidInput naming --recompute when it does not apply.
void require_recompute_applies(Recompute r, const ModelSpec& m);

// A model known only by its size (`--params 7e9`): params_only, nominal_params = n.
ModelSpec model_from_params(double n);

}  // namespace tally
