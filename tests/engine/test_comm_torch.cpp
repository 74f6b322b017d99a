// The at::Tensor overloads of Comm (engine/runtime/comm_torch.hpp, internal): same results as the
// Buffer API, on contiguous and non-contiguous tensors; bad tensors are InvalidInput. A torch TU.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "comm_torch.hpp"
#include "rank_harness.hpp"
#include "tally/core/types.hpp"

namespace tally::engine {
namespace {

constexpr double kTimeout_s = 20;

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

}  // namespace
}  // namespace tally::engine
