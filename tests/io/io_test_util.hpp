// Shared helpers for the io tests: fixture paths, text edits, and "throws InvalidInput whose message
// contains all of these pieces".
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>

#include "tally/core/types.hpp"
#include "tally/io/files.hpp"

namespace tally::io::test {

inline std::filesystem::path data_path(std::string_view name) {
  return std::filesystem::path(TALLY_IO_TEST_DATA) / name;
}

inline std::string fixture(std::string_view name) { return read_text_file(data_path(name)); }

// `text` with the first occurrence of `from` replaced; fails the test if `from` is absent.
inline std::string replaced(std::string text, std::string_view from, std::string_view to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "fixture lacks " << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// The InvalidInput message thrown by f, or "" (and a test failure) if f throws nothing or else.
inline std::string invalid_input_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidInput& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-InvalidInput exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

// f throws InvalidInput and its message contains every piece.
inline void expect_invalid(const std::function<void()>& f,
                           std::initializer_list<std::string_view> pieces) {
  const std::string msg = invalid_input_message(f);
  for (const auto piece : pieces)
    EXPECT_NE(msg.find(piece), std::string::npos) << "message: " << msg << "\nlacks: " << piece;
}

// For the random-mutation tests: runs `read` on mutation `iter`; true when it accepted the input,
// false when it threw InvalidInput with a one-line message; any other exception fails the test.
inline bool reads_or_fails_in_one_line(int iter, const std::function<void()>& read) {
  try {
    read();
    return true;
  } catch (const InvalidInput& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(!msg.empty() && msg.find('\n') == std::string::npos)
        << "mutation " << iter << ": not one line: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "mutation " << iter << " threw a non-InvalidInput exception: " << e.what();
  }
  return false;
}

// A file under the test's temporary directory holding `content`.
inline std::filesystem::path temp_file(std::string_view name, std::string_view content) {
  const auto dir = std::filesystem::temp_directory_path() / "tally_io_tests";
  std::filesystem::create_directories(dir);
  const auto path = dir / name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr);
  if (f) {
    std::fwrite(content.data(), 1, content.size(), f);
    std::fclose(f);
  }
  return path;
}

}  // namespace tally::io::test
