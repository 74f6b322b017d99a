// Shared by the QLoRA run's tests (exp_qlora.cpp, exp_qlora_llama.cpp): every check of a run holds,
// each failure naming the check, its measured value, relation and limit; one fixed batch of tokens
// over a vocabulary of 256 and a model's loss on it.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <utility>

#include "lora_model.hpp"
#include "tally/engine/experiments/qlora.hpp"

namespace tally::test {

inline void expect_every_check_ok(const engine::QloraResult& r) {
  for (const auto& c : engine::qlora_checks(r))
    EXPECT_TRUE(c.ok) << c.id << " " << c.what << ": " << c.measured << " " << c.relation << " "
                      << c.limit;
}

// B sequences of T + 1 tokens from a fixed seed: (inputs, next-token targets).
inline std::pair<torch::Tensor, torch::Tensor> batch(std::int64_t B, std::int64_t T) {
  torch::manual_seed(99);
  const auto seq = torch::randint(256, {B, T + 1}, torch::kLong);
  return {seq.narrow(1, 0, T).contiguous(), seq.narrow(1, 1, T).contiguous()};
}

inline double loss_of(const engine::LoraModel& m,
                      const std::pair<torch::Tensor, torch::Tensor>& b) {
  torch::NoGradGuard no_grad;
  return m.forward(b.first, b.second, false).item<double>();
}

}  // namespace tally::test
