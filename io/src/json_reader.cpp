#include "json_reader.hpp"

#include <cmath>
#include <cstdio>
#include <set>
#include <vector>

#include "tally/io/files.hpp"

namespace tally::io::detail {

std::string Range::str() const {
  return (lo_open ? "(" : "[") + format_number(lo) + ", " + format_number(hi) + "]";
}

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

std::string show(const json& v) {
  // ensure_ascii escapes every non-ASCII character; replace guards against invalid UTF-8.
  std::string s = v.dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
  constexpr std::size_t kMaxChars = 60;
  if (s.size() > kMaxChars) s = s.substr(0, kMaxChars) + "...";
  return s;
}

void fail(std::string_view source, std::string_view field, std::string_view value,
          std::string_view allowed) {
  throw InvalidInput(std::string(source) + ": " + std::string(field) + " = " + std::string(value) +
                     ": " + std::string(allowed));
}

void fail_missing(std::string_view source, std::string_view field, std::string_view allowed) {
  throw InvalidInput(std::string(source) + ": " + std::string(field) + " missing: " +
                     std::string(allowed));
}

void rethrow_with_source(std::string_view source, const InvalidInput& e) {
  throw InvalidInput(std::string(source) + ": " + e.what());
}

namespace {

const char* kind_of(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "a number";
}

// nlohmann's messages start with "[json.exception.parse_error.101] "; drop that prefix.
std::string strip_exception_id(std::string_view what) {
  if (!what.empty() && what.front() == '[') {
    const auto end = what.find("] ");
    if (end != std::string_view::npos) what.remove_prefix(end + 2);
  }
  return printable(what);
}

std::string size_text(std::size_t bytes) {
  if (bytes % (std::size_t{1} << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}

}  // namespace

json parse_object(std::string_view text, std::string_view source_name, const ParseLimits& limits) {
  const std::string source(source_name);
  const std::string what = limits.what.empty() ? "" : std::string(limits.what) + " ";
  const std::string not_json =
      source + ": " + (limits.what.empty() ? "" : std::string(limits.what) + " is ") +
      "not valid JSON: ";
  if (text.size() > limits.max_bytes)
    fail(source, what + "size", std::to_string(text.size()) + " bytes",
         "must be at most " + size_text(limits.max_bytes));
  if (const auto nul = text.find('\0'); nul != std::string_view::npos)
    throw InvalidInput(not_json + "byte " + std::to_string(nul) +
                       " is 0x00 (NUL): JSON text holds no NUL bytes");

  // Track the keys of each open object to reject duplicates, and the depth to bound nesting.
  std::vector<std::set<std::string>> open_objects;
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= limits.max_depth)
          fail(source, what + "nesting depth", std::to_string(depth + 1),
               "must be at most " + std::to_string(limits.max_depth));
        if (event == json::parse_event_t::object_start) open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get_ref<const std::string&>()).second)
          throw InvalidInput(source + ": " + what + "key " + show(parsed) +
                             (open_objects.size() == 1 && !limits.top_key_is.empty()
                                  ? " (" + std::string(limits.top_key_is) + ")"
                                  : std::string()) +
                             " appears twice in one object: each key may appear once");
        break;
      default:
        break;
    }
    return true;
  };

  json root;
  try {
    // strict parse: only JSON whitespace may follow the value.
    root = json::parse(text.begin(), text.end(), check, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    throw InvalidInput(not_json + strip_exception_id(e.what()));
  }
  if (!root.is_object())
    throw InvalidInput(source + ": " + (limits.what.empty() ? "top level" : std::string(limits.what)) +
                       " is " + kind_of(root) + ": must be a JSON object {...}");
  return root;
}

std::string integer_range(std::int64_t lo, std::int64_t hi) {
  return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

std::int64_t to_integer(const json& v, std::string_view source, std::string_view field,
                        std::int64_t lo, std::int64_t hi) {
  const std::string allowed = "must be an integer in " + integer_range(lo, hi);
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(hi) || static_cast<std::int64_t>(u) < lo)
      fail(source, field, show(v), allowed);
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_integer()) {
    const auto i = v.get<std::int64_t>();
    if (i < lo || i > hi) fail(source, field, show(v), allowed);
    return i;
  }
  if (v.is_number_float()) {
    // 4096.0 is accepted as 4096; 4096.5 and 1e12 are not.
    // [-2^63, 2^63) is exactly the doubles that convert to int64 without undefined behaviour;
    // double(INT64_MAX) rounds up to 2^63, so it must not be the bound.
    const double d = v.get<double>();
    constexpr double kTwo63 = 9223372036854775808.0;
    if (!std::isfinite(d) || d != std::floor(d) || !(d >= -kTwo63 && d < kTwo63))
      fail(source, field, show(v), allowed);
    const auto i = static_cast<std::int64_t>(d);
    if (i < lo || i > hi) fail(source, field, show(v), allowed);
    return i;
  }
  fail(source, field, show(v), allowed + ", not " + kind_of(v));
}

