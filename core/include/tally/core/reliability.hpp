// The reliability ledger (可靠性账): failures, checkpoint cost and the checkpoint interval.
//
// Legend: G = GPUs (components whose failure stops the job), λ = failures per GPU-hour,
// M = MTBF (hours), C = checkpoint save cost (hours), R = restart cost per failure (hours: detect,
// reschedule, reload), T = checkpoint interval (hours). All times in hours unless suffixed _s.
//
// Note [seed erratum 1] (DESIGN.md §1): the seed's E(T) = 4fT + 55.8/T multiplies half the interval
// by the restart cost and mixes minutes with hours, giving T* ≈ 5.3 h (f = 0.5/h) and ≈ 24 h
// (8192 GPUs). With consistent units the lost fraction is C/T + (T/2 + R)/M, minimised near
// Young's √(2CM): ≈ 15 min and ≈ 1.13 h respectively.
#pragma once

#include <optional>
#include <string>

#include "tally/core/hardware.hpp"

namespace tally {

// 1/(G·λ) (seed §A4: λ_sys ≈ Σ λ_g ≈ Gλ). λ = 0 → +infinity.
double mtbf_hours(double gpus, double failure_rate_per_hour);

// Seconds to write `copies` copies of state_bytes at write_bps (sharded: copies = 1; the seed's full
// strategy writes 128 copies). seed §A4 (2).
double save_seconds(double state_bytes, double write_bps, double copies = 1);

// Young 1974: T = √(2·C·M).
double young_interval_hours(double checkpoint_hours, double mtbf_hours);

// Daly 2006 (FGCS 22, eq. 37): T = √(2CM)·[1 + ⅓√(C/2M) + (1/9)(C/2M)] − C for C < 2M, else M.
double daly_interval_hours(double checkpoint_hours, double mtbf_hours);

// Expected fraction of wall-clock lost: save cost C/T plus, per failure (rate 1/M), half an
// interval of rework and the restart R: C/T + (T/2 + R)/M. First-order model (Young 1974).
double overhead_fraction(double interval_hours, double checkpoint_hours, double restart_hours,
                         double mtbf_hours);

// run_hours / M.
double expected_failures(double run_hours, double mtbf_hours);

struct ReliabilitySetup {
  double gpus = 0;                      // G
  double failure_rate_per_hour = kFleetFailureRatePerGpuHour;  // λ per GPU (hardware.hpp)
  double state_bytes = 0;               // total checkpointed state (sharded across ranks)
  double write_bps = 2e9;               // aggregate write bandwidth, bytes/s
  double restart_hours = 0;             // R
  std::optional<double> interval_hours; // a given interval to evaluate
  std::optional<double> run_hours;      // a run length, for expected failures
  double full_copies = 1;               // copies written by the "full" strategy (seed: 128)
  void validate() const;                // throws InvalidInput naming the field
};

struct ReliabilityReport {
  ReliabilitySetup setup;
  double mtbf_hours = 0;
  double save_seconds = 0;              // sharded: state_bytes / write_bps (this is C)
  double full_save_seconds = 0;         // full_copies · state_bytes / write_bps
  double young_interval_hours = 0;
  double daly_interval_hours = 0;
  double recommended_interval_hours = 0;  // = Daly
  double overhead_at_recommended = 0;     // fraction of wall-clock
  std::optional<double> overhead_at_given;
  std::optional<double> expected_failures;
  std::string convention() const;
};

ReliabilityReport reliability(const ReliabilitySetup& setup);

}  // namespace tally
