// Shared by the libFuzzer harnesses of tests/fuzz (one per io reader, fuzz_<reader>.cpp).
//
// A harness is one function, LLVMFuzzerTestOneInput(data, size), that feeds the bytes to a reader
// and checks what the reader promises. Each broken promise is a *finding*: the harness prints one
// "tally fuzz finding:" line and aborts, so libFuzzer saves the input and reports it, and the
// replay test (replay_main.cpp) fails on it.
//
// Note [fuzz contract]. The promises checked:
//  1. a reader returns a value or throws tally::InvalidInput; any other exception (std::bad_alloc,
//     std::system_error, an nlohmann exception, ...) escaping it is a finding;
//  2. an InvalidInput message is one non-empty line (no '\n');
//  3. where a file reader and an in-memory reader exist, both give the same value or the same
//  message
//     for the same bytes (the file reader is called with the path, the in-memory one with the same
//     source name);
//  4. where a writer exists, a value that was read is written, read back and compared: the round
//  trip
//     is exact (field by field, bit for bit), and writing it again gives the same bytes;
//  5. accepted JSON is JSON: no raw control character (expect_json_text);
//  6. every figure read is finite and, where positive, not so small that its reciprocal overflows
//     (expect_sane_figure): a quantity that divides a time or a size must not turn it into inf.
// ASan/UBSan catch memory errors and undefined behaviour; libFuzzer catches leaks, timeouts and
// allocations beyond -malloc_limit_mb.
#pragma once

#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "tally/core/types.hpp"

namespace tally::fuzz {

namespace fs = std::filesystem;

// Prints the broken promise and aborts (libFuzzer turns the abort into a saved crash input).
[[noreturn]] inline void finding(std::string_view what) {
  std::fprintf(stderr, "tally fuzz finding: %.*s\n", int(what.size()), what.data());
  std::fflush(stderr);
  std::abort();
}

#define FUZZ_CHECK(cond, what)                                                                  \
  do {                                                                                          \
    if (!(cond)) ::tally::fuzz::finding(std::string("check failed: ") + #cond + ": " + (what)); \
  } while (0)

// Stands in for the value of a call that returns void.
struct Done {
  bool operator==(const Done&) const = default;
};

// What one reader call did: its value, or the message of the InvalidInput it threw.
template <class T>
struct Outcome {
  std::optional<T> value;
  std::string error;  // empty when value is set
  bool ok() const { return value.has_value(); }
};

// Runs f (a call named `call` in findings) and returns its outcome; promises 1 and 2.
template <class F>
auto attempt(std::string_view call, F&& f) {
  using R = std::invoke_result_t<F&>;
  using T = std::conditional_t<std::is_void_v<R>, Done, R>;
  Outcome<T> out;
  try {
    if constexpr (std::is_void_v<R>) {
      f();
      out.value = Done{};
    } else {
      out.value.emplace(f());
    }
  } catch (const InvalidInput& e) {
    out.error = e.what();
    if (out.error.empty()) finding(std::string(call) + " threw InvalidInput with an empty message");
    if (out.error.find('\n') != std::string::npos)
      finding(std::string(call) + " threw a message of more than one line: " + out.error);
  } catch (const std::exception& e) {
    finding(std::string(call) + " threw " + typeid(e).name() +
            " (not tally::InvalidInput): " + e.what());
  } catch (...) {
    finding(std::string(call) + " threw a non-std exception");
  }
  return out;
}

// The value of f, which must not throw at all (a writer given a value that was read); a finding
// otherwise.
template <class F>
auto must_succeed(std::string_view call, F&& f) {
  auto out = attempt(call, std::forward<F>(f));
  if (!out.ok()) finding(std::string(call) + " refused a value its reader accepted: " + out.error);
  return std::move(*out.value);
}

// Promise 3: two outcomes for the same bytes agree (same message, or values equal under `same`).
template <class T, class Same>
void expect_agree(std::string_view a_name, const Outcome<T>& a, std::string_view b_name,
                  const Outcome<T>& b, Same&& same) {
  if (a.ok() != b.ok())
    finding(std::string(a_name) + " and " + std::string(b_name) +
            " disagree: " + std::string(a.ok() ? b_name : a_name) + " threw \"" +
            (a.ok() ? b.error : a.error) + "\", the other accepted the input");
  if (!a.ok() && a.error != b.error)
    finding(std::string(a_name) + " and " + std::string(b_name) + " give different messages: \"" +
            a.error + "\" vs \"" + b.error + "\"");
  if (a.ok() && !same(*a.value, *b.value))
    finding(std::string(a_name) + " and " + std::string(b_name) + " read different values");
}

// Promise 5. RFC 8259 §2 and §7: JSON text holds no byte below 0x20 except the whitespace tab, LF
// and CR (a control character inside a string must be escaped). `text` was accepted as JSON (plus
// the space padding a safetensors header may have), so any other such byte — a NUL after which the
// parser stopped, say — means the reader accepted something that is not JSON.
inline void expect_json_text(std::string_view what, std::string_view text) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r')
      finding(std::string(what) + " accepted JSON holding the raw control byte " +
              std::to_string(c) + " at offset " + std::to_string(i));
  }
}

