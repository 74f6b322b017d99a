// `tally bench allreduce` (see the header for the legend and the harness). No torch here: the
// Comm's Buffer API over std::vector is all the harness needs.
#include "tally/engine/bench/allreduce.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <array>
#include <cstring>
#include <functional>
#include <thread>
#include <sstream>

#include "tally/core/comm.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/tracking_allocator.hpp"

namespace tally::engine {

namespace {

constexpr double kElementBytes = 4;            // float32
constexpr double kMinSizeBytes = 4;            // one element
constexpr double kMaxSizeBytes = 4e9;          // 4 GB per buffer; the harness holds three
constexpr std::size_t kMaxSizes = 64;

[[noreturn]] void bad(const std::string& field, double value, const std::string& allowed) {
  std::ostringstream os;
  os << field << " = " << value << ": " << allowed;
  throw InvalidInput(os.str());
}

std::string fmt_double(double v, int precision = 3) {
  std::ostringstream os;
  os.precision(precision);
  os << v;
  return os.str();
}

// Rank r's value at element i: a small integer, so any order of summing k <= kMaxWorldSize of them
// (each < 520, sums < 2^24) is exact in float32; rank-dependent in value and in pattern, so a
// chunk summed twice, skipped or taken from the wrong rank shows up as a wrong element.
float fill_value(int rank, std::int64_t i) {
  return float(((i + 31 * std::int64_t(rank)) & 511) + (rank & 7));
}

// Buffers of one size: what each rank starts from, and the exact sum over ranks.
struct SizeData {
  std::vector<float> initial, expected, data;
};

SizeData make_size_data(std::int64_t count, int rank, int ranks) {
  SizeData d;
  d.initial.resize(std::size_t(count));
  d.expected.assign(std::size_t(count), 0.0f);
  for (std::int64_t i = 0; i < count; ++i) d.initial[std::size_t(i)] = fill_value(rank, i);
  for (int r = 0; r < ranks; ++r)
    for (std::int64_t i = 0; i < count; ++i) d.expected[std::size_t(i)] += fill_value(r, i);
  d.data.resize(std::size_t(count));
  return d;
}

std::int64_t count_wrong(const std::vector<float>& got, const std::vector<float>& expected) {
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i) wrong += got[i] != expected[i];
  return wrong;
}

double bytes_sent_so_far(const Comm& comm, AllReduceAlgorithm a) {
  return a == AllReduceAlgorithm::ring ? comm.counters().ring_all_reduce.bytes_sent
                                       : comm.counters()[Collective::all_reduce].bytes_sent;
}

// The ring's counter sums the integer byte counts its sends actually moved — exact in double
// (< 2^53) — so it must equal the core's figure exactly. Gloo's counter adds the core's formula
// itself, a rounded double such as 2S·(2/3) at k = 3; the difference of two running sums can lose
// its last bits, so that one is compared to 1e-12 relative.
bool same_bytes(AllReduceAlgorithm a, double counted, double core) {
  if (a == AllReduceAlgorithm::ring) return counted == core;
  return std::abs(counted - core) <= 1e-12 * std::max(1.0, core);
}

void run_once(Comm& comm, AllReduceAlgorithm a, std::vector<float>& data) {
  if (a == AllReduceAlgorithm::ring)
    comm.ring_all_reduce(data);
  else
    comm.all_reduce(data);
}

// Note [busy before a call]
// In a training step every collective follows compute, and on a host whose cores all run ranks
// (`run zero` at k = 2 on 2 cores) a call made right after a busy CPU costs more than the same
// call back to back: at k = 2 a 0.25 MB ring all-reduce took 0.41 ms back to back, 0.45–0.52 ms
// after each rank slept 2 ms before the barrier, and 1.6–2.9 ms after 2 ms of a busy loop, of
// GEMMs or of a streaming loop alike (2026-12-05, docs/ledgers.md §5) — not the threads' wake-up
// (the barrier has woken them) nor the kind of work. `--busy-ms` times every call that way: each
// rank spins on the steady clock for busy_s before the barrier, so the ranks still start each call
// together and the wait for the slowest rank stays out of the figure. bench/predict_vs_measured.sh
// calibrates with 2 ms (its -b); the effect was there from 0.5 ms on.
void keep_cpu_busy(double seconds) {
  if (!(seconds > 0)) return;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
  }
}

