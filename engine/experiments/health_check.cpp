// `tally run health-check` (health_check.hpp).
#include "tally/engine/experiments/health_check.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <span>
#include <string>

#include "tally/core/comm.hpp"
#include "tally/core/operators.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/bench/kernels.hpp"
#include "tally/engine/comm.hpp"
#include "tally/io/files.hpp"

namespace tally::engine {

namespace {

constexpr std::uint64_t kChecksumSeed = 20261201;  // any fixed seed: the same A, B on every rank
// Each turn of a kernel: 1 untimed call, 3 samples of at least 2 ms of CPU time each (time_calls).
const BenchKernelTiming kKernelTiming{.threads = 1, .warmup = 1, .samples = 3,
                                      .min_sample_s = 2e-3, .clock = TimerClock::process_cpu};
constexpr int kLinkWarmup = 1, kLinkIters = 4;  // per link per round (run_timed_loop)

int repeat_on(int rank, const HealthCheckFault& f) { return rank == f.slow_rank ? f.slow_factor : 1; }

// Figures over `values` relative to their median: values[i] / median.
std::vector<double> relative_to_median(const std::vector<double>& values, double median) {
  std::vector<double> out;
  for (double v : values) out.push_back(v / median);
  return out;
}

// The checksum GEMM: C = A · B from fixed-seed inputs; rank `corrupt` flips one bit of C first.
std::uint32_t checksum_gemm(std::int64_t n, bool corrupt) {
  at::manual_seed(kChecksumSeed);
  const at::Tensor a = at::randn({n, n}), b = at::randn({n, n});
  at::Tensor c = at::mm(a, b).contiguous();
  if (corrupt) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, c.data_ptr<float>(), sizeof bits);
    bits ^= 1u;  // the lowest mantissa bit of C[0, 0]
    std::memcpy(c.data_ptr<float>(), &bits, sizeof bits);
  }
  return io::crc32c({reinterpret_cast<const std::byte*>(c.data_ptr<float>()),
                     std::size_t(c.numel()) * sizeof(float)});
}

// This rank's GEMM and memory figures, the best over the rounds; every rank takes its turn alone
// (Note [health-check timing under load]).
std::pair<double, double> time_kernels_in_turn(Comm& comm, const HealthCheckOptions& o) {
  const int r = comm.rank(), k = comm.world_size(), repeat = repeat_on(r, o.fault);
  std::vector<double> gemm_flops, memory_bps;
  for (int round = 0; round < o.rounds; ++round)
    for (int turn = 0; turn < k; ++turn) {
      comm.barrier();
      if (turn != r) continue;
      gemm_flops.push_back(time_gemm(o.gemm_n, o.gemm_n, o.gemm_n, kKernelTiming, repeat).flops_per_s);
      memory_bps.push_back(time_memory(o.memory_bytes, kKernelTiming, repeat).add_bps);
    }
  comm.barrier();
  // Best of the rounds (Note [health-check timing under load]).
  return {*std::max_element(gemm_flops.begin(), gemm_flops.end()),
          *std::max_element(memory_bps.begin(), memory_bps.end())};
}

// Every link r → r+1 mod k in turn, `rounds` times interleaved; per link the per-message times.
std::vector<std::vector<double>> time_links(Comm& comm, const HealthCheckOptions& o,
                                            std::vector<float>& message) {
  const int r = comm.rank(), k = comm.world_size();
  std::vector<std::vector<double>> per_link(std::size_t(k > 1 ? k : 0));
  for (int round = 0; round < o.rounds; ++round)
    for (int src = 0; src < int(per_link.size()); ++src) {
      const int dst = (src + 1) % k, repeat = repeat_on(src, o.fault);
      const TimedLoopResult t = run_timed_loop(
          comm, {.warmup_iters = kLinkWarmup, .iters = kLinkIters, .run = [&](int) {
                   for (int i = 0; i < repeat; ++i) {
                     if (r == src) comm.send(message, dst);
                     if (r == dst) comm.recv(message, src);
                   }
                 }});
      per_link[std::size_t(src)].insert(per_link[std::size_t(src)].end(), t.slowest_s.begin(),
                                        t.slowest_s.end());
    }
  return per_link;
}

}  // namespace

