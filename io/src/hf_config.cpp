#include "tally/io/hf_config.hpp"

#include <algorithm>
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
constexpr std::int64_t kMaxRank = std::int64_t{1} << 20;        // MLA ranks and head dims
constexpr std::size_t kMaxNameChars = 64;

// Parts of a family's layers that its config class implies rather than states.
enum class Extras {
  none,
  qwen3_moe,    // q/k RMSNorm per head (modeling_qwen3_moe.py q_norm, k_norm)
  gpt_oss,      // sink logit per head, biased experts and router (modeling_gpt_oss.py)
  deepseek_v3,  // MLA, shared experts, dense leading layers (modeling_deepseek_v3.py)
};

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
  Extras extras = Extras::none;
};

// Llama, Mistral, Mixtral, Qwen2: transformers' modeling_<type>.py (RMSNorm, bias-free q/k/v/o and
// MLP, rotary); Qwen2 adds q/k/v biases (modeling_qwen2.py: bias=True on q_proj, k_proj, v_proj).
// GPT-2:
// modeling_gpt2.py (Conv1D with bias, LayerNorm, wpe table, lm_head tied to wte). GPT-NeoX:
// modeling_gpt_neox.py (biased linears, LayerNorm, rotary, untied embed_out). Qwen3-MoE, GPT-OSS,
// DeepSeek-V3: RMSNorm, rotary, untied by default (their configuration_*.py), with the Extras
// above; GPT-OSS's attention biases follow its attention_bias key (default true).
constexpr std::array<Family, 9> kFamilies{{
    {"llama", NormKind::rmsnorm, false, false, PositionKind::rotary, false, false, "silu"},
    {"mistral", NormKind::rmsnorm, false, false, PositionKind::rotary, false, false, "silu"},
    {"mixtral", NormKind::rmsnorm, false, false, PositionKind::rotary, false, false, "silu"},
    {"qwen2", NormKind::rmsnorm, false, true, PositionKind::rotary, false, false, "silu"},
    {"gpt2", NormKind::layernorm, true, false, PositionKind::learned, true, true, "gelu_new"},
    {"gpt_neox", NormKind::layernorm, true, false, PositionKind::rotary, false, false, "gelu"},
    {"qwen3_moe", NormKind::rmsnorm, false, false, PositionKind::rotary, false, false, "silu",
     Extras::qwen3_moe},
    {"gpt_oss", NormKind::rmsnorm, true, false, PositionKind::rotary, false, false, "silu",
     Extras::gpt_oss},
    {"deepseek_v3", NormKind::rmsnorm, false, false, PositionKind::rotary, false, false, "silu",
     Extras::deepseek_v3},
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

// Mixture of experts: E routed experts of width f (moe_intermediate_size, else intermediate_size),
// E_act per token; DeepSeek's n_shared_experts of width moe_intermediate_size (Qwen2-MoE's single
// shared_expert_intermediate_size otherwise) and first_k_dense_replace dense layers of width
// intermediate_size. Layer patterns other than "dense first, then every layer MoE" are refused.
void read_experts(const ObjectReader& r, ModelSpec& m) {
  std::string_view experts_key;
  for (const std::string_view key : {"num_local_experts", "num_experts", "n_routed_experts"})
    if (experts_key.empty() && r.has(key)) experts_key = key;
  if (experts_key.empty()) return;
  m.experts = r.integer(experts_key, 1, kMaxExperts);
  if (m.experts == 1) return;
  const std::string_view top_k_key = r.has("num_experts_per_tok") || !r.has("experts_per_token")
                                         ? "num_experts_per_tok"
                                         : "experts_per_token";  // GPT-OSS states both
  m.experts_per_token = r.integer(top_k_key, 1, m.experts);
  if (const auto f = r.opt_integer("moe_intermediate_size", 1, kMaxFfn)) m.ffn = *f;
  if (const auto n = r.opt_integer("n_shared_experts", 0, kMaxExperts); n && *n > 0) {
    m.shared_experts = *n;
    m.shared_expert_ffn = r.integer("moe_intermediate_size", 1, kMaxFfn);
  } else if (const auto f = r.opt_integer("shared_expert_intermediate_size", 0, kMaxFfn);
             f && *f > 0) {
    m.shared_experts = 1;
    m.shared_expert_ffn = *f;
  }
  m.dense_layers = r.opt_integer("first_k_dense_replace", 0, kMaxLayers).value_or(0);
  for (const std::string_view key : {"moe_layer_freq", "decoder_sparse_step"})
    if (const auto step = r.opt_integer(key, 1, kMaxLayers); step && *step != 1)
      detail::fail(r.source(), r.field(key), std::to_string(*step),
                   "only 1 (every layer after the dense ones is MoE) is modelled");
  if (const detail::json* only = r.opt_array("mlp_only_layers", std::size_t(kMaxLayers));
      only && !only->empty())
    detail::fail(r.source(), r.field("mlp_only_layers"), detail::show(*only),
                 "dense layers other than the first ones are not modelled (expected [])");
}

// DeepSeek's multi-head latent attention; q_lora_rank null (DeepSeek-V2-Lite) = no q compression.
void read_mla(const ObjectReader& r, ModelSpec& m) {
  if (!r.has("kv_lora_rank")) return;
  m.kv_lora_rank = r.integer("kv_lora_rank", 1, kMaxRank);
  m.q_lora_rank = r.opt_integer("q_lora_rank", 1, kMaxRank);
  m.qk_nope_head_dim = r.integer("qk_nope_head_dim", 1, kMaxRank);
  m.qk_rope_head_dim = r.integer("qk_rope_head_dim", 1, kMaxRank);
  m.v_head_dim = r.integer("v_head_dim", 1, kMaxRank);
}

void read_extras(const ObjectReader& r, const Family& fam, ModelSpec& m) {
  switch (fam.extras) {
    case Extras::none: break;
    case Extras::qwen3_moe:
      m.qk_norm = true;
      if (r.opt_boolean("attention_bias").value_or(false))
        detail::fail(r.source(), r.field("attention_bias"), "true",
                     "biases on Qwen3's q, k, v, o are not modelled (expected false)");
      break;
    case Extras::gpt_oss:
      m.attention_sinks = m.expert_bias = true;
      m.router_bias = m.is_moe();
      m.linear_bias = r.opt_boolean("attention_bias").value_or(true);
      // Note [GPT-OSS kernels] (core/operators.hpp): GptOssConfig's swiglu_limit (default 7.0)
      // and its YaRN attention factor change no count, only Megatron-Core's kernels.
      m.glu_clamp = r.opt_number("swiglu_limit", detail::Range{0, 1e6}).value_or(7.0);
      if (const auto rs = r.opt_object("rope_scaling")) {
        auto type = rs->opt_string("rope_type", kMaxNameChars);
        if (!type) type = rs->opt_string("type", kMaxNameChars);  // the older key
        if (type && *type == "yarn") {
          const auto given = rs->opt_number("attention_factor", detail::Range{1e-6, 100});
          m.rotary_attention_scale = given ? *given : yarn_attention_factor(
              rs->opt_number("factor", detail::Range{1e-6, 1e6}).value_or(1.0));
        }
      }
      break;
    case Extras::deepseek_v3: {
      read_mla(r, m);
      // noaux_tc routing (the V3 default) keeps a per-expert e_score_correction_bias.
      const auto method = r.opt_string("topk_method", kMaxNameChars).value_or("noaux_tc");
      m.router_bias = m.is_moe() && method == "noaux_tc";
      if (r.opt_boolean("attention_bias").value_or(false))
        detail::fail(r.source(), r.field("attention_bias"), "true",
                     "biases on MLA's projections are not modelled (expected false)");
      break;
    }
  }
}

// Sliding-window attention (Note [sliding window], core/src/operators.cpp): sliding_window (absent,
// null or 0 = none, as in Llama's and Mistral v0.3's configs) on the layers layer_types calls
// "sliding_attention"; without layer_types, GPT-OSS's default (GptOssConfig: every other layer,
// the first sliding) or on every layer from max_window_layers on (Qwen2's rule; none listed: every
// layer, Mistral v0.1), unless use_sliding_window is false. The Qwen config classes (Qwen2Config,
// Qwen3MoeConfig) default use_sliding_window to false and max_window_layers to 28, and their
// configs carry a sliding_window they do not use; a max_window_layers past L (Qwen2.5-14B: 70 of
// 48) leaves no layer windowed.
void read_window(const ObjectReader& r, const Family& fam, ModelSpec& m) {
  const bool qwen = fam.model_type == "qwen2" || fam.extras == Extras::qwen3_moe;
  const auto w = r.opt_integer("sliding_window", 0, kMaxPositions);  // 0: none
  if (!w || *w == 0 || !r.opt_boolean("use_sliding_window").value_or(!qwen)) return;
  std::int64_t windowed = 0;
  if (const detail::json* types = r.opt_array("layer_types", std::size_t(kMaxLayers))) {
    if (std::int64_t(types->size()) != m.layers)
      detail::fail(r.source(), r.field("layer_types"), std::to_string(types->size()) + " entries",
                   "must list num_hidden_layers = " + std::to_string(m.layers) + " layers");
    for (const detail::json& t : *types) {
      if (t == "sliding_attention")
        ++windowed;
      else if (t != "full_attention")
        detail::fail(r.source(), r.field("layer_types"), detail::show(t),
                     "each entry must be \"sliding_attention\" or \"full_attention\"");
    }
  } else if (fam.extras == Extras::gpt_oss) {
    windowed = (m.layers + 1) / 2;
  } else {
    const std::int64_t from =
        r.opt_integer("max_window_layers", 0, kMaxLayers).value_or(qwen ? 28 : 0);
    windowed = std::max<std::int64_t>(0, m.layers - from);
  }
  if (windowed == 0) return;
  m.attention_window = *w;
  m.window_layers = windowed;
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
  if (m.dense_layers > 0) m.dense_ffn = r.integer("intermediate_size", 1, kMaxFfn);
  if (const auto d = r.opt_integer("head_dim", 1, kMaxHidden); d && *d != m.head_dim())
    m.attn_head_dim = *d;  // Qwen3, GPT-OSS, Mistral-Nemo: a·d ≠ h
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
  read_extras(r, fam, m);
  if (!fam.gpt2_keys) read_window(r, fam, m);
  m.tied_embeddings = r.opt_boolean("tie_word_embeddings").value_or(fam.tied_default);
  m.dropout = trains_with_dropout(r);

  try {
    m.validate();
  } catch (const InvalidInput& e) {
    detail::rethrow_with_source(source, e);
  }
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
