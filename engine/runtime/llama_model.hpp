// The engine's Llama-layout decoder in libtorch (internal: includes torch), fp32: the source a
// LoRA / QLoRA model is built from (lora_model.hpp) and the reference its loss is compared with.
// Shape and legend: tally/engine/llama.hpp (B, T, C, L, a, a_kv, d = C/a, f, V).
//
// The pieces below are shared with the LoRA model, so both run the very same computation; each
// follows its input's dtype (fp32 or bf16), with the statistics of RMSNorm and the rotary angles in
// fp32 as Hugging Face's LlamaRMSNorm and LlamaRotaryEmbedding compute them. Their autograd keeps
// what fused kernels keep, which is what core's activation inventory counts (Q, K, V at their
// widths, the norm's input): RMSNorm its input and 1/rms (Note [rms norm]), rotary the tables only,
// GQA no copy of the key/value heads (HF's eager repeat_kv copies them; flash attention and
// PyTorch's grouped SDPA do not).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>

#include "tally/engine/llama.hpp"

namespace tally::engine {

// Note [rms norm]
// RMSNorm (Zhang & Sennrich 2019; HF LlamaRMSNorm): x / √(mean(x²) + ε) in fp32, back in x's
// dtype, times the weight (cast to x's dtype). x (…, C), weight (C). An autograd function that
// saves x and the fp32 1/rms of each row (B·T·4 bytes), as torch's layer_norm saves x, mean and
// rstd; its backward is the norm's closed form in fp32.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// Note [rotary positions]
// RoPE (Su et al. 2021, "RoFormer", eq. 34) in Hugging Face's layout (rotate_half): the head's
// dimension i < d/2 pairs with i + d/2, and at position t the pair (x_i, x_{i+d/2}) turns by the
// angle t·θ^(−2i/d): x_i' = x_i·cos − x_{i+d/2}·sin, x_{i+d/2}' = x_{i+d/2}·cos + x_i·sin. The
// tables are (T, d): cos and sin of [t·θ^(−2i/d)] for i in [0, d/2) twice over, made in fp32 and
// cast to `dtype`. q·k after rotation depends on positions only through their difference.
// apply_rotary is an autograd function that keeps only the tables: backward turns the gradient by
// the opposite angles, as Megatron's FusedRoPEFunc and flash-attn's ApplyRotaryEmb do.
std::pair<torch::Tensor, torch::Tensor> rotary_tables(std::int64_t T, std::int64_t head_dim,
                                                      double theta, torch::ScalarType dtype);
// x (B, heads, T, d) rotated by the tables (T, d).
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin);

// Causal self-attention of Llama: q (B, T, a·d), k and v (B, T, a_kv·d) → (B, T, a·d). Rotary on
// q and k; each key/value head serves a/a_kv consecutive query heads (HF repeat_kv's grouping,
// computed as one matmul per group, without copying k and v); softmax(q·kᵀ/√d, causal)·v with
// materialised (B, a, T, T) scores.
torch::Tensor llama_attention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, std::int64_t heads, std::int64_t kv_heads,
                              const torch::Tensor& causal_mask, const torch::Tensor& cos,
                              const torch::Tensor& sin);

// One block: x + o(attn(norm_1(x))), then + down(silu(gate(n)) ⊙ up(n)), n = norm_2(h).
struct LlamaBlockImpl : torch::nn::Module {
  explicit LlamaBlockImpl(const LlamaConfig& c);
  // x (B, T, C); causal_mask (T, T) bool; cos, sin (T, d) from rotary_tables.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& causal_mask,
                        const torch::Tensor& cos, const torch::Tensor& sin);

  std::int64_t heads, kv_heads;
  double eps;
  torch::Tensor input_layernorm, post_attention_layernorm;  // RMSNorm weights (C)
  torch::nn::Linear q_proj{nullptr};     // weight (a·d, C)
  torch::nn::Linear k_proj{nullptr};     // weight (a_kv·d, C)
  torch::nn::Linear v_proj{nullptr};     // weight (a_kv·d, C)
  torch::nn::Linear o_proj{nullptr};     // weight (C, a·d)
  torch::nn::Linear gate_proj{nullptr};  // weight (f, C)
  torch::nn::Linear up_proj{nullptr};    // weight (f, C)
  torch::nn::Linear down_proj{nullptr};  // weight (C, f)
};
TORCH_MODULE(LlamaBlock);

struct LlamaImpl : torch::nn::Module {
  // Hugging Face's LlamaPreTrainedModel init: every linear and the embedding N(0, 0.02), the
  // RMSNorm weights 1; drawn from torch's default generator.
  explicit LlamaImpl(const LlamaConfig& config);
  // idx, targets (B, T) int64 → mean cross-entropy (fp32 scalar; logits upcast, lm_loss).
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets);
  std::int64_t parameter_count() const;  // Σ numel over parameters()

  LlamaConfig config;
  torch::nn::Embedding embed_tokens{nullptr};  // weight (V, C)
  torch::nn::ModuleList layers{nullptr};       // L × LlamaBlock
  torch::Tensor norm;                          // final RMSNorm weight (C)
  torch::nn::Linear lm_head{nullptr};          // weight (V, C), untied
};
TORCH_MODULE(Llama);

}  // namespace tally::engine
