#include "tally/core/model.hpp"

#include <string>

#include "tally/core/types.hpp"

namespace tally {

namespace {
void require(bool ok, const std::string& field, std::int64_t value, const std::string& allowed) {
  if (!ok)
    throw InvalidInput("model field " + field + " = " + std::to_string(value) + ": " + allowed);
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
  require(hidden % heads == 0, "hidden_size", hidden,
          "must be divisible by num_attention_heads = " + std::to_string(heads));
  require(kv_heads > 0 && kv_heads <= heads && heads % kv_heads == 0, "num_key_value_heads",
          kv_heads, "must divide num_attention_heads = " + std::to_string(heads));
  require(ffn > 0, "intermediate_size", ffn, "must be > 0");
  require(vocab > 0, "vocab_size", vocab, "must be > 0");
  require(experts >= 1, "num_local_experts", experts, "must be >= 1");
  require(experts_per_token >= 1 && experts_per_token <= experts, "num_experts_per_tok",
          experts_per_token, "must be in [1, num_local_experts = " + std::to_string(experts) + "]");
  require(position != PositionKind::learned || max_positions > 0, "max_position_embeddings",
          max_positions, "must be > 0 for learned position embeddings");
}

// Counting follows the layer definitions of the Llama / Mistral / Mixtral / GPT-3 reference code:
//   attention: W_q h×h, W_k and W_v h×(a_kv·d), W_o h×h (+ biases when linear_bias; q, k, v
//              biases only when qkv_bias)
//   mlp:       gelu 2·h·f (+ f + h biases); swiglu 3·h·f; MoE: E experts + router h×E
//   norms:     2 per layer + 1 final, h each (×2 for LayerNorm's bias)
ParamCount count_params(const ModelSpec& m) {
  m.validate();
  ParamCount c;
  if (m.params_only) {
    c.embedding = 0;
    c.mlp = c.mlp_active = *m.nominal_params;  // unknown split: all counted in one item
    return c;
  }
  const double h = double(m.hidden), L = double(m.layers), f = double(m.ffn);
  const double kv = double(m.kv_heads * m.head_dim());
  const double bias = m.linear_bias ? 1.0 : 0.0;

  c.embedding = double(m.vocab) * h;
  if (m.position == PositionKind::learned) c.embedding += double(m.max_positions) * h;

  const double qkv_bias = m.qkv_bias && !m.linear_bias ? h + 2 * kv : 0.0;  // Qwen2
  const double attn = 2 * h * h + 2 * h * kv + bias * (2 * h + 2 * kv) + qkv_bias;
  c.attention = L * attn;

  const double expert = m.mlp == MlpKind::swiglu ? 3 * h * f : 2 * h * f + bias * (f + h);
  const double router = m.is_moe() ? h * double(m.experts) : 0.0;
  c.mlp = L * (double(m.experts) * expert + router);
  c.mlp_active = L * (double(m.experts_per_token) * expert + router);

  const double norm = m.norm == NormKind::layernorm ? 2 * h : h;
  c.norms = (2 * L + 1) * norm;

  c.output_head = m.tied_embeddings ? 0.0 : double(m.vocab) * h;
  return c;
}

double state_params(const ModelSpec& m) {
  if (m.nominal_params) return *m.nominal_params;
  return count_params(m).total();
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