// Note [host overlap]
// tally's DDP, as PyTorch's, starts each gradient bucket's all-reduce from the autograd hooks and
// waits after the backward (ddp.cpp): the collective runs beside the backward's kernels. On a GPU
// NCCL runs on SMs of its own and the kernels beside it slow by σ ≈ 0.19 (Note [overlap
// contention], core/planner.cpp); on this host Gloo's threads reduce and copy on the cores the
// ranks compute on, so far less is hidden (2026-12-05, PyTorch's own Gloo all-reduce beside a
// GEMM loop twice its length at k = 2: 5–37 % of a 1–10.6 MB all-reduce hidden, none when the loop
// was shorter than the call). The probe measures it: per size, a fixed amount of CPU work sized to
// about twice the all-reduce, timed alone, the all-reduce alone, and both started together
// (all_reduce_async, the work, wait()); medians over the iterations, averaged over the ranks.
// With work w ≥ comm c, core's overlap_exposed_s prices the pair at w + c·σ/(1 + σ), so the
// exposed share x = (together − w)/c gives the host's σ = x/(1 − x) (io::overlap_slowdown, the
// median over sizes). The work is arithmetic on an L1-resident array: the cores' time is what the
// two compete for (the kind of compute did not change the cost after it: Note [busy before a
// call]). Not probed where the ranks outnumber the host's cores: there the probe's barrier-aligned
// work keeps every core busy through the call, while a step's ranks drift apart and a rank waiting
// for its buckets frees its core for another's kernels (the model already stretches their time by
// k·t/c). Measured at k = 4 on 2 cores (2026-12-05 18:22 report): the probed σ of 4.9–8.7 priced
// `bench ddp`'s exposed reduction at 29–32 ms against 19–21 ms of sync wait (0.77–0.87 of the
// step), where the GPU figure had priced it at 22.5 ms; at k = 2 it moved the same run from 1.18
// to 0.98–1.26 (median 1.10) of its prediction.
double fixed_cpu_work(int reps) {
  static std::array<float, 4096> a{};
  float s = 0;
  for (int r = 0; r < reps; ++r)
    for (std::size_t i = 0; i < a.size(); ++i) {
      a[i] = a[i] * 0.999f + 1.0f;
      s += a[i];
    }
  return double(s);
}

