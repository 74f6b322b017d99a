// The shape of the engine's GPT-style decoder (engine/runtime/gpt_model.hpp builds it in libtorch) and
// its description for the core ledgers. Torch-free, so the CLI and core-side tests can use it.
//
// Legend: B = micro-batch, T = sequence (= the learned position table), C = hidden (h),
// L = layers, a = heads, d = C/a head dim, V = vocabulary.
//
// The module (GPT-2 layout, no dropout): token embedding (V, C) + learned positions (T, C); L blocks
// of [LayerNorm → causal self-attention with materialised (B, a, T, T) scores → residual,
// LayerNorm → Linear C→4C → GeLU → Linear 4C→C → residual]; final LayerNorm; LM head tied to the
// token embedding. Every Linear has a bias. Parameters: V·C + T·C + L·(12C² + 13C) + 2C.
#pragma once

#include <cstdint>

#include "tally/core/model.hpp"

namespace tally::engine {

// Note [default GPT shape]
// GPT-2 small's width and depth (h 768, L 12, a 12, V 50257) at T = 512, B = 1: N = 124.0 M
// parameters (≈0.1 B, the seed's fallback model). The whole fp32 step peaks at ≈2.3 GB (states 16N
// ≈ 2.0 GB, forward activations 0.56 GB). T = 512 keeps the attention scores a third of each layer's
// activations (5as/h = 40 vs 34). Time on 2 cores: bf16 ≈5 s (oneDNN kernels); fp32 ≈3 min,
// because Debian's libtorch sends fp32 matrix products to the system BLAS, here the single-threaded
// reference BLAS (an optimised libblas.so.3 such as OpenBLAS cuts that to seconds). Tests use a
// small shape.
struct GptConfig {
  std::int64_t hidden = 768;     // C
  std::int64_t layers = 12;      // L
  std::int64_t heads = 12;       // a
  std::int64_t vocab = 50257;    // V
  std::int64_t seq = 512;        // T, also the learned position table's length
  std::int64_t micro_batch = 1;  // B
  // Throws InvalidInput naming the flag (--hidden, --layers, ...), the value and the allowed range.
  void validate() const;
};

// The module as core sees it: GeLU MLP of width 4C, LayerNorm, learned positions (max_positions = T),
// tied embeddings, biases on every linear layer, a_kv = a. count_params(gpt_model_spec(c)).total()
// equals the module's parameter count exactly (tests/engine/exp_memory_profile.cpp).
ModelSpec gpt_model_spec(const GptConfig& c);

}  // namespace tally::engine
