// The one temporary-directory helper of tally's tests (io, engine, cli): a fresh directory per test
// under the system temp directory (TMPDIR), removed with everything in it at the end.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tally::test {

struct TempDir {
  std::filesystem::path path;
  // A directory named after the test (and the process, so parallel ctest runs never collide).
  explicit TempDir(std::string_view name)
      : path(std::filesystem::temp_directory_path() /
             ("tally_test_" + std::to_string(::getpid()) + "_" + std::string(name))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  // A uniquely named one (mkdtemp).
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tally_test_XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed under " + tmpl);
    path = tmpl;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::filesystem::path operator/(std::string_view p) const { return path / p; }
};

}  // namespace tally::test