void HealthCheckOptions::validate(int world_size) const {
  require_real(straggler_threshold >= 0.01 && straggler_threshold <= 10, "--straggler-threshold",
               straggler_threshold, "must be in [0.01, 10] (0.5 = flag a rank whose time is 1.5× "
               "the median's)");
  require_real(link_straggler_threshold >= 0.01 && link_straggler_threshold <= 10, "--link-threshold",
               link_straggler_threshold, "must be in [0.01, 10] (1.5 = flag a link whose time is "
               "2.5× the median's)");
  require_real(calibration_threshold >= 0.01 && calibration_threshold <= 10,
               "--calibration-threshold", calibration_threshold,
               "must be in [0.01, 10] (1 = flag a rank whose time is 2× its calibration's)");
  require_int(gemm_n >= 16 && gemm_n <= 4096, "--gemm-n", gemm_n, "must be in [16, 4096]");
  require_real(memory_bytes >= 4096 && memory_bytes <= 4.0 * (1LL << 30), "--memory-mib",
               memory_bytes / 1048576.0, "must be in [0.00390625, 4096] MiB");
  require_real(link_bytes >= 4 && link_bytes <= 1e9, "--link-mb", link_bytes / 1e6,
               "must be in [0.000004, 1000] MB");
  require_int(rounds >= 1 && rounds <= 100, "--rounds", rounds, "must be in [1, 100]");
  CommOptions{.timeout_s = timeout_s}.validate();
  const std::string ranks = "must be -1 (none) or a rank in [0, " + std::to_string(world_size - 1) + "]";
  require_int(fault.slow_rank >= -1 && fault.slow_rank < world_size, "--inject-slow-rank",
              fault.slow_rank, ranks);
  require_int(fault.slow_factor >= 2 && fault.slow_factor <= 100, "--inject-slow-factor",
              fault.slow_factor, "must be in [2, 100]");
  require_int(fault.corrupt_rank >= -1 && fault.corrupt_rank < world_size, "--inject-corrupt-rank",
              fault.corrupt_rank, ranks);
}

bool below(double figure, double expected, double threshold) {
  return figure < expected / (1 + threshold);
}

std::vector<bool> flag_stragglers(const std::vector<double>& figures, double threshold) {
  std::vector<bool> flagged(figures.size(), false);
  if (figures.empty()) return flagged;
  const double median = quantile(figures, 0.5);
  for (std::size_t i = 0; i < figures.size(); ++i)
    flagged[i] = below(figures[i], median, threshold);
  return flagged;
}

