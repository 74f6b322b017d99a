// The engine's MLP, sized (torch-free; engine/runtime/mlp.hpp builds it in ATen and runs it).
//
// Legend: widths = {d_0, d_1, …, d_L}: L Linear layers d_l → d_{l+1} (weight and bias), ReLU between
// them — nn.Sequential(Linear(d_0, d_1), ReLU(), …, Linear(d_{L−1}, d_L)).
#pragma once

#include <cstdint>
#include <vector>

namespace tally::engine {

// N = Σ_l d_l·d_{l+1} + d_{l+1}: the parameters of the MLP with these widths. The one sizing
// function for every caller that counts them (the ZeRO run, the DDP benchmark).
std::int64_t mlp_parameter_count(const std::vector<std::int64_t>& widths);

}  // namespace tally::engine
