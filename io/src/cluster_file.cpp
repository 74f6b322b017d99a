#include "tally/io/cluster_file.hpp"

#include <cmath>
#include <optional>
#include <string>

#include "json_reader.hpp"
#include "tally/core/hardware.hpp"
#include "tally/core/presets.hpp"
#include "tally/core/types.hpp"
#include "tally/io/files.hpp"

namespace tally::io {

namespace {

using detail::ObjectReader;
using detail::Range;

// Units of the file's fields (names carry them; see the header).
constexpr double kGiBBytes = 1073741824.0;  // memory_gib
constexpr double kGBBytes = 1e9;            // memory_gb, *_gbps (GB/s, bytes!)
constexpr double kTflops = 1e12;            // *_tflops
constexpr double kUs = 1e-6;                // *_us

// Bounds that reject typos and unit mix-ups while admitting any real or near-future system: core's
// HardwareBounds (the one place they are defined) in the file's units.
constexpr Range kMemoryGib{kMemoryBytesBounds.lo / kGiBBytes, 65536};  // up to 64 TiB per GPU
constexpr Range kMemoryGb{kMemoryBytesBounds.lo / kGBBytes, 70368.744177664};  // the same in GB
constexpr Range kPositiveTflops{kPeakFlopsBounds.lo / kTflops, kPeakFlopsBounds.hi / kTflops};
constexpr Range kTflops0{0, kPeakFlopsBounds.hi / kTflops};  // 0 = none
constexpr Range kBandwidthGbps{kBandwidthBpsBounds.lo / kGBBytes, 1e5};  // 1 MB/s .. 100 TB/s
constexpr Range kLatencyUs{kLatencySBounds.lo / kUs, kLatencySBounds.hi / kUs};
constexpr Range kFailureRate{kFailureRateBounds.lo, kFailureRateBounds.hi};  // per GPU-hour
constexpr Range kCheckpointGbps{kBandwidthBpsBounds.lo / kGBBytes, 1e6};
constexpr Range kMfu{kUtilisationBounds.lo, kUtilisationBounds.hi};
constexpr std::int64_t kMaxGpusPerNode = 1024;
constexpr std::int64_t kMaxNvlinkDomain = 1 << 16;  // GPUs on one NVLink fabric (NVL72: 72)
constexpr std::size_t kMaxNameChars = 64;

const char* const kNoPresetHint = "required when no \"preset\" is given";

// A field that is required without a preset and optional (keeps the preset's value) with one.
std::optional<double> get(const ObjectReader& r, std::string_view key, Range range, bool required) {
  if (required && !r.has(key))
    detail::fail_missing(r.source(), r.field(key),
                         std::string(kNoPresetHint) + ", a number in " + range.str());
  return r.opt_number(key, range);
}

void read_gpu(const ObjectReader& g, bool required, GpuSpec& gpu) {
  g.allow_only({"name", "memory_gib", "memory_gb", "peak_bf16_tflops", "peak_tf32_tflops",
                "peak_fp32_tflops", "peak_fp8_tflops", "peak_fp4_tflops", "memory_bandwidth_gbps",
                "sm_count", "compute_capability"});
  if (const auto name = g.opt_string("name", kMaxNameChars)) gpu.name = *name;
  if (g.has("memory_gib") && g.has("memory_gb"))
    detail::fail(g.source(), g.field("memory_gb"), detail::show(*g.find("memory_gb")),
                 "give either memory_gib or memory_gb, not both");
  if (g.has("memory_gb")) {
    gpu.memory_bytes = g.number("memory_gb", kMemoryGb) * kGBBytes;
  } else if (const auto gib = get(g, "memory_gib", kMemoryGib, required)) {
    gpu.memory_bytes = *gib * kGiBBytes;
  }
  if (const auto v = get(g, "peak_bf16_tflops", kPositiveTflops, required))
    gpu.peak_bf16_flops = *v * kTflops;
  if (const auto v = get(g, "peak_tf32_tflops", kPositiveTflops, required))
    gpu.peak_tf32_flops = *v * kTflops;
  if (const auto v = g.opt_number("peak_fp32_tflops", kTflops0)) gpu.peak_fp32_flops = *v * kTflops;
  if (const auto v = g.opt_number("peak_fp8_tflops", kTflops0)) gpu.peak_fp8_flops = *v * kTflops;
  if (const auto v = g.opt_number("peak_fp4_tflops", kTflops0)) gpu.peak_fp4_flops = *v * kTflops;
  // The operator time model's roofline (core/roofline.hpp); optional: without them a custom GPU
  // can be planned only with --time-model utilisation.
  if (const auto v = g.opt_number("memory_bandwidth_gbps", kBandwidthGbps))
    gpu.memory_bps = *v * kGBBytes;
  if (const auto v = g.opt_integer("sm_count", 1, 1'000'000)) gpu.kernels.sm_count = int(*v);
  // major.minor as NVIDIA writes it (9.0, 10.3): per-tensor fp8's weight copies (Note [fp8
  // operand layouts]); without it, and without a preset, TN-only fp8 GEMMs are assumed.
  if (const auto v = g.opt_number("compute_capability", Range{0, 99.9})) {
    const double tenths = *v * 10;
    if (std::abs(tenths - std::round(tenths)) > 1e-6)
      detail::fail(g.source(), g.field("compute_capability"),
                   detail::show(*g.find("compute_capability")),
                   "major.minor with one digit after the point, e.g. 9.0 or 10.3");
    gpu.compute_capability = int(std::lround(tenths));
  }
}

void read_link(const ObjectReader& r, std::string_view key, bool required, LinkSpec& link) {
  const auto obj = r.opt_object(key);
  if (!obj) {
    if (required)
      detail::fail_missing(r.source(), key,
                           std::string(kNoPresetHint) + ", {\"bandwidth_gbps\": GB/s, "
                           "\"latency_us\": microseconds}");
    return;
  }
  obj->allow_only({"bandwidth_gbps", "latency_us"});
  if (const auto v = get(*obj, "bandwidth_gbps", kBandwidthGbps, required))
    link.bandwidth_bps = *v * kGBBytes;
  if (const auto v = get(*obj, "latency_us", kLatencyUs, required)) link.latency_s = *v * kUs;
}

ClusterSpec parse(std::string_view text, std::string_view source) {
  const detail::json root = detail::parse_object(text, source);
  const ObjectReader r(root, source);
  r.allow_only({"preset", "comment", "gpu", "gpus_per_node", "nvlink_domain", "intra_node",
                "inter_node",
                "failure_rate_per_gpu_hour", "checkpoint_write_gbps",
                "checkpoint_write_gbps_per_node", "mfu"});
  (void)r.opt_string("comment", 4096);  // free text for humans; checked only for type

  ClusterSpec c;
  c.gpu.name = "custom";
  const auto preset = r.opt_string("preset", kMaxNameChars);
  if (preset) {
    const auto base = cluster_preset(*preset);
    if (!base) {
      std::string list;
      for (const auto& n : cluster_preset_names()) list += (list.empty() ? "" : ", ") + n;
      detail::fail(source, "preset", detail::show(detail::json(*preset)), "one of " + list);
    }
    c = *base;
  }
  const bool required = !preset;

  const auto gpu = r.opt_object("gpu");
  if (gpu)
    read_gpu(*gpu, required, c.gpu);
  else if (required)
    detail::fail_missing(source, "gpu", std::string(kNoPresetHint) + ", an object {...}");
  if (const auto n = r.opt_integer("gpus_per_node", 1, kMaxGpusPerNode)) c.gpus_per_node = int(*n);
  if (const auto n = r.opt_integer("nvlink_domain", 0, kMaxNvlinkDomain)) c.nvlink_domain = int(*n);
  read_link(r, "intra_node", required, c.intra_node);
  read_link(r, "inter_node", required, c.inter_node);
  if (const auto v = r.opt_number("failure_rate_per_gpu_hour", kFailureRate))
    c.failure_rate_per_hour = *v;
  if (const auto v = r.opt_number("checkpoint_write_gbps", kCheckpointGbps))
    c.checkpoint_write_bps = *v * kGBBytes;
  if (const auto v = r.opt_number("checkpoint_write_gbps_per_node", kCheckpointGbps))
    c.checkpoint_write_bps_per_node = *v * kGBBytes;
  if (const auto v = r.opt_number("mfu", kMfu)) c.mfu = *v;

  try {
    c.validate();
  } catch (const InvalidInput& e) {
    detail::rethrow_with_source(source, e);
  }
  return c;
}

}  // namespace

ClusterSpec parse_cluster(std::string_view json_text, std::string_view source_name) {
  return detail::guarded(source_name, [&] { return parse(json_text, source_name); });
}

ClusterSpec load_cluster(const std::filesystem::path& path) {
  return parse_cluster(read_text_file(path), path.string());
}

}  // namespace tally::io
