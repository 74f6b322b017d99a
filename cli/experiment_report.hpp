// The end of a checked `tally run <experiment>` (run_tp, run_cp, run_moe, …): rank 0 prints its
// report — one JSON line (which `tally launch` prefixes with "[rank 0] ") or the text — and then
// every rank fails on its first failed check: exit 1 with one line naming the experiment, the
// rank, the check, both values and the tolerance. Check is any {what, measured, predicted,
// tolerance, ok}.
#pragma once

#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string_view>
#include <vector>

namespace tally::cli {

// measured / predicted; 0 where there is no prediction (predicted <= 0).
inline double ratio(double measured, double predicted) {
  return predicted > 0 ? measured / predicted : 0;
}

// {"measured", "predicted", "ratio"}: one measured quantity beside its prediction in a report.
inline nlohmann::json measured_json(double measured, double predicted) {
  return {{"measured", measured}, {"predicted", predicted}, {"ratio", ratio(measured, predicted)}};
}

// The checks' summary in the report's JSON: "checks" (how many), "failed_checks" (their names), "ok".
template <class Check>
void add_checks_json(nlohmann::json& j, const std::vector<Check>& checks) {
  nlohmann::json failed = nlohmann::json::array();
  for (const auto& c : checks)
    if (!c.ok) failed.push_back(c.what);
  j["checks"] = checks.size();
  j["failed_checks"] = failed;
  j["ok"] = failed.empty();
}

template <class Result, class Check, class ToJson, class PrintText>
void report_and_check(std::string_view experiment, const Result& r,
                      const std::vector<Check>& checks, bool json, ToJson&& to_json,
                      PrintText&& print_text) {
  if (r.rank == 0) {
    if (json)
      std::cout << to_json(r, checks).dump() << std::endl;
    else
      print_text(r, checks);
    std::fflush(stdout);
  }
  for (const auto& c : checks)
    if (!c.ok)
      throw std::runtime_error(fmt::format("{}: rank {}: check failed: {}: {:.6g} vs {:.6g} "
                                           "(tolerance {:.1e})",
                                           experiment, r.rank, c.what, c.measured, c.predicted,
                                           c.tolerance));
}

}  // namespace tally::cli
