#include "tally/io/hf_config.hpp"

#include <array>
#include <filesystem>
#include <optional>
#include <string>

#include "json_reader.hpp"
#include "tally/core/types.hpp"
#include "tally/io/files.hpp"

namespace tally::io {

namespace {

using detail::ObjectReader;

// Upper bounds well above any published model (largest h ≈ 25k, L ≈ 128, V ≈ 256k, E ≈ 256) and far
// below where counts stop being meaningful; they reject typos such as hidden_size 1e12.
constexpr std::int64_t kMaxHidden = std::int64_t{1} << 20;      // 1,048,576
constexpr std::int64_t kMaxLayers = std::int64_t{1} << 14;      // 16,384
constexpr std::int64_t kMaxHeads = std::int64_t{1} << 16;       // 65,536
constexpr std::int64_t kMaxFfn = std::int64_t{1} << 24;         // 16,777,216
constexpr std::int64_t kMaxVocab = std::int64_t{1} << 24;       // 16,777,216
constexpr std::int64_t kMaxPositions = std::int64_t{1} << 24;   // 16,777,216
constexpr std::int64_t kMaxExperts = std::int64_t{1} << 16;     // 65,536
constexpr std::size_t kMaxNameChars = 64;

// What model_type implies beyond the sizes in the file.
struct Family {
  std::string_view model_type;
  NormKind norm;
  bool linear_bias;
  bool qkv_bias;
  PositionKind position;
  bool tied_default;
  bool gpt2_keys;                 // n_embd / n_layer / n_head / n_inner / n_positions
  std::string_view default_act;   // Hugging Face's default for the config class
};

// Llama, Mistral, Mixtral, Qwen2: transformers' modeling_<type>.py (RMSNorm, bias-free q/k/v/o and
// MLP, rotary); Qwen2 adds q/k/v biases (modeling_qwen2.py: bias=True on q_proj, k_proj, v_proj).
// GPT-2:
// modeling_gpt2.py (Conv1D with bias, LayerNorm, wpe table, lm_head tied to wte). GPT-NeoX:
// modeling_gpt_neox.py (biased linears, LayerNorm, rotary, untied embed_out).
constexpr std::array<Family, 6> kFamilies{{
    {"llama", NormKind::rmsnorm, false, false, PositionKind::rotary, false, false, "silu"},
    {"mistral", NormKind::rmsnorm, false, false, PositionKind::rotary, false, false, "silu"},
    {"mixtral", NormKind::rmsnorm, false, false, PositionKind::rotary, false, false, "silu"},
    {"qwen2", NormKind::rmsnorm, false, true, PositionKind::rotary, false, false, "silu"},
    {"gpt2", NormKind::layernorm, true, false, PositionKind::learned, true, true, "gelu_new"},
    {"gpt_neox", NormKind::layernorm, true, false, PositionKind::rotary, false, false, "gelu"},
}};

const Family& family_for(const ObjectReader& r, const std::optional<std::string>& model_type) {
  if (!model_type) {
    const bool gpt2_names = r.has("n_embd") && !r.has("hidden_size");
    return gpt2_names ? kFamilies[4] : kFamilies[0];
  }
  for (const auto& f : kFamilies)
    if (f.model_type == *model_type) return f;
  std::string list;
  for (const auto& f : kFamilies) list += (list.empty() ? "" : ", ") + std::string(f.model_type);
  detail::fail(r.source(), "model_type", detail::show(detail::json(*model_type)),
               "supported: " + list + " (for other architectures use a preset or --params N)");
}

MlpKind mlp_for(const ObjectReader& r, std::string_view key, std::string_view fallback) {
  const std::string act = r.opt_string(key, kMaxNameChars).value_or(std::string(fallback));
  if (act == "silu" || act == "swish") return MlpKind::swiglu;
  if (act == "gelu" || act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast" ||
      act == "relu")
    return MlpKind::gelu;
  detail::fail(r.source(), r.field(key), detail::show(detail::json(act)),
               "supported: silu, swish (gated MLP); gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, "
               "relu (plain MLP)");
}

void read_gpt2_names(const ObjectReader& r, ModelSpec& m) {
  m.hidden = r.integer("n_embd", 1, kMaxHidden);
  m.layers = r.integer("n_layer", 1, kMaxLayers);
  m.heads = r.integer("n_head", 1, kMaxHeads);
  m.kv_heads = m.heads;
  // GPT2Config: n_inner None → 4 · n_embd.
  m.ffn = r.opt_integer("n_inner", 1, kMaxFfn).value_or(4 * m.hidden);
  m.vocab = r.integer("vocab_size", 1, kMaxVocab);
  const auto positions = r.opt_integer("n_positions", 1, kMaxPositions);
  m.max_positions = positions ? *positions : r.integer("n_ctx", 1, kMaxPositions);
  m.mlp = mlp_for(r, "activation_function", "gelu_new");
}

// Mixture of experts, Mixtral style: every layer has E routed experts of size f, E_act per token.
void read_experts(const ObjectReader& r, ModelSpec& m) {
  for (const std::string_view key :
       {"n_shared_experts", "shared_expert_intermediate_size", "first_k_dense_replace"}) {
    const detail::json* v = r.find(key);
    if (v && !(v->is_number() && v->get<double>() == 0))
      detail::fail(r.source(), r.field(key), detail::show(*v),
                   "shared experts and dense leading layers are not representable (expected 0 or "
                   "absent; use --params N)");
  }
  std::string_view experts_key;
  for (const std::string_view key : {"num_local_experts", "num_experts", "n_routed_experts"})
    if (experts_key.empty() && r.has(key)) experts_key = key;
  if (experts_key.empty()) return;
  m.experts = r.integer(experts_key, 1, kMaxExperts);
  if (m.experts == 1) return;
  m.experts_per_token = r.integer("num_experts_per_tok", 1, m.experts);
  if (const auto f = r.opt_integer("moe_intermediate_size", 1, kMaxFfn)) m.ffn = *f;
}

void read_hf_names(const ObjectReader& r, const Family& fam, ModelSpec& m) {
  m.hidden = r.integer("hidden_size", 1, kMaxHidden);
  m.layers = r.integer("num_hidden_layers", 1, kMaxLayers);
  m.heads = r.integer("num_attention_heads", 1, kMaxHeads);
  m.kv_heads = r.opt_integer("num_key_value_heads", 1, kMaxHeads).value_or(m.heads);
  m.vocab = r.integer("vocab_size", 1, kMaxVocab);
  read_experts(r, m);
  const bool moe_ffn = m.is_moe() && r.has("moe_intermediate_size");
  if (!moe_ffn) m.ffn = r.integer("intermediate_size", 1, kMaxFfn);
  if (fam.position == PositionKind::learned)
    m.max_positions = r.integer("max_position_embeddings", 1, kMaxPositions);
  m.mlp = mlp_for(r, "hidden_act", fam.default_act);
}

// Dropout from the config: any dropout probability above 0 (GPT-2's resid/attn/embd_pdrop 0.1);
// Llama, Mistral and Qwen configs state 0 or nothing, and train without it.
bool trains_with_dropout(const ObjectReader& r) {
  for (const std::string_view key :
       {"attention_dropout", "hidden_dropout", "resid_pdrop", "attn_pdrop", "embd_pdrop",
        "hidden_dropout_prob", "attention_probs_dropout_prob", "dropout"})
    if (const auto p = r.opt_number(key, detail::Range{0, 1}); p && *p > 0) return true;
  return false;
}

ModelSpec parse(std::string_view text, std::string_view source) {
  const detail::json root = detail::parse_object(text, source);
  const ObjectReader r(root, source);
  const auto model_type = r.opt_string("model_type", kMaxNameChars);
  const Family& fam = family_for(r, model_type);

  ModelSpec m;
  m.name = model_type ? *model_type : std::filesystem::path(source).stem().string();
  m.norm = fam.norm;
  m.linear_bias = fam.linear_bias;
  m.qkv_bias = fam.qkv_bias;
  m.position = fam.position;
  if (fam.gpt2_keys)
    read_gpt2_names(r, m);
  else
    read_hf_names(r, fam, m);
  m.tied_embeddings = r.opt_boolean("tie_word_embeddings").value_or(fam.tied_default);
  m.dropout = trains_with_dropout(r);

  try {
    m.validate();
  } catch (const InvalidInput& e) {
    detail::rethrow_with_source(source, e);
  }
  // Newer configs state head_dim; where it differs from h / a (Gemma, Mistral-Nemo) the attention
  // shapes are not the ones ModelSpec counts.
  if (const auto d = r.opt_integer("head_dim", 1, kMaxHidden); d && *d != m.head_dim())
    detail::fail(source, "head_dim", std::to_string(*d),
                 "must equal hidden_size / num_attention_heads = " + std::to_string(m.head_dim()));
  return m;
}

}  // namespace

ModelSpec parse_hf_config(std::string_view json_text, std::string_view source_name) {
  return detail::guarded(source_name, [&] { return parse(json_text, source_name); });
}

ModelSpec load_hf_config(const std::filesystem::path& path) {
  return parse_hf_config(read_text_file(path), path.string());
}

}  // namespace tally::io
