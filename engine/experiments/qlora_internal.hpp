// Shared between qlora.cpp (the runner) and qlora_checks.cpp (the checks): internal, torch.
#pragma once

#include <torch/torch.h>

#include "lora_model.hpp"
#include "tally/engine/experiments/qlora.hpp"

namespace tally::engine {

// Note [quantization checks] in qlora_checks.cpp: one NF4 matrix against the fp32 weight it came
// from; err2 and sum2 gather ‖W − Ŵ‖² and ‖W‖².
void check_quantized(const torch::Tensor& source_weight, const FrozenWeight& f,
                     QuantizationChecks& q, double& err2, double& sum2);
// A matrix of code points × 1/8 in every block comes back bit for bit.
bool code_points_round_trip(const LoraSetup& s);

}  // namespace tally::engine
