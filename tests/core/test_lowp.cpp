// Low-precision formats against their specifications: OCP 8-bit Floating Point Specification
// (OFP8) v1.0 Table 1, OCP Microscaling Formats (MX) v1.0 (§5 element and scale formats, §6.3
// conversion), NVIDIA's NVFP4 (two-level scaling). Every expected value below is a number printed
// in those documents or arithmetic on the format's definition, not tally's output.
#include "tally/core/lowp.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tally/core/types.hpp"

namespace tally {
namespace {

// OFP8 Table 1: exponent bias, largest and smallest normals and subnormals, and their codes.
TEST(Lowp, Ofp8Table1) {
  EXPECT_EQ(max_normal(Minifloat::e4m3), 448);                 // S.1111.110
  EXPECT_EQ(decode(Minifloat::e4m3, 0x7E), 448);
  EXPECT_TRUE(std::isnan(decode(Minifloat::e4m3, 0x7F)));       // S.1111.111
  EXPECT_EQ(decode(Minifloat::e4m3, 0x08), std::ldexp(1.0, -6));  // min normal S.0001.000
  EXPECT_EQ(decode(Minifloat::e4m3, 0x07), 0.875 * std::ldexp(1.0, -6));  // max subnormal
  EXPECT_EQ(decode(Minifloat::e4m3, 0x01), std::ldexp(1.0, -9));  // min subnormal
  EXPECT_EQ(max_normal(Minifloat::e5m2), 57344);               // S.11110.11
  EXPECT_EQ(decode(Minifloat::e5m2, 0x7B), 57344);
  EXPECT_TRUE(std::isinf(decode(Minifloat::e5m2, 0x7C)));       // S.11111.00
  EXPECT_TRUE(std::isnan(decode(Minifloat::e5m2, 0x7D)));
  EXPECT_EQ(decode(Minifloat::e5m2, 0x04), std::ldexp(1.0, -14));
  EXPECT_EQ(decode(Minifloat::e5m2, 0x03), 0.75 * std::ldexp(1.0, -14));
  EXPECT_EQ(decode(Minifloat::e5m2, 0x01), std::ldexp(1.0, -16));
  EXPECT_EQ(decode(Minifloat::e4m3, 0x80 | 0x38), -1.0);        // sign bit, 1.0 = 0.0111.000
  EXPECT_EQ(max_normal_exponent(Minifloat::e4m3), 8);
  EXPECT_EQ(max_normal_exponent(Minifloat::e5m2), 15);
}

// MX v1.0 Table 3: every FP4 (E2M1) value.
TEST(Lowp, E2m1Values) {
  const double expect[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(decode(Minifloat::e2m1, std::uint8_t(c)), expect[c]) << c;
    EXPECT_EQ(decode(Minifloat::e2m1, std::uint8_t(8 | c)), -expect[c]) << c;
  }
  EXPECT_EQ(max_normal(Minifloat::e2m1), 6);
  EXPECT_EQ(max_normal_exponent(Minifloat::e2m1), 2);
  EXPECT_THROW(encode(Minifloat::e2m1, NAN), InvalidInput);
}

// Every code of every format decodes to a value that encodes back to the same code (NaNs aside;
// e5m2's infinities saturate to its largest normal, so they are skipped too).
TEST(Lowp, EveryCodeRoundTrips) {
  for (Minifloat f : {Minifloat::e4m3, Minifloat::e5m2, Minifloat::e2m1}) {
    const int codes = f == Minifloat::e2m1 ? 16 : 256;
    for (int c = 0; c < codes; ++c) {
      const double v = decode(f, std::uint8_t(c));
      if (std::isnan(v) || std::isinf(v)) continue;
      EXPECT_EQ(encode(f, v), c) << to_string(f) << " code " << c << " value " << v;
    }
  }
}

// Round to nearest, ties to even; saturation beyond the largest normal (OFP8 §3, MX §6.3).
TEST(Lowp, RoundToNearestEvenAndSaturate) {
  // e4m3 near 1: the grid is 1, 1.125, 1.25. 1.0625 is the midpoint of 1 (mantissa 000, even)
  // and 1.125 (001): to 1. 1.1875 between 1.125 (001) and 1.25 (010): to 1.25.
  EXPECT_EQ(round_to(Minifloat::e4m3, 1.0625), 1.0);
  EXPECT_EQ(round_to(Minifloat::e4m3, 1.1875), 1.25);
  EXPECT_EQ(round_to(Minifloat::e4m3, 1.07), 1.125);
  // Subnormals: the grid is 2^-9 apart; 1.5·2^-9 ties to 2·2^-9 (even), 2.5·2^-9 to 2·2^-9.
  EXPECT_EQ(round_to(Minifloat::e4m3, 1.5 * std::ldexp(1.0, -9)), 2 * std::ldexp(1.0, -9));
  EXPECT_EQ(round_to(Minifloat::e4m3, 2.5 * std::ldexp(1.0, -9)), 2 * std::ldexp(1.0, -9));
  EXPECT_EQ(round_to(Minifloat::e4m3, 0.25 * std::ldexp(1.0, -9)), 0.0);
  // Rounding up across a binade: 15.9 → 16 (the grid below 16 is 0.5 apart: 15.5, 16).
  EXPECT_EQ(round_to(Minifloat::e4m3, 15.9), 16.0);
  EXPECT_EQ(round_to(Minifloat::e4m3, 1000), 448);
  EXPECT_EQ(round_to(Minifloat::e4m3, -1e9), -448);
  EXPECT_EQ(round_to(Minifloat::e5m2, 1e6), 57344);
  EXPECT_EQ(round_to(Minifloat::e5m2, INFINITY), 57344);  // saturating ("satfinite")
  EXPECT_EQ(round_to(Minifloat::e2m1, 2.5), 2.0);          // tie between 2 (even) and 3
  EXPECT_EQ(round_to(Minifloat::e2m1, 3.5), 4.0);          // tie between 3 and 4 (even)
  EXPECT_EQ(round_to(Minifloat::e2m1, 5.0), 4.0);          // tie between 4 (even) and 6
  EXPECT_EQ(round_to(Minifloat::e2m1, 7.0), 6.0);
  EXPECT_TRUE(std::signbit(round_to(Minifloat::e4m3, -0.0)));
  EXPECT_TRUE(std::isnan(round_to(Minifloat::e4m3, NAN)));
  EXPECT_EQ(decode_e8m0(127), 1.0);
  EXPECT_EQ(decode_e8m0(0), std::ldexp(1.0, -127));
  EXPECT_TRUE(std::isnan(decode_e8m0(0xFF)));
}

// MX v1.0 §6.3 on one block of 32: amax 100 → floor(log2 100) = 6, minus e4m3's emax 8: the shared
// scale is 2^-2, so 100 → 400, a tie between 384 (mantissa 100) and 416 (101) that goes to the
// even 384 → 96; 1 → 4 → 1 exactly; 0.3 → 1.2 → 1.25 → 0.3125. A second block of 32 small values
// gets its own scale.
TEST(Lowp, MxBlocksShareAPowerOfTwoScale) {
  std::vector<double> x(64, 0.0);
  x[0] = 100;
  x[1] = 1;
  x[2] = 0.3;
  x[32] = 0.001;
  x[33] = -0.0007;
  const QuantizedTensor q = quantize_mx(x, Minifloat::e4m3);
  EXPECT_EQ(q.values[0], 96.0);
  EXPECT_EQ(q.values[1], 1.0);
  EXPECT_EQ(q.values[2], 0.3125);
  // Block 2: amax 0.001, floor(log2) = −10, scale 2^-18; 0.001·2^18 = 262.144 → 256 (the grid
  // between 256 and 288 is 32 apart), so 0.001 → 2^-10; −0.0007·2^18 = −183.5 → −176
  // (grid 16 apart: 176, 192) → −176·2^-18.
  EXPECT_EQ(q.values[32], std::ldexp(1.0, -10));
  EXPECT_EQ(q.values[33], -176 * std::ldexp(1.0, -18));
  EXPECT_EQ(q.element_bytes, 64);
  EXPECT_EQ(q.scale_bytes, 2);  // one e8m0 per 32
  // MXFP4: the same block structure with e2m1 elements (emax 2): amax 100 → scale 2^4, 100/16 =
  // 6.25 → 6 → 96.
  const QuantizedTensor f4 = quantize_mx(x, Minifloat::e2m1);
  EXPECT_EQ(f4.values[0], 96.0);
  EXPECT_EQ(f4.element_bytes, 32);
}

// NVFP4: tensor amax 6·448 = 2688 gives the tensor scale 1; the first block's amax 2688 → block
// scale e4m3(448) = 448, so 2688 → 6·448 and 1000 → 1000/448 = 2.23 → 2 → 896. A block of small
// values: amax 3 → block scale 0.5 → 3 → 6·0.5 = 3 exactly, 1 → 2 → 1.
TEST(Lowp, Nvfp4TwoLevelScaling) {
  std::vector<double> x(32, 0.0);
  x[0] = 2688;
  x[1] = 1000;
  x[16] = 3;
  x[17] = 1;
  const QuantizedTensor q = quantize_nvfp4(x);
  EXPECT_EQ(q.values[0], 2688.0);
  EXPECT_EQ(q.values[1], 896.0);
  EXPECT_EQ(q.values[16], 3.0);
  EXPECT_EQ(q.values[17], 1.0);
  EXPECT_EQ(q.element_bytes, 16);     // 4 bits each
  EXPECT_EQ(q.scale_bytes, 2 + 4);    // an e4m3 per 16, one fp32 per tensor
}

// Per-tensor fp8: the scale maps the amax onto e4m3's 448, so the largest value is exact and the
// relative error of the others is at most half an ulp, 2^-4 of their binade.
TEST(Lowp, PerTensorScaleMapsAmaxOntoTheLargestNormal) {
  const std::vector<double> x{3.0, -1.7, 0.01, 0.0};
  const QuantizedTensor q = quantize_per_tensor(x, Minifloat::e4m3);
  EXPECT_DOUBLE_EQ(q.values[0], 3.0);
  for (std::size_t i = 1; i < 3; ++i) EXPECT_LE(std::fabs(q.values[i] / x[i] - 1), 1.0 / 16) << i;
  EXPECT_EQ(q.values[3], 0.0);
  EXPECT_EQ(q.bytes(), 4 + 4);
  EXPECT_EQ(quantize_per_tensor(std::vector<double>(3, 0.0), Minifloat::e5m2).values[1], 0.0);
}

}  // namespace
}  // namespace tally
