// The engine's GPT-style decoder in libtorch (internal: includes torch); optimizer_torch.hpp
// trains it. Shape and legend: tally/engine/gpt.hpp (B, T, C, L, a, d = C/a, V).
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "tally/engine/gpt.hpp"

namespace tally::engine {

// One pre-norm block: x + attn(ln_1(x)), then + mlp(ln_2(x)). No dropout.
struct GptBlockImpl : torch::nn::Module {
  GptBlockImpl(std::int64_t hidden, std::int64_t heads);
  // x: (B, T, C); causal_mask: (T, T) bool, true where a query must not see a key (the future).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& causal_mask);

  std::int64_t heads;
  torch::nn::LayerNorm ln_1{nullptr};     // weight, bias (C)
  torch::nn::Linear c_attn{nullptr};      // weight (3C, C), bias (3C): q, k, v
  torch::nn::Linear c_proj{nullptr};      // weight (C, C), bias (C)
  torch::nn::LayerNorm ln_2{nullptr};     // weight, bias (C)
  torch::nn::Linear c_fc{nullptr};        // weight (4C, C), bias (4C)
  torch::nn::Linear mlp_proj{nullptr};    // weight (C, 4C), bias (C)
};
TORCH_MODULE(GptBlock);

struct GptImpl : torch::nn::Module {
  explicit GptImpl(const GptConfig& config);
  // idx, targets: (B, T) int64 token ids. Returns the mean cross-entropy, an fp32 scalar: the logits
  // (B, T, V) are computed in the parameters' dtype and upcast to fp32 for the loss (Megatron's
  // convention, the 4sbV of Korthikanti §4.3), so only the fp32 log-probabilities are saved.
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets);
  std::int64_t parameter_count() const;  // Σ numel over parameters()

  GptConfig config;
  torch::nn::Embedding wte{nullptr};      // weight (V, C), tied with the LM head
  torch::Tensor wpe;                      // (T, C) learned positions
  torch::nn::ModuleList blocks{nullptr};  // L × GptBlock
  torch::nn::LayerNorm ln_f{nullptr};     // weight, bias (C)
};
TORCH_MODULE(Gpt);

}  // namespace tally::engine
