// core/presets.hpp: every preset is valid and its hardware figures are the cited ones (presets.cpp
// names the datasheets); the default scenario resolves. Parameter counts are in test_model.cpp.
#include "tally/core/presets.hpp"

#include <gtest/gtest.h>

#include <iterator>
#include <set>
#include <string>
#include <utility>

namespace tally::test_presets {
namespace {

TEST(Presets, NamesAreUniqueAndResolve) {
  std::set<std::string> seen;
  for (const auto& n : model_preset_names()) {
    EXPECT_TRUE(seen.insert(n).second) << n;
    ASSERT_TRUE(model_preset(n).has_value()) << n;
    EXPECT_EQ(model_preset(n)->name, n);
    EXPECT_NO_THROW(model_preset(n)->validate()) << n;
  }
  for (const auto& n : cluster_preset_names()) {
    EXPECT_TRUE(seen.insert(n).second) << n;
    ASSERT_TRUE(cluster_preset(n).has_value()) << n;
    EXPECT_NO_THROW(cluster_preset(n)->validate()) << n;
  }
  EXPECT_FALSE(model_preset("llama-9-1t").has_value());
  EXPECT_FALSE(cluster_preset("").has_value());
  EXPECT_TRUE(model_preset(kDefaultModel).has_value());
  EXPECT_TRUE(cluster_preset(kDefaultCluster).has_value());
}

// NVIDIA A100 datasheet: 312 TFLOP/s BF16, 156 TF32, 19.5 FP32 (dense); nvidia-smi 81920 MiB.
// H100 SXM datasheet: 989.4 BF16, 494.7 TF32, 67 FP32, 1978.9 FP8 (dense); H200 shares the core
// with 143771 MiB (nvidia-smi, recorded in tests/data/h200_memory_probe.json).
TEST(Presets, GpuFiguresAreTheDatasheets) {
  const auto a100 = *cluster_preset("a100-80g");
  EXPECT_EQ(a100.gpu.peak_bf16_flops, 312e12);
  EXPECT_EQ(a100.gpu.peak_tf32_flops, 156e12);
  EXPECT_EQ(a100.gpu.peak_fp32_flops, 19.5e12);
  EXPECT_EQ(a100.gpu.peak_fp8_flops, 0.0);
  EXPECT_EQ(a100.gpu.memory_bytes, 81920 * 1048576.0);
  EXPECT_EQ(cluster_preset("a100-40g")->gpu.memory_bytes, 40960 * 1048576.0);
  const auto h200 = *cluster_preset("h200");
  EXPECT_EQ(h200.gpu.peak_bf16_flops, 989.4e12);
  EXPECT_EQ(h200.gpu.peak_fp8_flops, 1978.9e12);
  EXPECT_EQ(h200.gpu.memory_bytes, 143771 * 1048576.0);
  EXPECT_EQ(cluster_preset("h100-80g")->gpu.memory_bytes, 81559 * 1048576.0);
  // Training in fp32 runs its matmuls on TF32 tensor cores.
  EXPECT_EQ(a100.gpu.peak_flops(Precision::fp32), 156e12);
  EXPECT_EQ(a100.gpu.peak_flops(Precision::bf16), 312e12);
}

// NVLink 3 600 GB/s and NVLink 4 900 GB/s bidirectional are 300 and 450 GB/s per direction; one HDR
// (200 Gb/s = 25 GB/s) or NDR (400 Gb/s = 50 GB/s) NIC per GPU.
TEST(Presets, LinksArePerDirectionBytes) {
  EXPECT_EQ(cluster_preset("a100-80g")->intra_node.bandwidth_bps, 600e9 / 2);
  EXPECT_EQ(cluster_preset("a100-80g")->inter_node.bandwidth_bps, 200e9 / 8);
  EXPECT_EQ(cluster_preset("h100-80g")->intra_node.bandwidth_bps, 900e9 / 2);
  EXPECT_EQ(cluster_preset("h100-80g")->inter_node.bandwidth_bps, 400e9 / 8);
  // NVLink 5: 1.8 TB/s bidirectional; ConnectX-8: 800 Gb/s.
  EXPECT_EQ(cluster_preset("b200")->intra_node.bandwidth_bps, 1.8e12 / 2);
  EXPECT_EQ(cluster_preset("gb300-nvl72")->inter_node.bandwidth_bps, 800e9 / 8);
  // HGX/DGX hosts of 8 are their own NVLink domain; GB200/GB300 NVL72 racks join 18 hosts of 4.
  for (const auto& n : cluster_preset_names()) {
    const ClusterSpec c = *cluster_preset(n);
    const bool rack = n.rfind("-nvl72") == n.size() - 6;
    EXPECT_EQ(c.gpus_per_node, rack ? 4 : 8) << n;
    EXPECT_EQ(c.nvlink_domain_size(), rack ? 72 : 8) << n;
    EXPECT_NO_THROW(c.validate()) << n;
  }
}

// Blackwell peaks without sparsity (presets.cpp cites each): bf16 and fp8 per part, and the rack
// figures over 72 GPUs (GB300 NVL72: 180 PFLOP/s bf16, 360 fp8, 20.7 TB, 576 TB/s).
TEST(Presets, BlackwellPeaksAndRackShares) {
  EXPECT_EQ(cluster_preset("b200")->gpu.peak_bf16_flops, 2.25e15);
  EXPECT_EQ(cluster_preset("b200")->gpu.peak_fp8_flops, 4.5e15);
  const GpuSpec gb300 = cluster_preset("gb300-nvl72")->gpu;
  EXPECT_NEAR(gb300.peak_bf16_flops * 72, 180e15, 1e6);
  EXPECT_NEAR(gb300.peak_fp8_flops * 72, 360e15, 1e6);
  EXPECT_NEAR(gb300.memory_bytes * 72, 20.7e12, 1e3);
  EXPECT_NEAR(gb300.memory_bps * 72, 576e12, 1e3);
  EXPECT_NEAR(cluster_preset("gb200-nvl72")->gpu.memory_bytes * 72, 13.4e12, 1e10);
}

// Compute capabilities as NVIDIA lists them (developer.nvidia.com/cuda-gpus): A100 8.0, H100 and
// H200 9.0, B200 and GB200 10.0, B300 and GB300 10.3 — the Blackwell parts keep one fp8 weight copy.
TEST(Presets, ComputeCapabilities) {
  const std::pair<const char*, int> want[] = {
      {"a100-40g", 80}, {"a100-80g", 80}, {"h100-80g", 90},     {"h200", 90},
      {"b200", 100},    {"b300", 103},    {"gb200-nvl72", 100}, {"gb300-nvl72", 103}};
  for (const auto& [name, cc] : want)
    EXPECT_EQ(cluster_preset(name)->gpu.compute_capability, cc) << name;
  EXPECT_EQ(std::size(want), cluster_preset_names().size());  // every preset named above
}

}  // namespace
}  // namespace tally::test_presets
