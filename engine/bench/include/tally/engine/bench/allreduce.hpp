// `tally bench allreduce`: all-reduce timing after nccl-tests (seed: 通信计时, 验收标准 ④⑤).
//
// Legend: S = full tensor bytes (float32, S = 4·count), k = ranks, t = time of one all-reduce,
// algbw = S/t, busbw = bus_bandwidth(all_reduce, algbw, k) = algbw·2(k−1)/k (core/comm.hpp — the
// same function the planner uses), steps = collective_steps(all_reduce, k) = 2(k−1),
// bytes_per_rank = collective_bytes_per_rank(all_reduce, S, k) = 2S(k−1)/k.
//
// On the engine's one benchmark harness (harness.hpp: warm-up, barrier, timing, statistics);
// every rank runs it:
//   for each size S, for each algorithm (Gloo's Comm::all_reduce, tally's Comm::ring_all_reduce):
//     warm-up iterations, then timed iterations, each: refill the buffer with rank-dependent
//     values, barrier, time the all-reduce on this rank, verify every element exactly;
//   the time of iteration i is the max over ranks of each rank's own time (all-gathered after the
//   timed loop, so the exchange never disturbs the timing): the slowest rank decides, as in
//   nccl-tests. Median, min and max are over the timed iterations.
// #wrong (nccl-tests): elements that differ from the exact sum, summed over ranks and timed
// iterations. The values are small integers, so every summation order gives the exact float32.
// Every rank returns the same result.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tally/core/comm_fit.hpp"
#include "tally/engine/bench/harness.hpp"
#include "tally/engine/comm.hpp"
#include "tally/engine/dist_env.hpp"
#include "tally/io/calibration.hpp"