// Promise 6 for one figure called `what`.
inline void expect_sane_figure(std::string_view what, double v) {
  if (!std::isfinite(v) || (v > 0 && !std::isfinite(1 / v))) {
    char text[64];
    std::snprintf(text, sizeof text, " = %.17g (reciprocal %g)", v, 1 / v);
    finding(std::string(what) + text + " was accepted");
  }
}

// Doubles compared bit for bit: a round trip must not even turn -0 into 0.
inline bool same_bits(double a, double b) {
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

// A scratch directory for this process, <TMPDIR>/tally_fuzz_<pid>; removed at exit. scripts/fuzz.sh
// points TMPDIR at a RAM disk so the harnesses' writes and fsyncs stay cheap.
inline const fs::path& scratch_dir() {
  struct Scratch {
    fs::path path;
    Scratch() : path(fs::temp_directory_path() / ("tally_fuzz_" + std::to_string(::getpid()))) {
      fs::remove_all(path);
      fs::create_directories(path);
    }
    ~Scratch() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Scratch scratch;
  return scratch.path;
}

// Writes `bytes` to `path` (truncating); a finding if that fails (the harness's own I/O).
inline void write_bytes(const fs::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  out.close();
  if (!out) finding("harness cannot write " + path.string());
}

inline std::vector<std::byte> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) finding("harness cannot read " + path.string());
  std::vector<std::byte> out(chars.size());
  for (std::size_t i = 0; i < chars.size(); ++i) out[i] = std::byte(chars[i]);
  return out;
}

inline std::span<const std::byte> as_bytes(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

// The shared start of every JSON reader's harness: the input is read from memory (`parse`) and from
// a file named `file_name` in the scratch directory (`load`); the two must agree (promise 3) and an
// accepted input must be JSON text (promise 5). Returns the file reader's outcome.
template <class Parse, class Load, class Same>
auto read_json_both_ways(const std::uint8_t* data, std::size_t size, std::string_view file_name,
                         std::string_view parse_name, Parse&& parse, std::string_view load_name,
                         Load&& load, Same&& same) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::filesystem::path path = scratch_dir() / file_name;
  write_bytes(path, as_bytes(data, size));
  const auto mem = attempt(parse_name, [&] { return parse(text, path.string()); });
  const auto file = attempt(load_name, [&] { return load(path); });
  expect_agree(parse_name, mem, load_name, file, same);
  if (file.ok()) expect_json_text(load_name, text);
  return file;
}

}  // namespace tally::fuzz

// libFuzzer's entry point, defined once by each harness.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
