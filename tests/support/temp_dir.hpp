// The one temporary-directory helper of tally's tests (io, engine, cli): a fresh directory per test
// under the system temp directory (TMPDIR), removed with everything in it at the end; and a scoped
// environment variable (TMPDIR pointed at one, to see what a run leaves behind).
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

// An environment variable set for the processes started while it lives (they inherit it); the old
// value (or its absence) comes back. Used as TMPDIR to see what a run leaves in the temp directory.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string name_, const std::string& value) : name(std::move(name_)) {
    if (const char* v = std::getenv(name.c_str())) old = v;
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    if (old)
      ::setenv(name.c_str(), old->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

// The names in dir, sorted (for a message and a comparison); none when it cannot be read.
inline std::vector<std::string> names_in(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    names.push_back(it->path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace tally::test
