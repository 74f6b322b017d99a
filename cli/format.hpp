// The CLI's vocabulary that needs neither CLI11 nor JSON: exit codes, the output unit, sizes in
// words (so a file that only formats includes neither library: compile time).
#pragma once

#include <string>

#include "tally/core/reliability.hpp"
#include "tally/core/types.hpp"

namespace tally::cli {

// Exit codes (STYLE.md, after google/benchmark): 0 ok, 1 a run failed, 2 bad input.
enum ExitCode : int { kOk = 0, kRunFailed = 1, kBadInput = 2 };

struct OutputOptions {
  bool json = false;
  std::string unit = "GB";
  SizeUnit size_unit() const;
};
// Note [zero failure rate]
// With λ = 0 (or a λ so small that 1/(G·λ) overflows) core's MTBF is +infinity, and so are Young's
// and Daly's intervals: no failure is expected, so reliability asks for no checkpoint at all. Text
// reports say that in words (kNoFailuresExpected); JSON sets "no_failures_expected": true and null
// for mtbf_hours and every interval. The overhead stays a number: with no failure there is no
// rework, and with no checkpoint no save cost.
inline constexpr const char* kNoFailuresExpected =
    "no failures expected: no checkpoint interval is needed for reliability";
bool no_failures_expected(const ReliabilityReport& r);
// v to `digits` significant digits, as printf's %g: 1.23, 0.00123, 1.23e+06.
std::string sig_str(double v, int digits = 3);
// A fraction as a percentage with one decimal: 0.1234 -> "12.3 %".
std::string pct_str(double fraction);
// "12.34 GB" in the chosen unit.
std::string size_str(double bytes, SizeUnit u, int decimals = 2);
double in_gb(double bytes);  // JSON fields named *_gb are always decimal GB (1e9 B)

}  // namespace tally::cli
