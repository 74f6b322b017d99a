#include "tally/io/checkpoint.hpp"

#include "tally/core/sharding.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "json_reader.hpp"
#include "tally/core/types.hpp"
#include "tally/io/files.hpp"

namespace tally::io {

namespace {

namespace fs = std::filesystem;
using detail::fail;
using detail::json;
using detail::ObjectReader;
using detail::show;
using ojson = nlohmann::ordered_json;

constexpr std::int64_t kMaxCount = std::int64_t{1} << 62;  // steps, samples, elements
constexpr std::size_t kMaxGroups = 4096;
constexpr std::size_t kMaxTensorsPerGroup = std::size_t{1} << 20;
constexpr std::size_t kMaxGroupNameChars = 128;
constexpr std::size_t kMaxTensorNameChars = 1024;
constexpr std::size_t kMaxRngStateChars = std::size_t{1} << 20;
constexpr std::size_t kMaxScheduleNameChars = 64;
constexpr double kMaxLr = 1e6;
constexpr std::string_view kIndexName = "index.json";

std::string str(std::int64_t v) { return std::to_string(v); }
std::string quote(std::string_view s) { return show(json(std::string(s))); }
std::string range_text(const ShardSpan& r) {
  return "[" + str(r.offset) + ", " + str(r.count) + "]";
}
std::string shape_text(const std::vector<std::int64_t>& shape) { return show(json(shape)); }

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

bool all_chars(std::string_view s, bool upper_and_dot) {
  return std::all_of(s.begin(), s.end(), [&](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           (upper_and_dot && ((c >= 'A' && c <= 'Z') || c == '.'));
  });
}

// "<dir>" without a trailing separator, so <dir>.tmp-* names a sibling.
fs::path normalized(const fs::path& dir) {
  fs::path p = dir.lexically_normal();
  if (p.filename().empty() && p.has_parent_path()) p = p.parent_path();
  return p;
}

fs::path sibling(const fs::path& dir, std::string_view suffix) {
  fs::path p = normalized(dir);
  p += std::string(suffix);
  return p;
}

std::string index_source(const fs::path& dir) { return (dir / kIndexName).string(); }

// ---- validation ---------------------------------------------------------------------------------

void validate_schedule(const LrScheduleState& s, std::string_view source) {
  if (s.name.empty() || s.name.size() > kMaxScheduleNameChars || !all_chars(s.name, false))
    fail(source, "lr_schedule.name", quote(s.name),
         "must be 1 to 64 characters of a-z, 0-9, '_' and '-'");
  for (const auto& [field, v] : {std::pair{"lr_schedule.step", s.step},
                                 std::pair{"lr_schedule.warmup_steps", s.warmup_steps},
                                 std::pair{"lr_schedule.total_steps", s.total_steps}})
    if (v < 0 || v > kMaxCount) fail(source, field, str(v), "must be an integer in [0, 2^62]");
  for (const auto& [field, v] :
       {std::pair{"lr_schedule.base_lr", s.base_lr}, std::pair{"lr_schedule.lr", s.lr},
        std::pair{"lr_schedule.min_lr", s.min_lr}})
    if (!std::isfinite(v) || v < 0 || v > kMaxLr)
      fail(source, field, detail::format_number(v), "must be a number in [0, 1000000]");
}

// Shards cover [0, numel) in rank order: shard r starts where shard r−1 ends.
void validate_shards(const FlatGroup& g, const std::string& field, int world_size,
                     std::string_view source) {
  if (g.shards.size() != std::size_t(world_size))
    fail(source, field + ".shards", str(std::int64_t(g.shards.size())) + " ranges",
         "must have one [offset, count] per rank, world_size = " + str(world_size));
  std::int64_t end = 0;
  for (std::size_t r = 0; r < g.shards.size(); ++r) {
    const ShardSpan& s = g.shards[r];
    const std::string f = field + ".shards[" + std::to_string(r) + "]";
    if (s.offset < 0 || s.count < 0 || s.count > g.numel)
      fail(source, f, range_text(s),
           "offset and count must be in [0, numel = " + str(g.numel) + "]");
    if (s.offset != end)
      fail(source, f, range_text(s),
           (s.offset > end ? "leaves a gap: must start at " : "overlaps: must start at ") +
               str(end) +
               (r ? ", where shards[" + std::to_string(r - 1) + "] ends"
                  : ", the start of the flat space"));
    if (s.count > g.numel - end)
      fail(source, f, range_text(s), "ends past numel = " + str(g.numel));
    end += s.count;
  }
  if (end != g.numel)
    fail(source, field + ".shards", "cover [0, " + str(end) + ")",
         "must cover [0, numel = " + str(g.numel) + ") exactly");
}

void validate_tensors(const FlatGroup& g, const std::string& field, std::string_view source) {
  if (g.tensors.size() > kMaxTensorsPerGroup)
    fail(source, field + ".tensors", std::to_string(g.tensors.size()) + " items",
         "must have at most " + std::to_string(kMaxTensorsPerGroup));
  std::set<std::string_view> names;
  std::vector<std::pair<ShardSpan, std::size_t>> spans;
  for (std::size_t i = 0; i < g.tensors.size(); ++i) {
    const TensorSlot& t = g.tensors[i];
    const std::string f = field + ".tensors[" + std::to_string(i) + "]";
    if (t.name.empty() || t.name.size() > kMaxTensorNameChars)
      fail(source, f + ".name", quote(t.name), "must be 1 to 1024 characters");
    if (!names.insert(t.name).second)
      fail(source, f + ".name", quote(t.name), "appears twice in the group: must be unique");
    const auto n = shape_elements(t.shape);
    if (!n || t.shape.size() > SafetensorsLimits{}.max_dims)
      fail(source, f + ".shape", shape_text(t.shape),
           "must be at most 64 dimensions >= 0 with a product of at most 2^62");
    if (t.offset < 0 || t.offset > g.numel || *n > g.numel - t.offset)
      fail(source, f, "[offset " + str(t.offset) + ", " + str(*n) + " elements]",
           "must lie inside [0, numel = " + str(g.numel) + ")");
    spans.push_back({ShardSpan{t.offset, *n}, i});
  }
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) {
    return std::pair(a.first.offset, a.first.count) < std::pair(b.first.offset, b.first.count);
  });
  // Sorted by offset, a tensor overlaps an earlier one exactly when it starts before the furthest
  // end seen so far (empty tensors overlap nothing).
  std::int64_t furthest = 0;
  std::size_t furthest_i = 0;
  for (const auto& [cur, ci] : spans) {
    if (cur.count == 0) continue;
    if (cur.offset < furthest) {
      const TensorSlot& prev = g.tensors[furthest_i];
      fail(source, field + ".tensors[" + std::to_string(ci) + "]",
           quote(g.tensors[ci].name) + " at [" + str(cur.offset) + ", " + str(cur.offset + cur.count) + ")",
           "overlaps " + quote(prev.name) + " at [" + str(prev.offset) + ", " + str(furthest) +
               "): tensors must not overlap");
    }
    furthest = cur.offset + cur.count;
    furthest_i = ci;
  }
}

