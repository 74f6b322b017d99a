// Low-precision formats against their specifications: OCP 8-bit Floating Point Specification
// (OFP8) v1.0 Table 1, OCP Microscaling Formats (MX) v1.0 (§5 element and scale formats, §6.3
// conversion), NVIDIA's NVFP4 (two-level scaling). Every expected value below is a number printed
// in those documents or arithmetic on the format's definition, not tally's output.
#include "tally/core/lowp.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "tally/core/types.hpp"

namespace tally::test_lowp {
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
  // 3 maps onto 448 and back through the fp32 scale_inv = 1/fp32(448/3): 3 to fp32's precision.
  EXPECT_NEAR(q.values[0], 3.0, 3.0 * std::ldexp(1.0, -23));
  for (std::size_t i = 1; i < 3; ++i) EXPECT_LE(std::fabs(q.values[i] / x[i] - 1), 1.0 / 16) << i;
  EXPECT_EQ(q.values[3], 0.0);
  EXPECT_EQ(q.bytes(), 4 + 4);
  EXPECT_EQ(quantize_per_tensor(std::vector<double>(3, 0.0), Minifloat::e5m2).values[1], 0.0);
}

// The stored form (Note [encoded tensor]) of the same tensors, codes worked out by hand from OFP8
// Table 1 (e4m3: S.EEEE.MMM, bias 7) and MX v1.0 Table 3 (e2m1: S.EE.M): what a framework keeps,
// and value(i) reads back quantize_*'s values bit for bit.
TEST(LowpEncoded, PerTensorCodesAndFp32ScaleInv) {
  const std::vector<double> x{3.0, -1.7, 0.01, 0.0};
  const EncodedTensor e = encode_per_tensor(x, Minifloat::e4m3);
  const float scale = float(448.0 / 3.0);
  EXPECT_EQ(e.tensor_scale, 1.0f / scale);  // TE's fp32 scale_inv
  EXPECT_EQ(e.codes[0], 0x7E);  // 3·scale = 448 (to fp32 precision) = 1.75·2^8: S.1111.110
  // −1.7·149.33 = −253.9: between 240 and 256 (the grid is 16 apart in [128, 256)), nearer 256 =
  // 2^8: S.1111.000 with the sign.
  EXPECT_EQ(e.codes[1], 0xF8);
  EXPECT_EQ(e.codes[3], 0x00);
  EXPECT_EQ(e.bytes(), 4);  // one byte per element; the scale is metadata
  EXPECT_EQ(e.values(), quantize_per_tensor(x, Minifloat::e4m3).values);
}

// The MX block of Lowp.MxBlocksShareAPowerOfTwoScale: scale codes 127 − 2 = 125 and 127 − 18 = 109;
// 100 → 384 = 1.5·2^8: 0.1111.100; 1 → 4 = 2^2: 0.1001.000; 0.3 → 1.25 = 1.01b: 0.0111.010;
// 0.001 → 256 = 2^8: 0.1111.000; −0.0007 → −176 = −1.375·2^7: 1.1110.011.
TEST(LowpEncoded, MxCodesAndE8m0Scales) {
  std::vector<double> x(64, 0.0);
  x[0] = 100;
  x[1] = 1;
  x[2] = 0.3;
  x[32] = 0.001;
  x[33] = -0.0007;
  const EncodedTensor e = encode_mx(x, Minifloat::e4m3);
  EXPECT_EQ(e.block_scales, (std::vector<std::uint8_t>{125, 109}));
  EXPECT_EQ(e.codes[0], 0x7C);
  EXPECT_EQ(e.codes[1], 0x48);
  EXPECT_EQ(e.codes[2], 0x3A);
  EXPECT_EQ(e.codes[32], 0x78);
  EXPECT_EQ(e.codes[33], 0xF3);
  EXPECT_EQ(e.bytes(), 64 + 2);  // 1 + 1/32 per element, as the ledger counts one MXFP8 copy
  EXPECT_EQ(e.values(), quantize_mx(x, Minifloat::e4m3).values);
}

