// core/types.hpp: units, enum names at the boundary, count parsing and byte formatting.
#include "tally/core/types.hpp"

#include <gtest/gtest.h>

#include <string>

namespace tally::test_types {
namespace {

// GB is decimal (1e9 bytes, SI), GiB binary (2^30 bytes, IEC 80000-13).
TEST(Types, UnitsAreSiAndIec) {
  EXPECT_EQ(kGB, 1e9);
  EXPECT_EQ(kGiB, 1073741824.0);
  EXPECT_EQ(kMiB, 1048576.0);
  EXPECT_EQ(unit_bytes(SizeUnit::GB), 1e9);
  EXPECT_EQ(unit_bytes(SizeUnit::GiB), 1073741824.0);
  EXPECT_EQ(to_unit(80 * 1073741824.0, SizeUnit::GB), 85.89934592);  // "80 GB" cards hold 80 GiB
  EXPECT_EQ(format_bytes(26.25e9, SizeUnit::GB), "26.25 GB");
  EXPECT_EQ(format_bytes(80 * 1073741824.0, SizeUnit::GiB, 1), "80.0 GiB");
  EXPECT_EQ(parse_size_unit("GiB"), SizeUnit::GiB);
  EXPECT_FALSE(parse_size_unit("gb?").has_value());
}

// Every enum name parses back to itself, and only the listed names parse.
TEST(Types, EnumNamesRoundTrip) {
  for (const auto& n : allowed_precisions()) EXPECT_EQ(to_string(*parse_precision(n)), n);
  for (const auto& n : allowed_optimizers()) EXPECT_EQ(to_string(*parse_optimizer(n)), n);
  for (const auto& n : allowed_recomputes()) EXPECT_EQ(to_string(*parse_recompute(n)), n);
  for (const auto& n : allowed_attentions()) EXPECT_EQ(to_string(*parse_attention(n)), n);
  EXPECT_EQ(allowed_precisions().size(), 6u);  // fp32, bf16, fp16, fp8, mxfp8, nvfp4
  EXPECT_FALSE(parse_precision("fp4").has_value());  // the format is nvfp4 (or mxfp4, not modelled)
  EXPECT_FALSE(parse_optimizer("").has_value());
  EXPECT_FALSE(parse_recompute("Full ").has_value());
}

// Mixed precision keeps 16-bit parameters and gradients (seed: 2 + 2 + 8 + 4 bytes per parameter).
TEST(Types, DtypeBytes) {
  EXPECT_EQ(dtype_bytes(Precision::fp32), 4.0);
  EXPECT_EQ(dtype_bytes(Precision::bf16), 2.0);
  EXPECT_EQ(dtype_bytes(Precision::fp16), 2.0);
}

TEST(Types, ParseCountAcceptsTheSpellingsPeopleUse) {
  EXPECT_EQ(parse_count("7e9", "--params"), 7e9);
  EXPECT_EQ(parse_count("7B", "--params"), 7e9);
  EXPECT_EQ(parse_count("6.74b", "--params"), 6.74e9);
  EXPECT_EQ(parse_count("175B", "--params"), 175e9);
  EXPECT_EQ(parse_count("350M", "--params"), 350e6);
  EXPECT_EQ(parse_count("1.5T", "--params"), 1.5e12);
  EXPECT_EQ(parse_count("124k", "--params"), 124e3);
  EXPECT_EQ(parse_count("7000000000", "--params"), 7e9);
}

TEST(Types, ParseCountRejectsWithOneLineNamingTheField) {
  for (const char* bad : {"", "B", "7X", "-7B", "0", "nan", "inf", "1e999", "7 B", "0x10"}) {
    SCOPED_TRACE(bad);
    try {
      parse_count(bad, "--params");
      ADD_FAILURE() << "accepted";
    } catch (const InvalidInput& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("--params = '", 0), 0u) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
}

// Sizes: SI prefixes are powers of 1000, IEC prefixes of 1024 (IEC 80000-13).
TEST(Types, ParseBytesTakesTheUnitWithTheValue) {
  EXPECT_EQ(parse_bytes("14GB", "--size"), 14e9);
  EXPECT_EQ(parse_bytes("14 GB", "--size"), 14e9);
  EXPECT_EQ(parse_bytes("512MiB", "--size"), 512.0 * 1048576);
  EXPECT_EQ(parse_bytes("1.5TB", "--size"), 1.5e12);
  EXPECT_EQ(parse_bytes("2GiB", "--size"), 2.0 * 1073741824);
  EXPECT_EQ(parse_bytes("100B", "--size"), 100.0);
  EXPECT_EQ(parse_bytes("4KiB", "--size"), 4096.0);
  for (const char* bad : {"14", "14Gb", "14gb", "GB", "-1GB", "0GB", "nanGB", "1e999GB", "14 G B",
                          "14XB", ""}) {
    SCOPED_TRACE(bad);
    try {
      parse_bytes(bad, "--size");
      ADD_FAILURE() << "accepted";
    } catch (const InvalidInput& e) {
      EXPECT_EQ(std::string(e.what()).rfind("--size = '", 0), 0u) << e.what();
    }
  }
}

// Networks are sold in bits per second: 200 Gb/s (HDR InfiniBand) is 25 GB/s; NVLink 3's 600 GB/s
// bidirectional is bytes.
TEST(Types, ParseBandwidthTellsBitsFromBytes) {
  EXPECT_EQ(parse_bandwidth("50GB/s", "--bandwidth"), 50e9);
  EXPECT_EQ(parse_bandwidth("200Gb/s", "--bandwidth"), 25e9);
  EXPECT_EQ(parse_bandwidth("200Gbps", "--bandwidth"), 25e9);
  EXPECT_EQ(parse_bandwidth("400 Gb/s", "--bandwidth"), 50e9);
  EXPECT_EQ(parse_bandwidth("1.6Tb/s", "--bandwidth"), 200e9);
  EXPECT_EQ(parse_bandwidth("25GiB/s", "--bandwidth"), 25.0 * 1073741824);
  EXPECT_EQ(parse_bandwidth("100MB/s", "--bandwidth"), 1e8);
  for (const char* bad : {"50", "50GB", "50G/s", "bps", "50gbps", "-1GB/s", "0Gb/s", "infGB/s",
                          "50 GB / s"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(parse_bandwidth(bad, "--bandwidth"), InvalidInput);
  }
}

TEST(Types, FormatNumberPrintsWholeNumbersExactly) {
  EXPECT_EQ(format_number(1048576), "1048576");
  EXPECT_EQ(format_number(-2), "-2");
  EXPECT_EQ(format_number(7e9), "7000000000");
  EXPECT_EQ(format_number(0.5), "0.5");
  EXPECT_EQ(format_number(5e-324), "4.94066e-324");
  EXPECT_EQ(format_number(1e15), "1e+15");
  EXPECT_EQ(format_number(0.001), "0.001");
}

TEST(Types, InputChecksNameFieldValueAndRange) {
  try {
    require_real(false, "mfu", 2.5, "must be in [0.001, 1]");
    ADD_FAILURE();
  } catch (const InvalidInput& e) {
    EXPECT_STREQ(e.what(), "mfu = 2.5: must be in [0.001, 1]");
  }
  try {
    require_int(false, "tp", -3, "must be >= 1");
    ADD_FAILURE();
  } catch (const InvalidInput& e) {
    EXPECT_STREQ(e.what(), "tp = -3: must be >= 1");
  }
  EXPECT_NO_THROW(require_real(true, "x", 0, ""));
}

// Note [low precision]: bytes per linear weight of the copies each recipe keeps. OCP Microscaling
// Formats v1.0 §5: an MX block is 32 elements sharing one 8-bit (e8m0) scale; NVFP4 (NVIDIA, "Pretraining
// LLMs with NVFP4", 2025): 16 e2m1 (4-bit) elements share one e4m3 scale. Transformer Engine keeps a
// row-wise and a column-wise (transposed) copy of each weight.
// Note [low precision], Transformer Engine v2.8: a linear's saved input is its column-wise
// quantized data — e4m3 (1 B), e4m3 with an e8m0 scale per 32 (MX v1.0), e2m1 (4 bits) with an e4m3
// scale per 16 — and delayed scaling keeps 3 forward + 2 backward tensors per GEMM, each an fp32
// scale and an fp32 amax history: 5 · 4 · (1024 + 1) = 20,500 B at TE's default length.
TEST(Types, LowPrecisionSavedInputsAndScalingMetadata) {
  EXPECT_DOUBLE_EQ(saved_linear_input_bytes(Precision::fp8), 1.0);
  EXPECT_DOUBLE_EQ(saved_linear_input_bytes(Precision::mxfp8), 1.0 + 1.0 / 32);
  EXPECT_DOUBLE_EQ(saved_linear_input_bytes(Precision::nvfp4), 4.0 / 8 + 1.0 / 16);
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
    EXPECT_EQ(saved_linear_input_bytes(p), 0.0);
  EXPECT_EQ(kTeAmaxHistory, 1024);
  EXPECT_DOUBLE_EQ(delayed_scaling_bytes_per_gemm(1024), 20500);
  EXPECT_DOUBLE_EQ(delayed_scaling_bytes_per_gemm(1), 40);  // Megatron-Core's default length
  EXPECT_THROW(delayed_scaling_bytes_per_gemm(0), InvalidInput);
}

// Note [low precision], Note [fp8 operand layouts]: e4m3 weight + its transpose on a TN-only GPU,
// the weight alone where any layout is taken; the block formats keep both copies everywhere.
TEST(Types, LowPrecisionCopiesPerWeight) {
  constexpr Fp8GemmLayouts tn_only = Fp8GemmLayouts::tn_only, any = Fp8GemmLayouts::any;
  EXPECT_DOUBLE_EQ(low_precision_copy_bytes(Precision::fp8, tn_only), 1.0 + 1.0);
  EXPECT_DOUBLE_EQ(low_precision_copy_bytes(Precision::fp8, any), 1.0);
  for (Fp8GemmLayouts l : {tn_only, any}) {
    EXPECT_DOUBLE_EQ(low_precision_copy_bytes(Precision::mxfp8, l), 2 * (1.0 + 1.0 / 32));
    EXPECT_DOUBLE_EQ(low_precision_copy_bytes(Precision::nvfp4, l), 2 * (4.0 / 8 + 1.0 / 16));
  }
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    EXPECT_EQ(low_precision_copy_bytes(p, tn_only), 0.0);
    EXPECT_EQ(quantized_element_bytes(p), 0.0);
    EXPECT_FALSE(is_low_precision(p));
    EXPECT_EQ(compute_precision(p), p);
  }
  for (Precision p : {Precision::fp8, Precision::mxfp8, Precision::nvfp4}) {
    EXPECT_TRUE(is_low_precision(p));
    EXPECT_EQ(compute_precision(p), Precision::bf16);
    EXPECT_EQ(dtype_bytes(p), 2.0);  // parameters, gradients, activations stay bf16
  }
}

// TE's is_non_tn_fp8_gemm_supported (pytorch/utils.py at 40c69e7): (10, 0) <= cc < (12, 0) or
// cc >= (13, 0). Ada (8.9), Hopper (9.0) and consumer Blackwell (12.0) take TN only; an unknown
// GPU (0) is counted as TN only.
TEST(Types, Fp8GemmLayoutsFollowTransformerEngine) {
  for (int cc : {0, 80, 89, 90, 120, 121})
    EXPECT_EQ(fp8_gemm_layouts(cc), Fp8GemmLayouts::tn_only) << cc;
  for (int cc : {100, 103, 110, 130})
    EXPECT_EQ(fp8_gemm_layouts(cc), Fp8GemmLayouts::any) << cc;
  EXPECT_THROW(fp8_gemm_layouts(-1), InvalidInput);
  EXPECT_EQ(compute_capability_name(103), "10.3");
  EXPECT_EQ(compute_capability_name(90), "9.0");
  EXPECT_EQ(compute_capability_name(0), "unknown");
  // The label names what is kept, and why.
  EXPECT_NE(low_precision_copies_label(Precision::fp8, 100).find("the weight alone"),
            std::string::npos);
  EXPECT_NE(low_precision_copies_label(Precision::fp8, 90).find("its transpose"),
            std::string::npos);
  EXPECT_NE(low_precision_copies_label(Precision::fp8, 0).find("assumed"), std::string::npos);
  EXPECT_NE(low_precision_copies_label(Precision::mxfp8, 100).find("column-wise"),
            std::string::npos);
  EXPECT_EQ(low_precision_copies_label(Precision::bf16, 100), "");
}

}  // namespace
}  // namespace tally::test_types
