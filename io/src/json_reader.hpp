// Private to io/: checked access to untrusted JSON (DESIGN.md §5). Nothing here escapes io/ — the
// public headers expose tally types only, so nlohmann stays an implementation detail.
//
// Every failure is a tally::InvalidInput whose message reads "<source>: <field> = <value>: <allowed>"
// (STYLE.md), e.g. "config.json: hidden_size = 4096.5: must be an integer in [1, 1048576]".
// A JSON null counts as an absent field (Hugging Face writes `"rope_scaling": null` and the like).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "tally/core/types.hpp"
#include "tally/io/files.hpp"

namespace tally::io::detail {

using json = nlohmann::json;

// A closed range [lo, hi], or (lo, hi] when lo_open.
struct Range {
  double lo = 0;
  double hi = 0;
  bool lo_open = false;
  bool contains(double v) const { return (lo_open ? v > lo : v >= lo) && v <= hi; }
  std::string str() const;  // "[1, 1048576]", "(0, 1]"
};

using ::tally::format_number;  // core/types.hpp: the one number formatter
// A JSON value for messages: ASCII only, at most ~60 characters.
std::string show(const json& v);
// Bytes that are not printable ASCII become \xNN, so messages are safe to print or put into JSON.
std::string printable(std::string_view s);

[[noreturn]] void fail(std::string_view source, std::string_view field, std::string_view value,
                       std::string_view allowed);
[[noreturn]] void fail_missing(std::string_view source, std::string_view field,
                               std::string_view allowed);

// How parse_object bounds and names what it parses.
struct ParseLimits {
  std::size_t max_bytes = kMaxJsonFileBytes;
  int max_depth = kMaxJsonDepth;
  std::string_view what;         // "" for a whole file; "header" for a safetensors header
  std::string_view top_key_is;   // what a top-level key names, for messages ("a tensor name")
};

// Parses exactly `text` as one JSON object (the only JSON parse in tally): a NUL byte anywhere or
// anything but JSON whitespace after the object is an error (nlohmann's lexer would stop at a NUL
// and ignore the rest); size and depth are bounded; a key repeated within one object is an error
// (the last one would otherwise win silently).
json parse_object(std::string_view text, std::string_view source, const ParseLimits& limits = {});

// Runs f and turns any nlohmann exception that slipped past the checks into InvalidInput, so the only
// exception a reader lets out is InvalidInput (and std::bad_alloc).
template <class F>
auto guarded(std::string_view source, F&& f) -> decltype(f()) {
  try {
    return std::forward<F>(f)();
  } catch (const json::exception& e) {
    throw InvalidInput(std::string(source) + ": " + printable(e.what()));
  }
}

// One JSON object plus its place in the file (source and dotted field prefix) for messages.
class ObjectReader {
 public:
  ObjectReader(const json& object, std::string_view source, std::string prefix = "");

  std::string_view source() const { return source_; }
  std::string field(std::string_view key) const { return prefix_ + std::string(key); }
  // The value of `key`, or nullptr when absent or null.
  const json* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  std::int64_t integer(std::string_view key, std::int64_t lo, std::int64_t hi) const;
  std::optional<std::int64_t> opt_integer(std::string_view key, std::int64_t lo,
                                          std::int64_t hi) const;
  double number(std::string_view key, Range r) const;
  std::optional<double> opt_number(std::string_view key, Range r) const;
  std::optional<bool> opt_boolean(std::string_view key) const;
  std::optional<std::string> opt_string(std::string_view key, std::size_t max_chars) const;
  std::optional<ObjectReader> opt_object(std::string_view key) const;
  const json* opt_array(std::string_view key, std::size_t max_items) const;

  // Any key not in `allowed` is an error naming it: a typo must not be silently ignored.
  void allow_only(std::initializer_list<std::string_view> allowed) const;

 private:
  const json* object_;
  std::string source_;
  std::string prefix_;
};

// "[lo, hi]" with exact integers (a double would print 2^62 as 4.61169e+18).
std::string integer_range(std::int64_t lo, std::int64_t hi);

// Checked conversions of one value called `field`. Integers are range-checked exactly: a float such
// as 9223372036854775808.0 (2^63) is out of range, never converted with undefined behaviour.
std::int64_t to_integer(const json& v, std::string_view source, std::string_view field,
                        std::int64_t lo, std::int64_t hi);
double to_number(const json& v, std::string_view source, std::string_view field, Range r);

// "<source>: " + what, for rethrowing a core validate() message with the file's name.
[[noreturn]] void rethrow_with_source(std::string_view source, const InvalidInput& e);

}  // namespace tally::io::detail
