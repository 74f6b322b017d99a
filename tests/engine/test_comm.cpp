// tally::engine::Comm over real processes on loopback: every operation at world sizes 1–4 and
// element counts 0, 1, odd and large gives the exact expected values; the byte counters follow
// DESIGN.md's ring formulas (all-to-all: the pairwise exchange's); tally's ring all-reduce matches Gloo's; failures end in CommError
// within the timeout instead of a hang.
//
// Values are small integers wherever a result is compared exactly, so every float sum is exact
// whatever order Gloo or the ring adds in.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "rank_harness.hpp"
#include "tally/engine/comm.hpp"

namespace tally::engine {
namespace {

using harness::run_ranks;

constexpr double kTimeout_s = 20;       // per collective, generous for a loaded 2-core CI box
constexpr double kSweepLimit_s = 50;    // whole sweep of one world size; ctest TIMEOUT is 60 s
const std::vector<std::int64_t> kCounts = {0, 1, 7, 1000003};  // 0, 1, odd, large (odd, prime)

double triangular(int k) { return k * (k + 1) / 2.0; }  // Σ_{r<k} (r + 1)

// Collects up to a few mismatches per check so one bad element does not print a million lines.
template <class T>
void expect_values(const std::vector<T>& got, const std::function<T(std::int64_t)>& want,
                   const std::string& what) {
  int wrong = 0;
  for (std::int64_t i = 0; i < std::int64_t(got.size()); ++i)
    if (got[i] != want(i) && wrong++ < 3)
      ADD_FAILURE() << what << ": element " << i << " = " << got[i] << " vs expected " << want(i);
  EXPECT_EQ(wrong, 0) << what;
}

void sweep_one_count(Comm& comm, std::int64_t n) {
  const int k = comm.world_size();
  const int r = comm.rank();
  const std::string at = "k=" + std::to_string(k) + " rank " + std::to_string(r) + " n=" +
                         std::to_string(n) + " ";
  comm.reset_counters();

  // all-reduce, sum (float): element i of rank r is (r + 1)·(i mod 7 + 1).
  std::vector<float> a(n);
  for (std::int64_t i = 0; i < n; ++i) a[i] = float((r + 1) * (i % 7 + 1));
  comm.all_reduce(a);
  expect_values<float>(a, [&](std::int64_t i) { return float(triangular(k) * (i % 7 + 1)); },
                       at + "all-reduce sum");

  // all-reduce, average (double).
  std::vector<double> av(n);
  for (std::int64_t i = 0; i < n; ++i) av[i] = double((r + 1) * (i % 5));
  comm.all_reduce(av, ReduceOp::average);
  expect_values<double>(av, [&](std::int64_t i) { return triangular(k) * double(i % 5) / k; },
                        at + "all-reduce average");

  // reduce-scatter, sum (float): input element i of rank r is r + (i mod 3).
  std::vector<float> rs_in(n);
  for (std::int64_t i = 0; i < n; ++i) rs_in[i] = float(r + i % 3);
  const ShardSpan mine = chunk_range(n, k, r);
  std::vector<float> rs_out(mine.count);
  comm.reduce_scatter(rs_in, rs_out);
  expect_values<float>(
      rs_out, [&](std::int64_t j) { return float(k * (k - 1) / 2 + k * ((mine.offset + j) % 3)); },
      at + "reduce-scatter");

  // all-gather (double): each rank contributes its chunk of the sequence i + 0.25.
  std::vector<double> ag_in(mine.count);
  for (std::int64_t j = 0; j < mine.count; ++j) ag_in[j] = double(mine.offset + j) + 0.25;
  std::vector<double> ag_out(n, -1.0);
  comm.all_gather(ag_in, ag_out);
  expect_values<double>(ag_out, [](std::int64_t i) { return double(i) + 0.25; }, at + "all-gather");

  // broadcast from the last rank (float).
  const int root = k - 1;
  std::vector<float> b(n, -1.0f);
  if (r == root)
    for (std::int64_t i = 0; i < n; ++i) b[i] = float(i % 1000) + 0.5f;
  comm.broadcast(b, root);
  expect_values<float>(b, [](std::int64_t i) { return float(i % 1000) + 0.5f; }, at + "broadcast");

  // send / recv around the ring: even ranks send first, odd ranks receive first.
  if (k > 1) {
    const int right = (r + 1) % k, left = (r + k - 1) % k;
    std::vector<double> out(n), in(n, -1.0);
    for (std::int64_t i = 0; i < n; ++i) out[i] = 10.0 * r + double(i % 11);
    if (r % 2 == 0) {
      comm.send(out, right, /*tag=*/5);
      comm.recv(in, left, /*tag=*/5);
    } else {
      comm.recv(in, left, 5);
      comm.send(out, right, 5);
    }
    expect_values<double>(in, [&](std::int64_t i) { return 10.0 * left + double(i % 11); },
                          at + "recv from rank " + std::to_string(left));
  }
  // all-to-all, equal splits (float): k chunks of n; element i of the chunk rank r sends to rank
  // j is 1000r + 10j + (i mod 7), so rank r's chunk j must hold 1000j + 10r + (i mod 7).
  std::vector<float> a2a_in(std::size_t(k * n)), a2a_out(std::size_t(k * n), -1.0f);
  for (std::int64_t x = 0; x < k * n; ++x)
    a2a_in[std::size_t(x)] = float(1000 * r + 10 * (x / std::max<std::int64_t>(n, 1)) + x % n % 7);
  comm.all_to_all(a2a_in, a2a_out);
  expect_values<float>(
      a2a_out,
      [&](std::int64_t x) { return float(1000 * (x / n) + 10 * r + x % n % 7); },
      at + "all-to-all");
  // Uneven splits (double): rank r sends j + r + (n mod 3) elements to rank j, each 100r + j +
  // m/2 (m = position in the chunk); it receives r + i + (n mod 3) from rank i.
  std::vector<std::int64_t> sends, recvs;
  std::vector<double> v_in, v_out;
  for (int j = 0; j < k; ++j) {
    sends.push_back(j + r + n % 3);
    recvs.push_back(r + j + n % 3);
    for (std::int64_t m = 0; m < sends.back(); ++m) v_in.push_back(100.0 * r + j + 0.5 * m);
  }
  std::vector<double> v_want;
  for (int i = 0; i < k; ++i)
    for (std::int64_t m = 0; m < recvs[std::size_t(i)]; ++m) v_want.push_back(100.0 * i + r + 0.5 * m);
  v_out.assign(v_want.size(), -1.0);
  comm.all_to_all(v_in, v_out, sends, recvs);
  expect_values<double>(v_out, [&](std::int64_t x) { return v_want[std::size_t(x)]; },
                        at + "all-to-all uneven");
  double uneven_sent = 0;
  for (int j = 0; j < k; ++j)
    if (j != r) uneven_sent += 8.0 * double(sends[std::size_t(j)]);
  comm.barrier();

  // Counters: formula bytes, S = full tensor bytes. Written out here (not via the core function)
  // so the test checks the engine against DESIGN.md, not against itself.
  const double kk = k;
  const double s_f32 = 4.0 * double(n), s_f64 = 8.0 * double(n);
  const CommCounters& c = comm.counters();
  EXPECT_EQ(c[Collective::all_reduce].calls, 2) << at;
  EXPECT_DOUBLE_EQ(c[Collective::all_reduce].bytes_sent, 2 * (s_f32 + s_f64) * (kk - 1) / kk) << at;
  EXPECT_EQ(c[Collective::reduce_scatter].calls, 1) << at;
  EXPECT_DOUBLE_EQ(c[Collective::reduce_scatter].bytes_sent, s_f32 * (kk - 1) / kk) << at;
  EXPECT_EQ(c[Collective::all_gather].calls, 1) << at;
  EXPECT_DOUBLE_EQ(c[Collective::all_gather].bytes_sent, s_f64 * (kk - 1) / kk) << at;
  EXPECT_EQ(c[Collective::broadcast].calls, 1) << at;
  EXPECT_DOUBLE_EQ(c[Collective::broadcast].bytes_sent, k > 1 ? s_f32 : 0.0) << at;
  EXPECT_EQ(c[Collective::send_recv].calls, k > 1 ? 1 : 0) << at;
  EXPECT_DOUBLE_EQ(c[Collective::send_recv].bytes_sent, k > 1 ? s_f64 : 0.0) << at;
  // all-to-all: S = k·n floats scattered, S(k−1)/k = the k−1 chunks of n that leave (pairwise
  // exchange, Thakur et al. 2005); uneven: the elements sent to the other ranks.
  EXPECT_EQ(c[Collective::all_to_all].calls, 2) << at;
  EXPECT_DOUBLE_EQ(c[Collective::all_to_all].bytes_sent, 4.0 * double(n) * (kk - 1) + uneven_sent)
      << at;

  // tally's ring vs Gloo: exact on integers, within fp tolerance on random values.
  std::vector<float> ring(n);
  for (std::int64_t i = 0; i < n; ++i) ring[i] = float((r + 1) * (i % 7 + 1));
  comm.ring_all_reduce(ring);
  expect_values<float>(ring, [&](std::int64_t i) { return float(triangular(k) * (i % 7 + 1)); },
                       at + "ring all-reduce");
  const double ring_bytes = comm.counters().ring_all_reduce.bytes_sent;
  EXPECT_EQ(comm.counters().ring_all_reduce.calls, 1) << at;
  // Per rank the ring sends 2S − |C_r| − |C_{r+1}| (ring.cpp's note): exactly 2S(k−1)/k when k
  // divides n, within two elements of it otherwise; summed over ranks, exactly 2S(k−1).
  const double own = double(chunk_range(n, k, r).count + chunk_range(n, k, (r + 1) % k).count);
  EXPECT_DOUBLE_EQ(ring_bytes, k > 1 ? 4.0 * (2.0 * double(n) - own) : 0.0) << at;
  if (n % k == 0) {
    EXPECT_DOUBLE_EQ(ring_bytes, 2 * s_f32 * (kk - 1) / kk) << at;
  }
  EXPECT_LE(std::abs(ring_bytes - 2 * s_f32 * (kk - 1) / kk), 2 * 4.0) << at;
  std::vector<double> total{ring_bytes};
  comm.all_reduce(total);
  EXPECT_DOUBLE_EQ(total[0], 2 * s_f32 * (kk - 1)) << at << "ring bytes summed over ranks";

  std::mt19937 rng(1234u + unsigned(r));
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = uni(rng);
  std::vector<float> via_gloo = x, via_ring = x;
  comm.all_reduce(via_gloo, ReduceOp::average);
  comm.ring_all_reduce(via_ring, ReduceOp::average);
  int far = 0;
  for (std::int64_t i = 0; i < n; ++i)
    if (std::abs(via_gloo[i] - via_ring[i]) > 1e-6f * float(k) && far++ < 3)
      ADD_FAILURE() << at << "ring vs Gloo at " << i << ": " << via_ring[i] << " vs " << via_gloo[i];
  EXPECT_EQ(far, 0) << at;
}

class CommSweep : public ::testing::TestWithParam<int> {};

TEST_P(CommSweep, EveryOperationExactWithFormulaCounters) {
  const int k = GetParam();
  const auto result = run_ranks(k, kSweepLimit_s, [](const DistEnv& env) {
    Comm comm(env, {.timeout_s = kTimeout_s});
    ASSERT_EQ(comm.rank(), env.rank);
    ASSERT_EQ(comm.world_size(), env.world_size);
    for (const std::int64_t n : kCounts) sweep_one_count(comm, n);
  });
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CommSweep, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "k" + std::to_string(info.param); });

// Comm::reduce_scatter_in_place, the form the ZeRO stages use: on random values its owned chunk is,
// bit for bit, what the copying reduce_scatter writes (the same ring, so the same order of sums),
// on uneven counts; on small integers it is the exact sum or average; at k = 1 it is the identity
// (the whole buffer, untouched); it is counted as reduce_scatter with the formula's bytes.
void in_place_one_count(Comm& comm, std::int64_t n) {
  const int k = comm.world_size(), r = comm.rank();
  const std::string at = "k=" + std::to_string(k) + " rank " + std::to_string(r) + " n=" +
                         std::to_string(n) + " ";
  const ShardSpan mine = chunk_range(n, k, r);
  std::mt19937 rng(4321u + 7919u * unsigned(r) + unsigned(n));
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = uni(rng);
  for (const ReduceOp op : {ReduceOp::sum, ReduceOp::average}) {
    const std::string what = at + (op == ReduceOp::sum ? "sum " : "average ");
    std::vector<float> copied(mine.count);
    comm.reduce_scatter(x, copied, op);
    std::vector<float> data = x;
    comm.reset_counters();
    const Buffer own = comm.reduce_scatter_in_place(data, op);
    EXPECT_EQ(own.data, static_cast<void*>(data.data() + mine.offset)) << what;
    EXPECT_EQ(own.count, mine.count) << what;
    EXPECT_EQ(own.dtype, DType::f32) << what;
    EXPECT_EQ(std::memcmp(own.data, copied.data(), copied.size() * sizeof(float)), 0)
        << what << "in place vs copying: not the same bits";
    if (k == 1) {
      EXPECT_EQ(std::memcmp(data.data(), x.data(), x.size() * sizeof(float)), 0)
          << what << "k = 1 must leave the buffer as it was";
    }
    const CollectiveCounter& c = comm.counters()[Collective::reduce_scatter];
    EXPECT_EQ(c.calls, 1) << what;
    EXPECT_DOUBLE_EQ(c.bytes_sent, 4.0 * double(n) * (k - 1) / k) << what;
    if (k > 1 && n > 0) {
      EXPECT_GT(c.seconds, 0.0) << what;
    }
    EXPECT_GE(c.seconds, 0.0) << what;
  }
  // Exact: element i of rank r is (r + 1)·(i mod 5), so the sum is k(k + 1)/2·(i mod 5).
  std::vector<double> ints(n);
  for (std::int64_t i = 0; i < n; ++i) ints[i] = double((r + 1) * (i % 5));
  const Buffer own = comm.reduce_scatter_in_place(ints, ReduceOp::average);
  std::vector<double> got(static_cast<const double*>(own.data),
                          static_cast<const double*>(own.data) + own.count);
  expect_values<double>(
      got, [&](std::int64_t j) { return triangular(k) * double((mine.offset + j) % 5) / k; },
      at + "in-place average of integers");
}

class CommInPlaceSweep : public ::testing::TestWithParam<int> {};

TEST_P(CommInPlaceSweep, ReduceScatterInPlaceIsTheCopyingResultInTheCallersBuffer) {
  const int k = GetParam();
  const auto result = run_ranks(k, kSweepLimit_s, [](const DistEnv& env) {
    Comm comm(env, {.timeout_s = kTimeout_s});
    for (const std::int64_t n : {0, 1, 2, 7, 10007}) in_place_one_count(comm, n);
  });
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CommInPlaceSweep, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "k" + std::to_string(info.param); });

