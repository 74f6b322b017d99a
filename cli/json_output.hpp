// JSON output of the ledger commands (nlohmann): the finiteness check and the printer.
#pragma once

#include <nlohmann/json.hpp>

#include "tally/core/reliability.hpp"

namespace tally::cli {

// Note [no inf or nan in output]
// Every figure a ledger command (memory, comm, bubble, reliability, plan, compare, explain)
// prints is finite. A figure that is undefined for a legitimate input (the MTBF when no failure is
// expected, Note [zero failure rate]) is reported in words and, in JSON, as null beside a flag
// saying why. Any other non-finite figure means the inputs, each inside its interval, combine
// into one that cannot be computed: require_finite throws InvalidInput naming the field
// (`best.step_seconds = inf`) rather than let text print "inf" or JSON a bare null. Each ledger
// command builds its JSON object in both modes and calls require_finite on it before printing
// anything. Engine runs (`tally run …`, `tally bench …`) print measurements, where a NaN loss is
// an observation to report, and do not call it.
void require_finite(const nlohmann::json& j);
void print_json(const nlohmann::json& j);
// A count is an integer in JSON (7615616512, not 7615616512.0) when it is one and exact in a double.
nlohmann::json count_json(double n);

// `v`, or null when no failure is expected (the MTBF and the intervals).
nlohmann::json unless_no_failures(const ReliabilityReport& r, double v);

}  // namespace tally::cli
