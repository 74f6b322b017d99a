// Cluster JSON reader: units converted once to SI, presets with overrides, and hostile input.
#include "tally/io/cluster_file.hpp"

#include <gtest/gtest.h>

#include <string>

#include "io_test_util.hpp"
#include "tally/core/presets.hpp"

namespace tally::io::test_cluster_file {
namespace {

using test::data_path;
using test::expect_invalid;
using test::fixture;
using test::replaced;

const char* const kSrc = "test/cluster.json";
ClusterSpec parse(const std::string& text) { return parse_cluster(text, kSrc); }

TEST(ClusterFile, CustomFileInSiUnits) {
  const ClusterSpec c = load_cluster(data_path("cluster-custom.json"));
  EXPECT_EQ(c.gpu.name, "my-a100");
  EXPECT_EQ(c.gpu.memory_bytes, 80.0 * 1073741824.0);  // memory_gib: GiB
  EXPECT_EQ(c.gpu.peak_bf16_flops, 312e12);             // *_tflops: 1e12 FLOP/s
  EXPECT_EQ(c.gpu.peak_tf32_flops, 156e12);
  EXPECT_EQ(c.gpu.peak_fp32_flops, 19.5e12);
  EXPECT_EQ(c.gpu.peak_fp8_flops, 0);
  EXPECT_EQ(c.gpus_per_node, 8);
  EXPECT_EQ(c.intra_node.bandwidth_bps, 300e9);         // *_gbps: GB/s = 1e9 BYTES/s
  EXPECT_DOUBLE_EQ(c.intra_node.latency_s, 3e-6);       // *_us: microseconds
  EXPECT_EQ(c.inter_node.bandwidth_bps, 50e9);
  EXPECT_DOUBLE_EQ(c.inter_node.latency_s, 10e-6);
  EXPECT_EQ(c.failure_rate_per_hour, 3e-6);
  EXPECT_EQ(c.checkpoint_write_bps, 2e9);
  EXPECT_EQ(c.mfu, 0.5);
}

TEST(ClusterFile, PresetWithOverrides) {
  const ClusterSpec base = *cluster_preset("h100-80g");
  const ClusterSpec c = load_cluster(data_path("cluster-preset-override.json"));
  EXPECT_EQ(c.gpu.name, base.gpu.name);
  EXPECT_EQ(c.gpu.memory_bytes, base.gpu.memory_bytes);
  EXPECT_EQ(c.gpu.peak_bf16_flops, base.gpu.peak_bf16_flops);
  EXPECT_EQ(c.gpus_per_node, 4);
  EXPECT_EQ(c.inter_node.bandwidth_bps, 25e9);
  EXPECT_EQ(c.inter_node.latency_s, base.inter_node.latency_s);  // not overridden: kept
  EXPECT_EQ(c.intra_node.bandwidth_bps, base.intra_node.bandwidth_bps);
  EXPECT_EQ(c.mfu, 0.35);
}

// A rack-scale NVLink domain (hosts of 4 on a 72-GPU fabric) from a file; a domain that is not
// whole hosts is refused naming the field.
TEST(ClusterFile, NvlinkDomain) {
  const ClusterSpec c = parse(R"({"preset": "h100-80g", "gpus_per_node": 4, "nvlink_domain": 72})");
  EXPECT_EQ(c.nvlink_domain_size(), 72);
  EXPECT_EQ(parse(R"({"preset": "h100-80g"})").nvlink_domain_size(), 8);
  expect_invalid([] { parse(R"({"preset": "h100-80g", "nvlink_domain": 12})"); },
                 {kSrc, "nvlink_domain = 12", "multiple of gpus_per_node = 8"});
}

TEST(ClusterFile, PresetAloneEqualsPreset) {
  for (const auto& name : cluster_preset_names()) {
    const ClusterSpec c = parse("{\"preset\": \"" + name + "\"}");
    const ClusterSpec p = *cluster_preset(name);
    EXPECT_EQ(c.gpu.memory_bytes, p.gpu.memory_bytes) << name;
    EXPECT_EQ(c.intra_node.bandwidth_bps, p.intra_node.bandwidth_bps) << name;
    EXPECT_EQ(c.inter_node.bandwidth_bps, p.inter_node.bandwidth_bps) << name;
    EXPECT_EQ(c.mfu, p.mfu) << name;
  }
}

// A GPU with block-scaled tensor cores states its dense FP4 peak (Note [low precision]).
TEST(ClusterFile, Fp4Peak) {
  const ClusterSpec c = parse(R"({"preset": "h100-80g", "gpu": {"peak_fp4_tflops": 3000}})");
  EXPECT_EQ(c.gpu.peak_fp4_flops, 3000e12);
  EXPECT_EQ(parse(R"({"preset": "h100-80g"})").gpu.peak_fp4_flops, 0);
  expect_invalid([] { parse(R"({"preset": "h100-80g", "gpu": {"peak_fp4_tflops": -1}})"); },
                 {kSrc, "peak_fp4_tflops"});
}

TEST(ClusterFile, MemoryInGb) {
  const ClusterSpec c = parse(R"({"preset": "a100-80g", "gpu": {"memory_gb": 80}})");
  EXPECT_EQ(c.gpu.memory_bytes, 80e9);
}

// ---- hostile input ----------------------------------------------------------------------------------

TEST(ClusterFileBad, UnknownKeyIsNamed) {
  expect_invalid([] { parse(R"({"preset": "a100-80g", "gpus_per_nodes": 4})"); },
                 {kSrc, "unknown key \"gpus_per_nodes\"", "gpus_per_node"});
  expect_invalid([] { parse(R"({"preset": "a100-80g", "gpu": {"memory_gbs": 80}})"); },
                 {kSrc, "unknown key \"memory_gbs\" in gpu"});
  expect_invalid([] { parse(R"({"preset": "a100-80g", "inter_node": {"bandwidth_gbit": 200}})"); },
                 {kSrc, "unknown key \"bandwidth_gbit\" in inter_node", "bandwidth_gbps"});
}

TEST(ClusterFileBad, UnknownPreset) {
  expect_invalid([] { parse(R"({"preset": "a100-80gb"})"); },
                 {kSrc, "preset = \"a100-80gb\"", "a100-80g", "h100-80g"});
}

TEST(ClusterFileBad, MissingWithoutPreset) {
  const auto no_mem = replaced(fixture("cluster-custom.json"), "\"memory_gib\": 80,", "");
  expect_invalid([&] { parse(no_mem); }, {kSrc, "gpu.memory_gib missing", "preset"});
  const auto no_lat = replaced(fixture("cluster-custom.json"), ", \"latency_us\": 10", "");
  expect_invalid([&] { parse(no_lat); }, {kSrc, "inter_node.latency_us missing"});
  expect_invalid([] { parse("{}"); }, {kSrc, "gpu missing"});
}

TEST(ClusterFileBad, WrongTypes) {
  const auto text = fixture("cluster-custom.json");
  expect_invalid([&] { parse(replaced(text, "\"mfu\": 0.5", "\"mfu\": \"0.5\"")); },
                 {kSrc, "mfu = \"0.5\"", "[0.001, 1]", "a string"});
  expect_invalid([&] { parse(replaced(text, "\"gpus_per_node\": 8", "\"gpus_per_node\": true")); },
                 {kSrc, "gpus_per_node = true", "a boolean"});
  expect_invalid([&] { parse(replaced(text, "\"gpus_per_node\": 8", "\"gpus_per_node\": 8.5")); },
                 {kSrc, "gpus_per_node = 8.5", "integer"});
  expect_invalid([&] { parse(replaced(text, "\"gpu\": {", "\"gpu\": [{")); }, {kSrc});
  expect_invalid([&] { parse(R"({"preset": "a100-80g", "gpu": "a100"})"); },
                 {kSrc, "gpu = \"a100\"", "object"});
}

TEST(ClusterFileBad, OutOfRange) {
  const auto text = fixture("cluster-custom.json");
  expect_invalid([&] { parse(replaced(text, "\"mfu\": 0.5", "\"mfu\": 50")); },
                 {kSrc, "mfu = 50", "[0.001, 1]"});
  expect_invalid([&] { parse(replaced(text, "\"mfu\": 0.5", "\"mfu\": 0")); }, {kSrc, "mfu = 0"});
  expect_invalid([&] { parse(replaced(text, "\"bandwidth_gbps\": 300", "\"bandwidth_gbps\": -300")); },
                 {kSrc, "intra_node.bandwidth_gbps = -300", "[0.001, 100000]"});
  // 300e9 "GB/s" is someone who wrote bytes/s: rejected, not silently 3e20 bytes/s.
  expect_invalid([&] { parse(replaced(text, "\"bandwidth_gbps\": 300", "\"bandwidth_gbps\": 3e11")); },
                 {kSrc, "intra_node.bandwidth_gbps"});
  expect_invalid([&] { parse(replaced(text, "\"gpus_per_node\": 8", "\"gpus_per_node\": 0")); },
                 {kSrc, "gpus_per_node = 0", "[1, 1024]"});
  expect_invalid([&] { parse(replaced(text, "\"memory_gib\": 80", "\"memory_gib\": 1e12")); },
                 {kSrc, "gpu.memory_gib"});
  expect_invalid([&] { parse(replaced(text, "\"failure_rate_per_gpu_hour\": 3e-6",
                                      "\"failure_rate_per_gpu_hour\": -1")); },
                 {kSrc, "failure_rate_per_gpu_hour = -1", "[0, 1]"});
}

TEST(ClusterFileBad, BothMemoryUnits) {
  expect_invalid([] { parse(R"({"preset": "h200", "gpu": {"memory_gib": 80, "memory_gb": 80}})"); },
                 {kSrc, "memory_gib or memory_gb"});
}

TEST(ClusterFileBad, NotJsonNotObjectTooLarge) {
  expect_invalid([] { parse("{\"preset\": "); }, {kSrc, "not valid JSON"});
  expect_invalid([] { parse("[]"); }, {kSrc, "must be a JSON object"});
  const auto path = test::temp_file("cluster_too_large.json", std::string(kMaxJsonFileBytes + 1, ' '));
  expect_invalid([&] { load_cluster(path); }, {path.string(), "4 MiB"});
}

}  // namespace
}  // namespace tally::io::test_cluster_file

