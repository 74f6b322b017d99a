// Low-precision number formats, emulated exactly on the CPU (issue 15; Note [low precision] in
// types.hpp says which tensors a recipe stores in them). Pure arithmetic: no torch, no I/O.
//
// Element formats (sign, exponent, mantissa bits; bias):
//   e4m3  1-4-3, bias 7: no infinities, NaN only at S.1111.111; max normal 448 = 1.75·2^8, min
//         normal 2^-6, subnormals m·2^-9 (OCP 8-bit Floating Point Specification (OFP8) v1.0,
//         Table 1; the E4M3 of the OCP Microscaling Formats (MX) v1.0 spec, Table 2)
//   e5m2  1-5-2, bias 15: IEEE-style infinities and NaNs; max normal 57344 = 1.75·2^15, min normal
//         2^-14, subnormals m·2^-16 (OFP8 Table 1)
//   e2m1  1-2-1, bias 1: no infinities or NaN; the values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6} (MX v1.0
//         §5.3.3, Table 3; NVFP4's element)
//   e8m0  an unsigned power of two 2^(e−127), 0xFF = NaN: the MX shared scale (MX v1.0 §5.4)
// Conversion to an element format rounds to nearest, ties to even, and saturates: a finite value
// beyond the largest normal becomes it (OFP8 §3 "saturating" conversion; MX v1.0 §6.3); NaN stays
// NaN (e2m1, which has none, refuses it).
//
// Scaled tensors:
//   per-tensor fp8 (Transformer Engine's delayed/current scaling): scale = fmax / amax and its
//         reciprocal scale_inv, both fp32 as TE holds them; stored x·scale in e4m3 (x·scale formed
//         in double and rounded once — TE's kernel forms it in fp32 first, a second rounding
//         that can move a tie by one fp8 ulp; not emulated), read back code · scale_inv
//   MXFP8 / MXFP4 (MX v1.0 §6.3): blocks of 32 along a vector; shared exponent
//         E = floor(log2(amax)) − emax_element (e4m3: 8, e2m1: 2), clamped to e8m0's range; each
//         element x / 2^E converted as above
//   NVFP4 (NVIDIA, "Pretraining Large Language Models with NVFP4", 2025, §2): blocks of 16,
//         an e4m3 block scale and an fp32 tensor scale g = fp32(amax_tensor / (6 · 448)); block
//         scale s = e4m3(amax_block / (6 · g)); elements e2m1(x / (s · g)), read back e2m1 · s · g.
//         The 2D variant (TE NVFP4BlockScaling's weights, fp4_2d_quantization: "a single scaling
//         factor is shared by a 2D block of 16x16 elements") takes amax_block over 16×16 tiles of a
//         matrix, so a weight and its transpose quantize to the same values
// Every dequantized value is exact in double (a 2- or 4-bit significand times a power of two or an
// fp32 scale), so float(value) is the correctly rounded fp32 a GEMM reads.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace tally {

enum class Minifloat { e4m3, e5m2, e2m1 };

std::string_view to_string(Minifloat f);
double max_normal(Minifloat f);     // 448, 57344, 6
int max_normal_exponent(Minifloat f);  // emax_element: 8, 15, 2

// The code (low bits of the byte) of x in format f, round to nearest even, saturating. Throws
// InvalidInput for NaN in e2m1 (no NaN code).
std::uint8_t encode(Minifloat f, double x);
// The value of a code; NaN for NaN codes, ±inf for e5m2's infinities.
double decode(Minifloat f, std::uint8_t code);
// decode(encode(x)): the nearest representable value.
double round_to(Minifloat f, double x);

// e8m0: 2^(code − 127); code 0xFF is NaN.
double decode_e8m0(std::uint8_t code);

// One quantized tensor and the bytes it occupies (elements + scales), for the memory ledger.
struct QuantizedTensor {
  std::vector<double> values;   // dequantized: what the GEMM reads
  double element_bytes = 0;     // payload: 1 per fp8 element, 0.5 per fp4 element
  double scale_bytes = 0;       // the scales (per tensor: one fp32)
  double bytes() const { return element_bytes + scale_bytes; }
};

// Per-tensor fp8: scale = fp32(fmax/amax) (1 when amax is 0), values code · fp32(1/scale).
QuantizedTensor quantize_per_tensor(std::span<const double> x, Minifloat f);
// MX (MX v1.0 §6.3), blocks of 32 consecutive elements (the last one may be shorter).
QuantizedTensor quantize_mx(std::span<const double> x, Minifloat f);
// NVFP4: blocks of 16, e4m3 block scales, one fp32 tensor scale.
QuantizedTensor quantize_nvfp4(std::span<const double> x);
// NVFP4 with 16×16 tiles of the rows×cols row-major matrix x (edge tiles may be smaller); values in
// x's layout. Throws InvalidInput unless rows·cols = x.size().
QuantizedTensor quantize_nvfp4_2d(std::span<const double> x, std::int64_t rows, std::int64_t cols);

inline constexpr int kMxBlock = 32;
inline constexpr int kNvfp4Block = 16;