void validate_files(const CheckpointIndex& x, std::string_view source) {
  if (x.files.size() != std::size_t(x.world_size))
    fail(source, "files", std::to_string(x.files.size()) + " entries",
         "must have one per rank, world_size = " + str(x.world_size));
  for (std::size_t r = 0; r < x.files.size(); ++r) {
    const ShardFile& f = x.files[r];
    const std::string field = "files[" + std::to_string(r) + "]";
    if (f.rank != int(r)) fail(source, field + ".rank", str(f.rank), "must be " + str(r));
    const std::string want = shard_file_name(int(r), x.world_size);
    if (f.name != want) fail(source, field + ".name", quote(f.name), "must be \"" + want + "\"");
    if (f.size_bytes < 8 || f.size_bytes > std::uint64_t(kMaxCount))
      fail(source, field + ".size_bytes", std::to_string(f.size_bytes),
           "must be an integer in [8, 2^62]");
  }
}

}  // namespace

// ---- sharding rule and small helpers ------------------------------------------------------------

ShardSpan shard_range(std::int64_t numel, int world_size, int rank) {
  if (numel < 0 || world_size < 1 || rank < 0 || rank >= world_size)
    throw InvalidInput("shard_range: numel = " + str(numel) + ", world_size = " + str(world_size) +
                       ", rank = " + str(rank) + ": need numel >= 0 and 0 <= rank < world_size");
  return shard_span(numel, world_size, rank);
}

std::string shard_file_name(int rank, int world_size) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%05d-of-%05d.safetensors", rank, world_size);
  return buf;
}

const FlatGroup* CheckpointIndex::find_group(std::string_view name) const {
  for (const FlatGroup& g : groups)
    if (g.name == name) return &g;
  return nullptr;
}

FlatGroup make_flat_group(
    std::string name, TensorDType dtype,
    const std::vector<std::pair<std::string, std::vector<std::int64_t>>>& tensors, int world_size) {
  FlatGroup g{.name = std::move(name), .dtype = dtype};
  for (const auto& [tensor_name, shape] : tensors) {
    const auto n = shape_elements(shape);
    if (!n || *n > kMaxCount - g.numel)
      throw InvalidInput("make_flat_group " + quote(g.name) + ": tensor " + quote(tensor_name) +
                         ": shape = " + shape_text(shape) + ": invalid or too large");
    g.tensors.push_back({.name = tensor_name, .shape = shape, .offset = g.numel});
    g.numel += *n;
  }
  for (int r = 0; r < world_size; ++r) g.shards.push_back(shard_range(g.numel, world_size, r));
  return g;
}

