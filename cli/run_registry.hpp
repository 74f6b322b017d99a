// Self-registration of `tally run <experiment>` commands: each cli/run_<name>.cpp defines
//   static const RegisterRun reg{[](CLI::App& run) { ... run.add_subcommand("<name>", ...) ... }};
// so adding an experiment touches no shared file. (The run_*.cpp files are linked straight into the
// tally executable, never into a static library, so their registrars always run.)
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace tally::cli {

using RunRegistrar = void (*)(CLI::App& run);
std::vector<RunRegistrar>& run_registry();

struct RegisterRun {
  explicit RegisterRun(RunRegistrar f) { run_registry().push_back(f); }
};

// The same for top-level engine commands (e.g. `tally bench` in cli/bench_commands.cpp):
//   static const RegisterCommand reg{[](CLI::App& app) { ... app.add_subcommand("bench", ...) ... }};
// register_engine_commands() calls each with the root app.
using CommandRegistrar = void (*)(CLI::App& app);
std::vector<CommandRegistrar>& command_registry();

struct RegisterCommand {
  explicit RegisterCommand(CommandRegistrar f) { command_registry().push_back(f); }
};

// The subcommand `name` of app that groups others (`run`, `bench`), created with `description`
// and one required subcommand by whichever registrar comes first.
CLI::App& command_group(CLI::App& app, const std::string& name, const std::string& description);
inline constexpr const char* kBenchDescription =
    "benchmarks (allreduce and ddp on every rank started with `tally launch`; gemm and memory in "
    "one process)";

}  // namespace tally::cli
