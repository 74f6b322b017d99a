// The engine's GPT-style decoder in libtorch and the optimizer that trains it (internal: includes
// torch). Shape and legend: tally/engine/gpt.hpp (B, T, C, L, a, d = C/a, V).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

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

// Note [mixed-precision Adam]
// Adam with its state created eagerly in the constructor — PyTorch's torch.optim.Adam creates m and
// v lazily at the first step(), which would move the "+8N / +12N after optimizer init" of the
// ledger into the step. Per parameter it holds fp32 m and v (8 bytes/param) and, when the parameter
// is 16-bit, an fp32 master copy (4 bytes/param): the update runs on the master and is rounded into
// the bf16 parameter (seed A1: 2 + 2 + 8 + 4). fp32 parameters are their own master.
struct AdamOptions {
  double lr = 1e-4;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

class MasterAdam {
 public:
  MasterAdam(const std::vector<torch::Tensor>& params, const AdamOptions& options = {});
  void step();  // skips parameters without a gradient
  void zero_grad();  // drops the gradients (set_to_none)

 private:
  struct Slot {
    torch::Tensor param;   // (any shape) the model's parameter, fp32 or 16-bit
    torch::Tensor master;  // same shape, fp32; undefined when param is fp32
    torch::Tensor m, v;    // same shape, fp32
  };
  std::vector<Slot> slots_;
  AdamOptions options_;
  std::int64_t steps_ = 0;
};

}  // namespace tally::engine