void validate_index(const CheckpointIndex& x, std::string_view source, bool check_files) {
  if (x.world_size < 1 || x.world_size > kMaxCheckpointWorldSize)
    fail(source, "world_size", str(x.world_size), "must be an integer in [1, 65536]");
  if (x.step < 0 || x.step > kMaxCount)
    fail(source, "step", str(x.step), "must be an integer in [0, 2^62]");
  if (x.consumed_samples < 0 || x.consumed_samples > kMaxCount)
    fail(source, "consumed_samples", str(x.consumed_samples), "must be an integer in [0, 2^62]");
  if (x.rng_state.size() > kMaxRngStateChars)
    fail(source, "rng_state", std::to_string(x.rng_state.size()) + " characters",
         "must be at most 1048576");
  validate_schedule(x.lr_schedule, source);
  if (x.groups.empty() || x.groups.size() > kMaxGroups)
    fail(source, "groups", std::to_string(x.groups.size()) + " groups",
         "must have 1 to " + std::to_string(kMaxGroups));
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < x.groups.size(); ++i) {
    const FlatGroup& g = x.groups[i];
    const std::string field = "groups[" + std::to_string(i) + "]";
    if (g.name.empty() || g.name.size() > kMaxGroupNameChars || !all_chars(g.name, true) ||
        g.name == "__metadata__")
      fail(source, field + ".name", quote(g.name),
           "must be 1 to 128 characters of A-Z, a-z, 0-9, '_', '.' and '-'");
    if (!names.insert(g.name).second)
      fail(source, field + ".name", quote(g.name), "appears twice: group names must be unique");
    const std::int64_t max_numel = kMaxCount / std::int64_t(element_size_bytes(g.dtype));
    if (g.numel < 0 || g.numel > max_numel)
      fail(source, field + ".numel", str(g.numel),
           "must be an integer in [0, " + str(max_numel) + "] (2^62 bytes)");
    validate_shards(g, field, x.world_size, source);
    validate_tensors(g, field, source);
  }
  if (check_files || !x.files.empty()) validate_files(x, source);
}

// ---- index.json ---------------------------------------------------------------------------------

std::string index_to_json(const CheckpointIndex& x) {
  validate_index(x, "checkpoint index");
  // One top-level field, group, tensor or file per line: readable and diffable.
  const auto line = [](std::string_view key, const ojson& v) {
    return "\"" + std::string(key) + "\": " + v.dump();
  };
  const auto& s = x.lr_schedule;
  std::vector<std::string> top{line("format", kCheckpointFormat),
                               line("version", kCheckpointVersion),
                               line("step", x.step),
                               line("consumed_samples", x.consumed_samples),
                               line("seed", x.seed),
                               line("rng_state", x.rng_state),
                               line("lr_schedule", ojson{{"name", s.name},
                                                         {"step", s.step},
                                                         {"base_lr", s.base_lr},
                                                         {"lr", s.lr},
                                                         {"warmup_steps", s.warmup_steps},
                                                         {"total_steps", s.total_steps},
                                                         {"min_lr", s.min_lr}}),
                               line("world_size", x.world_size)};
  std::string groups = "\"groups\": [";
  for (std::size_t i = 0; i < x.groups.size(); ++i) {
    const FlatGroup& g = x.groups[i];
    ojson shards = ojson::array();
    for (const ShardSpan& r : g.shards) shards.push_back({r.offset, r.count});
    groups += std::string(i ? "," : "") + "\n    {" + line("name", g.name) + ", " +
              line("dtype", to_string(g.dtype)) + ", " + line("numel", g.numel) + ",\n     " +
              line("shards", shards) + ",\n     \"tensors\": [";
    for (std::size_t j = 0; j < g.tensors.size(); ++j) {
      const TensorSlot& t = g.tensors[j];
      groups += std::string(j ? "," : "") + "\n       " +
                ojson{{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}}.dump();
    }
    groups += "]}";
  }
  top.push_back(groups + "]");
  std::string files = "\"files\": [";
  for (std::size_t r = 0; r < x.files.size(); ++r) {
    const ShardFile& f = x.files[r];
    files += std::string(r ? "," : "") + "\n    " +
             ojson{{"rank", f.rank},
                   {"name", f.name},
                   {"size_bytes", f.size_bytes},
                   {"crc32c", crc32c_hex(f.crc32c)}}
                 .dump();
  }
  top.push_back(files + "]");
  std::string out = "{\n";
  for (std::size_t i = 0; i < top.size(); ++i)
    out += "  " + top[i] + (i + 1 < top.size() ? ",\n" : "\n");
  out += "}\n";
  if (out.size() > kMaxJsonFileBytes)
    throw InvalidInput("checkpoint index: index.json would be " + std::to_string(out.size()) +
                       " bytes: must be at most 4 MiB (fewer tensors per group or a shorter "
                       "rng_state)");
  return out;
}

