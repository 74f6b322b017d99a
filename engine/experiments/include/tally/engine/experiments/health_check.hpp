// `tally run health-check` (seed plan 4 ①, 检错: locate the bad card within minutes). Every rank of
// a group started with `tally launch --nproc N -- tally run health-check` measures itself and its
// links, and every rank returns the same report (rank 0's CLI prints it):
//
//   gemm      C (n × n) = A · B, float32, at::mm_out on 1 torch thread, timed by the benchmarks'
//             time_calls (bench/kernels.hpp time_gemm): FLOP/s = 2n³ / median per-call time;
//   memory    a.add_(b, α) over a working set of W bytes (bench/kernels.hpp time_memory): bytes/s
//             = 3 · W/2 / median (read a, read b, write a);
//   link      rank r sends S bytes to its ring neighbour r+1 mod k (Comm::send / recv over Gloo),
//             timed by the harness's run_timed_loop: bytes/s = S / least time;
//   all-reduce  the whole group, S bytes, Gloo's algorithm: busbw = bus_bandwidth(all_reduce, S/t,
//             k) (core/comm.hpp, the planner's formula) — one figure for the group, not flagged;
//   checksum  CRC-32C of the bytes of C = A · B, n × n, A and B from randn after manual_seed(fixed):
//             the same inputs on every rank, so on one machine every rank's bytes must agree.
//
// Note [health-check timing under load]
// A straggler is a rank (or link) whose figure is more than `straggler_threshold` slower than the
// group median: its time exceeds (1 + threshold) × the median time, i.e. figure < median / (1 +
// threshold). Comparing ranks only means something if they were measured under the same conditions,
// and a 2-core CI box running 4 ranks beside other builds is the worst case. Three measures:
//   - one at a time: the rank kernels and the links are measured barrier-serialised (rank 0's
//     turn, then rank 1's, ...), so ranks never contend with each other for the cores;
//   - kernels on the process's CPU clock (TimerClock::process_cpu), on one torch thread: the work
//     the GEMM or the add did, not how long the scheduler gave the cores to someone else meanwhile
//     (on a loaded box, wall-clock GEMM figures of healthy ranks were seen 0.37× to 2.2× their
//     median; a slowed rank's extra work shows on the CPU clock as on the wall clock);
//   - `rounds` interleaved repetitions (every rank's turn in each round), and each figure the
//     best over them: a rank's kernels their fastest round, a link its fastest message. Load from
//     outside only ever adds to a kernel's CPU time (cache and memory-bandwidth contention with
//     the other core, a hypervisor's steal) and only ever delays a transfer, never the reverse, so
//     the best is the rank's (or link's) own; a slowed or faulty rank is slow in every round.
// On that box, with 4 ranks beside other builds (and two busy loops), healthy ranks' GEMM figures
// were first seen within 0.92–1.04× their median and memory figures within 0.83–1.12× (the
// 16 MiB working set shares the last-level cache with whatever else runs), but not always: one CI
// run (2026-12-02, figures then the median of the rounds) read a healthy rank's GEMM at 0.61×, and
// with the best of the rounds, 30 checks under two busy loops or a looping 4-rank training test
// read the lowest healthy figure at 0.67–0.97× (a vCPU's throughput depends on what shares its
// physical core, which no clock removes). Healthy loopback links ranged 0.55–1.4×: a transfer needs
// both processes on a core at once. So the defaults leave room for a shared host: a rank is
// flagged beyond 1.5× the median time (`straggler_threshold` 0.5), a link beyond 2.5×
// (`link_straggler_threshold` 1.5); on a quiet cluster pass tighter ones, on an oversubscribed box
// looser ones (the tests' healthy groups pass 1.0: beyond 2×). An injected 8× slowdown reads
// about 0.12×.
//
// Note [health-check against a calibration]
// The median finds a rank slower than its peers, never a host whose every rank is slow, nor the
// one rank of a 1-rank run. With a calibration of the host (`tally bench gemm|memory --threads 1
// --clock cpu --calibration-out FILE`, the kernels section: docs/formats.md) each rank also sets its figures
// beside what its own host measured when healthy: the GEMM's FLOP/s for the self-test's n × n × n
// — the calibration's own sample of that shape, 2n³ / seconds_median, when it has one, else the
// operator model's prediction on the calibrated host (io::host_cluster's fitted KernelPerf, core's
// op_seconds of that GEMM: the one definition the planner uses) — and the memory test's bytes/s —
// the calibration's memory_curve point at the same working set, else the DRAM streaming rate
// (memory_bytes_per_s through op_seconds: a floor for a working set that fits a cache). Flagged
// like a straggler, with a threshold of its own: figure < expected / (1 + calibration_threshold).
// Its default is looser (1: below half the expected figure) because the two figures are taken at
// different times: within one run healthy ranks stay 0.83–1.12× their median, but a healthy rank
// against a CPU-clock calibration taken minutes earlier on this 2-core box at load 10–12 read
// 0.65× (GEMM; the fitted prediction) — load that thrashes the caches costs CPU time too. Each rank reads the file at the
// given path on its own host, so across hosts each is judged by its own host's calibration. The
// calibration must be of the health check's kernels: this CPU's libtorch on one thread, GEMMs
// timed warm (bench's "cpu, libtorch 1 thread", `bench gemm --cache warm`; bench gemm's default
// cold timing names "…, cold caches"); another device's or thread count's is refused
// (InvalidInput), as `plan --calibration` refuses another device's. The health check times the CPU clock, and so
// must the calibration (bench's --clock cpu): a wall-clock one taken on a busy host counts other
// processes' turns (at load 12 one read 9× below the health check's own figures) and then flags
// nothing. The file does not record the clock, so this is the user's part.
//
// Fault injection (tests, drills): fault.slow_rank runs each timed GEMM and memory call's work
// `slow_factor` times and sends each of its link messages that many times (its neighbour receives
// them all), so its figures drop to 1/slow_factor of a healthy rank's whatever the load;
// fault.corrupt_rank flips the lowest mantissa bit of one element of its checksum GEMM's result
// before the checksum — the smallest silent corruption there is.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tally/engine/bench/harness.hpp"
#include "tally/engine/dist_env.hpp"
#include "tally/io/calibration.hpp"

