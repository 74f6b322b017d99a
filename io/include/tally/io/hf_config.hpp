// Hugging Face config.json → ModelSpec (DESIGN.md §3 "Model input").
//
// Supported model_type values and what each implies (the file states sizes, not these choices):
//   llama, mistral, mixtral, qwen2   RMSNorm, no linear biases, rotary positions
//   gpt2                             LayerNorm, linear biases, learned positions, tied embeddings
//   gpt_neox                         LayerNorm, linear biases, rotary positions
//   (absent)                         GPT-2 if the file uses GPT-2 key names (n_embd …), else Llama's
// Any other model_type is rejected rather than guessed (use a preset or --params N instead).
//
// Keys read (null counts as absent):
//   hidden_size, num_hidden_layers, num_attention_heads      required
//   num_key_value_heads                                      default num_attention_heads
//   intermediate_size                                        required (dense)
//   vocab_size                                               required
//   tie_word_embeddings                                      default false (gpt2: true)
//   hidden_act  silu|swish → gated SwiGLU MLP (3 matrices); gelu|gelu_new|gelu_pytorch_tanh|
//               gelu_fast|relu → plain MLP (2 matrices). Default silu (gpt2: gelu_new, gpt_neox: gelu)
//   head_dim    if present, must equal hidden_size / num_attention_heads
//   MoE: num_local_experts | num_experts | n_routed_experts, num_experts_per_tok (required when
//        experts > 1), moe_intermediate_size (else intermediate_size). Shared experts or leading dense
//        layers (n_shared_experts, shared_expert_intermediate_size, first_k_dense_replace) are not
//        representable and are rejected.
//   GPT-2 names: n_embd, n_layer, n_head, n_inner (absent or null → 4·n_embd), n_positions (or
//        n_ctx), vocab_size, activation_function.
// Other keys (rope_theta, torch_dtype, …) are ignored: a config.json carries many we do not need.
//
// Hostile input (DESIGN.md §5): at most kMaxJsonFileBytes, nesting ≤ kMaxJsonDepth, every size
// bounds-checked; every failure is tally::InvalidInput "<file>: <field> = <value>: <allowed range>".
// The result has passed ModelSpec::validate(). Name: model_type, else the file's stem.
#pragma once

#include <filesystem>
#include <string_view>

#include "tally/core/model.hpp"

namespace tally::io {

ModelSpec load_hf_config(const std::filesystem::path& path);
// source_name names the input in messages (a path, or e.g. "<stdin>").
ModelSpec parse_hf_config(std::string_view json_text, std::string_view source_name);

}  // namespace tally::io
