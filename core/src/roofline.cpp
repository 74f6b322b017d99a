#include "tally/core/roofline.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tally {

namespace {

double ceil_div(double a, double b) { return std::ceil(a / b); }

// q(Tm, Tn) of Note [GEMM efficiency]: useful output over the output the occupied waves compute.
double quantisation(double m, double n, double batch, double tm, double tn, double sms) {
  const double tiles = batch * ceil_div(m, tm) * ceil_div(n, tn);
  const double waves = ceil_div(tiles, sms);
  return (batch * m * n) / (waves * sms * tm * tn);
}

}  // namespace

double attention_fraction(const KernelPerf& kp, bool backward, std::int64_t head_dim,
                          std::int64_t seq) {
  if (kp.attention_table.empty())
    return backward ? kp.attention_backward_fraction : kp.attention_forward_fraction;
  return attention_table_fraction(kp.attention_table, backward, head_dim, seq);
}

double attention_table_fraction(const std::vector<KernelPerf::AttentionFraction>& table,
                                bool backward, std::int64_t head_dim, std::int64_t seq) {
  TALLY_INVARIANT(!table.empty());
  const auto log2_of = [](std::int64_t v) {
    return std::log2(double(std::max<std::int64_t>(v, 1)));
  };
  // The nearest head dimension (a tie: the larger).
  std::int64_t d = table.front().head_dim;
  for (const auto& p : table) {
    const double now = std::fabs(log2_of(p.head_dim) - log2_of(head_dim));
    const double best = std::fabs(log2_of(d) - log2_of(head_dim));
    if (now < best || (now == best && p.head_dim > d)) d = p.head_dim;
  }
  // Its points by sequence, one fraction per sequence (the mean of equal shapes).
  std::vector<std::pair<double, double>> curve;  // (log seq, fraction), ascending
  std::vector<int> count;
  for (const auto& p : table) {
    if (p.head_dim != d) continue;
    const double f = backward ? p.backward : p.forward;
    const double x = log2_of(p.seq);
    std::size_t c = 0;
    while (c < curve.size() && curve[c].first != x) ++c;
    if (c == curve.size()) {
      curve.emplace_back(x, 0.0);
      count.push_back(0);
    }
    curve[c].second += (f - curve[c].second) / double(++count[c]);  // running mean
  }
  std::sort(curve.begin(), curve.end());
  const double x = log2_of(seq);
  if (x <= curve.front().first) return curve.front().second;
  if (x >= curve.back().first) return curve.back().second;
  for (std::size_t i = 1; i < curve.size(); ++i)
    if (x <= curve[i].first) {
      const auto& [x0, f0] = curve[i - 1];
      const auto& [x1, f1] = curve[i];
      return f0 + (f1 - f0) * (x - x0) / (x1 - x0);
    }
  return curve.back().second;
}

