// The one harness every engine benchmark runs on (nccl-tests' habit: the harness owns warm-up,
// timing and statistics; each benchmark only says what one iteration does and checks).
//
// Legend: W = warm-up iterations, S = timed iterations, k = ranks.
//
// run_timed_loop, on every rank, for iteration i in [0, W + S):
//   prepare(i)   untimed: refill buffers, read counters;
//   barrier      every rank starts the iteration together;
//   run(i)       timed on this rank with a steady clock;
//   check(i)     untimed: verify the result, read counters (timed tells a warm-up from a timed one).
// After the loop the ranks' own times are all-gathered (so the exchange never disturbs the timing)
// and the time of iteration i is the max over ranks: the slowest rank decides, as in nccl-tests.
// Statistics (time_stats) are over the S timed iterations.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "tally/engine/comm.hpp"

namespace tally::engine {

struct TimeStats {
  double median_s = 0, p10_s = 0, p90_s = 0, min_s = 0, max_s = 0;
  double mean_s = 0;  // nccl-tests' "time": the loop's total over its iterations
};

// q-quantile of the samples (0 <= q <= 1), linear between order statistics: sorted s,
// h = q·(n − 1), s[⌊h⌋] + (h − ⌊h⌋)·(s[⌊h⌋+1] − s[⌊h⌋]) — numpy.percentile's default, which
// bench/ddp_peer.py computes the same way. Throws InvalidInput when empty or q is outside [0, 1].
double quantile(std::vector<double> samples, double q);
// Median (q = 0.5: the mean of the middle two for an even count), p10, p90, min, max and mean.
// Throws InvalidInput when empty.
TimeStats time_stats(const std::vector<double>& seconds);

struct TimedLoop {
  int warmup_iters = 0;  // W
  int iters = 1;         // S
  std::function<void(int i)> prepare;                // may be empty
  std::function<void(int i)> run;                    // the timed work
  std::function<void(int i, bool timed)> check;      // may be empty
};

struct TimedLoopResult {
  std::vector<double> slowest_s;  // per timed iteration, the max over ranks
  TimeStats time;                 // over slowest_s
  // The calling thread's run-queue wait around the timed calls (Note [run-queue wait] in
  // tally/engine/comm.hpp; read just outside each timed window, so the reads cost the timing
  // nothing), per call: each rank's mean, averaged over the ranks; empty unless every rank could
  // read it.
  std::optional<double> runqueue_wait_s;
};

// Every rank of `comm` calls it with the same W and S.
TimedLoopResult run_timed_loop(Comm& comm, const TimedLoop& loop);

// Which clock time_calls reads. wall: steady_clock, what a user waits. process_cpu: the CPU time
// of this process, all its threads (CLOCK_PROCESS_CPUTIME_ID) — the work a compute kernel did,
// whatever else the scheduler ran on the cores meanwhile (Note [health-check timing under load]).
enum class TimerClock { wall, process_cpu };
// That clock's reading now, in seconds (differences only have a meaning).
double clock_now_s(TimerClock clock);

// One process's kernel timing (`tally bench gemm|memory`): `call` runs W times untimed, then S
// samples are timed, each repeating `call` r times, r = the smallest power of two for which one
// warm-up sample lasted >= min_sample_s (short kernels are timed over many calls, as
// timeit.autorange does). Returns the statistics of the per-call time (sample / r).
TimeStats time_calls(int warmup, int samples, double min_sample_s, const std::function<void()>& call,
                     TimerClock clock = TimerClock::wall);
// The same with cold caches (`tally bench gemm --cache cold`, Note [cold-cache GEMMs] in
// kernels.hpp): before each call, warm-up or timed, `flush` runs untimed; each of the S samples is
// one call (no repetition: a second call would find the operands the first one brought in).
TimeStats time_cold_calls(int warmup, int samples, const std::function<void()>& flush,
                          const std::function<void()>& call, TimerClock clock = TimerClock::wall);

}  // namespace tally::engine
