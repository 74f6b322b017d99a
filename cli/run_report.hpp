// The ending every `tally run <experiment>` with per-rank checks shares: rank 0 prints the report
// (one JSON line, which `tally launch` prefixes, or the text), then every rank throws on its first
// failed check, naming the experiment, the rank, both values and the tolerance (exit 1).
// Check: a struct with what, measured, predicted, tolerance and ok (engine::TpCheck, MoeCheck).
#pragma once

#include <fmt/core.h>

#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <vector>

namespace tally::cli {

template <class Check, class ToJson, class PrintText>
void report_then_check(const char* experiment, int rank, const std::vector<Check>& checks,
                       bool json, ToJson&& to_json, PrintText&& print_text) {
  if (rank == 0) {
    if (json)
      std::cout << to_json().dump() << std::endl;
    else
      print_text();
    std::fflush(stdout);
  }
  for (const Check& c : checks)
    if (!c.ok)
      throw std::runtime_error(fmt::format("{}: rank {}: check failed: {}: {:.6g} vs {:.6g} "
                                           "(tolerance {:.1e})",
                                           experiment, rank, c.what, c.measured, c.predicted,
                                           c.tolerance));
}

}  // namespace tally::cli
