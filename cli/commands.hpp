// One register function per subcommand; each lives in its own cmd_*.cpp.
#pragma once

#include <CLI/CLI.hpp>

namespace tally::cli {
void register_memory(CLI::App& app);
void register_comm(CLI::App& app);
void register_bubble(CLI::App& app);
void register_reliability(CLI::App& app);
void register_plan(CLI::App& app);
void register_compare(CLI::App& app);
}  // namespace tally::cli
