// tally — does it fit, how fast, what does communication cost, how often to checkpoint.
#include <CLI/CLI.hpp>

#include <iostream>

#include "commands.hpp"
#include "dispatch.hpp"
#include "flags.hpp"
#include "version.hpp"
#ifdef TALLY_ENGINE_BINARY
#include "engine_commands.hpp"
#else
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>
#endif

// Note [two executables]. The planner answers in milliseconds; libtorch takes ~0.7 s (10 s cold) and
// 165 MB just to load. So `tally` holds only the planner's commands and, for the engine's commands
// (run, launch, bench), replaces itself with `tally-engine` from its own directory (or the path in
// TALLY_ENGINE_BIN), passing the arguments unchanged: one command for users, and libtorch is loaded
// only by the commands that run it. `tally --help` lists the engine's commands; their own help comes
// from tally-engine.
#ifndef TALLY_ENGINE_BINARY
namespace {

constexpr std::string_view kEngineCommands[] = {"run", "launch", "bench"};

bool is_engine_command(const char* arg) {
  for (const std::string_view c : kEngineCommands)
    if (arg == c) return true;
  return false;
}

std::filesystem::path engine_binary() {
  if (const char* env = std::getenv("TALLY_ENGINE_BIN"); env && *env) return env;
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (ec ? std::filesystem::path(".") : self.parent_path()) / "tally-engine";
}

// Only returns on failure.
int exec_engine(char** argv) {
  const std::filesystem::path bin = engine_binary();
  ::execv(bin.c_str(), argv);
  const int err = errno;
  std::cerr << "tally: error: `tally " << argv[1] << "` runs the engine, " << bin.string() << ": "
            << std::strerror(err)
            << (err == ENOENT ? " (build it: ninja -C build tally-engine, or scripts/build.sh)" : "")
            << "\n";
  return tally::cli::kRunFailed;
}

// The engine's commands, listed in `tally --help`; tally-engine parses them. The experiments and
// benchmarks named here are the ones tally-engine registers (cli/run_*.cpp, bench_commands.cpp):
// tests/cli's Cli.HelpNamesEveryEngineCommand compares the two lists where the engine is built.
void register_engine_stubs(CLI::App& app) {
  app.add_subcommand("launch", "start N local ranks of a program under torchrun's environment "
                               "(runs tally-engine)");
  app.add_subcommand("run", "run an experiment with the libtorch + Gloo engine: ddp-check, "
                            "grad-accum, zero, checkpoint, fault-drill, health-check, "
                            "memory-profile, tp, pp, cp, 3d, moe, fp8, qlora, gloo-smoke (runs "
                            "tally-engine)");
  app.add_subcommand("bench", "benchmarks: allreduce, ddp, gemm, memory (runs tally-engine)");
}

}  // namespace
#endif

int main(int argc, char** argv) {
  using namespace tally::cli;
#ifndef TALLY_ENGINE_BINARY
  if (argc > 1 && is_engine_command(argv[1])) return exec_engine(argv);
#endif
  CLI::App app{"tally — training-run ledgers (memory, communication, pipeline, reliability), "
               "checked against real multi-process runs"};
  app.name("tally");
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every command");
  app.set_version_flag("--version", version_line(),
                       "print the commit tally was built from and exit");
  register_memory(app);
  register_comm(app);
  register_bubble(app);
  register_reliability(app);
  register_plan(app);
  register_compare(app);
  register_explain(app);
#ifdef TALLY_ENGINE_BINARY
  register_engine_commands(app);
#else
  register_serve(app);
  register_engine_stubs(app);
#endif
  refuse_empty_values(app);  // Note [empty values] (flags.hpp)
  const CommandOutcome outcome = run_command_line(app, argc, argv, std::cout);
  if (!outcome.error.empty()) std::cerr << outcome.error << "\n";
  return outcome.exit_code;
}