namespace {

std::string required_string(const ObjectReader& r, std::string_view key, std::size_t max_chars,
                            bool allow_empty = false) {
  const json* v = r.find(key);
  const std::string allowed = "must be a string of " + std::string(allow_empty ? "0" : "1") +
                              " to " + std::to_string(max_chars) + " characters";
  if (!v) detail::fail_missing(r.source(), r.field(key), "required, " + allowed.substr(8));
  if (!v->is_string()) fail(r.source(), r.field(key), show(*v), allowed);
  const auto& s = v->get_ref<const std::string&>();
  if ((s.empty() && !allow_empty) || s.size() > max_chars)
    fail(r.source(), r.field(key), show(*v), allowed);
  return s;
}

const json& required_array(const ObjectReader& r, std::string_view key, std::size_t max_items) {
  const json* v = r.opt_array(key, max_items);
  if (!v) detail::fail_missing(r.source(), r.field(key), "required, an array [...]");
  return *v;
}

std::uint64_t read_seed(const ObjectReader& r) {
  const json* v = r.find("seed");
  if (!v) detail::fail_missing(r.source(), "seed", "required, an integer in [0, 2^64)");
  if (v->is_number_unsigned()) return v->get<std::uint64_t>();
  if (v->is_number_integer() && v->get<std::int64_t>() >= 0) return v->get<std::uint64_t>();
  fail(r.source(), "seed", show(*v), "must be an integer in [0, 2^64)");
}

std::vector<std::int64_t> read_int_array(const json& v, std::string_view source,
                                         const std::string& field, std::size_t max_items) {
  if (!v.is_array() || v.size() > max_items)
    fail(source, field, show(v),
         "must be an array of at most " + std::to_string(max_items) + " integers");
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < v.size(); ++i)
    out.push_back(
        detail::to_integer(v[i], source, field + "[" + std::to_string(i) + "]", 0, kMaxCount));
  return out;
}

FlatGroup read_group(const json& v, std::string_view source, const std::string& field) {
  if (!v.is_object()) fail(source, field, show(v), "must be an object {\"name\": ...}");
  const ObjectReader g(v, source, field + ".");
  g.allow_only({"name", "dtype", "numel", "shards", "tensors"});
  FlatGroup out{.name = required_string(g, "name", kMaxGroupNameChars)};
  const std::string dtype = required_string(g, "dtype", 16);
  const auto d = parse_tensor_dtype(dtype);
  if (!d) fail(source, field + ".dtype", quote(dtype), "must be one of " + allowed_tensor_dtypes());
  out.dtype = *d;
  out.numel = g.integer("numel", 0, kMaxCount);
  const json& shards = required_array(g, "shards", kMaxCheckpointWorldSize);
  for (std::size_t r = 0; r < shards.size(); ++r) {
    const std::string f = field + ".shards[" + std::to_string(r) + "]";
    const auto pair = read_int_array(shards[r], source, f, 2);
    if (pair.size() != 2) fail(source, f, show(shards[r]), "must be [offset, count]");
    out.shards.push_back({pair[0], pair[1]});
  }
  const json& tensors = required_array(g, "tensors", kMaxTensorsPerGroup);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::string f = field + ".tensors[" + std::to_string(i) + "]";
    if (!tensors[i].is_object())
      fail(source, f, show(tensors[i]), "must be an object {\"name\": ...}");
    const ObjectReader t(tensors[i], source, f + ".");
    t.allow_only({"name", "shape", "offset"});
    const json* shape = t.find("shape");
    if (!shape) detail::fail_missing(source, f + ".shape", "required, an array of integers");
    out.tensors.push_back({.name = required_string(t, "name", kMaxTensorNameChars),
                           .shape = read_int_array(*shape, source, f + ".shape", 64),
                           .offset = t.integer("offset", 0, kMaxCount)});
  }
  return out;
}

