// The α–β link fitted to measured collectives (`tally bench allreduce`, a calibration's points):
// the one fit the bench prints, writes as a calibration's link and the host step model refits
// per implementation (io::fitted_link). Legend: α = latency per step (s), β = bytes/s per rank
// and direction, steps and bytes_per_rank = collective_steps / collective_bytes_per_rank
// (core/comm.hpp) of the measured call, t its measured seconds.
#pragma once

#include <span>
#include <string>

namespace tally {

// t = α·steps + bytes_per_rank/β fitted by least squares of the relative residual
// (t_model − t)/t, i.e. weights 1/t²: every size counts alike, so the small, latency-dominated
// sizes decide α and the large ones β. α < 0 is clamped to 0 (β refitted through the origin).
struct FitPoint {
  int steps = 0;
  double bytes_per_rank = 0;
  double seconds = 0;
};
struct AlphaBetaFit {
  bool ok = false;          // false: fewer than 2 distinct sizes, or no positive β
  double alpha_s = 0;       // latency per step
  double beta_bps = 0;      // bytes/s per rank, per direction
  double max_rel_error = 0; // max |t_model − t|/t over the points
  std::string note;         // why not ok, or "alpha clamped to 0"
  double predict_s(int steps, double bytes_per_rank) const {
    return alpha_s * steps + bytes_per_rank / beta_bps;
  }
};
AlphaBetaFit fit_alpha_beta(std::span<const FitPoint> points);

}  // namespace tally