namespace tally::engine {

// A rank's expected figures from its host's calibration (Note [health-check against a
// calibration]).
struct HealthExpectation {
  std::string source;               // the calibration file, as given
  double gemm_flops_per_s = 0;      // for the self-test's n × n × n
  bool gemm_measured = false;       // true: the calibration's own sample; false: the fitted model
  double memory_bytes_per_s = 0;    // for the memory test's working set
  bool memory_measured = false;     // true: the curve's point; false: the DRAM streaming rate
};

// Throws InvalidInput naming `flag`, the file and what is wrong: no kernels section, kernels of
// another device or thread count, no GEMM of that shape and fewer than 3 to fit, no memory figures.
HealthExpectation expect_from_calibration(const io::Calibration& c, const std::string& flag,
                                          const std::string& source, std::int64_t gemm_n,
                                          double memory_bytes);

struct HealthCheckFault {
  int slow_rank = -1;        // -1 = none
  int slow_factor = 4;       // ≥ 2 when slow_rank is set
  int corrupt_rank = -1;     // -1 = none
};

struct HealthCheckOptions {
  double straggler_threshold = 0.5;   // a rank: flagged when more than 50 % slower than the median
  double link_straggler_threshold = 1.5;  // a link: more than 150 % slower (2.5× the median time)
  double calibration_threshold = 1;   // a rank vs its calibration: more than 100 % slower
  std::int64_t gemm_n = 256;          // n of the n × n × n GEMM (timing and checksum)
  double memory_bytes = 16 * 1048576.0;  // W, the memory test's working set
  double link_bytes = 4e6;            // S of each send / recv and the all-reduce
  int rounds = 5;                     // interleaved repetitions (Note [health-check timing ...])
  double timeout_s = 60;              // rendezvous and every collective
  HealthCheckFault fault;
  std::optional<HealthExpectation> calibration;  // this rank's host's; none = the median alone
  // Throws InvalidInput naming the flag, the value and the allowed range; fault ranks must be -1
  // or a rank of `world_size`.
  void validate(int world_size) const;
};

struct RankHealth {
  int rank = 0;
  double gemm_flops_per_s = 0;
  double memory_bytes_per_s = 0;
  std::uint32_t checksum = 0;       // CRC-32C of the checksum GEMM's result bytes
  double gemm_vs_median = 1;        // gemm_flops_per_s / the group median
  double memory_vs_median = 1;
  bool gemm_straggler = false, memory_straggler = false;
  bool wrong_result = false;        // checksum differs from the majority's (or there is none)
  // Against the rank's own calibration (0 = none given).
  double gemm_expected_flops_per_s = 0, memory_expected_bytes_per_s = 0;
  double gemm_vs_calibration = 0, memory_vs_calibration = 0;
  bool gemm_below_calibration = false, memory_below_calibration = false;
  bool straggler() const { return gemm_straggler || memory_straggler; }
  bool below_calibration() const { return gemm_below_calibration || memory_below_calibration; }
};

struct LinkHealth {
  int src = 0, dst = 0;             // dst = src + 1 mod k
  TimeStats time;                   // per message, the slower end's, over every round
  double bytes_per_s = 0;           // S / min (Note [health-check timing under load])
  double vs_median = 1;
  bool straggler = false;
};

struct HealthCheckResult {
  HealthCheckOptions options;
  int world_size = 1;
  std::vector<RankHealth> ranks;    // by rank
  std::vector<LinkHealth> links;    // r → r+1 mod k, by r; none for k = 1
  double gemm_median_flops_per_s = 0, memory_median_bytes_per_s = 0, link_median_bytes_per_s = 0;
  double link_message_bytes = 0;    // S as sent (whole float32 elements)
  TimeStats all_reduce_time;        // k ≥ 2
  double all_reduce_busbw_bps = 0;  // k ≥ 2
  std::optional<std::uint32_t> majority_checksum;  // held by more than half the ranks

  std::vector<int> straggler_ranks() const;
  std::vector<int> wrong_result_ranks() const;
  std::vector<int> straggler_links() const;  // by src
  std::vector<int> below_calibration_ranks() const;
  bool ok() const {
    return straggler_ranks().empty() && wrong_result_ranks().empty() &&
           straggler_links().empty() && below_calibration_ranks().empty();
  }
};

// Pure parts, exposed for tests. Figures are rates (higher is better); flagged[i] when
// figures[i] < median / (1 + threshold). Median as time_stats: the mean of the middle two.
std::vector<bool> flag_stragglers(const std::vector<double>& figures, double threshold);
// The same rule against an expected figure: figure < expected / (1 + threshold).
bool below(double figure, double expected, double threshold);
// The value held by more than half of `values`, if any.
std::optional<std::uint32_t> majority_value(const std::vector<std::uint32_t>& values);

// Throws InvalidInput for bad env / options, CommError when the group fails.
HealthCheckResult run_health_check(const DistEnv& env, const HealthCheckOptions& options = {});

}  // namespace tally::engine