ShardFile read_file_entry(const json& v, std::string_view source, const std::string& field) {
  if (!v.is_object()) fail(source, field, show(v), "must be an object {\"rank\": ...}");
  const ObjectReader f(v, source, field + ".");
  f.allow_only({"rank", "name", "size_bytes", "crc32c"});
  ShardFile out{.rank = int(f.integer("rank", 0, kMaxCheckpointWorldSize - 1)),
                .name = required_string(f, "name", 64),
                .size_bytes = std::uint64_t(f.integer("size_bytes", 0, kMaxCount))};
  const std::string crc = required_string(f, "crc32c", 8);
  const bool hex = crc.size() == 8 && std::all_of(crc.begin(), crc.end(), [](char c) {
                     return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
                   });
  if (!hex) fail(source, field + ".crc32c", quote(crc), "must be 8 lower-case hex digits");
  out.crc32c = std::uint32_t(std::stoul(crc, nullptr, 16));
  return out;
}

}  // namespace

CheckpointIndex parse_index(std::string_view text, std::string_view source) {
  return detail::guarded(source, [&] {
    const json root = detail::parse_object(text, source);
    const ObjectReader r(root, source);
    r.allow_only({"format", "version", "step", "consumed_samples", "seed", "rng_state",
                  "lr_schedule", "world_size", "groups", "files"});
    if (required_string(r, "format", 64) != kCheckpointFormat)
      fail(source, "format", show(*r.find("format")),
           "must be \"" + std::string(kCheckpointFormat) + "\"");
    if (const auto v = r.integer("version", 0, std::numeric_limits<std::int64_t>::max());
        v != kCheckpointVersion)
      fail(source, "version", str(v),
           "this reader supports version " + str(kCheckpointVersion) + " only");
    CheckpointIndex x{.step = r.integer("step", 0, kMaxCount),
                      .consumed_samples = r.integer("consumed_samples", 0, kMaxCount),
                      .seed = read_seed(r),
                      .rng_state = required_string(r, "rng_state", kMaxRngStateChars, true),
                      .world_size = int(r.integer("world_size", 1, kMaxCheckpointWorldSize))};
    const auto s = r.opt_object("lr_schedule");
    if (!s) detail::fail_missing(source, "lr_schedule", "required, an object {\"name\": ...}");
    s->allow_only({"name", "step", "base_lr", "lr", "warmup_steps", "total_steps", "min_lr"});
    const detail::Range lr_range{0, kMaxLr};
    x.lr_schedule = {.name = required_string(*s, "name", kMaxScheduleNameChars),
                     .step = s->integer("step", 0, kMaxCount),
                     .base_lr = s->number("base_lr", lr_range),
                     .lr = s->number("lr", lr_range),
                     .warmup_steps = s->integer("warmup_steps", 0, kMaxCount),
                     .total_steps = s->integer("total_steps", 0, kMaxCount),
                     .min_lr = s->number("min_lr", lr_range)};
    const json& groups = required_array(r, "groups", kMaxGroups);
    for (std::size_t i = 0; i < groups.size(); ++i)
      x.groups.push_back(read_group(groups[i], source, "groups[" + std::to_string(i) + "]"));
    const json& files = required_array(r, "files", kMaxCheckpointWorldSize);
    for (std::size_t i = 0; i < files.size(); ++i)
      x.files.push_back(read_file_entry(files[i], source, "files[" + std::to_string(i) + "]"));
    validate_index(x, source);
    return x;
  });
}

void write_index(const fs::path& dir, const CheckpointIndex& index) {
  write_text_atomically(dir / kIndexName, index_to_json(index));
}

CheckpointIndex read_index(const fs::path& dir) {
  const std::string source = index_source(dir);
  return parse_index(read_text_file(dir / kIndexName, kMaxJsonFileBytes, Symlinks::refuse), source);
}

// ---- shards against the layout ------------------------------------------------------------------

