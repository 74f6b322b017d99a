// context_parallel.hpp: which chunks a CP rank holds and the causal block pairs it computes.
// Expected values worked out by hand from the chunk lists (a query chunk i attends key chunks
// 0..i), and Transformer Engine's split: rank r holds chunks r and 2c−1−r.
#include "tally/core/context_parallel.hpp"

#include <gtest/gtest.h>

#include "tally/core/types.hpp"

namespace tally::test_context_parallel {
namespace {

TEST(ContextParallel, ZigzagChunksAtC4) {
  // 8 chunks: rank 0 {0, 7}, rank 1 {1, 6}, rank 2 {2, 5}, rank 3 {3, 4}.
  EXPECT_EQ(cp_chunks(CpBalance::zigzag, 4, 0), (std::array<int, 2>{0, 7}));
  EXPECT_EQ(cp_chunks(CpBalance::zigzag, 4, 1), (std::array<int, 2>{1, 6}));
  EXPECT_EQ(cp_chunks(CpBalance::zigzag, 4, 3), (std::array<int, 2>{3, 4}));
  EXPECT_EQ(cp_chunks(CpBalance::contiguous, 4, 3), (std::array<int, 2>{6, 7}));
  EXPECT_EQ(cp_chunks(CpBalance::zigzag, 1, 0), (std::array<int, 2>{0, 1}));
}

TEST(ContextParallel, BlockPairsBalancedOnlyWithZigzag) {
  // c = 3, zigzag: {0,5} → 1 + 6, {1,4} → 2 + 5, {2,3} → 3 + 4: 7 each. Contiguous: {0,1} → 1 + 2
  // = 3, {2,3} → 3 + 4 = 7, {4,5} → 5 + 6 = 11. Every rank's pairs sum to the triangle's
  // 6·7/2 = 21 blocks.
  std::int64_t zig = 0, con = 0;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(cp_causal_block_pairs(CpBalance::zigzag, 3, r), 7);
    zig += cp_causal_block_pairs(CpBalance::zigzag, 3, r);
    con += cp_causal_block_pairs(CpBalance::contiguous, 3, r);
  }
  EXPECT_EQ(cp_causal_block_pairs(CpBalance::contiguous, 3, 0), 3);
  EXPECT_EQ(cp_causal_block_pairs(CpBalance::contiguous, 3, 2), 11);
  EXPECT_EQ(zig, 21);
  EXPECT_EQ(con, 21);
}

TEST(ContextParallel, BadRankOrDegreeIsInvalidInput) {
  EXPECT_THROW(cp_chunks(CpBalance::zigzag, 0, 0), InvalidInput);
  EXPECT_THROW(cp_chunks(CpBalance::zigzag, 2, 2), InvalidInput);
  EXPECT_THROW(cp_causal_block_pairs(CpBalance::contiguous, 2, -1), InvalidInput);
}

}  // namespace
}  // namespace tally::test_context_parallel