// Bad arguments are InvalidInput, thrown before anything is sent (so the group stays usable).
TEST(Comm, BadArgumentsAreInvalidInputNamingBothValues) {
  const auto result = run_ranks(2, kSweepLimit_s, [](const DistEnv& env) {
    Comm comm(env, {.timeout_s = kTimeout_s});
    std::vector<float> v(5), wrong(1);
    std::vector<double> d(3);
    try {
      comm.reduce_scatter(v, wrong);
      ADD_FAILURE() << "no throw";
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find("output count 1 vs"), std::string::npos) << e.what();
    }
    EXPECT_THROW(comm.all_gather(v, d), InvalidInput);                  // dtype mismatch
    EXPECT_THROW(comm.broadcast(v, 2), InvalidInput);                   // root out of range
    EXPECT_THROW(comm.send(v, env.rank, 0), InvalidInput);              // to itself
    EXPECT_THROW(comm.all_to_all(v, v), InvalidInput);                  // 5 not a multiple of 2
    const std::vector<std::int64_t> one{5};
    EXPECT_THROW(comm.all_to_all(v, v, one, one), InvalidInput);        // one count for 2 ranks
    EXPECT_THROW(comm.recv(v, 1 - env.rank, -1), InvalidInput);         // negative tag
    comm.all_reduce(v);                                                 // still usable
  });
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

