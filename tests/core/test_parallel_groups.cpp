// parallel_groups.hpp: Megatron-LM's "tp-cp-dp-pp" rank order. Every expected group below is
// worked out by hand from r = tp_i + t·(cp_i + c·(dp_i + d·pp_i)), not from the code.
#include "tally/core/parallel_groups.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>

#include "tally/core/types.hpp"

namespace tally::test_parallel_groups {
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

// Note [expert rank groups] (Megatron-Core core_v0.14.0 parallel_state.py: a second RankGenerator
// with tp = e_t, ep, dp = EDP, cp = 1 over "tp-cp-ep-dp-pp"). World 16 = tp 2 × dp 8, by hand
// from etp_i = r mod e_t, ep_i = (r / e_t) mod e_p, edp_i = r / (e_t·e_p):
//   e_t 1, e_p 8: EP {0..7} {8..15}, expert DP {r, r + 8} (EDP = 16 / 8 = 2);
//   e_t 2, e_p 4: ETP {0, 1}, EP {0, 2, 4, 6} and {1, 3, 5, 7}, expert DP {0, 8}.
TEST(ExpertGroups, ExpertTpOtherThanTp) {
  const ParallelLayout dense{.dp = 8, .tp = 2};
  const ExpertLayout one = expert_layout(dense, 1, 8);
  EXPECT_EQ(one.edp, 2);
  EXPECT_EQ(expert_group_ranks(one, ExpertGroupKind::ep, 5),
            (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(expert_group_ranks(one, ExpertGroupKind::ep, 12),
            (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(expert_group_ranks(one, ExpertGroupKind::edp, 3), (std::vector<int>{3, 11}));
  EXPECT_EQ(expert_group_ranks(one, ExpertGroupKind::etp, 3), (std::vector<int>{3}));
  const ExpertLayout two = expert_layout(dense, 0, 4);  // 0: e_t = tp = 2
  EXPECT_EQ(two.etp, 2);
  EXPECT_EQ(two.edp, 2);
  EXPECT_EQ(expert_group_ranks(two, ExpertGroupKind::etp, 1), (std::vector<int>{0, 1}));
  EXPECT_EQ(expert_group_ranks(two, ExpertGroupKind::ep, 4), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(expert_group_ranks(two, ExpertGroupKind::ep, 7), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(expert_group_ranks(two, ExpertGroupKind::edp, 0), (std::vector<int>{0, 8}));
  // With e_t = t the ETP groups are the TP groups, as Megatron-Core's default makes them.
  for (int r = 0; r < 16; ++r)
    EXPECT_EQ(expert_group_ranks(two, ExpertGroupKind::etp, r),
              group_ranks(dense, GroupKind::tp, r));
}

// World 16 = tp 2 × cp 2 × dp 2 × pp 2, e_t 1, e_p 4: a stage is 8 ranks (EDP = 8 / 4 = 2, the CP
// ranks join expert DP). Rank 13 is stage 1's local rank 5: ep_i = 5 mod 4 = 1, edp_i = 5 / 4 = 1,
// so EP {12, 13, 14, 15} and expert DP {9, 13}; its PP group is the dense one, {5, 13}.
TEST(ExpertGroups, ContextAndPipelineRanks) {
  const ParallelLayout dense{.dp = 2, .tp = 2, .pp = 2, .cp = 2};
  const ExpertLayout l = expert_layout(dense, 1, 4);
  EXPECT_EQ(l.edp, 2);
  EXPECT_EQ(l.world_size(), 16);
  EXPECT_EQ(expert_group_ranks(l, ExpertGroupKind::ep, 13), (std::vector<int>{12, 13, 14, 15}));
  EXPECT_EQ(expert_group_ranks(l, ExpertGroupKind::edp, 13), (std::vector<int>{9, 13}));
  EXPECT_EQ(l.stride(ExpertGroupKind::edp), 4);
  EXPECT_EQ(group_ranks(dense, GroupKind::pp, 13), (std::vector<int>{5, 13}));
}

TEST(ExpertGroups, BadSplitsNameTheFlag) {
  const ParallelLayout dense{.dp = 3, .tp = 2};
  for (const auto& [etp, ep] : {std::pair{1, 4}, std::pair{2, 2}, std::pair{4, 1}}) {
    try {
      (void)expert_layout(dense, etp, ep);
      FAIL() << "etp " << etp << " ep " << ep << " accepted on tp 2 x dp 3";
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find("--ep x --etp"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("= 6"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW((void)expert_layout(dense, 1, 6));
  EXPECT_THROW((void)expert_layout(dense, 1, 0), InvalidInput);
  // Note [expert tensor parallelism]: an expert TP other than TP needs SP when TP > 1.
  EXPECT_THROW(require_expert_tp(2, 1, false), InvalidInput);
  EXPECT_NO_THROW(require_expert_tp(2, 1, true));
  EXPECT_NO_THROW(require_expert_tp(1, 2, false));
  EXPECT_EQ(expert_gather_ranks(2, 2, true), 2);
  EXPECT_EQ(expert_gather_ranks(2, 2, false), 1);
  EXPECT_EQ(expert_gather_ranks(1, 4, false), 4);
}

}  // namespace
}  // namespace tally::test_parallel_groups
