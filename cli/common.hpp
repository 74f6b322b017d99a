// Shared pieces of the command line: model / cluster resolution, output flags, JSON printing.
// Strings become enums and SI units here, at the boundary (STYLE.md habit 2); nothing past this
// layer sees a flag's spelling.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tally/core/hardware.hpp"
#include "tally/core/model.hpp"
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
void add_output_flags(CLI::App* cmd, OutputOptions& out);

// --model PRESET|config.json or --params N (7e9, 7B). Exactly one must be given unless
// `allow_none`; returns nullopt then. Unset means not typed (a command's default model is set
// before parsing).
struct ModelOptions {
  std::optional<std::string> model;
  std::optional<std::string> params;
};
void add_model_flags(CLI::App* cmd, ModelOptions& m);
std::optional<ModelSpec> resolve_model(const ModelOptions& m, bool allow_none = false);

// --gpu PRESET|cluster.json (default a100-80g) plus --gpus-per-node and --calibration overrides.
struct ClusterOptions {
  std::string gpu = "a100-80g";
  std::optional<int> gpus_per_node;        // unset: the preset's value
  std::optional<std::string> calibration;  // a file written by `tally bench allreduce`
};
void add_cluster_flags(CLI::App* cmd, ClusterOptions& c);
ClusterSpec resolve_cluster(const ClusterOptions& c);

// Note [numbers on the command line]
// CLI::Range tests `v < lo || v > hi`; every comparison with NaN is false, so `--utilisation nan`
// passed it, and commands that read "0 or NaN" as "not given" then ran with the default. Two rules:
//  - every floating-point flag is checked by finite_in: its text must parse (as CLI11 will parse
//    it) to a finite double inside the interval, so nan, inf, -inf and 1e999 are refused with one
//    line naming the flag, the value and the interval:
//      tally: error: --utilisation: 'nan' must be a finite number in [0.001, 1]
//  - a flag whose absence selects a default is a std::optional: "was it given" is the parser's
//    answer, never a sentinel value (0, -1, NaN, "").
// Integer flags need no more than CLI::Range: "nan", "inf" and "1e999" are not integers, so the
// conversion fails and the line names the flag, the value and the range (or, for an engine flag
// without a range, "Could not convert: --steps = nan").
enum class Ends { closed, open_lo, open_hi };  // [lo, hi], (lo, hi], [lo, hi)
CLI::Validator finite_in(double lo, double hi, Ends ends = Ends::closed);
// Finite only, for a flag whose range the engine checks with its own message (`tally launch
// --timeout -1` says "must be >= 0 s (0 = no limit)"); `range` names it in the refusal here:
//   --timeout: 'nan' must be a finite number (>= 0 s; 0 = no limit)
CLI::Validator finite_number(const std::string& range);

// Note [units on the command line]
// "Gbps" means gigabits per second to everyone who buys networks, so a value carries its unit:
// `--bandwidth 50GB/s`, `200Gb/s`, `1.6Tb/s`; `--size 14GB`, `512MiB` (core's parse_bandwidth /
// parse_bytes: B is a byte, b a bit). The old unit-in-the-name flags (`--bandwidth-gbps 50`, which
// always meant GB/s, and `--size-gb 14`) stay as documented aliases into the same value; giving
// both is an error. The value lands in SI units (bytes/s, bytes) and is checked against [lo, hi].
void add_bandwidth_flag(CLI::App* cmd, const std::string& name, const std::string& gbps_alias,
                        std::optional<double>& bps, const std::string& what, double lo_bps,
                        double hi_bps);
void add_size_flag(CLI::App* cmd, const std::string& name, const std::string& gb_alias,
                   std::optional<double>& bytes, const std::string& what, double lo_bytes,
                   double hi_bytes);

// Note [empty values]
// `--params ""` once meant "no --params" and ran the default plan. Every flag that takes a value
// names a file, a preset, a number or a choice, and none of them is empty, so refuse_empty_values
// (called once in main, after every command is registered) gives each such option a check that
// refuses "" with one line naming the flag. Positional arguments (the program `tally launch`
// starts and its arguments) are left alone: an empty argument can be legitimate there.
void refuse_empty_values(CLI::App& app);

// Enum flags: a CLI11 check listing the allowed names, so errors name flag, value and choices.
CLI::Validator one_of(const std::vector<std::string>& names);
Precision precision_from(const std::string& s);
Optimizer optimizer_from(const std::string& s);
Recompute recompute_from(const std::string& s);
Attention attention_from(const std::string& s);

// Note [no inf or nan in output]
// Every figure a ledger command (memory, comm, bubble, reliability, plan, compare) prints is
// finite. A figure that is undefined for a legitimate input (the MTBF when no failure is
// expected, Note [zero failure rate]) is reported in words and, in JSON, as null beside a flag
// saying why. Any other non-finite figure means the inputs, each inside its interval, combine
// into one that cannot be computed: require_finite throws InvalidInput naming the field
// (`best.step_seconds = inf`) rather than let text print "inf" or JSON a bare null. Each ledger
// command builds its JSON object in both modes and calls require_finite on it before printing
// anything. Engine runs (`tally run …`, `tally bench …`) print measurements, where a NaN loss is
// an observation to report, and do not call it.
void require_finite(const nlohmann::json& j);
void print_json(const nlohmann::json& j);

// Note [zero failure rate]
// With λ = 0 (or a λ so small that 1/(G·λ) overflows) core's MTBF is +infinity, and so are Young's
// and Daly's intervals: no failure is expected, so reliability asks for no checkpoint at all. Text
// reports say that in words (kNoFailuresExpected); JSON sets "no_failures_expected": true and null
// for mtbf_hours and every interval. The overhead stays a number: with no failure there is no
// rework, and with no checkpoint no save cost.
inline constexpr const char* kNoFailuresExpected =
    "no failures expected: no checkpoint interval is needed for reliability";
bool no_failures_expected(const ReliabilityReport& r);
// `v`, or null when no failure is expected (the MTBF and the intervals).
nlohmann::json unless_no_failures(const ReliabilityReport& r, double v);

// "12.34 GB" in the chosen unit.
std::string size_str(double bytes, SizeUnit u, int decimals = 2);
double in_gb(double bytes);  // JSON fields named *_gb are always decimal GB (1e9 B)

}  // namespace tally::cli