namespace tally::engine {

enum class AllReduceAlgorithm { gloo, ring };
std::string_view to_string(AllReduceAlgorithm a);  // "gloo", "ring"

struct BenchAllReduceOptions {
  // Requested S per size, bytes. Default: the seed's `for MB in (1, 4, 16, 64)`, MB = 1e6 B
  // (the seed's MB·250_000 float32 elements).
  std::vector<double> sizes_bytes = {1e6, 4e6, 16e6, 64e6};
  int warmup_iters = 5;  // nccl-tests -w default
  int iters = 20;        // nccl-tests -n default
  std::vector<AllReduceAlgorithm> algorithms = {AllReduceAlgorithm::gloo, AllReduceAlgorithm::ring};
  double timeout_s = 60;  // every wait of the Comm
  // Note [busy before a call] (allreduce.cpp): seconds each rank keeps its CPU busy before the
  // barrier that starts every call, as a training step's compute does; 0 = back to back.
  double busy_s = 0;
  // Note [host overlap] (allreduce.cpp): after the timed rows, at each size, time a fixed amount
  // of CPU work alone, Gloo's all-reduce alone, and the two started together.
  bool overlap_probe = false;
  // Note [sharded collectives] (allreduce.cpp): after the all-reduce rows, time every size as
  // ZeRO's two halves as `run zero` calls them: tally's ring reduce-scatter (in place) and Gloo's
  // all-gather, each call after busy_s like the all-reduces. Not where the ranks outnumber this
  // host's cores.
  bool sharded = false;
  // Throws InvalidInput naming the field: sizes in [4 B, 4 GB], 1..64 of them, ascending and
  // distinct; warmup in [0, 10000]; iters in [1, 100000]; 1..2 distinct algorithms; 0 < timeout;
  // busy in [0, 1] s.
  void validate() const;
};

// nccl-tests' -b/-e/-f sweep: min, min·factor, min·factor², ... while <= max (plus 0.1% slack for
// rounding). Throws InvalidInput unless 0 < min <= max and factor > 1.
std::vector<double> geometric_sizes(double min_bytes, double max_bytes, double factor);

// float32 elements benchmarked for a requested size at k ranks: floor(S/4) rounded down to a
// multiple of k (at least k). Note [divisible counts]: only then are the ring's chunks equal and
// its per-rank bytes exactly the core's 2S(k−1)/k (ring.cpp, Note [ring all-reduce]); otherwise a
// rank sends within 2 elements of it and the exact check below could not hold.
std::int64_t bench_element_count(double size_bytes, int ranks);

// One (size, algorithm) line of the table.
struct BenchRow {
  AllReduceAlgorithm algorithm = AllReduceAlgorithm::gloo;
  std::int64_t count = 0;              // float32 elements
  double size_bytes = 0;               // S = 4·count
  TimeStats time;                      // per iteration, slowest rank (harness.hpp)
  double algbw_bps = 0;                // S / median
  double busbw_bps = 0;                // bus_bandwidth(all_reduce, algbw, k)
  std::int64_t wrong = 0;              // #wrong over ranks and timed iterations
  double bytes_per_rank_core = 0;      // collective_bytes_per_rank(all_reduce, S, k)
  double bytes_per_rank_counted = 0;   // rank 0's counter per call: ring = its sends, gloo = formula
  // Every rank's counted bytes, every call == the core's: exactly for the ring (its real sends),
  // to 1e-12 relative for Gloo (its counter is the formula, summed in double).
  bool bytes_exact = true;
  std::optional<double> runqueue_wait_s;  // TimedLoopResult::runqueue_wait_s of its calls
};

// The α–β fit (FitPoint, AlphaBetaFit, fit_alpha_beta) is core's: tally/core/comm_fit.hpp.

enum class CheckState { pass, fail, not_applicable };
std::string_view to_string(CheckState s);  // "PASS", "FAIL", "n/a"

// Seed ④'s checks, one algorithm's rows at a time (BenchAllReduceResult::checks()).
enum class BenchCheckKind {
  small_vs_large,  // the smallest size's busbw below the largest's: small messages are
                   // latency-dominated. n/a at k = 1 or fewer than 2 sizes.
  linearity,       // min/max busbw of two adjacent sizes past the smallest >= threshold: time
                   // about linear in S. n/a at k = 1 or fewer than 3 sizes.
};
inline constexpr double kLinearBusbwRatio = 0.8;  // seed ④: 相邻点带宽比值 >= 0.8

// One check and the numbers it compared (all 0 when n/a); cli/bench_commands.cpp words it.
struct BenchCheck {
  BenchCheckKind kind = BenchCheckKind::small_vs_large;
  AllReduceAlgorithm algorithm = AllReduceAlgorithm::gloo;
  CheckState state = CheckState::not_applicable;
  // small_vs_large: a = the smallest size, b = the largest; linearity: the adjacent pair, a < b.
  double size_a_bytes = 0, size_b_bytes = 0;
  double busbw_a_bps = 0, busbw_b_bps = 0;
  double ratio = 0;      // linearity: min(busbw)/max(busbw) of the pair (0 when both are 0)
  double threshold = 0;  // linearity: kLinearBusbwRatio
};

// One size of the overlap probe (Note [host overlap]): each a median over the timed iterations,
// averaged over the ranks.
struct OverlapRow {
  double size_bytes = 0;
  double work_s = 0;      // the fixed CPU work alone
  double comm_s = 0;      // Gloo's all-reduce alone (blocking, after a barrier)
  double together_s = 0;  // all_reduce_async, the same work, then wait()
  // (together − work) / comm: the share of the collective the work did not hide (may fall
  // outside [0, 1] by noise; io::overlap_slowdown clamps it).
  double exposed_fraction() const { return comm_s > 0 ? (together_s - work_s) / comm_s : 0.0; }
};

// One size of a sharded collective (Note [sharded collectives]): S = the full tensor, each rank
// holding (reduce-scatter: keeping; all-gather: giving) S/k of it.
struct ShardedRow {
  Collective collective = Collective::reduce_scatter;  // or all_gather
  std::int64_t count = 0;              // float32 elements of the full tensor
  double size_bytes = 0;               // S = 4·count
  TimeStats time;                      // per iteration, slowest rank (harness.hpp)
  double bytes_per_rank_core = 0;      // collective_bytes_per_rank(collective, S, k) = S(k−1)/k
  double busbw_bps = 0;                // bus_bandwidth(collective, S / median, k)
  std::int64_t wrong = 0;              // elements of the result that differ, over ranks and calls
  std::optional<double> runqueue_wait_s;  // TimedLoopResult::runqueue_wait_s of its calls
};
// Which implementation times each: "ring" (Comm::reduce_scatter_in_place, tally's ring) for the
// reduce-scatter, "gloo" (Comm::all_gather) for the all-gather — the ones `run zero` calls.
std::string_view sharded_implementation(Collective c);

struct BenchAllReduceResult {
  int world_size = 1;
  int warmup_iters = 0, iters = 0;
  double busy_s = 0;  // BenchAllReduceOptions::busy_s
  std::vector<AllReduceAlgorithm> algorithms;
  std::vector<BenchRow> rows;  // size-major: for each size, one row per algorithm, in order
  std::vector<OverlapRow> overlap;  // with overlap_probe (k >= 2), ascending size
  // overlap_probe asked for but skipped: every rank on this host and more ranks than its cores
  // (Note [host overlap]).
  bool overlap_oversubscribed = false;
  std::vector<ShardedRow> sharded;  // with sharded: per size, reduce-scatter then all-gather
  bool sharded_oversubscribed = false;  // sharded asked for, skipped as the overlap probe is