// NVFP4 of Lowp.Nvfp4TwoLevelScaling, packed two per byte with element 2j in the low nibble:
// 2688 → 6 = 0.11.1 (7), 1000 → 2 = 0.10.0 (4): byte 0x47; −224 → −0.5 = 1.00.1 (9) beside a 0:
// byte 0x09. Block scales e4m3(448) = 0.1111.110 and e4m3(0.5) = 0.0110.000; g = 1.
TEST(LowpEncoded, Nvfp4PackedCodes) {
  std::vector<double> x(32, 0.0);
  x[0] = 2688;
  x[1] = 1000;
  x[2] = -224;
  x[16] = 3;
  x[17] = 1;
  const EncodedTensor e = encode_nvfp4(x);
  EXPECT_EQ(e.tensor_scale, 1.0f);
  EXPECT_EQ(e.block_scales, (std::vector<std::uint8_t>{0x7E, 0x30}));
  ASSERT_EQ(e.codes.size(), 16u);
  EXPECT_EQ(e.codes[0], 0x47);
  EXPECT_EQ(e.codes[1], 0x09);
  EXPECT_EQ(e.codes[8], 0x47);  // 3/0.5 = 6, 1/0.5 = 2
  EXPECT_EQ(e.code(2), 9);
  EXPECT_EQ(e.bytes(), 16 + 2);  // 0.5 + 1/16 per element: one NVFP4 copy in the ledger
  EXPECT_EQ(e.values(), quantize_nvfp4(x).values);
}

// 2D NVFP4 (TE's weights): one scale per 16×16 tile of a 32×32 matrix, written once per 16-element
// row segment; stored as x or as xᵀ, the same values. Tile (0,0) holds the tensor amax 2688 (g = 1,
// scale 448), so its 1 at (1, 0) becomes 1/448 → 0 — where 1D blocks give row 1 its own scale
// e4m3(1/6) = 0.171875 and 1 → 5.82 → 6 → 1.03125. Tile (0,1): 3 → scale 0.5; tile (1,0): 1.5 →
// scale 0.25 (0.0101.000), and its 0.25 → 1 → 0.25; tile (1,1) is all zeros (scale code 0).
TEST(LowpEncoded, Nvfp4TwoDimensionalTiles) {
  const std::int64_t n = 32;
  std::vector<double> x(std::size_t(n * n), 0.0);
  auto at = [&](std::int64_t r, std::int64_t c) -> double& { return x[std::size_t(r * n + c)]; };
  at(0, 1) = 2688;
  at(1, 0) = 1;
  at(3, 20) = 3;
  at(17, 2) = 1.5;
  at(17, 3) = 0.25;
  const QuantizedTensor q = quantize_nvfp4_2d(x, n, n);
  EXPECT_EQ(q.values[std::size_t(0 * n + 1)], 2688);
  EXPECT_EQ(q.values[std::size_t(1 * n + 0)], 0.0);
  EXPECT_EQ(quantize_nvfp4(x).values[std::size_t(1 * n + 0)], 1.03125);
  EXPECT_EQ(q.values[std::size_t(3 * n + 20)], 3.0);
  EXPECT_EQ(q.values[std::size_t(17 * n + 3)], 0.25);
  EXPECT_EQ(q.scale_bytes, 64 + 4);
  const EncodedTensor rows = encode_nvfp4_2d(x, n, n, false), cols = encode_nvfp4_2d(x, n, n, true);
  for (const EncodedTensor* e : {&rows, &cols}) {
    ASSERT_EQ(e->block_scales.size(), 64u);  // 2 segments of 16 per stored row
    EXPECT_EQ(e->bytes(), 512 + 64);
    EXPECT_EQ(e->tensor_scale, 1.0f);
  }
  // Row 15, segment 0 lies in tile (0,0): the tile's 448 although row 15 is all zeros.
  EXPECT_EQ(rows.block_scales[15 * 2 + 0], 0x7E);
  EXPECT_EQ(rows.block_scales[3 * 2 + 1], 0x30);   // tile (0,1)
  EXPECT_EQ(rows.block_scales[17 * 2 + 0], 0x28);  // tile (1,0)
  EXPECT_EQ(rows.block_scales[17 * 2 + 1], 0x00);  // tile (1,1)
  EXPECT_EQ(cols.block_scales[20 * 2 + 0], 0x30);  // xᵀ row 20 = x's column 20, rows 0–15
  EXPECT_EQ(cols.block_scales[2 * 2 + 1], 0x28);   // xᵀ row 2, rows 16–31 of x
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t c = 0; c < n; ++c) {
      const double v = q.values[std::size_t(r * n + c)];
      ASSERT_EQ(rows.value(r * n + c), v) << r << "," << c;
      ASSERT_EQ(cols.value(c * n + r), v) << r << "," << c;
    }
  EXPECT_THROW(encode_nvfp4_2d(x, 16, 32, false), InvalidInput);  // 512 elements named, 1024 given
  EXPECT_THROW(quantize_nvfp4_2d(std::vector<double>(24 * 16, 0.0), 24, 16), InvalidInput);
}

