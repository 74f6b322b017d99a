#include "tally/io/calibration.hpp"

#include <cmath>
#include <string>
#include <utility>

#include "json_reader.hpp"
#include "tally/core/hardware.hpp"
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
  p.allow_only({"collective", "ranks", "size_bytes", "seconds_median", "busbw_bytes_per_s"});
  return CalibrationPoint{.collective = read_collective(p),
                          .ranks = int(p.integer("ranks", 1, kMaxRanks)),
                          .size_bytes = p.number("size_bytes", kSizeBytes),
                          .seconds_median = p.number("seconds_median", kSeconds),
                          .busbw_bps = p.number("busbw_bytes_per_s", kBusbwBps)};
}

Calibration parse(std::string_view text, std::string_view source) {
  const json root = detail::parse_object(text, source);
  const ObjectReader r(root, source);
  r.allow_only({"format", "version", "source", "comment", "intra_node", "inter_node", "mfu",
                "points"});
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
    require_finite(c.points[i].busbw_bps, at + "busbw_bytes_per_s");
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
  for (const auto& p : c.points)
    points.push_back({{"collective", p.collective},
                      {"ranks", p.ranks},
                      {"size_bytes", p.size_bytes},
                      {"seconds_median", p.seconds_median},
                      {"busbw_bytes_per_s", p.busbw_bps}});
  j["points"] = std::move(points);
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

ClusterSpec apply_calibration(ClusterSpec cluster, const Calibration& c) {
  if (c.intra_node) cluster.intra_node = *c.intra_node;
  if (c.inter_node) cluster.inter_node = *c.inter_node;
  if (c.mfu) cluster.mfu = *c.mfu;
  try {
    cluster.validate();
  } catch (const InvalidInput& e) {
    detail::rethrow_with_source("calibration " + c.source, e);
  }
  return cluster;
}

}  // namespace tally::io