void validate_kernel_perf(const GpuSpec& gpu) {
  const KernelPerf& k = gpu.kernels;
  require_int(k.sm_count >= 1 && k.sm_count <= 1'000'000, "gpu sm_count", k.sm_count,
              "must be in [1, 1000000]");
  require_int(k.tile_m >= 1 && k.tile_m <= 4096, "gpu tile_m", k.tile_m, "must be in [1, 4096]");
  require_int(k.tile_n >= 1 && k.tile_n <= 4096, "gpu tile_n", k.tile_n, "must be in [1, 4096]");
  auto fraction = [](double v, const char* field) {
    require_real(std::isfinite(v) && v > 0 && v <= 1, field, v, "must be in (0, 1]");
  };
  fraction(k.gemm_fraction, "gpu gemm_fraction");
  fraction(k.gemm_ceiling, "gpu gemm_ceiling");
  fraction(k.half_tile_efficiency, "gpu half_tile_efficiency");
  fraction(k.attention_forward_fraction, "gpu attention_forward_fraction");
  fraction(k.attention_backward_fraction, "gpu attention_backward_fraction");
  fraction(k.memory_fraction, "gpu memory_fraction");
  for (const auto& a : k.attention_table) {
    require_int(a.head_dim >= 1, "gpu attention_table head_dim", a.head_dim, "must be >= 1");
    require_int(a.seq >= 1, "gpu attention_table seq", a.seq, "must be >= 1");
    fraction(a.forward, "gpu attention_table forward");
    fraction(a.backward, "gpu attention_table backward");
  }
  fraction(k.sustained_gemm, "gpu sustained_gemm");
  require_real(std::isfinite(k.gemm_half_k) && k.gemm_half_k >= 0 && k.gemm_half_k <= 1e6,
               "gpu gemm_half_k", k.gemm_half_k, "must be in [0, 1000000] elements");
  require_real(std::isfinite(k.gemm_half_mn) && k.gemm_half_mn >= 0 && k.gemm_half_mn <= 1e6,
               "gpu gemm_half_mn", k.gemm_half_mn, "must be in [0, 1000000] elements");
  require_real(std::isfinite(k.kernel_overhead_s) && k.kernel_overhead_s >= 0 &&
                   k.kernel_overhead_s <= 1,
               "gpu kernel_overhead_s", k.kernel_overhead_s, "must be in [0, 1] s");
  for (const KernelPerf::StreamingRate& r : k.streaming_rates) {
    if (r.family.empty())
      throw InvalidInput("gpu streaming_rates family = \"\": must name a kernel family");
    require_real(std::isfinite(r.bytes_per_s) && r.bytes_per_s >= kBandwidthBpsBounds.lo &&
                     r.bytes_per_s <= kBandwidthBpsBounds.hi,
                 "gpu streaming_rates " + r.family, r.bytes_per_s, [] {
                   return "must be in [" + format_number(kBandwidthBpsBounds.lo) + ", " +
                          format_number(kBandwidthBpsBounds.hi) + "] B/s";
                 });
  }
  if (k.memory_overhead_s)
    require_real(std::isfinite(*k.memory_overhead_s) && *k.memory_overhead_s >= 0 &&
                     *k.memory_overhead_s <= 1,
                 "gpu memory_overhead_s", *k.memory_overhead_s, "must be in [0, 1] s");
  require_real(std::isfinite(gpu.memory_bps) && gpu.memory_bps >= kBandwidthBpsBounds.lo &&
                   gpu.memory_bps <= kBandwidthBpsBounds.hi,
               "gpu memory_bps", gpu.memory_bps,
               "must be in [" + format_number(kBandwidthBpsBounds.lo) + ", " +
                   format_number(kBandwidthBpsBounds.hi) + "] bytes/s");
}

double gemm_efficiency(const KernelPerf& kp, std::int64_t m, std::int64_t n, std::int64_t k,
                       double batch) {
  require_int(m >= 1, "gemm m", m, "must be >= 1");
  require_int(n >= 1, "gemm n", n, "must be >= 1");
  require_int(k >= 1, "gemm k", k, "must be >= 1");
  require_real(std::isfinite(batch) && batch >= 1, "gemm batch", batch, "must be >= 1");
  const double sms = std::max(kp.sm_count, 1);
  double best = 0;
  // The kernel's tile and its halves down to 64 (or the tile itself if smaller) in each dimension;
  // each halving costs a factor half_tile_efficiency (its powers by multiplication: the planner
  // times every distinct shape, and std::pow was a tenth of a MoE search).
  double cost_m = 1;  // half_tile_efficiency^hm
  for (int hm = 0; hm == 0 || (kp.tile_m >> hm) >= 64; ++hm, cost_m *= kp.half_tile_efficiency) {
    double cost = cost_m;  // half_tile_efficiency^(hm + hn)
    for (int hn = 0; hn == 0 || (kp.tile_n >> hn) >= 64; ++hn, cost *= kp.half_tile_efficiency) {
      const double q = quantisation(double(m), double(n), batch, double(kp.tile_m >> hm),
                                    double(kp.tile_n >> hn), sms);
      best = std::max(best, q * cost);
    }
  }
  const double outer = double(std::min(m, n));
  return std::min(kp.gemm_ceiling, kp.gemm_fraction * best *
                                       (double(k) / (double(k) + kp.gemm_half_k)) *
                                       (outer / (outer + kp.gemm_half_mn)));
}

