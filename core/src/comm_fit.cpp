// The α–β fit (comm_fit.hpp).
#include "tally/core/comm_fit.hpp"

#include <algorithm>
#include <cmath>

namespace tally {

AlphaBetaFit fit_alpha_beta(std::span<const FitPoint> points) {
  AlphaBetaFit fit;
  // Minimise Σ (α·u_i + b·v_i − 1)² with u = steps/t, v = bytes/t, b = 1/β: the 2×2 normal
  // equations [Σuu Σuv; Σuv Σvv]·[α; b] = [Σu; Σv].
  double suu = 0, suv = 0, svv = 0, su = 0, sv = 0;
  for (const FitPoint& p : points) {
    if (!(p.seconds > 0)) continue;
    const double u = p.steps / p.seconds, v = p.bytes_per_rank / p.seconds;
    suu += u * u, suv += u * v, svv += v * v, su += u, sv += v;
  }
  const double det = suu * svv - suv * suv;
  double alpha = 0, b = 0;
  if (det > 1e-9 * suu * svv) {
    alpha = (su * svv - sv * suv) / det;
    b = (suu * sv - suv * su) / det;
  } else {
    fit.note = "needs at least 2 distinct sizes at k >= 2";
    return fit;
  }
  if (alpha < 0) {  // latency below resolution: β alone, through the origin
    alpha = 0;
    b = svv > 0 ? sv / svv : 0.0;
    fit.note = "alpha clamped to 0";
  }
  if (!(b > 0)) {
    fit.note = "no positive bandwidth fits (time does not grow with size)";
    return fit;
  }
  fit.ok = true;
  fit.alpha_s = alpha;
  fit.beta_bps = 1.0 / b;
  for (const FitPoint& p : points)
    if (p.seconds > 0)
      fit.max_rel_error =
          std::max(fit.max_rel_error,
                   std::abs(fit.predict_s(p.steps, p.bytes_per_rank) - p.seconds) / p.seconds);
  return fit;
}

}  // namespace tally
