// The one temporary-directory helper of tally's tests (io, engine, cli): a fresh directory per test,
// named after the test and the process, removed with everything in it at the end.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <string_view>

namespace tally::test {

struct TempDir {
  std::filesystem::path root;
  explicit TempDir(std::string_view name)
      : root(std::filesystem::temp_directory_path() /
             ("tally_test_" + std::to_string(::getpid()) + "_" + std::string(name))) {
    std::filesystem::remove_all(root);
    std::filesystem::create_directories(root);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }
  std::filesystem::path operator/(std::string_view p) const { return root / p; }
};

}  // namespace tally::test
