// Shared by the end-to-end tests of the tally binary that take it as argv (test_html, test_serve):
// running it with a deadline, and reading a file it wrote. TALLY_BIN is the binary's path (CMake).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../support/subprocess.hpp"

namespace tally::clitest {

struct TallyRun {
  int rc = -1;
  std::string out, err;
};

// `tally ARGS…` with stdout and stderr apart; a run past 50 s is killed and fails the test.
inline TallyRun tally(const std::vector<std::string>& args) {
  std::vector<std::string> argv{TALLY_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  const auto r = tally::subprocess::run_command(argv, 50);
  EXPECT_FALSE(r.killed_at_limit);
  return {r.exit_code, r.out, r.err};
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace tally::clitest
