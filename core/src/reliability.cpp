#include "tally/core/reliability.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "tally/core/types.hpp"

namespace tally {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void require_nonneg(double v, const char* field, const char* unit) {
  require_real(std::isfinite(v) && v >= 0, field, v, unit);
}

// MTBF may be +infinity (λ = 0) but never <= 0 or NaN.
void require_mtbf(double mtbf) {
  require_real(mtbf > 0, "mtbf_hours", mtbf, "must be > 0 hours (infinity when the failure rate is 0)");
}

}  // namespace

// seed §A4 (1): a job of G components fails when any one does, λ_sys ≈ G·λ, MTBF ≈ 1/(G·λ).
double mtbf_hours(double gpus, double failure_rate_per_hour) {
  require_real(std::isfinite(gpus) && gpus >= 1, "gpus", gpus, "must be >= 1");
  require_nonneg(failure_rate_per_hour, "failure_rate_per_hour", "must be >= 0 per GPU-hour");
  if (failure_rate_per_hour == 0) return kInf;
  return 1.0 / (gpus * failure_rate_per_hour);
}

// seed §A4 (2): t_save = state / write bandwidth (112 GB / 2 GB/s = 56 s); full: 128 × 112 GB.
double save_seconds(double state_bytes, double write_bps, double copies) {
  require_nonneg(state_bytes, "state_bytes", "must be >= 0");
  require_real(std::isfinite(write_bps) && write_bps > 0, "write_bps", write_bps,
          "must be > 0 bytes/s");
  require_real(std::isfinite(copies) && copies >= 1, "full_copies", copies, "must be >= 1");
  return copies * state_bytes / write_bps;
}

// Young 1974, "A first order approximation to the optimum checkpoint interval", CACM 17(9).
double young_interval_hours(double checkpoint_hours, double mtbf) {
  require_nonneg(checkpoint_hours, "checkpoint_hours", "must be >= 0 hours");
  require_mtbf(mtbf);
  return std::sqrt(2.0 * checkpoint_hours * mtbf);
}

// Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart dumps",
// FGCS 22(3), eq. 37.
double daly_interval_hours(double checkpoint_hours, double mtbf) {
  require_nonneg(checkpoint_hours, "checkpoint_hours", "must be >= 0 hours");
  require_mtbf(mtbf);
  const double C = checkpoint_hours;
  if (!(C < 2.0 * mtbf)) return mtbf;
  if (std::isinf(mtbf)) return C > 0 ? kInf : 0.0;
  const double x = C / (2.0 * mtbf);
  return std::sqrt(2.0 * C * mtbf) * (1.0 + std::sqrt(x) / 3.0 + x / 9.0) - C;
}

// DESIGN.md §1 erratum 1: per hour of wall-clock, one save of C every T hours (C/T) and, per
// failure (1/M per hour), on average T/2 of rework plus the restart R.
double overhead_fraction(double interval_hours, double checkpoint_hours, double restart_hours,
                         double mtbf) {
  require_real(interval_hours > 0, "interval_hours", interval_hours, "must be > 0 hours");
  require_nonneg(checkpoint_hours, "checkpoint_hours", "must be >= 0 hours");
  require_nonneg(restart_hours, "restart_hours", "must be >= 0 hours");
  require_mtbf(mtbf);
  const double save = std::isinf(interval_hours) ? 0.0 : checkpoint_hours / interval_hours;
  if (std::isinf(mtbf)) return save;  // no failures: only the save cost
  return save + (interval_hours / 2.0 + restart_hours) / mtbf;
}

double expected_failures(double run_hours, double mtbf) {
  require_nonneg(run_hours, "run_hours", "must be >= 0 hours");
  require_mtbf(mtbf);
  return run_hours / mtbf;
}

void ReliabilitySetup::validate() const {
  require_real(std::isfinite(gpus) && gpus >= 1, "gpus", gpus, "must be >= 1");
  require_nonneg(failure_rate_per_hour, "failure_rate_per_hour", "must be >= 0 per GPU-hour");
  require_nonneg(state_bytes, "state_bytes", "must be >= 0");
  require_real(std::isfinite(write_bps) && write_bps > 0, "write_bps", write_bps,
          "must be > 0 bytes/s");
  require_nonneg(restart_hours, "restart_hours", "must be >= 0 hours");
  if (interval_hours)
    require_real(std::isfinite(*interval_hours) && *interval_hours > 0, "interval_hours",
            *interval_hours, "must be > 0 hours");
  if (run_hours) require_nonneg(*run_hours, "run_hours", "must be >= 0 hours");
  require_real(std::isfinite(full_copies) && full_copies >= 1, "full_copies", full_copies,
          "must be >= 1");
}

ReliabilityReport reliability(const ReliabilitySetup& setup) {
  setup.validate();
  ReliabilityReport r;
  r.setup = setup;
  r.mtbf_hours = mtbf_hours(setup.gpus, setup.failure_rate_per_hour);
  r.save_seconds = save_seconds(setup.state_bytes, setup.write_bps);
  r.full_save_seconds = save_seconds(setup.state_bytes, setup.write_bps, setup.full_copies);
  const double C = r.save_seconds / 3600.0;
  r.young_interval_hours = young_interval_hours(C, r.mtbf_hours);
  r.daly_interval_hours = daly_interval_hours(C, r.mtbf_hours);
  r.recommended_interval_hours = r.daly_interval_hours;
  // C = 0 makes the optimum T = 0 (checkpoint continuously, for free): only restarts cost.
  r.overhead_at_recommended =
      r.recommended_interval_hours > 0
          ? overhead_fraction(r.recommended_interval_hours, C, setup.restart_hours, r.mtbf_hours)
          : (std::isinf(r.mtbf_hours) ? 0.0 : setup.restart_hours / r.mtbf_hours);
  if (setup.interval_hours)
    r.overhead_at_given =
        overhead_fraction(*setup.interval_hours, C, setup.restart_hours, r.mtbf_hours);
  if (setup.run_hours) r.expected_failures = expected_failures(*setup.run_hours, r.mtbf_hours);
  return r;
}

std::string ReliabilityReport::convention() const {
  return "MTBF = 1/(G*lambda), G=" + format_number(setup.gpus) + ", lambda=" +
         format_number(setup.failure_rate_per_hour) + "/GPU-hour | C = state/write_bps (sharded), " +
         format_number(setup.state_bytes) + " B at " + format_number(setup.write_bps) + " B/s; full = " +
         format_number(setup.full_copies) + " copies | interval: Daly 2006 eq. 37 (Young 1974 sqrt(2CM)"
         " shown) | overhead = C/T + (T/2 + R)/MTBF, R=" + format_number(setup.restart_hours) +
         " h | hours unless _s";
}

}  // namespace tally