// The NF4 code book as published (QLoRA, Dettmers et al. 2023, Appendix E; bitsandbytes
// functional.py), built from normal quantiles by nf4_code(): equal to 1e-7 (in fact bit for bit).
TEST(Nf4, CodeBookIsThePublishedTable) {
  const double published[16] = {-1.0, -0.6961928009986877, -0.5250730514526367,
                                -0.39491748809814453, -0.28444138169288635, -0.18477343022823334,
                                -0.09105003625154495, 0.0, 0.07958029955625534,
                                0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
                                0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0};
  for (std::size_t i = 0; i < 16; ++i) {
    EXPECT_NEAR(nf4_code()[i], published[i], 1e-7) << i;
    EXPECT_EQ(nf4_code()[i], float(published[i])) << i;  // the same float32
  }
  // Φ⁻¹ itself: the textbook quantiles.
  EXPECT_NEAR(normal_quantile(0.975), 1.959963984540054, 1e-12);
  EXPECT_NEAR(normal_quantile(0.5), 0.0, 1e-15);
  EXPECT_NEAR(normal_quantile(0.8413447460685429), 1.0, 1e-12);
  EXPECT_THROW(normal_quantile(1.0), InvalidInput);
}

// bitsandbytes' signed dynamic map: 2·(1 + 2 + … + 64) = 254 values, 0 and 1; sorted, distinct,
// largest 1, smallest −(mean of the last two boundaries of linspace(0.1, 1, 65)) = −0.99296875.
TEST(Nf4, DynamicMapForTheConstants) {
  const auto& m = dynamic_map();
  EXPECT_TRUE(std::is_sorted(m.begin(), m.end()));
  EXPECT_EQ(std::adjacent_find(m.begin(), m.end()), m.end());
  EXPECT_EQ(m.back(), 1.0f);
  EXPECT_NEAR(m.front(), -(0.1 + 0.9 * 63.5 / 64), 1e-7);
  EXPECT_NE(std::find(m.begin(), m.end(), 0.0f), m.end());
  EXPECT_NEAR(m[128], 1e-6 * 0.55, 1e-12);  // the smallest positive: 10^-6 · (0.1 + 1)/2
}

// Block-wise NF4: every value becomes its nearest code point times the block's absmax (checked
// against all 16 by brute force); a block made of code points × absmax comes back exactly; two
// indices per byte, the first in the high nibble.
TEST(Nf4, QuantizesToTheNearestCodePoint) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(64 * 40 + 5);
  for (float& x : w) x = normal(rng);
  for (bool dq : {false, true}) {
    const Nf4Tensor q = quantize_nf4(w, 64, dq);
    const std::vector<float> back = dequantize_nf4(q);
    ASSERT_EQ(back.size(), w.size());
    EXPECT_EQ(q.packed.size(), (w.size() + 1) / 2);
    double err2 = 0, sum2 = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
      float a = 0;
      const std::size_t b = i / 64;
      for (std::size_t j = b * 64; j < std::min(w.size(), b * 64 + 64); ++j)
        a = std::max(a, std::fabs(w[j]));
      const float x = w[i] / a;
      int best = 0;
      for (int c = 1; c < 16; ++c)
        if (std::fabs(x - nf4_code()[std::size_t(c)]) <
            std::fabs(x - nf4_code()[std::size_t(best)]))
          best = c;
      ASSERT_EQ(q.index(std::int64_t(i)), best) << i;
      err2 += double(back[i] - w[i]) * double(back[i] - w[i]);
      sum2 += double(w[i]) * double(w[i]);
    }
    EXPECT_LT(std::sqrt(err2 / sum2), 0.12) << "dq " << dq;  // 4 bits of a Gaussian: ~0.1
  }
  std::vector<float> grid;
  for (float c : nf4_code()) grid.push_back(0.5f * c);
  const Nf4Tensor g = quantize_nf4(grid, 16, /*double_quant=*/false);
  EXPECT_EQ(dequantize_nf4(g), grid);
  EXPECT_EQ(g.packed[0], 0x01);  // codes 0 and 1: high nibble first
  EXPECT_THROW(quantize_nf4(std::vector<float>{1.0f, NAN}), InvalidInput);
}

