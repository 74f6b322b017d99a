#include "tally/io/calibration.hpp"

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <vector>
#include <string>
#include <utility>

#include "json_reader.hpp"
#include "tally/core/comm.hpp"
#include "tally/core/comm_fit.hpp"
#include "tally/core/hardware.hpp"
#include "tally/core/operators.hpp"
#include "tally/core/types.hpp"
#include "tally/io/files.hpp"

namespace tally::io {

namespace {

using detail::json;
using detail::ObjectReader;
using detail::Range;

constexpr std::string_view kFormat = "tally-calibration";
constexpr std::int64_t kVersion = 1;

// core's HardwareBounds, the one place the physical bounds are defined.
constexpr Range kAlphaS{kLatencySBounds.lo, kLatencySBounds.hi};            // per-step latency
constexpr Range kBetaBps{kBandwidthBpsBounds.lo, kBandwidthBpsBounds.hi};   // 1 MB/s .. 1 PB/s
constexpr Range kMfu{kUtilisationBounds.lo, kUtilisationBounds.hi};
constexpr std::int64_t kMaxRanks = std::int64_t{1} << 20;
constexpr Range kSizeBytes{0, 1e15};
constexpr Range kSeconds{0, 1e6};
constexpr Range kPositiveSeconds{1e-9, 1e6};  // divided by (Note [host overlap])
constexpr Range kBusbwBps{0, 1e15};
constexpr std::size_t kMaxPoints = 100000;
constexpr std::size_t kMaxSourceChars = 4096;
constexpr std::size_t kMaxCollectiveChars = 32;

json link_to_json(const LinkSpec& l) {
  return json{{"alpha_s", l.latency_s}, {"beta_bytes_per_s", l.bandwidth_bps}};
}

std::optional<LinkSpec> read_link(const ObjectReader& r, std::string_view key) {
  const auto obj = r.opt_object(key);
  if (!obj) return std::nullopt;
  obj->allow_only({"alpha_s", "beta_bytes_per_s"});
  return LinkSpec{.bandwidth_bps = obj->number("beta_bytes_per_s", kBetaBps),
                  .latency_s = obj->number("alpha_s", kAlphaS)};
}

std::string read_collective(const ObjectReader& p) {
  const auto name = p.opt_string("collective", kMaxCollectiveChars);
  if (!name)
    detail::fail_missing(p.source(), p.field("collective"), "required, e.g. \"allreduce\"");
  for (const char ch : *name)
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-'))
      detail::fail(p.source(), p.field("collective"), detail::show(json(*name)),
                   "must use only a-z, 0-9, '_' and '-'");
  return *name;
}

CalibrationPoint read_point(const json& v, std::string_view source, std::size_t i) {
  const std::string field = "points[" + std::to_string(i) + "]";
  if (!v.is_object())
    detail::fail(source, field, detail::show(v), "must be an object {\"collective\": ...}");
  const ObjectReader p(v, source, field + ".");
  p.allow_only({"collective", "ranks", "size_bytes", "seconds_median", "seconds_mean",
                "busbw_bytes_per_s"});
  return CalibrationPoint{.collective = read_collective(p),
                          .ranks = int(p.integer("ranks", 1, kMaxRanks)),
                          .size_bytes = p.number("size_bytes", kSizeBytes),
                          .seconds_median = p.number("seconds_median", kSeconds),
                          .busbw_bps = p.number("busbw_bytes_per_s", kBusbwBps),
                          .seconds_mean = p.has("seconds_mean") ? p.number("seconds_mean", kSeconds)
                                                                : 0.0};
}

OverlapPoint read_overlap(const json& v, std::string_view source, std::size_t i) {
  const std::string field = "overlap[" + std::to_string(i) + "]";
  if (!v.is_object())
    detail::fail(source, field, detail::show(v), "must be an object {\"ranks\": ...}");
  const ObjectReader p(v, source, field + ".");
  p.allow_only({"ranks", "size_bytes", "work_seconds", "comm_seconds", "together_seconds"});
  return OverlapPoint{.ranks = int(p.integer("ranks", 2, kMaxRanks)),
                      .size_bytes = p.number("size_bytes", kSizeBytes),
                      .work_seconds = p.number("work_seconds", kPositiveSeconds),
                      .comm_seconds = p.number("comm_seconds", kPositiveSeconds),
                      .together_seconds = p.number("together_seconds", kPositiveSeconds)};
}

constexpr Range kPeakFlops{kPeakFlopsBounds.lo, kPeakFlopsBounds.hi};
constexpr Range kMemoryBps{kBandwidthBpsBounds.lo, kBandwidthBpsBounds.hi};
constexpr Range kKernelSeconds{1e-9, 1e6};
constexpr Range kOverheadSeconds{0, 1};  // KernelPerf's overheads: [0, 1] s
constexpr Range kWorkingSetBytes{1, 1e15};
constexpr std::int64_t kMaxDim = std::int64_t{1} << 24;
constexpr std::size_t kMaxNameChars = 128;

// A GEMM grid of a few hundred points is plenty; the fit costs ~800 model evaluations per point,
// so the cap keeps a hostile file from turning `plan --calibration` into minutes.
constexpr std::size_t kMaxKernelPoints = 4096;

// The array `key` of objects, each read by `one(reader, index)`.
template <class T, class F>
std::vector<T> read_objects(const ObjectReader& r, std::string_view key, F one) {
  std::vector<T> out;
  const json* items = r.opt_array(key, kMaxKernelPoints);
  if (!items) return out;
  for (std::size_t i = 0; i < items->size(); ++i) {
    const std::string field = r.field(key) + "[" + std::to_string(i) + "]";
    if (!(*items)[i].is_object()) detail::fail(r.source(), field, detail::show((*items)[i]), "must be an object");
    out.push_back(one(ObjectReader((*items)[i], r.source(), field + "."), i));
  }
  return out;
}

std::optional<KernelCalibration> read_kernels(const ObjectReader& r) {
  const auto k = r.opt_object("kernels");
  if (!k) return std::nullopt;
  k->allow_only({"device", "precision", "peak_flops", "sm_count", "memory_bytes_per_s",
                 "memory_overhead_s", "memory_curve", "gemm", "gemm_sustained", "attention",
                 "streaming_kernels"});
  KernelCalibration c;
  c.device = k->opt_string("device", kMaxNameChars).value_or("");
  c.precision = k->opt_string("precision", 16).value_or("bf16");
  if (!parse_precision(c.precision))
    detail::fail(k->source(), k->field("precision"), detail::show(json(c.precision)),
                 "one of fp32, bf16, fp16");
  c.peak_flops = k->number("peak_flops", kPeakFlops);
  if (const auto sm = k->opt_integer("sm_count", 1, 1'000'000)) c.sm_count = int(*sm);
  c.memory_bps = k->opt_number("memory_bytes_per_s", kMemoryBps);
  c.memory_overhead_s = k->opt_number("memory_overhead_s", kOverheadSeconds);
  c.memory_curve = read_objects<BandwidthPoint>(*k, "memory_curve", [](const ObjectReader& b, std::size_t) {
    b.allow_only({"working_set_bytes", "bytes_per_s"});
    return BandwidthPoint{.working_set_bytes = b.number("working_set_bytes", kWorkingSetBytes),
                          .bytes_per_s = b.number("bytes_per_s", kMemoryBps)};
  });
  const auto gemm_sample = [](const ObjectReader& g, std::size_t) {
    g.allow_only({"m", "n", "k", "batch", "seconds_median"});
    return GemmSample{.m = g.integer("m", 1, kMaxDim), .n = g.integer("n", 1, kMaxDim),
                      .k = g.integer("k", 1, kMaxDim),
                      .batch = double(g.opt_integer("batch", 1, kMaxDim).value_or(1)),
                      .seconds = g.number("seconds_median", kKernelSeconds)};
  };
  c.gemm = read_objects<GemmSample>(*k, "gemm", gemm_sample);
  c.gemm_sustained = read_objects<GemmSample>(*k, "gemm_sustained", gemm_sample);
  c.attention = read_objects<AttentionPoint>(*k, "attention", [](const ObjectReader& a, std::size_t) {
    a.allow_only({"batch", "heads", "seq", "head_dim", "causal", "forward_seconds",
                  "backward_seconds"});
    return AttentionPoint{.batch = int(a.integer("batch", 1, kMaxDim)),
                          .heads = int(a.integer("heads", 1, kMaxDim)),
                          .seq = a.integer("seq", 1, kMaxDim),
                          .head_dim = a.integer("head_dim", 1, kMaxDim),
                          .causal = a.opt_boolean("causal").value_or(true),
                          .forward_seconds = a.number("forward_seconds", kKernelSeconds),
                          .backward_seconds = a.number("backward_seconds", kKernelSeconds)};
  });
  c.streaming_kernels = read_objects<StreamingKernelPoint>(
      *k, "streaming_kernels", [](const ObjectReader& e, std::size_t) {
        e.allow_only({"kernel", "bytes", "seconds_median"});
        const auto name = e.opt_string("kernel", kMaxCollectiveChars);
        if (!name) detail::fail_missing(e.source(), e.field("kernel"), "required, e.g. \"gelu\"");
        if (name->empty() || kernel_family(*name) != *name)
          detail::fail(e.source(), e.field("kernel"), detail::show(json(*name)),
                       "must be a kernel family as core names it (\"norm\", not \"norm-1\")");
        return StreamingKernelPoint{.kernel = *name,
                                    .bytes = e.number("bytes", kWorkingSetBytes),
                                    .seconds_median = e.number("seconds_median", kKernelSeconds)};
      });
  for (std::size_t i = 0; i < c.streaming_kernels.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (c.streaming_kernels[j].kernel == c.streaming_kernels[i].kernel)
        detail::fail(k->source(), k->field("streaming_kernels") + "[" + std::to_string(i) +
                                      "].kernel",
                     detail::show(json(c.streaming_kernels[i].kernel)),
                     "each kernel family at most once");
  return c;
}

json kernels_to_json(const KernelCalibration& c) {
  json j{{"device", c.device}, {"precision", c.precision}, {"peak_flops", c.peak_flops}};
  if (c.sm_count) j["sm_count"] = *c.sm_count;
  if (c.memory_bps) j["memory_bytes_per_s"] = *c.memory_bps;
  if (c.memory_overhead_s) j["memory_overhead_s"] = *c.memory_overhead_s;
  json gemm = json::array(), attention = json::array(), curve = json::array();
  for (const auto& b : c.memory_curve)
    curve.push_back({{"working_set_bytes", b.working_set_bytes}, {"bytes_per_s", b.bytes_per_s}});
  if (!c.memory_curve.empty()) j["memory_curve"] = std::move(curve);
  const auto gemm_json = [](const GemmSample& g) {
    return json{{"m", g.m}, {"n", g.n}, {"k", g.k}, {"batch", std::int64_t(g.batch)},
                {"seconds_median", g.seconds}};
  };
  for (const auto& g : c.gemm) gemm.push_back(gemm_json(g));
  if (!c.gemm_sustained.empty()) {
    json sustained = json::array();
    for (const auto& g : c.gemm_sustained) sustained.push_back(gemm_json(g));
    j["gemm_sustained"] = std::move(sustained);
  }
  for (const auto& a : c.attention)
    attention.push_back({{"batch", a.batch}, {"heads", a.heads}, {"seq", a.seq},
                         {"head_dim", a.head_dim}, {"causal", a.causal},
                         {"forward_seconds", a.forward_seconds},
                         {"backward_seconds", a.backward_seconds}});
  j["gemm"] = std::move(gemm);
  j["attention"] = std::move(attention);
  if (!c.streaming_kernels.empty()) {
    json streaming = json::array();
    for (const auto& e : c.streaming_kernels)
      streaming.push_back(
          {{"kernel", e.kernel}, {"bytes", e.bytes}, {"seconds_median", e.seconds_median}});
    j["streaming_kernels"] = std::move(streaming);
  }
  return j;
}

Calibration parse(std::string_view text, std::string_view source) {
  const json root = detail::parse_object(text, source);
  const ObjectReader r(root, source);
  r.allow_only({"format", "version", "source", "comment", "intra_node", "inter_node", "mfu",
                "points", "overlap", "kernels"});
  if (const auto f = r.opt_string("format", 64); f && *f != kFormat)
    detail::fail(source, "format", detail::show(json(*f)),
                 "must be \"" + std::string(kFormat) + "\"");
  (void)r.opt_integer("version", kVersion, kVersion);
  (void)r.opt_string("comment", kMaxSourceChars);

  Calibration c;
  c.source = r.opt_string("source", kMaxSourceChars).value_or(std::string(source));
  c.intra_node = read_link(r, "intra_node");
  c.inter_node = read_link(r, "inter_node");
  c.mfu = r.opt_number("mfu", kMfu);
  if (const json* points = r.opt_array("points", kMaxPoints)) {
    c.points.reserve(points->size());
    for (std::size_t i = 0; i < points->size(); ++i)
      c.points.push_back(read_point((*points)[i], source, i));
  }
  if (const json* overlap = r.opt_array("overlap", kMaxPoints))
    for (std::size_t i = 0; i < overlap->size(); ++i)
      c.overlap.push_back(read_overlap((*overlap)[i], source, i));
  c.kernels = read_kernels(r);
  return c;
}

// NaN and infinities would dump as null and read back as "missing"; name them here instead.
void require_finite(double v, const std::string& field) {
  if (!std::isfinite(v))
    detail::fail("calibration_to_json", field, detail::format_number(v), "must be a finite number");
}

void require_finite(const Calibration& c) {
  for (const auto& [link, name] : {std::pair{&c.intra_node, "intra_node"},
                                   std::pair{&c.inter_node, "inter_node"}}) {
    if (!*link) continue;
    require_finite((*link)->latency_s, std::string(name) + ".alpha_s");
    require_finite((*link)->bandwidth_bps, std::string(name) + ".beta_bytes_per_s");
  }
  if (c.mfu) require_finite(*c.mfu, "mfu");
  for (std::size_t i = 0; i < c.points.size(); ++i) {
    const std::string at = "points[" + std::to_string(i) + "].";
    require_finite(c.points[i].size_bytes, at + "size_bytes");
    require_finite(c.points[i].seconds_median, at + "seconds_median");
    require_finite(c.points[i].seconds_mean, at + "seconds_mean");
    require_finite(c.points[i].busbw_bps, at + "busbw_bytes_per_s");
  }
  for (std::size_t i = 0; i < c.overlap.size(); ++i) {
    const std::string at = "overlap[" + std::to_string(i) + "].";
    require_finite(c.overlap[i].size_bytes, at + "size_bytes");
    require_finite(c.overlap[i].work_seconds, at + "work_seconds");
    require_finite(c.overlap[i].comm_seconds, at + "comm_seconds");
    require_finite(c.overlap[i].together_seconds, at + "together_seconds");
  }
}

}  // namespace

std::string calibration_to_json(const Calibration& c) {
  require_finite(c);
  json j{{"format", kFormat}, {"version", kVersion}, {"source", c.source}};
  if (c.intra_node) j["intra_node"] = link_to_json(*c.intra_node);
  if (c.inter_node) j["inter_node"] = link_to_json(*c.inter_node);
  if (c.mfu) j["mfu"] = *c.mfu;
  json points = json::array();
  for (const auto& p : c.points) {
    json q{{"collective", p.collective},
           {"ranks", p.ranks},
           {"size_bytes", p.size_bytes},
           {"seconds_median", p.seconds_median},
           {"busbw_bytes_per_s", p.busbw_bps}};
    if (p.seconds_mean != 0) q["seconds_mean"] = p.seconds_mean;
    points.push_back(std::move(q));
  }
  j["points"] = std::move(points);
  if (!c.overlap.empty()) {
    json overlap = json::array();
    for (const OverlapPoint& o : c.overlap)
      overlap.push_back({{"ranks", o.ranks},
                         {"size_bytes", o.size_bytes},
                         {"work_seconds", o.work_seconds},
                         {"comm_seconds", o.comm_seconds},
                         {"together_seconds", o.together_seconds}});
    j["overlap"] = std::move(overlap);
  }
  if (c.kernels) j["kernels"] = kernels_to_json(*c.kernels);
  // Invalid UTF-8 in strings is replaced rather than thrown on.
  std::string text = j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  // Read it back with the reader's checks, so nothing is written that cannot be loaded.
  (void)parse_calibration(text, "calibration_to_json");
  return text;
}

Calibration parse_calibration(std::string_view json_text, std::string_view source_name) {
  return detail::guarded(source_name, [&] { return parse(json_text, source_name); });
}

Calibration load_calibration(const std::filesystem::path& path) {
  return parse_calibration(read_text_file(path), path.string());
}

namespace {

// The upper median: the middle sample of an odd count, the larger middle one of an even count.
double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// A measured GEMM as the operator model's kernel: its FLOPs and bytes in precision p.
Op gemm_sample_op(const GemmSample& g, Precision p) {
  return gemm_kernel("gemm", Pass::forward, g.m, g.n, g.k, g.batch, dtype_bytes(p));
}

// Note [GEMM calibration] applied: fractions are relative to the peak the benchmark states, so a
// measurement keeps its meaning on a preset whose peak is quoted differently.
void apply_kernels(GpuSpec& gpu, const KernelCalibration& k) {
  KernelPerf& kp = gpu.kernels;
  if (k.sm_count) kp.sm_count = *k.sm_count;
  const Precision p = *parse_precision(k.precision);
  const double rescale = k.peak_flops / gpu.peak_flops(p);  // fraction of the benchmark's peak
  // Another device's kernels (a CPU's on a GPU preset) would turn every GEMM into a crawl, or a
  // sprint: one line instead of a silently wrong plan.
  if (!(rescale >= 0.02 && rescale <= 50))
    throw InvalidInput("kernels measured on '" + k.device + "' (peak_flops " +
                       format_number(k.peak_flops) + " FLOP/s) cannot describe gpu '" + gpu.name +
                       "' (" + format_number(gpu.peak_flops(p)) + " FLOP/s at " + k.precision +
                       "): use a calibration of that device");
  // The streaming rate first: a GEMM's modelled time below is a roofline, its bytes at this rate.
  if (k.memory_overhead_s) kp.memory_overhead_s = *k.memory_overhead_s;
  if (k.memory_bps) {
    if (gpu.memory_bps <= 0) gpu.memory_bps = *k.memory_bps;
    kp.memory_fraction = std::min(1.0, *k.memory_bps / gpu.memory_bps);
  }
  if (k.gemm.size() >= 3) {
    const KernelPerf fit = fit_gemm_perf(kp, k.peak_flops, k.gemm);
    kp.gemm_half_k = fit.gemm_half_k;
    kp.gemm_half_mn = fit.gemm_half_mn;
    kp.half_tile_efficiency = fit.half_tile_efficiency;
    kp.kernel_overhead_s = fit.kernel_overhead_s;
    kp.gemm_fraction = std::min(1.0, fit.gemm_fraction * rescale);
    // No shape faster than the best one measured.
    double best = 0;
    for (const GemmSample& g : k.gemm)
      best = std::max(best, 2.0 * g.batch * double(g.m) * double(g.n) * double(g.k) / g.seconds);
    kp.gemm_ceiling = std::clamp(best / gpu.peak_flops(p), 1e-6, 1.0);
  }
  // Note [GEMM residuals] (core/roofline.hpp): each measured shape against the fitted terms, at
  // burst clock (the grid's), the model's own GEMM time: FLOPs and bytes in the stated precision.
  kp.gemm_residuals.clear();
  if (k.gemm.size() >= 3) {
    GpuSpec fitted = gpu;
    fitted.kernels.sustained_gemm = 1;
    fitted.kernels.gemm_residuals.clear();
    for (const GemmSample& g : k.gemm) {
      const Op op = gemm_sample_op(g, p);
      kp.gemm_residuals.push_back({.log2_m = std::log2(double(g.m)),
                                   .log2_n = std::log2(double(g.n)),
                                   .log2_k = std::log2(double(g.k)),
                                   .log2_batch = std::log2(g.batch),
                                   .log_ratio = std::log(g.seconds / op_seconds(op, fitted, p))});
    }
  }
  if (!k.gemm_sustained.empty()) {
    // Note [power cap]: the burst terms above against GEMMs timed at the cap.
    GpuSpec burst = gpu;
    burst.kernels.sustained_gemm = 1;
    std::vector<double> ratio;
    for (const GemmSample& g : k.gemm_sustained)
      ratio.push_back(g.seconds / op_seconds(gemm_sample_op(g, p), burst, p));
    kp.sustained_gemm = std::clamp(1 / median(ratio), 1e-6, 1.0);
  }
  if (!k.attention.empty()) {
    std::vector<double> fwd, bwd;
    kp.attention_table.clear();
    kp.cudnn_attention_table.clear();  // the probe's kernel prices every choice (Note [cuDNN
                                       // attention], presets.cpp)
    for (const auto& a : k.attention) {
      const double flops = 4.0 * a.batch * a.heads * double(a.seq) * double(a.seq) *
                           double(a.head_dim) * (a.causal ? 0.5 : 1.0);
      fwd.push_back(std::clamp(flops / (k.peak_flops * a.forward_seconds) * rescale, 1e-6, 1.0));
      bwd.push_back(
          std::clamp(2.5 * flops / (k.peak_flops * a.backward_seconds) * rescale, 1e-6, 1.0));
      kp.attention_table.push_back(
          {.head_dim = a.head_dim, .seq = a.seq, .forward = fwd.back(), .backward = bwd.back()});
    }
    // The medians stand where one figure is asked for; each kernel takes the table (Note
    // [attention table], core/roofline.hpp).
    kp.attention_forward_fraction = median(fwd);
    kp.attention_backward_fraction = median(bwd);
  }
  if (!k.streaming_kernels.empty()) {
    kp.streaming_rates.clear();
    for (const StreamingKernelPoint& e : k.streaming_kernels) {
      const double rate = e.bytes / e.seconds_median;
      if (!(rate >= kBandwidthBpsBounds.lo && rate <= kBandwidthBpsBounds.hi))
        throw InvalidInput("kernels.streaming_kernels '" + e.kernel +
                           "': bytes / seconds_median = " + format_number(rate) +
                           " B/s: must be in [" +
                           format_number(kBandwidthBpsBounds.lo) + ", " +
                           format_number(kBandwidthBpsBounds.hi) + "] B/s");
      kp.streaming_rates.push_back({.family = e.kernel, .bytes_per_s = rate});
    }
  }
}

}  // namespace

ClusterSpec apply_calibration(ClusterSpec cluster, const Calibration& c) {
  if (c.intra_node) cluster.intra_node = *c.intra_node;
  if (c.inter_node) cluster.inter_node = *c.inter_node;
  if (c.mfu) cluster.mfu = *c.mfu;
  if (c.kernels) apply_kernels(cluster.gpu, *c.kernels);
  try {
    cluster.validate();
  } catch (const InvalidInput& e) {
    detail::rethrow_with_source("calibration " + c.source, e);
  }
  return cluster;
}

Calibration merged_with_file(Calibration c, const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) return c;
  Calibration old = load_calibration(path);
  if (!c.intra_node) c.intra_node = old.intra_node;
  if (!c.inter_node) c.inter_node = old.inter_node;
  if (!c.mfu) c.mfu = old.mfu;
  if (!c.kernels) c.kernels = std::move(old.kernels);
  if (c.points.empty()) c.points = std::move(old.points);
  if (c.overlap.empty()) c.overlap = std::move(old.overlap);
  return c;
}

ClusterSpec host_cluster(const Calibration& c, bool need_link) {
  const auto missing = [&](const std::string& what) {
    throw InvalidInput("calibration " + c.source + ": " + what +
                       " (run `tally bench gemm`, `tally bench memory` and, with k >= 2 ranks, "
                       "`tally bench allreduce` with --calibration-out FILE)");
  };
  if (!c.kernels) missing("no kernels section");
  const KernelCalibration& k = *c.kernels;
  if (k.gemm.size() < 3) missing("kernels.gemm has " + std::to_string(k.gemm.size()) +
                                 " samples; the fit needs >= 3");
  if (!k.memory_bps) missing("no kernels.memory_bytes_per_s");
  if (need_link && !c.intra_node) missing("no intra_node alpha/beta");
  ClusterSpec host;
  host.gpu.name = k.device.empty() ? "host" : k.device;
  host.gpu.memory_bytes = kMemoryBytesBounds.hi;  // not a constraint of the step model
  host.gpu.peak_fp32_flops = host.gpu.peak_tf32_flops = host.gpu.peak_bf16_flops = k.peak_flops;
  host.gpu.memory_bps = *k.memory_bps;
  host.gpu.kernels = KernelPerf{.sm_count = k.sm_count.value_or(1), .tile_m = 1, .tile_n = 1};
  host.gpus_per_node = 1 << 20;  // every rank on this host
  const LinkSpec link = c.intra_node.value_or(LinkSpec{.bandwidth_bps = 1e9, .latency_s = 0});
  host.intra_node = host.inter_node = link;
  return apply_calibration(host, c);
}

Collective points_collective(std::string_view label) {
  if (label == kRingReduceScatterPoints) return Collective::reduce_scatter;
  if (label == kGlooAllGatherPoints) return Collective::all_gather;
  return Collective::all_reduce;
}

std::optional<LinkSpec> fitted_link(const Calibration& c, std::string_view collective, int ranks) {
  if (ranks < 2) return std::nullopt;
  std::vector<const CalibrationPoint*> chosen;
  for (const CalibrationPoint& p : c.points)
    if (p.collective == collective && p.ranks == ranks) chosen.push_back(&p);
  const bool means = !chosen.empty() && std::all_of(chosen.begin(), chosen.end(), [](auto* p) {
    return p->seconds_mean > 0;
  });
  std::vector<FitPoint> points;
  const Collective kind = points_collective(collective);
  const int steps = collective_steps(kind, ranks);
  for (const CalibrationPoint* p : chosen)
    points.push_back({.steps = steps,
                      .bytes_per_rank = collective_bytes_per_rank(kind, p->size_bytes, ranks),
                      .seconds = means ? p->seconds_mean : p->seconds_median});
  const AlphaBetaFit fit = fit_alpha_beta(points);
  if (!fit.ok) return std::nullopt;
  const std::string at = "the '" + std::string(collective) + "' points at " +
                         std::to_string(ranks) + " ranks fit ";
  require_real(fit.beta_bps >= kBandwidthBpsBounds.lo && fit.beta_bps <= kBandwidthBpsBounds.hi,
               at + "beta_bytes_per_s", fit.beta_bps, "must be in [1e6, 1e15] bytes/s");
  require_real(fit.alpha_s >= kLatencySBounds.lo && fit.alpha_s <= kLatencySBounds.hi,
               at + "alpha_s", fit.alpha_s, "must be in [0, 1] s");
  return LinkSpec{.bandwidth_bps = fit.beta_bps, .latency_s = fit.alpha_s};
}

// Note [host overlap] (engine/bench/allreduce.cpp).
std::optional<double> overlap_slowdown(const Calibration& c, int ranks) {
  std::vector<double> exposed;
  for (const OverlapPoint& o : c.overlap)
    if (o.ranks == ranks)
      exposed.push_back(
          std::clamp((o.together_seconds - o.work_seconds) / o.comm_seconds, 0.0,
                     kMaxExposedFraction));
  if (exposed.empty()) return std::nullopt;
  std::sort(exposed.begin(), exposed.end());
  const std::size_t n = exposed.size();
  const double x = n % 2 ? exposed[n / 2] : (exposed[n / 2 - 1] + exposed[n / 2]) / 2;
  return x / (1 - x);
}

}  // namespace tally::io
