// The shape of the engine's Llama-layout decoder (engine/runtime/llama_model.hpp builds it in
// libtorch) and its description for the core ledgers. Torch-free, so the CLI can use it.
//
// Legend: B = micro-batch, T = sequence, C = hidden (h), L = layers, a = heads, a_kv = key/value
// heads (GQA), d = C/a head dim, f = the SwiGLU width, V = vocabulary.
//
// The module (Hugging Face's LlamaForCausalLM, no dropout, no bias anywhere): token embedding
// (V, C); L blocks of [RMSNorm → causal self-attention with q_proj (C → a·d), k_proj and v_proj
// (C → a_kv·d), rotary positions on q and k, each key/value head shared by a/a_kv query heads,
// materialised (B, a, T, T) scores, o_proj (a·d → C) → residual, RMSNorm → down_proj(silu(
// gate_proj(x)) ⊙ up_proj(x)) with gate, up C → f and down f → C → residual]; final RMSNorm;
// an untied LM head (V, C) (Llama-2's tie_word_embeddings = false). Parameters:
// 2·V·C + L·(2C·a·d + 2C·a_kv·d + 3C·f + 2C) + C.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "tally/core/model.hpp"

namespace tally::engine {

// The decoder layouts `tally run qlora` builds: GPT-2's (gpt.hpp) or Llama's (this file).
enum class Arch { gpt, llama };
std::string_view to_string(Arch a);  // "gpt", "llama"
std::optional<Arch> parse_arch(std::string_view s);

// Meta's Llama FeedForward width for a model of width h (llama/model.py: hidden_dim = 4h, then
// int(2·hidden_dim/3), rounded up to a multiple of multiple_of = 256): 11008 for h = 4096
// (Llama-2-7B), 2048 for h = 768.
std::int64_t llama_ffn(std::int64_t hidden);

struct LlamaConfig {
  std::int64_t hidden = 768;     // C
  std::int64_t layers = 12;      // L
  std::int64_t heads = 12;       // a
  std::int64_t kv_heads = 12;    // a_kv, dividing a (a_kv < a: grouped-query attention)
  std::int64_t ffn = 2048;       // f = llama_ffn(768)
  std::int64_t vocab = 50257;    // V
  std::int64_t micro_batch = 1;  // B
  double rope_theta = 10000;     // rotary base (Llama-2's rope_theta)
  double norm_eps = 1e-5;        // RMSNorm ε (Llama-2's rms_norm_eps)
  // Throws InvalidInput naming the flag (--hidden, --kv-heads, --ffn, ...), the value and the
  // allowed range; d = C/a must be even (rotary pairs).
  void validate() const;
};

// The module as core sees it: SwiGLU MLP of width f, RMSNorm, rotary positions, untied head, no
// biases, no dropout, a_kv key/value heads. count_params(llama_model_spec(c)).total() equals the
// module's parameter count exactly (tests/engine/exp_qlora_llama.cpp).
ModelSpec llama_model_spec(const LlamaConfig& c);

}  // namespace tally::engine
