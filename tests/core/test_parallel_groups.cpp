// parallel_groups.hpp: Megatron-LM's "tp-cp-dp-pp" rank order. Every expected group below is
// worked out by hand from r = tp_i + t·(cp_i + c·(dp_i + d·pp_i)), not from the code.
#include "tally/core/parallel_groups.hpp"

#include <gtest/gtest.h>

#include <set>

#include "tally/core/types.hpp"

namespace tally {
namespace {

using Groups = std::vector<std::vector<int>>;

// world 8 = dp 2 × tp 2 × pp 2 (the header's example).
TEST(ParallelGroups, Dp2Tp2Pp2) {
  const ParallelLayout l{.dp = 2, .tp = 2, .pp = 2};
  EXPECT_EQ(all_groups(l, GroupKind::tp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(all_groups(l, GroupKind::dp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(all_groups(l, GroupKind::pp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(all_groups(l, GroupKind::cp),
            (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
}

// world 16 = tp 2 × cp 2 × dp 2 × pp 2; rank 13 = 1 + 2·(0 + 2·(1 + 2·1)).
TEST(ParallelGroups, AllFourDimensionsRank13) {
  const ParallelLayout l{.dp = 2, .tp = 2, .pp = 2, .cp = 2};
  const RankCoords c = rank_coords(l, 13);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.cp, 0);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(group_ranks(l, GroupKind::tp, 13), (std::vector<int>{12, 13}));
  EXPECT_EQ(group_ranks(l, GroupKind::cp, 13), (std::vector<int>{13, 15}));
  EXPECT_EQ(group_ranks(l, GroupKind::dp, 13), (std::vector<int>{9, 13}));
  EXPECT_EQ(group_ranks(l, GroupKind::pp, 13), (std::vector<int>{5, 13}));
}

// world 12 = tp 3 × dp 2 × pp 2: rank 7 = 1 + 3·(0 + 2·1), so tp 1, dp 0, pp 1.
TEST(ParallelGroups, Tp3Dp2Pp2) {
  const ParallelLayout l{.dp = 2, .tp = 3, .pp = 2};
  EXPECT_EQ(group_ranks(l, GroupKind::tp, 7), (std::vector<int>{6, 7, 8}));
  EXPECT_EQ(group_ranks(l, GroupKind::dp, 7), (std::vector<int>{7, 10}));
  EXPECT_EQ(group_ranks(l, GroupKind::pp, 7), (std::vector<int>{1, 7}));
  EXPECT_EQ(all_groups(l, GroupKind::tp),
            (Groups{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9, 10, 11}}));
}

// Property: for every kind, the groups partition the world, each of size(kind), spaced stride(kind).
TEST(ParallelGroups, GroupsPartitionTheWorld) {
  for (const ParallelLayout l : {ParallelLayout{.dp = 3, .tp = 2, .pp = 2, .cp = 1},
                                 ParallelLayout{.dp = 1, .tp = 4, .pp = 1, .cp = 2},
                                 ParallelLayout{.dp = 2, .tp = 1, .pp = 3, .cp = 2}}) {
    for (GroupKind k : {GroupKind::tp, GroupKind::cp, GroupKind::dp, GroupKind::pp}) {
      std::set<int> seen;
      for (const auto& g : all_groups(l, k)) {
        ASSERT_EQ(int(g.size()), l.size(k));
        for (std::size_t i = 0; i < g.size(); ++i) {
          EXPECT_TRUE(seen.insert(g[i]).second) << to_string(k) << " rank " << g[i] << " twice";
          if (i > 0) {
            EXPECT_EQ(g[i] - g[i - 1], l.stride(k));
          }
          EXPECT_EQ(group_ranks(l, k, g[i]), g);
        }
      }
      EXPECT_EQ(int(seen.size()), l.world_size());
    }
  }
}

TEST(ParallelGroups, BadLayoutNamesTheFlag) {
  try {
    ParallelLayout{.tp = 3}.validate(4);
    FAIL() << "no throw";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("= 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("world size 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ParallelLayout{.tp = 0}.validate(0), InvalidInput);
  EXPECT_THROW(ParallelLayout{.pp = -1}.validate(1), InvalidInput);
  EXPECT_NO_THROW((ParallelLayout{.dp = 2, .tp = 2}.validate(4)));
  EXPECT_THROW(rank_coords(ParallelLayout{.tp = 2}, 2), InvalidInput);
}

}  // namespace
}  // namespace tally