double seconds_of(const std::function<void()>& f) {
  const auto t = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

double median_of(std::vector<double> v) { return time_stats(v).median_s; }

OverlapRow probe_overlap(Comm& comm, std::int64_t count, const BenchAllReduceOptions& o) {
  std::vector<float> buf(std::size_t(count), 0.0f);  // zeros: sums stay finite
  volatile double sink = 0;
  std::vector<double> unit, alone;
  for (int i = 0; i < 5; ++i) {
    unit.push_back(seconds_of([&] { sink = sink + fixed_cpu_work(1); }));
    comm.barrier();
    alone.push_back(seconds_of([&] { comm.all_reduce(buf); }));
  }
  // Every rank runs the same work: the reps from the ranks' mean timings.
  std::vector<double> sizing{median_of(unit), median_of(alone)};
  comm.all_reduce(sizing);
  const int reps = int(std::clamp(std::ceil(2 * sizing[1] / std::max(sizing[0], 1e-9)), 1.0, 1e7));
  std::vector<double> work, coll, together;
  for (int i = 0; i < o.warmup_iters + o.iters; ++i) {
    comm.barrier();
    const double w = seconds_of([&] { sink = sink + fixed_cpu_work(reps); });
    comm.barrier();
    const double c = seconds_of([&] { comm.all_reduce(buf); });
    comm.barrier();
    const double t = seconds_of([&] {
      PendingCollective p = comm.all_reduce_async(Buffer(buf));
      sink = sink + fixed_cpu_work(reps);
      p.wait();
    });
    if (i < o.warmup_iters) continue;
    work.push_back(w), coll.push_back(c), together.push_back(t);
  }
  std::vector<double> m{median_of(work), median_of(coll), median_of(together)};
  comm.all_reduce(m);
  const double k = comm.world_size();
  return {.size_bytes = double(count) * kElementBytes,
          .work_s = m[0] / k,
          .comm_s = m[1] / k,
          .together_s = m[2] / k};
}

// Note [sharded collectives]
// The α–β fits above are all-reduces: 2(k−1) steps, 2S(k−1)/k bytes a rank. `run zero`'s ZeRO
// stages call its halves instead — tally's ring reduce-scatter (in place) and Gloo's all-gather,
// k−1 steps and S(k−1)/k bytes each; `run 3d`'s sequence parallelism the same two (its
// reduce-scatter the copying form) — and on this host a call after compute pays a fixed cost
// (Note [busy before a call]) once per call, not per step: priced on the all-reduce fit, each half
// gets half of it. Measured at k = 2 (2026-12-05, each call after 2 ms of busy CPU, mean of 50): a
// 6.31 MB reduce-scatter 4.24 ms and all-gather 4.58 ms against 3.60 and 3.55 from the all-reduce
// fits; 41 KB 1.69 and 2.10 ms against 1.21 and 0.72. `--sharded` times them as the runs call
// them and writes them as the calibration's "reduce-scatter-ring" and "all-gather" points, which
// the host model prices those collectives on (io::fitted_link, Note [per-implementation links]
// in core/mlp_step.hpp). Not where every rank is on one host and they outnumber its cores, as the
// overlap probe (Note [host overlap]): at k = 4 on 2 cores the same calls took 8.7 and 5.7 ms at
// 41 KB (the all-reduce 7.6–11.5), and priced on these points' means the 19:44 report's ZeRO-3
// (nine calls a step) would have read 92 ms where it measured 62 (0.67), ZeRO-1/2 0.88–0.90: four
// ranks' barrier-aligned busy loops on two cores charge every call a scheduling cost that a step's
// drifting ranks, which free their cores while they wait, do not pay.
//
// One (size, algorithm) on the harness (harness.hpp): refill, time, check; the bookkeeping
// collectives (gathering times, summing #wrong) run after the timed loop.
BenchRow bench_one(Comm& comm, AllReduceAlgorithm a, SizeData& d, const BenchAllReduceOptions& o) {
  const int k = comm.world_size();
  BenchRow row{.algorithm = a,
               .count = std::int64_t(d.data.size()),
               .size_bytes = double(d.data.size()) * kElementBytes};
  row.bytes_per_rank_core = collective_bytes_per_rank(Collective::all_reduce, row.size_bytes, k);
  std::int64_t wrong = 0;
  double mismatched_calls = 0;
  double sent_before = 0;
  const TimedLoopResult timed = run_timed_loop(
      comm, {.warmup_iters = o.warmup_iters,
             .iters = o.iters,
             .prepare =
                 [&](int) {
                   std::memcpy(d.data.data(), d.initial.data(), d.data.size() * sizeof(float));
                   keep_cpu_busy(o.busy_s);
                   sent_before = bytes_sent_so_far(comm, a);
                 },
             .run = [&](int) { run_once(comm, a, d.data); },
             .check =
                 [&](int, bool is_timed) {
                   const double sent = bytes_sent_so_far(comm, a) - sent_before;
                   if (!same_bytes(a, sent, row.bytes_per_rank_core)) mismatched_calls += 1;
                   row.bytes_per_rank_counted = sent;
                   if (is_timed) wrong += count_wrong(d.data, d.expected);
                 }});
  // #wrong and byte mismatches over all ranks (counts far below 2^53: exact in double).
  std::vector<double> totals{double(wrong), mismatched_calls};
  comm.all_reduce(totals);
  row.wrong = std::int64_t(totals[0]);
  row.bytes_exact = totals[1] == 0;
  row.time = timed.time;
  row.runqueue_wait_s = timed.runqueue_wait_s;
  row.algbw_bps = row.time.median_s > 0 ? row.size_bytes / row.time.median_s : 0.0;
  row.busbw_bps = bus_bandwidth(Collective::all_reduce, row.algbw_bps, k);
  return row;
}

// Rank q's chunk of the full tensor, as every rank's all-gather result holds it: q's own values.
std::vector<float> gathered_expected(std::int64_t count, int ranks) {
  std::vector<float> out(static_cast<std::size_t>(count));
  for (int q = 0; q < ranks; ++q) {
    const ShardSpan c = chunk_range(count, ranks, q);
    for (std::int64_t i = c.offset; i < c.offset + c.count; ++i)
      out[std::size_t(i)] = fill_value(q, i);
  }
  return out;
}

// One size of one sharded collective (Note [sharded collectives]), on the harness as bench_one.
ShardedRow bench_sharded(Comm& comm, Collective c, SizeData& d, const BenchAllReduceOptions& o) {
  const int k = comm.world_size();
  const std::int64_t count = std::int64_t(d.data.size());
  ShardedRow row{.collective = c, .count = count, .size_bytes = double(count) * kElementBytes};
  row.bytes_per_rank_core = collective_bytes_per_rank(c, row.size_bytes, k);
  const ShardSpan mine = chunk_range(count, k, comm.rank());
  const std::vector<float> gathered =
      c == Collective::all_gather ? gathered_expected(count, k) : std::vector<float>();
  std::vector<float> out(c == Collective::all_gather ? std::size_t(count) : 0);
  Buffer chunk;
  std::int64_t wrong = 0;
  const TimedLoopResult timed = run_timed_loop(
      comm, {.warmup_iters = o.warmup_iters,
             .iters = o.iters,
             .prepare =
                 [&](int) {
                   std::memcpy(d.data.data(), d.initial.data(), d.data.size() * sizeof(float));
                   std::fill(out.begin(), out.end(), -1.0f);
                   keep_cpu_busy(o.busy_s);
                 },
             .run =
                 [&](int) {
                   if (c == Collective::reduce_scatter)
                     chunk = comm.reduce_scatter_in_place(d.data);
                   else
                     comm.all_gather(ConstBuffer(d.data.data() + mine.offset, mine.count,
                                                 DType::f32),
                                     out);
                 },
             .check =
                 [&](int, bool is_timed) {
                   if (!is_timed) return;
                   if (c == Collective::all_gather) {
                     wrong += count_wrong(out, gathered);
                     return;
                   }
                   const auto* got = static_cast<const float*>(chunk.data);
                   if (chunk.count != mine.count) wrong += mine.count;
                   else
                     for (std::int64_t i = 0; i < mine.count; ++i)
                       wrong += got[i] != d.expected[std::size_t(mine.offset + i)];
                 }});
  std::vector<double> total{double(wrong)};
  comm.all_reduce(total);
  row.wrong = std::int64_t(total[0]);
  row.time = timed.time;
  row.runqueue_wait_s = timed.runqueue_wait_s;
  row.busbw_bps =
      row.time.median_s > 0 ? bus_bandwidth(c, row.size_bytes / row.time.median_s, k) : 0.0;
  return row;
}

// Seed ④ for one algorithm's rows (ascending size).
void add_checks(AllReduceAlgorithm a, const std::vector<BenchRow>& rows, int k,
                std::vector<BenchCheck>& out) {
  if (k < 2 || rows.size() < 2) {
    out.push_back({.kind = BenchCheckKind::small_vs_large, .algorithm = a});
  } else {
    const BenchRow& s = rows.front();
    const BenchRow& l = rows.back();
    out.push_back({.kind = BenchCheckKind::small_vs_large, .algorithm = a,
                   .state = s.busbw_bps < l.busbw_bps ? CheckState::pass : CheckState::fail,
                   .size_a_bytes = s.size_bytes, .size_b_bytes = l.size_bytes,
                   .busbw_a_bps = s.busbw_bps, .busbw_b_bps = l.busbw_bps});
  }
  if (k < 2 || rows.size() < 3) {
    out.push_back({.kind = BenchCheckKind::linearity, .algorithm = a});
    return;
  }
  for (std::size_t i = 1; i + 1 < rows.size(); ++i) {
    const double lo = std::min(rows[i].busbw_bps, rows[i + 1].busbw_bps);
    const double hi = std::max(rows[i].busbw_bps, rows[i + 1].busbw_bps);
    const double ratio = hi > 0 ? lo / hi : 0.0;
    out.push_back({.kind = BenchCheckKind::linearity, .algorithm = a,
                   .state = ratio >= kLinearBusbwRatio ? CheckState::pass : CheckState::fail,
                   .size_a_bytes = rows[i].size_bytes, .size_b_bytes = rows[i + 1].size_bytes,
                   .busbw_a_bps = rows[i].busbw_bps, .busbw_b_bps = rows[i + 1].busbw_bps,
                   .ratio = ratio, .threshold = kLinearBusbwRatio});
  }
}

}  // namespace

