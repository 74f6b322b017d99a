// Which ranks form which process group in a (dp, tp, pp, cp) layout: the rank arithmetic the
// planner's link choice (comm.hpp: TP stride 1, CP stride tp, DP stride tp·cp, PP stride
// tp·cp·dp) and the engine's process groups (engine/runtime/include/tally/engine/process_groups.hpp)
// share. Pure integer arithmetic, no torch.
//
// Rank order: Megatron-LM's default "tp-cp-dp-pp" (megatron/core/parallel_state.py,
// RankGenerator with order "tp-cp-ep-dp-pp", ep = 1): TP varies fastest, then CP, then DP, then
// PP. A global rank r has coordinates
//   tp_i = r mod t,  cp_i = (r / t) mod c,  dp_i = (r / (t·c)) mod d,  pp_i = r / (t·c·d),
// i.e. r = tp_i + t·(cp_i + c·(dp_i + d·pp_i)). The group of kind X holding r is every rank whose
// coordinates other than X equal r's, listed in increasing X coordinate (= increasing global rank);
// a rank's index in that list is its rank inside the group.
//
// Example, world 8 = dp 2 × tp 2 × pp 2: TP groups {0,1} {2,3} {4,5} {6,7}; DP groups {0,2} {1,3}
// {4,6} {5,7}; PP groups {0,4} {1,5} {2,6} {3,7}.
#pragma once

#include <string_view>
#include <vector>

namespace tally {

enum class GroupKind { tp, cp, dp, pp };
std::string_view to_string(GroupKind k);  // "tp", "cp", "dp", "pp"

struct ParallelLayout {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  int world_size() const { return dp * tp * pp * cp; }
  int size(GroupKind k) const;    // ranks in one group of kind k
  int stride(GroupKind k) const;  // spacing of a group's ranks in the global order
  // Throws InvalidInput naming the flag (--dp, --tp, --pp, --cp) when a degree is < 1, or naming
  // the product when dp·tp·pp·cp ≠ world_size.
  void validate(int world_size) const;
};

struct RankCoords {
  int tp = 0, cp = 0, dp = 0, pp = 0;
  int operator[](GroupKind k) const;
};

// Coordinates of global rank r (0 <= r < world_size). Throws InvalidInput on a rank out of range.
RankCoords rank_coords(const ParallelLayout& layout, int rank);
// The global ranks of the kind-k group holding `rank`, in group order.
std::vector<int> group_ranks(const ParallelLayout& layout, GroupKind k, int rank);
// Every kind-k group, ordered by their first rank.
std::vector<std::vector<int>> all_groups(const ParallelLayout& layout, GroupKind k);

}  // namespace tally
