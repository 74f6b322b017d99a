// Parsing a command line and running the command it names, with the outcome as a value: main and
// `tally serve` (Note [one code path] in commands.hpp) share it, so a bad value gets the same one
// line from both.
#pragma once

#include <CLI/CLI.hpp>
#include <ostream>
#include <string>

namespace tally::cli {

struct CommandOutcome {
  int exit_code = 0;  // ExitCode (format.hpp): 0 ok, 1 a run failed, 2 bad input
  std::string error;  // unless 0: the one line for stderr, "tally: error: …" (no newline)
};

// Parses argv (argv[0] the program) with `app` and runs the command's callback. --help and
// --help-all print to `help` and give 0. Catches what a command throws: CLI11's parse errors and
// tally::InvalidInput are bad input (2), std::bad_alloc and any other exception a failed run (1),
// whose message is cut to its first line (libtorch appends a backtrace).
CommandOutcome run_command_line(CLI::App& app, int argc, const char* const* argv,
                                std::ostream& help);

}  // namespace tally::cli