  std::vector<ShardedRow> sharded_of(Collective c) const;  // ascending size
  // α–β of one sharded collective over its rows' mean times: steps k−1, bytes S(k−1)/k.
  AlphaBetaFit fit_sharded(Collective c) const;

  std::vector<BenchRow> rows_of(AllReduceAlgorithm a) const;  // ascending size
  // α–β (core fit_alpha_beta) over the rows' mean times: the expected time of one call, which a
  // step's calls add up to (nccl-tests' "time" is the mean too). A median of single calls can sit
  // anywhere between two modes: Note [mean, not median] in allreduce.cpp.
  AlphaBetaFit fit(AllReduceAlgorithm a) const;
  std::int64_t total_wrong() const;  // all-reduce and sharded rows
  bool ring_bytes_exact() const;  // every ring row exact (true when the ring was not run)
  bool ok() const { return total_wrong() == 0 && ring_bytes_exact(); }  // sharded rows included
  // Seed ④ per algorithm: the smallest size's busbw below the largest's; and "time grows about
  // linearly with S": for adjacent sizes past the smallest (the smallest is latency-dominated by
  // design of the first check), min(busbw)/max(busbw) >= 0.8. n/a at k = 1 or too few sizes.
  std::vector<BenchCheck> checks() const;
  // ring busbw / gloo busbw at the largest size both were run at; nullopt if not both.
  std::optional<double> ring_over_gloo_busbw() const;
};

// Runs the benchmark on this rank over its own Comm (rendezvous included). Throws InvalidInput
// for bad env / options and CommError when the group fails; a wrong result is reported in the
// result (ok() false), not thrown.
BenchAllReduceResult run_bench_allreduce(const DistEnv& env, const BenchAllReduceOptions& options);
// Same over an existing Comm (every rank of it must call this with the same options).
BenchAllReduceResult run_bench_allreduce(Comm& comm, const BenchAllReduceOptions& options);

// The calibration a run measured: the fitted α, β of `fit_from` as the intra_node link
// (single_host) or inter_node (a multi-host ring runs at its slowest link); points = every row
// ("allreduce" for Gloo, "allreduce-ring" for tally's ring) and every sharded row
// ("reduce-scatter-ring", "all-gather": io's labels). Throws InvalidInput when the fit is
// not ok or the run was not ok.
io::Calibration to_calibration(const BenchAllReduceResult& result, bool single_host,
                               AllReduceAlgorithm fit_from = AllReduceAlgorithm::gloo);

}  // namespace tally::engine
