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
//   per-tensor fp8 (Transformer Engine's delayed/current scaling): scale = fmax / amax, stored
//         x·scale in e4m3, read back /scale
//   MXFP8 / MXFP4 (MX v1.0 §6.3): blocks of 32 along a vector; shared exponent
//         E = floor(log2(amax)) − emax_element (e4m3: 8, e2m1: 2), clamped to e8m0's range; each
//         element x / 2^E converted as above
//   NVFP4 (NVIDIA, "Pretraining Large Language Models with NVFP4", 2025, §2): blocks of 16,
//         an e4m3 block scale and an fp32 tensor scale g = amax_tensor / (6 · 448); block scale
//         s = e4m3(amax_block / (6 · g)); elements e2m1(x / (s · g))
#pragma once

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

// Per-tensor fp8: scale = fmax/amax (1 when amax is 0), values read back exactly as the format holds
// them.
QuantizedTensor quantize_per_tensor(std::span<const double> x, Minifloat f);
// MX (MX v1.0 §6.3), blocks of 32 consecutive elements (the last one may be shorter).
QuantizedTensor quantize_mx(std::span<const double> x, Minifloat f);
// NVFP4: blocks of 16, e4m3 block scales, one fp32 tensor scale.
QuantizedTensor quantize_nvfp4(std::span<const double> x);

inline constexpr int kMxBlock = 32;
inline constexpr int kNvfp4Block = 16;

}  // namespace tally
