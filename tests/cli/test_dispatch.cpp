// run_command_line (cli/dispatch.hpp): the exit code and the one line a command's exception gives.
#include <gtest/gtest.h>

#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "dispatch.hpp"
#include "tally/core/types.hpp"

namespace tally::cli::test_dispatch {
namespace {

CommandOutcome outcome_of(const std::function<void()>& command) {
  CLI::App app{"test"};
  app.add_subcommand("go", "")->callback(command);
  const char* argv[] = {"tally", "go"};
  std::ostringstream help;
  return run_command_line(app, 2, argv, help);
}

// libtorch's c10::Error puts a C++ backtrace after its message in what(); a user sees the
// message's line only (found with `tally run tp --micro-batch 100000000`: 30 lines of frames).
TEST(Dispatch, AFailedRunGivesOneLine) {
  const auto failed = outcome_of([] {
    throw std::runtime_error(
        "DefaultCPUAllocator: can't allocate memory\nframe #0: c10::alloc_cpu\nframe #1: main");
  });
  EXPECT_EQ(failed.exit_code, 1);
  EXPECT_EQ(failed.error, "tally: error: DefaultCPUAllocator: can't allocate memory");
  const auto bad = outcome_of([] { throw InvalidInput("--x = 3: must be <= 2"); });
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.error, "tally: error: --x = 3: must be <= 2");
  EXPECT_EQ(outcome_of([] {}).exit_code, 0);
}

}  // namespace
}  // namespace tally::cli::test_dispatch