double gemm_residual(const KernelPerf& kp, std::int64_t m, std::int64_t n, std::int64_t k,
                     double batch) {
  if (kp.gemm_residuals.empty()) return 1.0;
  const double lm = std::log2(double(m)), ln = std::log2(double(n)), lk = std::log2(double(k));
  const double lb = std::log2(std::max(batch, 1.0));
  double sum_w = 0, sum = 0;
  for (const KernelPerf::GemmResidual& r : kp.gemm_residuals) {
    if ((r.log2_batch > 0) != (lb > 0)) continue;  // single and batched apart
    const double dm = lm - r.log2_m, dn = ln - r.log2_n, dk = lk - r.log2_k, db = lb - r.log2_batch;
    const double d2 = dm * dm + dn * dn + dk * dk + db * db;
    if (d2 < 1e-18) return std::exp(r.log_ratio);  // a measured shape
    const double w = 1 / (d2 * d2);
    sum_w += w;
    sum += w * r.log_ratio;
  }
  return sum_w > 0 ? std::exp(sum / sum_w) : 1.0;
}

double roofline_seconds(const GpuSpec& gpu, double flops, double flops_per_s, double bytes) {
  return roofline_seconds(gpu, flops, flops_per_s, bytes, gpu.kernels.kernel_overhead_s);
}

double roofline_seconds(const GpuSpec& gpu, double flops, double flops_per_s, double bytes,
                        double overhead_s) {
  const double compute_s = flops > 0 ? flops / flops_per_s : 0.0;
  const double memory_s = bytes / (gpu.memory_bps * gpu.kernels.memory_fraction);
  return std::max(compute_s, memory_s) + overhead_s;
}

KernelPerf fit_gemm_perf(KernelPerf base, double peak_flops,
                         const std::vector<GemmSample>& samples) {
  require_int(samples.size() >= 3, "gemm samples", std::int64_t(samples.size()),
              "need >= 3 measured GEMMs to fit");
  require_real(std::isfinite(peak_flops) && peak_flops > 0, "peak_flops", peak_flops,
               "must be > 0 FLOP/s");
  for (const GemmSample& g : samples) {
    require_real(std::isfinite(g.seconds) && g.seconds > 0, "gemm seconds", g.seconds,
                 "must be > 0");
    (void)gemm_efficiency(base, g.m, g.n, g.k, g.batch);  // validates the shape
  }
  KernelPerf best = base;
  double best_err = std::numeric_limits<double>::infinity();
  std::vector<double> implied;
  implied.reserve(samples.size());
  // A kernel whose tile can halve (a GPU's) charges thin GEMMs by tile quantisation: mn½ stays 0.
  // One whose tile cannot (a CPU's 1 × 1) has no half-tile efficiency to fit: only mn½.
  const bool tiles_halve = base.tile_m >= 128 || base.tile_n >= 128;
  std::vector<double> half_mns = {0.0}, tiles = {1.0};
  if (tiles_halve) {
    tiles.clear();
    for (int i = 0; i <= 10; ++i) tiles.push_back(0.5 + 0.05 * i);
  } else {
    half_mns = {0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0};
  }
  for (const double half_k : {0.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0})
    for (const double half_mn : half_mns)
    for (const double tile : tiles)
      for (const double overhead : {0.0, 1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5}) {
        KernelPerf kp = base;
        kp.gemm_half_k = half_k;
        kp.gemm_half_mn = half_mn;
        kp.half_tile_efficiency = std::min(tile, 1.0);
        kp.gemm_fraction = 1.0;
        kp.gemm_ceiling = 1.0;  // fractions here are of peak_flops, the best measured
        kp.kernel_overhead_s = overhead;
        implied.clear();
        for (const GemmSample& g : samples) {
          const double compute_s = g.seconds - overhead;
          if (compute_s <= 0) continue;
          const double flops = 2.0 * g.batch * double(g.m) * double(g.n) * double(g.k);
          implied.push_back(flops / (peak_flops * gemm_efficiency(kp, g.m, g.n, g.k, g.batch) *
                                     compute_s));
        }
        if (implied.size() < samples.size()) continue;  // overhead longer than a kernel
        std::nth_element(implied.begin(), implied.begin() + implied.size() / 2, implied.end());
        kp.gemm_fraction = std::clamp(implied[implied.size() / 2], 1e-6, 1.0);
        double err = 0;
        for (const GemmSample& g : samples) {
          const double flops = 2.0 * g.batch * double(g.m) * double(g.n) * double(g.k);
          const double predicted =
              flops / (peak_flops * gemm_efficiency(kp, g.m, g.n, g.k, g.batch)) + overhead;
          const double e = std::log(predicted / g.seconds);
          err += e * e;
        }
        if (err < best_err) {
          best_err = err;
          best = kp;
        }
      }
  return best;
}

}  // namespace tally
