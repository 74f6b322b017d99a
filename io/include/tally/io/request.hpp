// A `tally serve` API request body (DESIGN.md §5: input from outside, read as hostile): one JSON
// object whose keys are a command's flag names, turned into the words of that command line, so
// the command's own flags check every value (Note [one code path] in cli/commands.hpp).
//
//   {"gpus": 64, "seq": "4096", "sp": true, "model": {...config.json...}, "alternative": ["a", "b"]}
//
// Keys: a flag's name without its dashes ("gpus", "global-batch"): a lower-case letter, then
// lower-case letters, digits and '-', at most 64 characters. Values, as the command line would
// type them:
//   true                 the bare flag (--sp)
//   false, null, []      the flag left out (its default)
//   a string             the value exactly (--seq=4096); no NUL byte
//   a number             a whole number below 2^53 as an integer (64, 7e9 → 7000000000), any
//                        other in the shortest form that reads back exactly (0.2, 1e-05, 1e+21)
//   an array             the flag once per item (strings or numbers: --alternative=a --alternative=b)
//   an object            its JSON text, compact (--model accepts config.json text, --gpu a
//                        cluster JSON's: cli/flags.hpp)
// Bounded like every JSON io reads (json_reader.hpp): at most kMaxRequestBytes, nesting at most
// kMaxJsonDepth, no NUL, no key twice. Every refusal is tally::InvalidInput, one line:
//   request body: key "GPUs": must be a flag name (lower-case letters, digits and '-')
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace tally::io {

// The largest request body `tally serve` reads (its HTTP layer answers 413 above it). A pasted
// config.json is a few KiB; 1 MiB leaves room and bounds the work one request can ask for.
inline constexpr std::size_t kMaxRequestBytes = std::size_t{1} << 20;

struct RequestFlag {
  std::string name;                 // "global-batch"
  std::vector<std::string> values;  // one per occurrence; empty for a bare flag (true)
};

// The flags of a request body, in the body's key order (nlohmann's: sorted by key); keys whose
// value leaves the flag out are dropped.
std::vector<RequestFlag> parse_request(std::string_view json_text,
                                       std::string_view source_name = "request body");

}  // namespace tally::io
