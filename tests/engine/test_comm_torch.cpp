// The at::Tensor overloads of Comm (engine/runtime/comm_torch.hpp, internal): same results as the
// Buffer API, on contiguous and non-contiguous tensors; bad tensors are InvalidInput. send_async
// (comm_p2p.hpp): two ranks that both send first still meet. A torch TU.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "comm_p2p.hpp"
#include "comm_torch.hpp"
#include "rank_harness.hpp"
#include "tally/core/types.hpp"

namespace tally::engine {
namespace {

constexpr double kTimeout_s = 20;

// Note [non-blocking send] in comm.cpp: with blocking sends, two ranks that each send to the other
// before receiving would wait until the timeout (Gloo ships only into a posted receive). Posted
// with send_async they both reach their recv. Counted when posted: 2 sends of 5 doubles = 80 bytes.
TEST(CommTorch, SendAsyncLetsBothNeighboursSendFirst) {
  const auto result = harness::run_ranks(2, 50, [](const DistEnv& env) {
    Comm comm(env, {.timeout_s = kTimeout_s});
    const int r = env.rank, peer = 1 - r;
    const at::Tensor out = at::arange(0, 5, at::kDouble) + 10.0 * r;
    const at::Tensor out2 = out * 2;
    PendingCollective a = send_async(comm, out, peer, 7);
    PendingCollective b = send_async(comm, out2, peer, 8);
    EXPECT_EQ(comm.counters()[Collective::send_recv].calls, 2);
    EXPECT_EQ(comm.counters()[Collective::send_recv].bytes_sent, 80);
    at::Tensor in2 = at::empty({5}, at::kDouble), in = at::empty({5}, at::kDouble);
    recv(comm, in2, peer, 8);  // tags match whatever the order
    recv(comm, in, peer, 7);
    a.wait();
    b.wait();
    EXPECT_TRUE(a.waited() && b.waited());
    EXPECT_TRUE(at::equal(in, at::arange(0, 5, at::kDouble) + 10.0 * peer));
    EXPECT_TRUE(at::equal(in2, (at::arange(0, 5, at::kDouble) + 10.0 * peer) * 2));
    comm.barrier();
  });
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

TEST(CommTorch, TensorOverloadsMatchExpectedValues) {
  const auto result = harness::run_ranks(3, 50, [](const DistEnv& env) {
    Comm comm(env, {.timeout_s = kTimeout_s});
    const int k = env.world_size, r = env.rank;
    const double tri = k * (k + 1) / 2.0;

    at::Tensor a = at::arange(0, 11, at::kFloat) * float(r + 1);
    all_reduce(comm, a);
    EXPECT_TRUE(at::equal(a, at::arange(0, 11, at::kFloat) * float(tri)));

    // Non-contiguous: every other column of a 4×6 matrix, reduced in place.
    at::Tensor m = at::full({4, 6}, double(r + 1), at::kDouble);
    at::Tensor cols = m.slice(1, 0, 6, 2);
    ASSERT_FALSE(cols.is_contiguous());
    all_reduce(comm, cols, ReduceOp::average);
    EXPECT_TRUE(at::equal(m.slice(1, 0, 6, 2), at::full({4, 3}, tri / k, at::kDouble)));
    EXPECT_TRUE(at::equal(m.slice(1, 1, 6, 2), at::full({4, 3}, double(r + 1), at::kDouble)));

    at::Tensor ring = at::arange(0, 10, at::kDouble) + r;
    ring_all_reduce(comm, ring);
    EXPECT_TRUE(at::equal(ring, at::arange(0, 10, at::kDouble) * k + k * (k - 1) / 2.0));

    const std::int64_t n = 10;
    const ShardSpan mine = chunk_range(n, k, r);
    at::Tensor rs_out = at::empty({mine.count}, at::kFloat);
    reduce_scatter(comm, at::ones({n}, at::kFloat), rs_out);
    EXPECT_TRUE(at::equal(rs_out, at::full({mine.count}, float(k), at::kFloat)));

    at::Tensor gathered = at::empty({n}, at::kFloat);
    all_gather(comm, at::arange(mine.offset, mine.offset + mine.count, at::kFloat), gathered);
    EXPECT_TRUE(at::equal(gathered, at::arange(0, n, at::kFloat)));

    at::Tensor b = r == 0 ? at::full({5}, 7.0, at::kFloat) : at::zeros({5}, at::kFloat);
    broadcast(comm, b, 0);
    EXPECT_TRUE(at::equal(b, at::full({5}, 7.0, at::kFloat)));

    if (r == 0) send(comm, at::full({4}, 2.5, at::kDouble), 1, 9);
    if (r == 1) {
      at::Tensor got = at::zeros({4}, at::kDouble);
      recv(comm, got, 0, 9);
      EXPECT_TRUE(at::equal(got, at::full({4}, 2.5, at::kDouble)));
    }

    // all-to-all into a non-contiguous output (a column of a (3k, 2) matrix): chunk j of rank r's
    // input is 100r + 3j + i, so rank r's chunk j holds 100j + 3r + i.
    at::Tensor a2a_in = at::arange(0, 3, at::kDouble).repeat({k}) + 100.0 * r +
                        3.0 * at::arange(0, k, at::kDouble).repeat_interleave(3);
    at::Tensor grid = at::zeros({3 * k, 2}, at::kDouble);
    at::Tensor column = grid.select(1, 0);
    ASSERT_FALSE(column.is_contiguous());
    all_to_all(comm, a2a_in, column);
    EXPECT_TRUE(at::equal(grid.select(1, 0), at::arange(0, 3, at::kDouble).repeat({k}) + 3.0 * r +
                                                 100.0 * at::arange(0, k, at::kDouble)
                                                             .repeat_interleave(3)));
    EXPECT_TRUE(at::equal(grid.select(1, 1), at::zeros({3 * k}, at::kDouble)));

    at::Tensor ints = at::zeros({3}, at::kInt);
    EXPECT_THROW(all_reduce(comm, ints), InvalidInput);
    at::Tensor undefined;
    EXPECT_THROW(all_reduce(comm, undefined), InvalidInput);
    comm.barrier();
    EXPECT_EQ(comm.counters()[Collective::all_reduce].calls, 2);
    EXPECT_EQ(comm.counters().ring_all_reduce.calls, 1);
  });
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

// The in-place forms the ZeRO stages use (comm_torch.hpp), at world sizes 1–4 and counts 0, 1,
// odd and larger (uneven chunks): reduce_scatter_in_place returns a view of the caller's tensor
// holding exactly what the copying reduce_scatter writes (bit for bit: the same ring); a
// non-contiguous input gives the same values; all_gather_in_place fills every chunk around the
// caller's own without moving the tensor; at k = 1 both leave the tensor as it was.
class CommTorchInPlace : public ::testing::TestWithParam<int> {};

TEST_P(CommTorchInPlace, InPlaceFormsMatchTheCopyingOnes) {
  const auto result = harness::run_ranks(GetParam(), 50, [](const DistEnv& env) {
    Comm comm(env, {.timeout_s = kTimeout_s});
    const int k = env.world_size, r = env.rank;
    for (const std::int64_t n : {0, 1, 7, 10007}) {
      const std::string at = "k=" + std::to_string(k) + " rank " + std::to_string(r) +
                             " n=" + std::to_string(n);
      const ShardSpan mine = chunk_range(n, k, r);
      at::manual_seed(std::uint64_t(100 * r + n));
      const at::Tensor x = at::randn({n}, at::kFloat);

      at::Tensor copied = at::empty({mine.count}, at::kFloat);
      reduce_scatter(comm, x, copied, ReduceOp::average);
      at::Tensor data = x.clone();
      const at::Tensor own = reduce_scatter_in_place(comm, data, ReduceOp::average);
      EXPECT_TRUE(at::equal(own, copied)) << at;
      EXPECT_EQ(own.data_ptr<float>(), data.data_ptr<float>() + mine.offset) << at;
      if (k == 1) {
        EXPECT_TRUE(at::equal(data, x)) << at;
      }

      // Every other element of a (n, 2) tensor: not contiguous, reduced through a copy.
      at::Tensor wide = at::stack({x, at::full({n}, -7.0f)}, 1);
      at::Tensor strided = wide.select(1, 0);
      ASSERT_TRUE(n <= 1 || !strided.is_contiguous()) << at;
      EXPECT_TRUE(at::equal(reduce_scatter_in_place(comm, strided, ReduceOp::average), copied))
          << at;

      // All-gather in place: own chunk i + 0.5, the rest poisoned with -1.
      at::Tensor full = at::full({n}, -1.0, at::kDouble);
      full.narrow(0, mine.offset, mine.count)
          .copy_(at::arange(mine.offset, mine.offset + mine.count, at::kDouble) + 0.5);
      const void* before = full.data_ptr();
      all_gather_in_place(comm, full);
      EXPECT_TRUE(at::equal(full, at::arange(0, n, at::kDouble) + 0.5)) << at;
      EXPECT_EQ(full.data_ptr(), before) << at;
    }
    // Counted as the copying forms: per count, two reduce-scatters in place, one copying, one
    // all-gather; bytes S(k − 1)/k each (0 at k = 1).
    const double kk = k, all_n = 0 + 1 + 7 + 10007;
    const CommCounters& c = comm.counters();
    EXPECT_EQ(c[Collective::reduce_scatter].calls, 3 * 4);
    EXPECT_DOUBLE_EQ(c[Collective::reduce_scatter].bytes_sent, 3 * 4.0 * all_n * (kk - 1) / kk);
    EXPECT_EQ(c[Collective::all_gather].calls, 4);
    EXPECT_DOUBLE_EQ(c[Collective::all_gather].bytes_sent, 8.0 * all_n * (kk - 1) / kk);
  });
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CommTorchInPlace, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "k" + std::to_string(info.param); });

}  // namespace
}  // namespace tally::engine