std::string_view to_string(AllReduceAlgorithm a) {
  return a == AllReduceAlgorithm::ring ? "ring" : "gloo";
}

std::string_view to_string(CheckState s) {
  switch (s) {
    case CheckState::pass: return "PASS";
    case CheckState::fail: return "FAIL";
    case CheckState::not_applicable: return "n/a";
  }
  return "n/a";
}

void BenchAllReduceOptions::validate() const {
  if (sizes_bytes.empty() || sizes_bytes.size() > kMaxSizes)
    bad("sizes", double(sizes_bytes.size()), "must list 1 to 64 sizes");
  for (std::size_t i = 0; i < sizes_bytes.size(); ++i) {
    const double s = sizes_bytes[i];
    if (!(s >= kMinSizeBytes && s <= kMaxSizeBytes))
      bad("size", s, "bytes must be in [4, 4e9] (one float32 to 4 GB)");
    if (i > 0 && !(s > sizes_bytes[i - 1]))
      bad("size", s, "sizes must be ascending and distinct (previous " +
                         fmt_double(sizes_bytes[i - 1], 10) + " B)");
  }
  if (warmup_iters < 0 || warmup_iters > 10000)
    bad("warmup", warmup_iters, "must be in [0, 10000]");
  if (iters < 1 || iters > 100000) bad("iters", iters, "must be in [1, 100000]");
  if (algorithms.empty() || algorithms.size() > 2 ||
      (algorithms.size() == 2 && algorithms[0] == algorithms[1]))
    bad("algorithms", double(algorithms.size()), "must be gloo, ring or both, each once");
  if (!(timeout_s > 0 && timeout_s <= 86400)) bad("timeout", timeout_s, "must be in (0, 86400] s");
  if (!(busy_s >= 0 && busy_s <= 1)) bad("busy", busy_s, "must be in [0, 1] s");
}