// Note [health-check against a calibration].
HealthExpectation expect_from_calibration(const io::Calibration& c, const std::string& flag,
                                          const std::string& source, std::int64_t gemm_n,
                                          double memory_bytes) {
  const std::string ours = host_device_name(kKernelTiming.threads);
  const auto refuse = [&](const std::string& what) {
    throw InvalidInput(flag + " = " + source + ": " + what);
  };
  if (!c.kernels)
    refuse("no kernels section (write one with `tally bench gemm --threads 1 --clock cpu "
           "--cache warm --calibration-out " + source + "` and `tally bench memory` alike)");
  const io::KernelCalibration& k = *c.kernels;
  if (k.device != ours || k.precision != "fp32")
    refuse("measured on '" + k.device + "' at " + k.precision + "; health-check times '" + ours +
           "' at fp32 (calibrate with `tally bench gemm --threads " +
           std::to_string(kKernelTiming.threads) +
           " --clock cpu --cache warm --calibration-out FILE` and `tally bench memory` with the "
           "same --threads and --clock)");
  HealthExpectation e{.source = source};
  const double n = double(gemm_n), flops = 2 * n * n * n;
  for (const GemmSample& g : k.gemm)
    if (g.m == gemm_n && g.n == gemm_n && g.k == gemm_n && g.batch == 1) {
      e.gemm_flops_per_s = flops / g.seconds;
      e.gemm_measured = true;
    }
  // The working set as time_memory runs it: whole float32 pairs.
  const double w = 8.0 * std::max<double>(1, std::floor(memory_bytes / 8));
  for (const io::BandwidthPoint& p : k.memory_curve)
    if (std::abs(p.working_set_bytes - w) <= 1e-9 * w) {
      e.memory_bytes_per_s = p.bytes_per_s;
      e.memory_measured = true;
    }
  if (e.gemm_measured && e.memory_measured) return e;
  if (!k.memory_bps)
    refuse("no memory figures (run `tally bench memory --threads 1 --clock cpu --calibration-out " +
           source + "`)");
  if (!e.gemm_measured && k.gemm.size() < 3)
    refuse("no " + std::to_string(gemm_n) + "³ GEMM and " + std::to_string(k.gemm.size()) +
           " others (the fit needs >= 3: `tally bench gemm --threads 1 --clock cpu "
           "--cache warm --calibration-out " + source + "`)");
  const GpuSpec host = io::host_cluster(c, false).gpu;
  if (!e.gemm_measured) {
    const Op gemm{.name = "health-check gemm", .kind = OpKind::gemm, .m = gemm_n, .n = gemm_n,
                  .k = gemm_n, .flops = flops, .bytes = 4 * 3 * n * n};
    e.gemm_flops_per_s = flops / op_seconds(gemm, host, Precision::fp32);
  }
  if (!e.memory_measured) {
    const Op add{.name = "health-check add", .kind = OpKind::memory, .bytes = 3 * w / 2};
    e.memory_bytes_per_s = add.bytes / op_seconds(add, host, Precision::fp32);
  }
  return e;
}

std::optional<std::uint32_t> majority_value(const std::vector<std::uint32_t>& values) {
  std::map<std::uint32_t, std::size_t> count;
  for (std::uint32_t v : values)
    if (2 * ++count[v] > values.size()) return v;
  return std::nullopt;
}

std::vector<int> HealthCheckResult::straggler_ranks() const {
  std::vector<int> out;
  for (const RankHealth& h : ranks)
    if (h.straggler()) out.push_back(h.rank);
  return out;
}

std::vector<int> HealthCheckResult::wrong_result_ranks() const {
  std::vector<int> out;
  for (const RankHealth& h : ranks)
    if (h.wrong_result) out.push_back(h.rank);
  return out;
}

std::vector<int> HealthCheckResult::below_calibration_ranks() const {
  std::vector<int> out;
  for (const RankHealth& h : ranks)
    if (h.below_calibration()) out.push_back(h.rank);
  return out;
}

std::vector<int> HealthCheckResult::straggler_links() const {
  std::vector<int> out;
  for (const LinkHealth& l : links)
    if (l.straggler) out.push_back(l.src);
  return out;
}

