// The engine's GPT-style decoder in libtorch (internal: includes torch); optimizer_torch.hpp
// trains it. Shape and legend: tally/engine/gpt.hpp (B, T, C, L, a, d = C/a, V).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>

#include "tally/engine/gpt.hpp"

namespace tally::engine {

// How a block runs its four linear layers: given the layer and its input (B, T, in), the output
// (B, T, out). Unset (the default): the layer's own forward, x·Wᵀ + b. The fp8 run
// (engine/experiments/fp8.cpp) passes a GEMM on the weights' low-precision copies.
using LinearForward = std::function<torch::Tensor(torch::nn::Linear&, const torch::Tensor&)>;

// One pre-norm block: x + attn(ln_1(x)), then + mlp(ln_2(x)). No dropout.
struct GptBlockImpl : torch::nn::Module {
  GptBlockImpl(std::int64_t hidden, std::int64_t heads);
  // x: (B, T, C); causal_mask: (T, T) bool, true where a query must not see a key (the future).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& causal_mask,
                        const LinearForward& linear = {});

  std::int64_t heads;
  torch::nn::LayerNorm ln_1{nullptr};     // weight, bias (C)
  torch::nn::Linear c_attn{nullptr};      // weight (3C, C), bias (3C): q, k, v
  torch::nn::Linear c_proj{nullptr};      // weight (C, C), bias (C)
  torch::nn::LayerNorm ln_2{nullptr};     // weight, bias (C)
  torch::nn::Linear c_fc{nullptr};        // weight (4C, C), bias (4C)
  torch::nn::Linear mlp_proj{nullptr};    // weight (C, 4C), bias (C)
};
TORCH_MODULE(GptBlock);

// Pieces the single-process model and the tensor-parallel one (tp_model.hpp) share, so a TP
// shard runs the very computation of the heads it holds:
// (T, T) bool: key j is in query i's future. One tensor for all layers (T² bytes).
torch::Tensor causal_mask(std::int64_t T);
// qkv: (B, T, 3·C') holding q, k, v of `heads` heads of d = C'/heads each (C' = C, or C/t on a
// TP rank); returns softmax(q·kᵀ/√d, causal) · v re-laid out as (B, T, C').
torch::Tensor causal_self_attention(const torch::Tensor& qkv, std::int64_t heads,
                                    const torch::Tensor& causal_mask);
// The same from separate q, k, v, each (B, T, C') (LoRA's q_proj, k_proj, v_proj, lora_model.hpp).
torch::Tensor causal_self_attention(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, std::int64_t heads,
                                    const torch::Tensor& causal_mask);
// Mean cross-entropy of logits (B, T, V) against targets (B, T), in at least fp32: bf16 / fp16
// logits are upcast (Megatron's convention), float64 stays float64.
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets);

struct GptImpl : torch::nn::Module {
  explicit GptImpl(const GptConfig& config);
  // idx, targets: (B, T) int64 token ids. Returns the mean cross-entropy, an fp32 scalar: the logits
  // (B, T, V) are computed in the parameters' dtype and upcast to fp32 for the loss (Megatron's
  // convention, the 4sbV of Korthikanti §4.3), so only the fp32 log-probabilities are saved;
  // float64 parameters keep the loss in float64 (lm_loss).
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets,
                        const LinearForward& linear = {});
  std::int64_t parameter_count() const;  // Σ numel over parameters()

  GptConfig config;
  torch::nn::Embedding wte{nullptr};      // weight (V, C), tied with the LM head
  torch::Tensor wpe;                      // (T, C) learned positions
  torch::nn::ModuleList blocks{nullptr};  // L × GptBlock
  torch::nn::LayerNorm ln_f{nullptr};     // weight, bias (C)
};
TORCH_MODULE(Gpt);

}  // namespace tally::engine