std::vector<double> geometric_sizes(double min_bytes, double max_bytes, double factor) {
  if (!(min_bytes > 0)) bad("min size", min_bytes, "bytes must be > 0");
  if (!(max_bytes >= min_bytes)) bad("max size", max_bytes, "must be >= the min size");
  if (!(factor > 1 && factor <= 1e6)) bad("factor", factor, "must be in (1, 1e6]");
  std::vector<double> sizes;
  for (double s = min_bytes; s <= max_bytes * 1.001 && sizes.size() <= kMaxSizes; s *= factor)
    sizes.push_back(s);
  if (sizes.size() > kMaxSizes)
    bad("factor", factor, "gives more than 64 sizes between min and max; use a larger factor");
  return sizes;
}

std::int64_t bench_element_count(double size_bytes, int ranks) {
  TALLY_INVARIANT(ranks >= 1);
  const auto elements = std::int64_t(std::floor(size_bytes / kElementBytes));
  return std::max<std::int64_t>(ranks, elements - elements % ranks);
}

std::vector<BenchRow> BenchAllReduceResult::rows_of(AllReduceAlgorithm a) const {
  std::vector<BenchRow> out;
  for (const BenchRow& r : rows)
    if (r.algorithm == a) out.push_back(r);
  return out;
}

// Note [mean, not median]
// The α–β is fitted to each size's mean time per call, not its median. A training step adds its
// collectives up, so what it pays is their expected time; on this host the two differ most: with
// two ranks on two cores, each call after 2 ms of busy CPU (Note [busy before a call]) took
// either about 0.3–0.5 ms or 1.5–2.5 ms for the same 41 KB (2026-12-05: min 0.32, median 1.97,
// max 8.0 ms over 50 calls), and a median sits anywhere between the two modes — a 0.25 MB call's
// median read 1.8 ms where 1 MB's read 1.0, and Gloo's median fit missed its own points by up to
// 64 %. Fitted to means, `run zero`'s ZeRO-3 at k = 2 (six calls a step) was priced 15.1–16.5 ms
// of collectives against 16.8–20.3 measured (wait included), on medians 11.8–14.1 (three
// calibrate-then-run pairs, docs/ledgers.md §5). The table still prints the median (and the seed's
// ④ checks read its busbw): it is what one call typically takes.
namespace {
// α–β over rows of one collective, `steps` per call, on their mean times.
template <class Row>
AlphaBetaFit fit_mean_times(const std::vector<Row>& rows, int steps) {
  std::vector<FitPoint> points;
  for (const Row& r : rows)
    points.push_back({.steps = steps, .bytes_per_rank = r.bytes_per_rank_core,
                      .seconds = r.time.mean_s});
  return fit_alpha_beta(points);
}
}  // namespace