HealthCheckResult run_health_check(const DistEnv& env, const HealthCheckOptions& options) {
  env.validate();
  options.validate(env.world_size);
  const HealthCheckOptions& o = options;
  Comm comm(env, {.timeout_s = o.timeout_s});
  const int k = env.world_size, r = env.rank;
  at::set_num_threads(kKernelTiming.threads);

  // Per rank: gemm FLOP/s, memory bytes/s, checksum, and the figures its own calibration
  // expects (0: none); all-gathered (5 doubles each).
  const auto [gemm_flops, memory_bps] = time_kernels_in_turn(comm, o);
  const std::uint32_t checksum = checksum_gemm(o.gemm_n, r == o.fault.corrupt_rank);
  const HealthExpectation expected = o.calibration.value_or(HealthExpectation{});
  constexpr int kFields = 5;
  const std::vector<double> mine = {gemm_flops, memory_bps, double(checksum),
                                    expected.gemm_flops_per_s, expected.memory_bytes_per_s};
  std::vector<double> all(std::size_t(kFields * k));
  comm.all_gather(mine, all);

  HealthCheckResult res{.options = o, .world_size = k};
  std::vector<double> gemm, memory;
  std::vector<std::uint32_t> sums;
  for (int q = 0; q < k; ++q) {
    gemm.push_back(all[std::size_t(kFields * q)]);
    memory.push_back(all[std::size_t(kFields * q + 1)]);
    sums.push_back(std::uint32_t(all[std::size_t(kFields * q + 2)]));
  }
  res.gemm_median_flops_per_s = quantile(gemm, 0.5);
  res.memory_median_bytes_per_s = quantile(memory, 0.5);
  res.majority_checksum = majority_value(sums);
  const std::vector<bool> slow_gemm = flag_stragglers(gemm, o.straggler_threshold);
  const std::vector<bool> slow_memory = flag_stragglers(memory, o.straggler_threshold);
  const std::vector<double> gemm_rel = relative_to_median(gemm, res.gemm_median_flops_per_s);
  const std::vector<double> memory_rel = relative_to_median(memory, res.memory_median_bytes_per_s);
  for (int q = 0; q < k; ++q) {
    const auto i = std::size_t(q);
    res.ranks.push_back({.rank = q, .gemm_flops_per_s = gemm[i], .memory_bytes_per_s = memory[i],
                         .checksum = sums[i], .gemm_vs_median = gemm_rel[i],
                         .memory_vs_median = memory_rel[i], .gemm_straggler = slow_gemm[i],
                         .memory_straggler = slow_memory[i],
                         .wrong_result = res.majority_checksum != sums[i]});
    RankHealth& h = res.ranks.back();
    h.gemm_expected_flops_per_s = all[std::size_t(kFields * q + 3)];
    h.memory_expected_bytes_per_s = all[std::size_t(kFields * q + 4)];
    if (h.gemm_expected_flops_per_s > 0) {
      h.gemm_vs_calibration = h.gemm_flops_per_s / h.gemm_expected_flops_per_s;
      h.memory_vs_calibration = h.memory_bytes_per_s / h.memory_expected_bytes_per_s;
      h.gemm_below_calibration =
          below(h.gemm_flops_per_s, h.gemm_expected_flops_per_s, o.calibration_threshold);
      h.memory_below_calibration =
          below(h.memory_bytes_per_s, h.memory_expected_bytes_per_s, o.calibration_threshold);
    }
  }

  // Links and the group's all-reduce: S bytes of float32.
  std::vector<float> message(std::size_t(std::max<double>(1, o.link_bytes / 4)), 1.0f);
  res.link_message_bytes = 4.0 * double(message.size());
  if (k > 1) {
    const std::vector<std::vector<double>> per_link = time_links(comm, o, message);
    std::vector<double> link_bps;
    for (int src = 0; src < k; ++src) {
      LinkHealth l{.src = src, .dst = (src + 1) % k, .time = time_stats(per_link[std::size_t(src)])};
      l.bytes_per_s = res.link_message_bytes / l.time.min_s;
      link_bps.push_back(l.bytes_per_s);
      res.links.push_back(l);
    }
    res.link_median_bytes_per_s = quantile(link_bps, 0.5);
    const std::vector<bool> slow_link = flag_stragglers(link_bps, o.link_straggler_threshold);
    for (std::size_t i = 0; i < res.links.size(); ++i) {
      res.links[i].vs_median = link_bps[i] / res.link_median_bytes_per_s;
      res.links[i].straggler = slow_link[i];
    }
    const TimedLoopResult ar = run_timed_loop(
        comm, {.warmup_iters = kLinkWarmup, .iters = kLinkIters * o.rounds,
               .prepare = [&](int) { std::fill(message.begin(), message.end(), 1.0f); },
               .run = [&](int) { comm.all_reduce(message); }});
    res.all_reduce_time = ar.time;
    res.all_reduce_busbw_bps =
        bus_bandwidth(Collective::all_reduce, res.link_message_bytes / ar.time.median_s, k);
  }
  return res;
}

}  // namespace tally::engine