namespace {

std::map<std::string, std::string> shard_metadata(const CheckpointIndex& x, int rank) {
  return {{"format", std::string(kCheckpointFormat)},
          {"rank", std::to_string(rank)},
          {"world_size", std::to_string(x.world_size)},
          {"step", std::to_string(x.step)}};
}

// A shard's header matches the layout: the metadata names this checkpoint and rank, and the shard
// holds exactly one tensor per group, of the group's dtype and of shape [shards[rank].count].
void check_shard_header(const SafetensorsHeader& h, const CheckpointIndex& x, int rank) {
  for (const auto& [key, want] : shard_metadata(x, rank)) {
    const auto it = h.metadata.find(key);
    if (it == h.metadata.end() || it->second != want)
      throw InvalidInput(h.source + ": metadata " + key + " = " +
                         (it == h.metadata.end() ? "missing" : quote(it->second)) +
                         ": index.json expects " + quote(want));
  }
  for (const FlatGroup& g : x.groups) {
    const TensorInfo* t = h.find(g.name);
    const std::int64_t count = g.shards[std::size_t(rank)].count;
    if (!t)
      throw InvalidInput(h.source + ": tensor " + quote(g.name) +
                         " missing: index.json lists group " + quote(g.name));
    if (t->dtype != g.dtype || t->shape != std::vector<std::int64_t>{count})
      throw InvalidInput(h.source + ": tensor " + quote(g.name) + " = " +
                         std::string(to_string(t->dtype)) + " " + shape_text(t->shape) +
                         ": index.json expects " + std::string(to_string(g.dtype)) + " [" +
                         str(count) + "] (shards[" + str(rank) + "] of the group)");
  }
  if (h.tensors.size() != x.groups.size())
    for (const TensorInfo& t : h.tensors)
      if (!x.find_group(t.name))
        throw InvalidInput(h.source + ": tensor " + quote(t.name) +
                           " is not a group of index.json: a shard holds exactly its groups");
}

// Note [no links in checkpoints]. Every file of a checkpoint is a regular file inside its
// directory: index.json and the shards are opened with Symlinks::refuse (lstat, then O_NOFOLLOW), so
// a link planted in a checkpoint can neither make tally read a file elsewhere nor reveal anything
// about one (its size, its type) in an error message; recovery promotes only real directories.
// Shard names are checked to be exactly shard_file_name(r, k), so no name leaves the directory.
constexpr SafetensorsLimits kShardRead{.links = Symlinks::refuse};

// The shard of `rank`: present, a regular file (not a link), of the recorded size; returns its path.
fs::path checked_shard_path(const fs::path& dir, const CheckpointIndex& x, int rank) {
  const ShardFile& f = x.files[std::size_t(rank)];
  const fs::path path = dir / f.name;
  std::error_code ec;
  const auto st = fs::symlink_status(path, ec);
  if (fs::is_symlink(st))
    throw InvalidInput(path.string() +
                       ": is a symbolic link: must be a regular file (links are refused here)");
  if (!fs::exists(st))
    throw InvalidInput(path.string() + ": missing: index.json lists it as the shard of rank " +
                       str(rank));
  if (!fs::is_regular_file(st)) throw InvalidInput(path.string() + ": not a regular file");
  const ReadOnlyFile file(path, path.string(), Symlinks::refuse);
  if (file.size_bytes() != f.size_bytes)
    throw InvalidInput(path.string() + ": size = " + std::to_string(file.size_bytes()) +
                       " bytes: index.json records " + std::to_string(f.size_bytes) +
                       (file.size_bytes() < f.size_bytes ? " (truncated)" : ""));
  return path;
}

}  // namespace

// ---- saving -------------------------------------------------------------------------------------

fs::path staging_dir(const fs::path& dir, std::string_view token) {
  if (token.empty() || token.size() > 64 || !all_chars(token, true))
    throw InvalidInput("staging token = " + quote(token) +
                       ": must be 1 to 64 characters of A-Z, a-z, 0-9, '_', '.' and '-'");
  return sibling(dir, ".tmp-" + std::string(token));
}

fs::path prepare_staging_dir(const fs::path& dir, std::string_view token) {
  const fs::path staging = staging_dir(dir, token);
  std::error_code ec;
  fs::remove_all(staging, ec);
  if (ec) throw std::system_error(ec, staging.string() + ": remove stale staging directory");
  fs::create_directories(staging, ec);
  if (ec) throw std::system_error(ec, staging.string() + ": create");
  return staging;
}

ShardFile write_shard(const fs::path& staging, const CheckpointIndex& index, int rank,
                      const std::vector<TensorView>& tensors) {
  const std::string source = "write_shard(rank " + str(rank) + ")";
  validate_index(index, source, /*check_files=*/false);
  if (rank < 0 || rank >= index.world_size)
    fail(source, "rank", str(rank), "must be in [0, world_size = " + str(index.world_size) + ")");
  if (tensors.size() != index.groups.size())
    fail(source, "tensors", std::to_string(tensors.size()),
         "must be one per group: " + std::to_string(index.groups.size()));
  for (const TensorView& t : tensors) {
    const FlatGroup* g = index.find_group(t.name);
    if (!g) fail(source, "tensor", quote(t.name), "is not a group of the index");
    const std::int64_t count = g->shards[std::size_t(rank)].count;
    if (t.dtype != g->dtype || t.shape != std::vector<std::int64_t>{count})
      fail(source, "tensor " + quote(t.name),
           std::string(to_string(t.dtype)) + " " + shape_text(t.shape),
           "must be " + std::string(to_string(g->dtype)) + " [" + str(count) + "]");
  }
  const std::string name = shard_file_name(rank, index.world_size);
  const WrittenFile w = write_safetensors(staging / name, tensors, shard_metadata(index, rank));
  return {.rank = rank, .name = name, .size_bytes = w.size_bytes, .crc32c = w.crc32c};
}

