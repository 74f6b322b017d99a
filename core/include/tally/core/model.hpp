// Decoder-only transformer architecture and its parameter count.
//
// Legend: h = hidden size, L = layers, a = attention heads, a_kv = key/value heads (GQA), d = h/a head
// dim, f = FFN intermediate size, V = vocabulary, E = experts, E_act = experts routed per token.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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

  std::int64_t head_dim() const { return heads > 0 ? hidden / heads : 0; }
  bool is_moe() const { return experts > 1; }
  // Throws InvalidInput naming the first field out of range.
  void validate() const;
};

// Itemized parameter count (elements, not bytes).
struct ParamCount {
  double embedding = 0;       // token (+ learned position) embedding
  double attention = 0;       // all layers: q, k, v, o (+ biases)
  double mlp = 0;             // all layers, all experts (+ router)
  double mlp_active = 0;      // all layers, E_act experts (+ router)
  double norms = 0;           // all layers + final norm
  double output_head = 0;     // 0 when tied
  double total() const { return embedding + attention + mlp + norms + output_head; }
  double active() const { return embedding + attention + mlp_active + norms + output_head; }
};

ParamCount count_params(const ModelSpec& m);

// N used by the state ledger: nominal_params if set, else the counted total.
double state_params(const ModelSpec& m);

// A model known only by its size (`--params 7e9`): params_only, nominal_params = n.
ModelSpec model_from_params(double n);

}  // namespace tally
