#include "tally/io/request.hpp"

#include <charconv>
#include <cmath>
#include <cstdint>

#include "json_reader.hpp"

namespace tally::io {

namespace {

using detail::json;

constexpr std::size_t kMaxKeyChars = 64;

bool flag_name(std::string_view k) {
  if (k.empty() || k.size() > kMaxKeyChars || !(k[0] >= 'a' && k[0] <= 'z')) return false;
  for (const char c : k)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  return true;
}

// One scalar as the command line would type it; `field` names it in messages.
std::string word(const json& v, std::string_view source, const std::string& field) {
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (s.find('\0') != std::string::npos)
      detail::fail(source, field, detail::show(v), "must not hold a NUL character (\\u0000)");
    return s;
  }
  if (v.is_number_unsigned()) return std::to_string(v.get<std::uint64_t>());
  if (v.is_number_integer()) return std::to_string(v.get<std::int64_t>());
  if (v.is_number_float()) {
    const double d = v.get<double>();
    char buf[32];
    // A whole number below 2^53 as an integer (7e9 → "7000000000", which an integer flag reads),
    // anything else in the shortest form that reads back exactly (0.2 → "0.2", 1e21 → "1e+21").
    const auto r = std::trunc(d) == d && std::fabs(d) < 9007199254740992.0
                       ? std::to_chars(buf, buf + sizeof buf, std::int64_t(d))
                       : std::to_chars(buf, buf + sizeof buf, d);
    return std::string(buf, r.ptr);
  }
  detail::fail(source, field, detail::show(v), "must be a string or a number");
}

}  // namespace

std::vector<RequestFlag> parse_request(std::string_view json_text, std::string_view source_name) {
  return detail::guarded(source_name, [&] {
    const json root = detail::parse_object(
        json_text, source_name,
        {.max_bytes = kMaxRequestBytes, .top_key_is = "a flag name"});
    std::vector<RequestFlag> flags;
    for (const auto& [key, v] : root.items()) {
      if (!flag_name(key))
        throw InvalidInput(std::string(source_name) + ": key " + detail::show(json(key)) +
                           ": must be a flag name without its dashes (a lower-case letter, then "
                           "lower-case letters, digits and '-'; at most 64 characters)");
      if (v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_array() && v.empty()))
        continue;  // the flag left out
      RequestFlag f{.name = key, .values = {}};
      if (v.is_boolean()) {
        // true: the bare flag
      } else if (v.is_object()) {
        f.values.push_back(v.dump());
      } else if (v.is_array()) {
        for (std::size_t i = 0; i < v.size(); ++i)
          f.values.push_back(word(v[i], source_name, key + "[" + std::to_string(i) + "]"));
      } else {
        f.values.push_back(word(v, source_name, key));
      }
      flags.push_back(std::move(f));
    }
    return flags;
  });
}

}  // namespace tally::io