// ---- Stored form: the bytes a framework keeps ---------------------------------------------------
// Note [encoded tensor]
// The quantize_* functions above give the values; encode_* give what is stored, computed with the
// same scales and the same encode() (so value(i) equals quantize_*'s values[i] bit for bit):
//   codes         fp8: one byte per element; e2m1: two per byte, element 2j in the low nibble and
//                 2j+1 in the high one (PyTorch's float4_e2m1fn_x2, TE's NVFP4 data)
//   block_scales  MX: one e8m0 code per block of 32; NVFP4: one e4m3 code per 16 consecutive
//                 elements of the stored layout (2D: each 16-element row segment of a tile
//                 carries the tile's scale, the 1×16 layout the GEMM reads); per-tensor fp8: none
//   tensor_scale  fp32, multiplies every element: per-tensor fp8 scale_inv, NVFP4 g; MX: 1
// bytes() = codes + block scales: what core's ledger counts per copy (low_precision_copy_bytes);
// the tensor scale (4 bytes) is metadata it leaves out (types.hpp Note [low precision]).
struct EncodedTensor {
  Minifloat element = Minifloat::e4m3;
  enum class Scales { none, e8m0, e4m3 } scale_format = Scales::none;
  int block = 0;              // elements per block scale (0: none)
  std::int64_t count = 0;     // elements
  std::vector<std::uint8_t> codes;
  std::vector<std::uint8_t> block_scales;
  float tensor_scale = 1.0f;

  std::uint8_t code(std::int64_t i) const;   // element i's code (unpacked)
  double block_scale(std::int64_t b) const;  // block b's scale, decoded (1 without block scales)
  double value(std::int64_t i) const;        // decode(code) · block scale · tensor scale (exact)
  std::vector<double> values() const;
  double bytes() const { return double(codes.size() + block_scales.size()); }
};
EncodedTensor encode_per_tensor(std::span<const double> x, Minifloat f);
EncodedTensor encode_mx(std::span<const double> x, Minifloat f);
EncodedTensor encode_nvfp4(std::span<const double> x);
// The rows×cols row-major x with 16×16 tiles, stored as x (transpose = false: 16-element blocks
// along rows) or as xᵀ (cols×rows, blocks along x's columns): the same values either way.
EncodedTensor encode_nvfp4_2d(std::span<const double> x, std::int64_t rows, std::int64_t cols,
                              bool transpose);

// ---- NF4 with double quantization (QLoRA, Dettmers et al. 2023, §3) ---------------------------
// The 4-bit NormalFloat code: 16 values, 8 positive and 7 negative quantiles of N(0, 1) and an
// exact zero, normalised to [−1, 1] — bitsandbytes' create_normal_map(offset = 0.9677083):
// positives Φ⁻¹ at 8 of 9 points linearly spaced from the offset to 0.5, negatives −Φ⁻¹ at 7 of 8,
// computed as bitsandbytes does (float32 points and values, float64 quantiles), so the table equals
// the published one bit for bit.
const std::array<float, 16>& nf4_code();
// The inverse standard normal CDF, to double precision (bisection on std::erfc); p in (0, 1).
double normal_quantile(double p);
// bitsandbytes' signed dynamic 8-bit map (create_dynamic_map(signed=True, max_exponent_bits=7)):
// 256 sorted values in [−1, 1] — ±10^(i−6)·(midpoints of linspace(0.1, 1, 2^i + 1)) for i = 0..6,
// 0 and 1 — the code QLoRA's double quantization stores the constants in.
const std::array<float, 256>& dynamic_map();

// Block-wise NF4 (bitsandbytes quantize_4bit): each block of `block` weights is divided by its
// absmax and each value stored as the index of the nearest code point, two per byte (the first in
// the high nibble). With double quantization the fp32 absmax constants, less their mean, are
// themselves quantized block-wise (block2 of them) to the dynamic map with an fp32 absmax each.
struct Nf4Tensor {
  std::int64_t count = 0;
  int block = 64, block2 = 256;
  bool double_quant = true;
  std::vector<std::uint8_t> packed;       // ⌈count/2⌉ bytes
  std::vector<float> absmax;              // per block (without double quantization)
  std::vector<std::uint8_t> absmax_code;  // per block, into dynamic_map() (double quantization)
  std::vector<float> absmax2;             // per block2 blocks (double quantization)
  float absmax_mean = 0;                  // subtracted before the second quantization
  // Bytes stored: the packed indices and the constants, as core/finetune.hpp counts them (the
  // mean's 4 bytes aside): 4 per block, or 1 per block + 4 per block2 blocks.
  double bytes() const;
  int index(std::int64_t i) const;        // the 4-bit code of element i
  float block_absmax(std::int64_t b) const;  // the (dequantized) absmax of block b
};
Nf4Tensor quantize_nf4(std::span<const float> w, int block = 64, bool double_quant = true,
                       int block2 = 256);
std::vector<float> dequantize_nf4(const Nf4Tensor& q);

// The same storage seen through spans: what a holder of the arrays elsewhere (the engine keeps
// them in tensors, Note [NF4 linear] in engine/runtime/lora_model.hpp) hands to the dequantizer, so
// weights are always read back through this one definition.
struct Nf4View {
  std::int64_t count = 0;
  int block = 64, block2 = 256;
  bool double_quant = true;
  std::span<const std::uint8_t> packed;       // ⌈count/2⌉
  std::span<const float> absmax;              // ⌈count/block⌉ without double quantization, else empty
  std::span<const std::uint8_t> absmax_code;  // ⌈count/block⌉ with double quantization, else empty
  std::span<const float> absmax2;             // ⌈blocks/block2⌉ with double quantization
  float absmax_mean = 0;
  std::int64_t blocks() const { return (count + block - 1) / block; }
  // Throws InvalidInput when an array's length does not match count, block and block2.
  void validate() const;
  float block_absmax(std::int64_t b) const;   // as Nf4Tensor::block_absmax
};
Nf4View view(const Nf4Tensor& q);
// Dequantizes blocks [first_block, end_block) of q into out, which holds exactly their elements
// (out[0] is element first_block·block): code[index] · block_absmax, in float32, the values
// dequantize_nf4 gives. Disjoint block ranges may run on different threads.
void dequantize_nf4(const Nf4View& q, std::int64_t first_block, std::int64_t end_block,
                    std::span<float> out);

}  // namespace tally
