// The engine's commands: `tally launch` and `tally run <experiment>` (DESIGN.md §3).
#pragma once

#include <CLI/CLI.hpp>

namespace tally::cli {
// Adds `launch` and `run gloo-smoke` (creating `run` if no one has yet).
void register_engine_commands(CLI::App& app);
}  // namespace tally::cli
