// The engine's mixture-of-experts layer: its configuration (torch-free). The layer itself, with
// expert parallelism over Gloo all-to-all, is engine/runtime/moe_layer.hpp (internal).
#pragma once

#include <cstdint>

#include "tally/core/model.hpp"

namespace tally::engine {

struct MoeConfig {
  std::int64_t hidden = 16;      // h
  std::int64_t ffn = 32;         // f, per routed expert
  std::int64_t experts = 8;      // E, routed experts
  std::int64_t top_k = 2;        // k, experts per token
  std::int64_t shared_ffn = 0;   // f_s: one always-active shared expert of this width; 0 = none
  MlpKind mlp = MlpKind::swiglu; // bias-free GeLU (2 matrices) or SwiGLU (3) experts
  double capacity_factor = 1;    // c_f: slots per expert as a multiple of the balanced share

  // Parameters: router E·h, routed experts E·m·f·h, shared expert m·f_s·h (m = 2 GeLU, 3 SwiGLU).
  std::int64_t matrices() const { return mlp == MlpKind::gelu ? 2 : 3; }
  std::int64_t router_params() const { return experts * hidden; }
  std::int64_t routed_expert_params() const { return experts * matrices() * ffn * hidden; }
  std::int64_t shared_params() const { return matrices() * shared_ffn * hidden; }
  std::int64_t params() const {
    return router_params() + routed_expert_params() + shared_params();
  }
};

}  // namespace tally::engine