// Note [atomic checkpoint]. The staging directory is complete once index.json is in it (written
// last, after every shard was fsynced). Putting it in place:
//  - no <dir> yet: rename(staging, dir);
//  - otherwise renameat2(RENAME_EXCHANGE) swaps the two names atomically; the old checkpoint, now
//    under the staging name, is removed (a crash before that leaves it as a stale staging dir);
//  - where the swap is unsupported (EINVAL: some file systems; ENOSYS: old kernels): rename <dir>
//  to
//    <dir>.old-<pid>, rename staging to <dir>, remove the old one. A crash between the two renames
//    leaves no <dir> but two complete checkpoints beside it, which recover_checkpoint resolves.
// The parent directory is fsynced after each rename so the new names survive a power loss.
void commit_checkpoint(const fs::path& dir_in, const fs::path& staging,
                       const CheckpointIndex& index, const CommitOptions& options) {
  const fs::path dir = normalized(dir_in);
  validate_index(index, index_source(staging));
  if (options.crash == CommitCrash::before_index) return;
  write_index(staging, index);
  if (options.verify) (void)verify_checkpoint(staging);
  if (options.crash == CommitCrash::before_swap) return;

  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  std::error_code ec;
  const auto st = fs::symlink_status(dir, ec);
  if (fs::exists(st) && !fs::is_directory(st))
    throw InvalidInput(dir.string() + ": exists and is not a directory: will not replace it");
  if (!fs::exists(st)) {
    if (::rename(staging.c_str(), dir.c_str()) != 0) throw_errno(staging.string() + ": rename");
    sync_directory(parent);
    return;
  }
  if (options.exchange &&
      ::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    sync_directory(parent);
    fs::remove_all(staging, ec);  // the old checkpoint; a leftover is only a stale staging dir
    return;
  }
  if (options.exchange && errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
    throw_errno(staging.string() + ": exchange with " + dir.string());
  const fs::path aside = sibling(dir, ".old-" + std::to_string(::getpid()));
  fs::remove_all(aside, ec);
  if (::rename(dir.c_str(), aside.c_str()) != 0) throw_errno(dir.string() + ": rename aside");
  sync_directory(parent);
  if (options.crash == CommitCrash::after_rename_aside) return;
  if (::rename(staging.c_str(), dir.c_str()) != 0) throw_errno(staging.string() + ": rename");
  sync_directory(parent);
  fs::remove_all(aside, ec);
}

void write_checkpoint(const fs::path& dir, const CheckpointIndex& index,
                      const std::vector<std::vector<TensorView>>& shards,
                      const CommitOptions& options) {
  validate_index(index, "write_checkpoint", /*check_files=*/false);
  if (shards.size() != std::size_t(index.world_size))
    fail("write_checkpoint", "shards", std::to_string(shards.size()) + " ranks",
         "must be world_size = " + str(index.world_size));
  const fs::path staging = prepare_staging_dir(dir, std::to_string(::getpid()));
  try {
    CheckpointIndex full = index;
    full.files.clear();
    for (int r = 0; r < index.world_size; ++r)
      full.files.push_back(write_shard(staging, index, r, shards[std::size_t(r)]));
    commit_checkpoint(dir, staging, full, options);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(staging, ec);
    throw;
  }
}

// ---- loading ------------------------------------------------------------------------------------

CheckpointIndex verify_checkpoint(const fs::path& dir) {
  CheckpointIndex x = read_index(dir);
  for (int r = 0; r < x.world_size; ++r) {
    const fs::path path = checked_shard_path(dir, x, r);
    const ShardFile& f = x.files[std::size_t(r)];
    const WrittenFile actual = checksum_file(path, Symlinks::refuse);
    if (actual.size_bytes != f.size_bytes)
      throw InvalidInput(path.string() + ": size = " + std::to_string(actual.size_bytes) +
                         " bytes while reading: index.json records " +
                         std::to_string(f.size_bytes));
    if (actual.crc32c != f.crc32c)
      throw InvalidInput(path.string() + ": crc32c = " + crc32c_hex(actual.crc32c) +
                         ": index.json records " + crc32c_hex(f.crc32c) + " (the file is corrupt)");
    check_shard_header(read_safetensors_header(path, kShardRead), x, r);
  }
  return x;
}

std::vector<std::byte> load_flat_range(const fs::path& dir, const CheckpointIndex& index,
                                       std::string_view group, std::int64_t offset,
                                       std::int64_t count) {
  const std::string source = index_source(dir);
  validate_index(index, source);
  const FlatGroup* g = index.find_group(group);
  if (!g) fail(source, "group", quote(group), "is not in the checkpoint");
  if (offset < 0 || count < 0 || offset > g->numel || count > g->numel - offset)
    fail(source, "range of group " + quote(group),
         "[" + str(offset) + ", " + str(offset) + " + " + str(count) + ")",
         "must lie inside [0, numel = " + str(g->numel) + ")");
  // Check every shard the range needs (present, a regular file of the recorded size, a header that
  // matches the layout) before allocating: the index alone may claim any size, the files on disk
  // bound what can be read.
  const std::size_t esize = element_size_bytes(g->dtype);
  struct Piece {
    SafetensorsHeader header;
    std::int64_t lo, hi;  // elements of the flat space this shard provides
    std::int64_t shard_offset;
  };
  std::vector<Piece> pieces;
  for (int r = 0; r < index.world_size; ++r) {
    const ShardSpan& s = g->shards[std::size_t(r)];
    const std::int64_t lo = std::max(offset, s.offset);
    const std::int64_t hi = std::min(offset + count, s.offset + s.count);
    if (lo >= hi) continue;
    SafetensorsHeader h = read_safetensors_header(checked_shard_path(dir, index, r), kShardRead);
    check_shard_header(h, index, r);
    pieces.push_back({std::move(h), lo, hi, s.offset});
  }
  std::vector<std::byte> out;
  try {
    out.resize(std::size_t(count) * esize);
  } catch (const std::bad_alloc&) {
    throw InvalidInput(source + ": group " + quote(group) + ": cannot allocate " +
                       std::to_string(std::uint64_t(count) * esize) + " bytes to load " +
                       str(count) + " elements");
  }
  for (const Piece& p : pieces)
    read_tensor_bytes(p.header, *p.header.find(g->name),
                      std::uint64_t(p.lo - p.shard_offset) * esize,
                      std::span(out).subspan(std::size_t(p.lo - offset) * esize,
                                             std::size_t(p.hi - p.lo) * esize));
  return out;
}

std::vector<float> load_flat_range_f32(const fs::path& dir, const CheckpointIndex& index,
                                       std::string_view group, std::int64_t offset,
                                       std::int64_t count) {
  static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");
  const FlatGroup* g = index.find_group(group);
  if (g && g->dtype != TensorDType::f32)
    fail(index_source(dir), "dtype of group " + quote(group), std::string(to_string(g->dtype)),
         "load_flat_range_f32 needs F32 (use load_flat_range for raw bytes)");
  const std::vector<std::byte> bytes = load_flat_range(dir, index, group, offset, count);
  std::vector<float> out(bytes.size() / sizeof(float));
  if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::vector<std::byte> load_tensor(const fs::path& dir, const CheckpointIndex& index,
                                   std::string_view group, std::string_view tensor) {
  const FlatGroup* g = index.find_group(group);
  if (!g) fail(index_source(dir), "group", quote(group), "is not in the checkpoint");
  for (const TensorSlot& t : g->tensors)
    if (t.name == tensor)
      return load_flat_range(dir, index, group, t.offset, *shape_elements(t.shape));
  fail(index_source(dir), "tensor", quote(tensor), "is not in group " + quote(group));
}

// ---- recovery -----------------------------------------------------------------------------------

RecoveryReport recover_checkpoint(const fs::path& dir_in) {
  const fs::path dir = normalized(dir_in);
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  const std::string stem = dir.filename().string();
  std::vector<fs::path> siblings;
  std::error_code ec;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with(stem + ".tmp-") || name.starts_with(stem + ".old-"))
      siblings.push_back(it->path());
  }
  // Only a real directory, as commit_checkpoint stages one, may be promoted (Note [no links in
  // checkpoints]): a link named like a staging directory is removed (the link, not its target).
  const auto is_real_directory = [](const fs::path& p) {
    std::error_code e;
    return fs::is_directory(fs::symlink_status(p, e)) && !e;
  };
  if (ec) throw std::system_error(ec, parent.string() + ": list directory");
  std::sort(siblings.begin(), siblings.end());

  RecoveryReport report;
  if (!fs::exists(fs::symlink_status(dir, ec))) {
    std::int64_t best_step = -1;
    for (const fs::path& p : siblings) {
      if (!is_real_directory(p)) continue;
      try {
        const CheckpointIndex x = verify_checkpoint(p);
        if (x.step > best_step) {
          best_step = x.step;
          report.restored_from = p;
        }
      } catch (const InvalidInput&) {
        // incomplete or corrupt: never restored
      }
    }
    if (!report.restored_from.empty()) {
      if (::rename(report.restored_from.c_str(), dir.c_str()) != 0)
        throw_errno(report.restored_from.string() + ": rename to " + dir.string());
      sync_directory(parent);
    }
  }
  for (const fs::path& p : siblings) {
    if (p == report.restored_from) continue;
    fs::remove_all(p, ec);
    if (ec) throw std::system_error(ec, p.string() + ": remove");
    report.removed.push_back(p);
  }
  return report;
}

}  // namespace tally::io