AlphaBetaFit BenchAllReduceResult::fit(AllReduceAlgorithm a) const {
  return fit_mean_times(rows_of(a), collective_steps(Collective::all_reduce, world_size));
}

std::string_view sharded_implementation(Collective c) {
  return c == Collective::reduce_scatter ? "ring" : "gloo";
}

std::vector<ShardedRow> BenchAllReduceResult::sharded_of(Collective c) const {
  std::vector<ShardedRow> out;
  for (const ShardedRow& r : sharded)
    if (r.collective == c) out.push_back(r);
  return out;
}

AlphaBetaFit BenchAllReduceResult::fit_sharded(Collective c) const {
  return fit_mean_times(sharded_of(c), collective_steps(c, world_size));
}

std::int64_t BenchAllReduceResult::total_wrong() const {
  std::int64_t n = 0;
  for (const BenchRow& r : rows) n += r.wrong;
  for (const ShardedRow& r : sharded) n += r.wrong;
  return n;
}

bool BenchAllReduceResult::ring_bytes_exact() const {
  for (const BenchRow& r : rows)
    if (r.algorithm == AllReduceAlgorithm::ring && !r.bytes_exact) return false;
  return true;
}

std::vector<BenchCheck> BenchAllReduceResult::checks() const {
  std::vector<BenchCheck> out;
  for (AllReduceAlgorithm a : algorithms) add_checks(a, rows_of(a), world_size, out);
  return out;
}

std::optional<double> BenchAllReduceResult::ring_over_gloo_busbw() const {
  const auto gloo = rows_of(AllReduceAlgorithm::gloo);
  const auto ring = rows_of(AllReduceAlgorithm::ring);
  if (gloo.empty() || ring.empty() || !(gloo.back().busbw_bps > 0)) return std::nullopt;
  return ring.back().busbw_bps / gloo.back().busbw_bps;
}

// Note [calibration allocator]
// The runs this calibrates (`run zero`: DP's ring all-reduce, the ZeRO stages' reduce-scatter)
// train under the engine's caching allocator (tracking_allocator.hpp), so the owned tensors each
// ring exchange allocates (Note [owned tensors], comm.cpp) come from its cache. Timed under
// glibc's malloc instead, a chunk of a few MB is mmap'ed and unmapped at every exchange, and on
// the 2-core CI VM that put the ring into a slow mode at random (2026-12-04: 4 MB in 17–31 ms or
// in 2–4 ms, back to back; the runs' own ring moved 6.3 MB in 8.6 ms; with glibc's mmap threshold
// raised, always fast). So the timed loops run under the same caching allocator: the collective
// as the runs call it. Gloo's algorithm allocates its scratch outside c10 and is unaffected.
BenchAllReduceResult run_bench_allreduce(Comm& comm, const BenchAllReduceOptions& o) {
  o.validate();
  TrackingAllocatorScope cache({.cache = true});
  const int k = comm.world_size();
  BenchAllReduceResult result{.world_size = k, .warmup_iters = o.warmup_iters, .iters = o.iters,
                              .busy_s = o.busy_s,
                              .algorithms = o.algorithms};
  // Note [host overlap], Note [sharded collectives]: not where the ranks outnumber this host's
  // cores.
  const bool oversubscribed =
      comm.on_one_host() && k > int(std::max(1u, std::thread::hardware_concurrency()));
  result.sharded_oversubscribed = o.sharded && k > 1 && oversubscribed;
  const bool sharded = o.sharded && k > 1 && !oversubscribed;
  for (const double requested : o.sizes_bytes) {
    const std::int64_t count = bench_element_count(requested, k);
    // Two requested sizes rounding to one count would repeat a row: keep the first.
    if (!result.rows.empty() && result.rows.back().count == count) continue;
    SizeData d = make_size_data(count, comm.rank(), k);
    for (AllReduceAlgorithm a : o.algorithms) result.rows.push_back(bench_one(comm, a, d, o));
    if (sharded)
      for (Collective c : {Collective::reduce_scatter, Collective::all_gather})
        result.sharded.push_back(bench_sharded(comm, c, d, o));
  }
  result.overlap_oversubscribed = o.overlap_probe && k > 1 && oversubscribed;
  if (o.overlap_probe && k > 1 && !oversubscribed)
    for (const BenchRow& row : result.rows)
      if (result.overlap.empty() || result.overlap.back().size_bytes != row.size_bytes)
        result.overlap.push_back(probe_overlap(comm, row.count, o));
  return result;
}

