// Running the `tally` binary from a test (tests/cli): its exit code, stdout and stderr apart, with a
// deadline (tests/support/subprocess.hpp: a hung tally fails the test instead of hanging it).
// TALLY_BIN is the binary's path, set by tests/cli/CMakeLists.txt.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

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

// Its stdout as JSON, after checking it exited 0.
inline nlohmann::json json_of(const Run& r) {
  EXPECT_EQ(r.rc, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

}  // namespace tally::cli_test