double to_number(const json& v, std::string_view source, std::string_view field, Range r) {
  const std::string allowed = "must be a number in " + r.str();
  if (!v.is_number()) fail(source, field, show(v), allowed + ", not " + kind_of(v));
  const double d = v.get<double>();
  if (!std::isfinite(d) || !r.contains(d)) fail(source, field, show(v), allowed);
  // A subnormal (0 < |d| < 2.2e-308) is no measured figure, and its reciprocal is inf: refused
  // wherever a range starts at 0, in every reader at once (fuzzing found it field by field).
  if (std::fpclassify(d) == FP_SUBNORMAL)
    fail(source, field, show(v), allowed + " and not subnormal (0 or at least 2.2e-308)");
  return d;
}

ObjectReader::ObjectReader(const json& object, std::string_view source, std::string prefix)
    : object_(&object), source_(source), prefix_(std::move(prefix)) {
  TALLY_INVARIANT(object.is_object());
}

const json* ObjectReader::find(std::string_view key) const {
  const auto it = object_->find(std::string(key));
  if (it == object_->end() || it->is_null()) return nullptr;
  return &*it;
}

std::int64_t ObjectReader::integer(std::string_view key, std::int64_t lo, std::int64_t hi) const {
  const json* v = find(key);
  if (!v)
    fail_missing(source_, field(key), "required, an integer in " + integer_range(lo, hi));
  return to_integer(*v, source_, field(key), lo, hi);
}

std::optional<std::int64_t> ObjectReader::opt_integer(std::string_view key, std::int64_t lo,
                                                      std::int64_t hi) const {
  const json* v = find(key);
  if (!v) return std::nullopt;
  return to_integer(*v, source_, field(key), lo, hi);
}

double ObjectReader::number(std::string_view key, Range r) const {
  const json* v = find(key);
  if (!v) fail_missing(source_, field(key), "required, a number in " + r.str());
  return to_number(*v, source_, field(key), r);
}

std::optional<double> ObjectReader::opt_number(std::string_view key, Range r) const {
  const json* v = find(key);
  if (!v) return std::nullopt;
  return to_number(*v, source_, field(key), r);
}

std::optional<bool> ObjectReader::opt_boolean(std::string_view key) const {
  const json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean())
    fail(source_, field(key), show(*v), std::string("must be true or false, not ") + kind_of(*v));
  return v->get<bool>();
}

std::optional<std::string> ObjectReader::opt_string(std::string_view key,
                                                    std::size_t max_chars) const {
  const json* v = find(key);
  if (!v) return std::nullopt;
  const std::string allowed = "must be a string of 1 to " + std::to_string(max_chars) + " characters";
  if (!v->is_string()) fail(source_, field(key), show(*v), allowed + ", not " + kind_of(*v));
  const auto& s = v->get_ref<const std::string&>();
  if (s.empty() || s.size() > max_chars) fail(source_, field(key), show(*v), allowed);
  return s;
}

std::optional<ObjectReader> ObjectReader::opt_object(std::string_view key) const {
  const json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_object())
    fail(source_, field(key), show(*v), std::string("must be an object {...}, not ") + kind_of(*v));
  return ObjectReader(*v, source_, field(key) + ".");
}

const json* ObjectReader::opt_array(std::string_view key, std::size_t max_items) const {
  const json* v = find(key);
  if (!v) return nullptr;
  if (!v->is_array())
    fail(source_, field(key), show(*v), std::string("must be an array [...], not ") + kind_of(*v));
  if (v->size() > max_items)
    fail(source_, field(key), std::to_string(v->size()) + " items",
         "must have at most " + std::to_string(max_items));
  return v;
}

void ObjectReader::allow_only(std::initializer_list<std::string_view> allowed) const {
  for (const auto& item : object_->items()) {
    bool known = false;
    for (const auto k : allowed) known = known || item.key() == k;
    if (known) continue;
    std::string list;
    for (const auto k : allowed) list += (list.empty() ? "" : ", ") + std::string(k);
    throw InvalidInput(std::string(source_) + ": unknown key " + show(json(item.key())) +
                       (prefix_.empty() ? "" : " in " + prefix_.substr(0, prefix_.size() - 1)) +
                       ": allowed keys are " + list);
  }
}

}  // namespace tally::io::detail