BenchAllReduceResult run_bench_allreduce(const DistEnv& env, const BenchAllReduceOptions& o) {
  o.validate();
  Comm comm(env, {.timeout_s = o.timeout_s});
  return run_bench_allreduce(comm, o);
}

io::Calibration to_calibration(const BenchAllReduceResult& r, bool single_host,
                               AllReduceAlgorithm fit_from) {
  if (!r.ok())
    throw InvalidInput("calibration: the run was not correct (#wrong " +
                       std::to_string(r.total_wrong()) + ", ring bytes " +
                       (r.ring_bytes_exact() ? "exact" : "NOT exact") + "); nothing written");
  const AlphaBetaFit fit = r.fit(fit_from);
  if (!fit.ok)
    throw InvalidInput("calibration: cannot fit alpha/beta to the " +
                       std::string(to_string(fit_from)) + " rows: " + fit.note);
  io::Calibration c;
  c.source = "tally bench allreduce, " + std::string(single_host ? "1 host" : "multi-host") +
             " x " + std::to_string(r.world_size) + " ranks, gloo, float32; alpha/beta fitted to " +
             (fit_from == AllReduceAlgorithm::ring ? "tally's ring" : "Gloo's all-reduce") +
             " (t = alpha*2(k-1) + 2S(k-1)/k / beta, mean times, relative least squares)" +
             (r.busy_s > 0 ? "; every call after " + fmt_double(r.busy_s * 1e3, 6) +
                                 " ms of busy CPU and a barrier (--busy-ms)"
                           : "");
  const LinkSpec link{.bandwidth_bps = fit.beta_bps, .latency_s = fit.alpha_s};
  if (single_host)
    c.intra_node = link;
  else
    c.inter_node = link;
  for (const OverlapRow& o : r.overlap)
    c.overlap.push_back({.ranks = r.world_size,
                         .size_bytes = o.size_bytes,
                         .work_seconds = o.work_s,
                         .comm_seconds = o.comm_s,
                         .together_seconds = o.together_s});
  // Each timed row as a point under its implementation's label (io::points_collective).
  const auto add_point = [&](const std::string_view label, const auto& row) {
    c.points.push_back({.collective = std::string(label),
                        .ranks = r.world_size,
                        .size_bytes = row.size_bytes,
                        .seconds_median = row.time.median_s,
                        .busbw_bps = row.busbw_bps,
                        .seconds_mean = row.time.mean_s});
  };
  for (const BenchRow& row : r.rows)
    add_point(row.algorithm == AllReduceAlgorithm::ring ? io::kRingAllReducePoints
                                                        : io::kGlooAllReducePoints,
              row);
  for (const ShardedRow& row : r.sharded)
    add_point(row.collective == Collective::reduce_scatter ? io::kRingReduceScatterPoints
                                                           : io::kGlooAllGatherPoints,
              row);
  return c;
}

}  // namespace tally::engine
