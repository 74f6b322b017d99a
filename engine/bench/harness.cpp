// The benchmark harness (tally/engine/bench/harness.hpp).
#include "tally/engine/bench/harness.hpp"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>

#include "tally/core/types.hpp"

namespace tally::engine {

double quantile(std::vector<double> s, double q) {
  if (s.empty()) throw InvalidInput("quantile: no samples");
  if (!(q >= 0 && q <= 1))
    throw InvalidInput("quantile: q = " + std::to_string(q) + ": must be in [0, 1]");
  std::sort(s.begin(), s.end());
  const double h = q * double(s.size() - 1);
  const auto lo = std::size_t(std::floor(h));
  if (lo + 1 >= s.size()) return s.back();
  return s[lo] + (h - double(lo)) * (s[lo + 1] - s[lo]);
}

TimeStats time_stats(const std::vector<double>& seconds) {
  if (seconds.empty()) throw InvalidInput("time_stats: no samples");
  return {.median_s = quantile(seconds, 0.5),
          .p10_s = quantile(seconds, 0.1),
          .p90_s = quantile(seconds, 0.9),
          .min_s = quantile(seconds, 0.0),
          .max_s = quantile(seconds, 1.0),
          .mean_s = std::accumulate(seconds.begin(), seconds.end(), 0.0) / double(seconds.size())};
}

namespace {

// Every rank's own times all-gathered (rank r's at offset r·S); the max per iteration.
std::vector<double> slowest_rank_times(Comm& comm, const std::vector<double>& mine) {
  const std::size_t S = mine.size(), k = std::size_t(comm.world_size());
  std::vector<double> all(S * k);
  comm.all_gather(mine, all);
  std::vector<double> slowest(S, 0.0);
  for (std::size_t r = 0; r < k; ++r)
    for (std::size_t i = 0; i < S; ++i) slowest[i] = std::max(slowest[i], all[r * S + i]);
  return slowest;
}

}  // namespace

TimedLoopResult run_timed_loop(Comm& comm, const TimedLoop& loop) {
  TALLY_INVARIANT(loop.warmup_iters >= 0 && loop.iters >= 1 && loop.run);
  std::vector<double> mine(std::size_t(loop.iters));
  double queued_s = 0;  // this rank's run-queue wait over the timed calls; < 0: unreadable
  for (int i = 0; i < loop.warmup_iters + loop.iters; ++i) {
    const bool timed = i >= loop.warmup_iters;
    if (loop.prepare) loop.prepare(i);
    comm.barrier();
    const std::optional<double> q0 = thread_runqueue_wait_s();
    const auto t0 = std::chrono::steady_clock::now();
    loop.run(i);
    const auto t1 = std::chrono::steady_clock::now();
    const std::optional<double> q1 = thread_runqueue_wait_s();
    if (timed) {
      mine[std::size_t(i - loop.warmup_iters)] = std::chrono::duration<double>(t1 - t0).count();
      queued_s = q0 && q1 && queued_s >= 0 ? queued_s + std::max(0.0, *q1 - *q0) : -1.0;
    }
    if (loop.check) loop.check(i, timed);
  }
  TimedLoopResult r;
  r.slowest_s = slowest_rank_times(comm, mine);
  r.time = time_stats(r.slowest_s);
  const std::vector<double> one{queued_s < 0 ? -1.0 : queued_s / loop.iters};
  std::vector<double> every(std::size_t(comm.world_size()));
  comm.all_gather(one, every);
  if (std::all_of(every.begin(), every.end(), [](double q) { return q >= 0; }))
    r.runqueue_wait_s = std::accumulate(every.begin(), every.end(), 0.0) / double(every.size());
  return r;
}

double clock_now_s(TimerClock clock) {
  if (clock == TimerClock::wall)
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

TimeStats time_calls(int warmup, int samples, double min_sample_s,
                     const std::function<void()>& call, TimerClock clock) {
  TALLY_INVARIANT(warmup >= 0 && samples >= 1 && min_sample_s >= 0 && call);
  const auto now_s = [clock] { return clock_now_s(clock); };
  const auto timed = [&](long reps) {
    const double t0 = now_s();
    for (long i = 0; i < reps; ++i) call();
    return now_s() - t0;
  };
  for (int i = 0; i < warmup; ++i) call();
  long reps = 1;
  while (timed(reps) < min_sample_s && reps < (1L << 30)) reps *= 2;
  std::vector<double> per_call(static_cast<std::size_t>(samples));
  for (double& t : per_call) t = timed(reps) / double(reps);
  return time_stats(per_call);
}

TimeStats time_cold_calls(int warmup, int samples, const std::function<void()>& flush,
                          const std::function<void()>& call, TimerClock clock) {
  TALLY_INVARIANT(warmup >= 0 && samples >= 1 && flush && call);
  for (int i = 0; i < warmup; ++i) {
    flush();
    call();
  }
  std::vector<double> per_call(static_cast<std::size_t>(samples));
  for (double& t : per_call) {
    flush();
    const double t0 = clock_now_s(clock);
    call();
    // A call shorter than the clock's tick reads 0 s: count it as one nanosecond (its FLOP/s
    // finite, if too high) rather than divide by zero.
    t = std::max(clock_now_s(clock) - t0, 1e-9);
  }
  return time_stats(per_call);
}

}  // namespace tally::engine