// Note [async collectives]: several all-reduces in flight at once, waited in any order; each is
// counted when started and writes the caller's buffer only in wait().
TEST(CommAsync, AllReducesInFlightCompleteInWaitWithCounters) {
  const auto result = run_ranks(3, kSweepLimit_s, [](const DistEnv& env) {
    Comm comm(env, {.timeout_s = kTimeout_s});
    const int k = env.world_size, r = env.rank;
    std::vector<float> a(1001, float(r + 1));
    std::vector<double> b(7, double(r));
    std::vector<float> empty;
    PendingCollective pa = comm.all_reduce_async(a);
    PendingCollective pb = comm.all_reduce_async(b, ReduceOp::average);
    PendingCollective pe = comm.all_reduce_async(empty);
    EXPECT_EQ(comm.counters()[Collective::all_reduce].calls, 3);  // counted when started
    EXPECT_DOUBLE_EQ(comm.counters()[Collective::all_reduce].bytes_sent,
                     collective_bytes_per_rank(Collective::all_reduce, 1001 * 4 + 7 * 8, k));
    EXPECT_FALSE(pa.waited());
    EXPECT_EQ(b[0], double(r)) << "written before wait()";
    pb.wait();  // out of issue order
    pa.wait();
    pe.wait();
    pa.wait();  // idempotent
    EXPECT_TRUE(pa.waited());
    expect_values<float>(a, [&](std::int64_t) { return float(triangular(k)); }, "async sum");
    expect_values<double>(b, [&](std::int64_t) { return (k - 1) / 2.0; }, "async average");
    PendingCollective none;
    none.wait();  // a default handle has nothing to do
    PendingCollective moved = std::move(pa);
    moved.wait();
    comm.barrier();  // the group is still in step
  });
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

// Note [arrival wait]: the split of one call's spans, worked by hand. Three ranks enter at 1.0,
// 1.5 and 1.2 s and leave at 2.0, 2.1 and 2.05 s: the last arrival is 1.5 s, so rank 0 waited
// 0.5 s and then spent 0.5 s, rank 1 waited 0 and spent 0.6 s, rank 2 waited 0.3 s, spent 0.55 s.
TEST(CommSpans, ArrivalSplitIsWaitForTheLastRankAndTheRest) {
  const std::vector<CallSpan> call{{1.0, 2.0}, {1.5, 2.1}, {1.2, 2.05}};
  const double want_wait[] = {0.5, 0.0, 0.3}, want_rest[] = {0.5, 0.6, 0.55};
  for (int r = 0; r < 3; ++r) {
    const ArrivalSplit a = arrival_split(call, r);
    EXPECT_NEAR(a.wait_s, want_wait[r], 1e-12) << "rank " << r;
    EXPECT_NEAR(a.rest_s, want_rest[r], 1e-12) << "rank " << r;
  }
  // A rank that returned before the last one entered (impossible for a real collective, but
  // clocks of two hosts could say so) gets 0, never a negative time.
  const std::vector<CallSpan> skewed{{1.0, 1.2}, {1.5, 2.0}};
  EXPECT_EQ(arrival_split(skewed, 0).rest_s, 0.0);
  EXPECT_THROW(arrival_split(call, 3), InvalidInput);
  EXPECT_THROW(arrival_split(std::vector<CallSpan>{}, 0), InvalidInput);
}

// Comm::record_spans: only while on, one span per blocking collective (the blocking all-reduce's
// start and finish make one), none for the async all-reduce, send, recv or barrier; and the
// split of a call that rank 1 enters 300 ms late (arrival_splits: each rank's own) gives rank 0 a
// wait of about that (its entry is a barrier's exit earlier; 150 ms of slack either way for a
// loaded 2-core machine) and rank 1 none to speak of.
TEST(CommSpans, RecordedPerBlockingCollectiveAndSplitByArrival) {
  const auto result = run_ranks(2, kSweepLimit_s, [](const DistEnv& env) {
    Comm comm(env, {.timeout_s = kTimeout_s});
    const int r = env.rank;
    std::vector<float> a(1000, 1.0f), full(1000, 0.0f);
    std::vector<float> shard(500, float(r));
    comm.all_reduce(a);  // not recorded: off
    EXPECT_TRUE(comm.take_spans().empty());
    comm.record_spans(true);
    comm.all_reduce(a);
    comm.ring_all_reduce(a);
    (void)comm.reduce_scatter_in_place(a);
    comm.all_gather(shard, full);
    comm.broadcast(a, 0);
    comm.all_reduce_async(a).wait();
    comm.barrier();
    if (r == 0) comm.send(shard, 1); else comm.recv(shard, 0);
    std::vector<CallSpan> spans = comm.take_spans();
    EXPECT_EQ(spans.size(), 5u) << "all_reduce, ring_all_reduce, reduce_scatter_in_place, "
                                   "all_gather, broadcast";
    for (const CallSpan& c : spans) EXPECT_LE(c.enter_s, c.exit_s);
    EXPECT_TRUE(comm.take_spans().empty()) << "take_spans clears";

    comm.barrier();
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    comm.all_reduce(a);
    spans = comm.take_spans();
    comm.record_spans(false);
    ASSERT_EQ(spans.size(), 1u);
    EXPECT_TRUE(comm.on_one_host());
    const std::vector<ArrivalSplit> split = arrival_splits(comm, spans);  // every rank's split
    ASSERT_EQ(split.size(), 1u);
    if (r == 0) {
      EXPECT_GT(split[0].wait_s, 0.15);
      EXPECT_LT(split[0].wait_s, 0.45);
    } else {
      EXPECT_LT(split[0].wait_s, 0.15);
    }
    EXPECT_GE(split[0].rest_s, 0.0);
  });
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

// DESIGN.md §5: a dead rank makes the others fail, naming it where the operation knows the peer.
TEST(CommFailure, PeerThatExitsEarlyMakesOthersThrowWithinTimeout) {
  constexpr double timeout_s = 5;
  const auto result = run_ranks(3, kSweepLimit_s, [&](const DistEnv& env) {
    Comm comm(env, {.timeout_s = timeout_s});
    comm.barrier();
    if (env.rank == 2) _exit(0);  // leaves without a word; the kernel closes its sockets
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> v(1000, 1.0f);
    try {
      if (env.rank == 0) {
        comm.recv(v, /*src_rank=*/2);
      } else {
        comm.all_reduce(v);
      }
      ADD_FAILURE() << "rank " << env.rank << ": no CommError";
    } catch (const CommError& e) {
      const double took_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_LT(took_s, timeout_s + 3) << e.what();
      if (env.rank == 0) {
        EXPECT_EQ(e.op(), "recv");
        EXPECT_EQ(e.peer_rank(), 2);
        EXPECT_NE(std::string(e.what()).find("from rank 2"), std::string::npos) << e.what();
      } else {
        EXPECT_EQ(e.op(), "all-reduce");
      }
      std::fprintf(stderr, "rank %d after %.2f s: %s\n", env.rank, took_s, e.what());
    }
    // The Comm is unusable afterwards, and says so at once.
    EXPECT_THROW(comm.barrier(), CommError);
  });
  ASSERT_EQ(result.ranks.size(), 3u);
  for (const auto& r : result.ranks) EXPECT_TRUE(r.ok()) << result.describe();
  EXPECT_LT(result.elapsed_s, timeout_s + 15) << result.describe();
}

TEST(CommFailure, SilentPeerTimesOut) {
  constexpr double timeout_s = 2;
  const auto result = run_ranks(2, kSweepLimit_s, [&](const DistEnv& env) {
    Comm comm(env, {.timeout_s = timeout_s});
    comm.barrier();
    if (env.rank == 1) {  // alive, connected, but never joins the all-reduce
      std::this_thread::sleep_for(std::chrono::duration<double>(timeout_s + 2));
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    std::vector<double> v(10, 1.0);
    try {
      comm.all_reduce(v);
      ADD_FAILURE() << "no CommError";
    } catch (const CommError& e) {
      const double took_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_TRUE(e.timed_out()) << e.what();
      EXPECT_NE(std::string(e.what()).find("timed out after 2 s"), std::string::npos) << e.what();
      EXPECT_GE(took_s, timeout_s - 0.1);
      EXPECT_LT(took_s, timeout_s + 2) << e.what();
    }
  });
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

TEST(CommFailure, MissingRankFailsRendezvousWithinTimeout) {
  constexpr double timeout_s = 3;
  const auto result = run_ranks(3, kSweepLimit_s, [&](const DistEnv& env) {
    if (env.rank == 2) return;  // never joins
    const auto start = std::chrono::steady_clock::now();
    try {
      Comm comm(env, {.timeout_s = timeout_s});
      ADD_FAILURE() << "rank " << env.rank << ": rendezvous succeeded without rank 2";
    } catch (const CommError& e) {
      const double took_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_EQ(e.op(), "rendezvous");
      EXPECT_LT(took_s, 2 * timeout_s + 2) << e.what();
    }
  });
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

}  // namespace
}  // namespace tally::engine
