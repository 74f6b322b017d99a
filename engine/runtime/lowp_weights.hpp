// Low-precision copies of linear weights and the GEMM that reads them (internal: includes torch):
// the engine side of core's Note [low precision] (types.hpp), as Transformer Engine keeps a
// weight's workspaces. The engine stores bytes; every rounding rule is core's (core/lowp.hpp).
//
// Legend: W = a linear weight (out, in) row-major, x = its input (…, in), y = x·Wᵀ + b (…, out),
// n = out·in elements.
//
// Note [low-precision copies]
// Each linear weight keeps two copies, both quantized from the bf16 weight (TE: "both versions are
// computed from the high precision input to avoid double quantization errors"), refreshed after
// every optimizer step:
//   row  the forward GEMM's operand, W as stored (blocks along in, the forward's inner dimension)
//   col  the backward dgrad's operand, Wᵀ (in, out) (blocks along out, dgrad's inner dimension);
//        per-tensor fp8 needs it because Hopper's fp8 GEMMs take TN layouts only (on Blackwell
//        TE keeps the row copy alone, Note [fp8 operand layouts]; the engine keeps Hopper's two)
// and per format (bytes per element of one copy as core's ledger counts them):
//   fp8    e4m3 codes (1); one fp32 scale_inv per weight, shared by W and Wᵀ (TE's Float8Tensor)
//   mxfp8  e4m3 codes + an e8m0 scale per 32 (1 + 1/32); no tensor scale. The scale follows MX
//          v1.0 §6.3, 2^(⌊log2 amax⌋ − 8), under which a block's values above 448·2^E clamp; TE's
//          kernels round amax/448 up to a power of two instead (float_to_e8m0 rounding up), so
//          nothing clamps — not emulated, the bytes are the same
//   nvfp4  e2m1 codes two per byte + an e4m3 scale per 16 (0.5 + 1/16), the scale shared by a
//          16×16 tile (TE's 2D weight quantization) and written per 16-element segment of each
//          copy's rows; one fp32 tensor scale per copy
// Codes and block scales are uint8 tensors of exactly those sizes; the fp32 tensor scales are the
// metadata core's ledger leaves out (4 B each). Nothing else is kept (no amax history: the scale
// is computed from this refresh's amax, TE's Float8CurrentScaling; delayed scaling would add a
// history of amaxes per tensor, also outside the ledger).
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "tally/core/lowp.hpp"
#include "tally/core/types.hpp"

namespace tally::engine {

enum class CopyLayout { row, col };

// Elements per block scale of a recipe's copies: mxfp8 32, nvfp4 16, fp8 1 (one scale per tensor).
// Both dimensions of a copied weight must be multiples of it.
int copy_block(Precision format);

class LowpWeight {
 public:
  // format: fp8, mxfp8 or nvfp4. Throws InvalidInput for another precision or a shape the format's
  // blocks do not tile (mxfp8: out and in multiples of 32; nvfp4: of 16).
  LowpWeight(Precision format, std::int64_t out, std::int64_t in);

  // Two steps so a caller can measure each (tally run fp8): the codes and block scales, then the
  // fp32 tensor scales. Both are needed before refresh().
  void allocate_payload();
  void allocate_scales();

  // Re-quantizes both copies from `weight` (out, in), any floating dtype: core's encode_* on its
  // values, the bytes copied into the tensors in place (no allocation that outlives the call).
  void refresh(const torch::Tensor& weight);

  // The copy as the GEMM reads it: fp32 (out, in) for row, (in, out) for col, dequantized with
  // torch ops (code tables from core's decode, times the block and tensor scales).
  torch::Tensor dequantize(CopyLayout layout) const;
  // The stored bytes read back into core's form, for checking against core's scalar emulation.
  EncodedTensor stored(CopyLayout layout) const;

  Precision format() const { return format_; }
  std::int64_t out() const { return out_; }
  std::int64_t in() const { return in_; }
  double payload_bytes() const;  // codes + block scales of both copies
  double scale_bytes() const;    // fp32 tensor scales
  int tensor_scales() const;     // how many: fp8 1, mxfp8 0, nvfp4 2

 private:
  struct Copy {
    torch::Tensor codes;         // uint8: n (fp8) or n/2 (e2m1) bytes
    torch::Tensor block_scales;  // uint8: n/block, or undefined (fp8)
    torch::Tensor tensor_scale;  // float32 (1,), or undefined (mxfp8); fp8's col aliases row's
    std::int64_t rows = 0, cols = 0;  // of the stored matrix
  };
  const Copy& copy(CopyLayout l) const { return l == CopyLayout::row ? row_ : col_; }
  Precision format_;
  std::int64_t out_, in_;
  Copy row_, col_;
};

// y = x·Wᵀ + b for a bf16 (or any dtype) x, weight, bias with the GEMMs emulated in fp32, the
// outputs rounded to x's dtype. With copies: the forward reads copies->dequantize(row), the
// backward's dgrad copies->dequantize(col), and the weight gradient dW = dyᵀ·x goes to `weight`
// (straight through the quantization, as TE's fp8 Linear: its wgrad GEMM writes the
// high-precision weight's gradient). Without copies (nullptr) both read the weight itself: the
// same GEMMs unquantized, the reference run. The copies must not be refreshed between a forward
// and its backward.
torch::Tensor lowp_linear(const torch::Tensor& x, const torch::Tensor& weight,
                          const torch::Tensor& bias, const LowpWeight* copies);

}  // namespace tally::engine