namespace tally::io::test_cluster_file {
namespace {

// The operator model's roofline figures and the per-node checkpoint bandwidth, in their units.
TEST(ClusterFile, RooflineAndPerNodeCheckpointFields) {
  const ClusterSpec c = parse_cluster(
      R"({"preset": "a100-80g", "gpu": {"memory_bandwidth_gbps": 1555, "sm_count": 100},
          "checkpoint_write_gbps_per_node": 2.5})",
      "t.json");
  EXPECT_EQ(c.gpu.memory_bps, 1555e9);  // GB/s = 1e9 bytes/s
  EXPECT_EQ(c.gpu.kernels.sm_count, 100);
  EXPECT_EQ(c.checkpoint_write_bps_per_node, 2.5e9);
  EXPECT_EQ(c.checkpoint_write_bps_for(64), 8 * 2.5e9);  // 64 GPUs = 8 nodes of 8
  test::expect_invalid([] { parse_cluster(R"({"preset": "h200", "gpu": {"sm_count": 0}})", "t"); },
                       {"sm_count"});
}

// Compute capability as NVIDIA writes it, stored as 10·major + minor; a preset keeps its own.
TEST(ClusterFile, ComputeCapabilityIsMajorDotMinor) {
  EXPECT_EQ(parse_cluster(R"({"preset": "h100-80g", "gpu": {"compute_capability": 10.3}})", "t")
                .gpu.compute_capability,
            103);
  EXPECT_EQ(parse_cluster(R"({"preset": "b200"})", "t").gpu.compute_capability, 100);
  test::expect_invalid(
      [] { parse_cluster(R"({"preset": "h200", "gpu": {"compute_capability": 9.05}})", "t"); },
      {"compute_capability", "9.0 or 10.3"});
  test::expect_invalid(
      [] { parse_cluster(R"({"preset": "h200", "gpu": {"compute_capability": 100}})", "t"); },
      {"compute_capability"});
}

}  // namespace
}  // namespace tally::io::test_cluster_file
