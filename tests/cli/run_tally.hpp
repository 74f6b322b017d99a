// Running the `tally` binary from a test (tests/cli): its exit code, stdout and stderr apart, with a
// deadline (tests/support/subprocess.hpp: a hung tally fails the test instead of hanging it).
// TALLY_BIN is the binary's path, set by tests/cli/CMakeLists.txt.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../support/subprocess.hpp"

namespace tally::cli_test {

struct Run {
  int rc = -1;
  std::string out, err;
};

// Runs tally with `args` (shell words, through /bin/sh).
inline Run tally(const std::string& args) {
  const auto ran =
      tally::subprocess::run_command({"/bin/sh", "-c", std::string(TALLY_BIN) + " " + args}, 50);
  EXPECT_FALSE(ran.killed_at_limit) << "tally " << args << ": still running after 50 s";
  return Run{.rc = ran.exit_code, .out = ran.out, .err = ran.err};
}

// Bad input: exit 2, nothing on stdout, one line on stderr naming each of `names` (a flag, a file
// and field, a value); returns that line.
inline std::string expect_bad_input(const std::string& args,
                                    const std::vector<std::string>& names = {}) {
  const Run r = tally(args);
  EXPECT_EQ(r.rc, 2) << args << "\n" << r.out << r.err;
  EXPECT_TRUE(r.out.empty()) << args << "\n" << r.out;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\n" << r.err;
  for (const auto& n : names) EXPECT_NE(r.err.find(n), std::string::npos) << args << "\n" << r.err;
  return r.err;
}

// Its stdout as JSON, after checking it exited 0.
inline nlohmann::json json_of(const Run& r) {
  EXPECT_EQ(r.rc, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

}  // namespace tally::cli_test