// Double quantization (QLoRA §3): the absmax constants, less their mean, become 8-bit indices into
// the dynamic map with one fp32 absmax per 256 of them — each the map's nearest value; 4 + 8/64 +
// 32/(64·256) = 4.127 bits per weight against 4 + 32/64 = 4.5 without, as core/finetune counts.
TEST(Nf4, DoubleQuantizedConstants) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(64 * 256 * 2);
  for (float& x : w) x = normal(rng);
  const Nf4Tensor q = quantize_nf4(w);
  const Nf4Tensor plain = quantize_nf4(w, 64, false);
  ASSERT_EQ(q.absmax_code.size(), 512u);
  ASSERT_EQ(q.absmax2.size(), 2u);
  for (std::size_t b = 0; b < 512; ++b) {
    const float c = (plain.absmax[b] - q.absmax_mean) / q.absmax2[b / 256];
    const auto& m = dynamic_map();
    const float chosen = m[q.absmax_code[b]];
    for (float v : m) ASSERT_LE(std::fabs(c - chosen), std::fabs(c - v) + 1e-7f) << b;
  }
  EXPECT_NEAR(8 * q.bytes() / double(w.size()), 4 + 8.0 / 64 + 32.0 / (64 * 256), 1e-12);
  EXPECT_NEAR(8 * plain.bytes() / double(w.size()), 4.5, 1e-12);
}

// The span view (what the engine's NF4 linear layers hand over, their arrays being tensors):
// any range of blocks dequantizes to exactly the elements dequantize_nf4 gives, for even and odd
// block sizes (an odd block starts some blocks on a low nibble) and a ragged last block; arrays of
// the wrong length are refused.
TEST(Nf4, ViewDequantizesAnyBlockRangeExactly) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(17 * 300 + 9);
  for (float& x : w) x = normal(rng);
  for (int block : {17, 64}) {
    for (bool dq : {false, true}) {
      const Nf4Tensor q = quantize_nf4(w, block, dq, 16);
      const std::vector<float> all = dequantize_nf4(q);
      const Nf4View v = view(q);
      v.validate();
      ASSERT_EQ(v.blocks(), std::int64_t((w.size() + std::size_t(block) - 1) / std::size_t(block)));
      for (auto [b0, b1] : {std::pair<std::int64_t, std::int64_t>{0, v.blocks()}, {3, 40},
                            {v.blocks() - 2, v.blocks()}, {7, 7}, {v.blocks(), v.blocks()}}) {
        const std::int64_t begin = std::min<std::int64_t>(q.count, b0 * block);
        const std::int64_t end = std::min<std::int64_t>(q.count, b1 * block);
        std::vector<float> part(std::size_t(end - begin));
        dequantize_nf4(v, b0, b1, part);
        for (std::int64_t i = begin; i < end; ++i)
          ASSERT_EQ(part[std::size_t(i - begin)], all[std::size_t(i)]) << block << " " << i;
      }
      Nf4View bad = v;
      bad.packed = bad.packed.subspan(1);
      EXPECT_THROW(bad.validate(), InvalidInput);
      bad = v;
      bad.double_quant = !dq;
      EXPECT_THROW(bad.validate(), InvalidInput);
    }
  }
}

}  // namespace
}  // namespace tally::test_lowp
