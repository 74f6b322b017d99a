// Process-group rank arithmetic (parallel_groups.hpp): Megatron-LM's "tp-cp-dp-pp" order.
#include "tally/core/parallel_groups.hpp"

#include <string>

#include "tally/core/types.hpp"

namespace tally {

std::string_view to_string(GroupKind k) {
  switch (k) {
    case GroupKind::tp: return "tp";
    case GroupKind::cp: return "cp";
    case GroupKind::dp: return "dp";
    case GroupKind::pp: return "pp";
  }
  TALLY_INVARIANT(false && "unknown group kind");
  return {};
}

namespace {
// The field of kind k among four per-kind values (a layout's degrees, a rank's coordinates).
int of_kind(GroupKind k, int tp, int cp, int dp, int pp) {
  switch (k) {
    case GroupKind::tp: return tp;
    case GroupKind::cp: return cp;
    case GroupKind::dp: return dp;
    case GroupKind::pp: return pp;
  }
  TALLY_INVARIANT(false && "unknown group kind");
  return 0;
}
}  // namespace

int ParallelLayout::size(GroupKind k) const { return of_kind(k, tp, cp, dp, pp); }

int ParallelLayout::stride(GroupKind k) const { return of_kind(k, 1, tp, tp * cp, tp * cp * dp); }

void ParallelLayout::validate(int world_size) const {
  require_int(dp >= 1, "--dp", dp, "must be >= 1");
  require_int(tp >= 1, "--tp", tp, "must be >= 1");
  require_int(pp >= 1, "--pp", pp, "must be >= 1");
  require_int(cp >= 1, "--cp", cp, "must be >= 1");
  if (this->world_size() != world_size)
    throw InvalidInput("--dp x --tp x --pp x --cp = " + std::to_string(dp) + " x " +
                       std::to_string(tp) + " x " + std::to_string(pp) + " x " +
                       std::to_string(cp) + " = " + std::to_string(this->world_size()) +
                       ": must equal the world size " + std::to_string(world_size));
}

int RankCoords::operator[](GroupKind k) const { return of_kind(k, tp, cp, dp, pp); }

RankCoords rank_coords(const ParallelLayout& l, int rank) {
  require_int(rank >= 0 && rank < l.world_size(), "rank", rank,
              "must be in [0, " + std::to_string(l.world_size()) + ")");
  return {.tp = rank % l.tp,
          .cp = (rank / l.tp) % l.cp,
          .dp = (rank / (l.tp * l.cp)) % l.dp,
          .pp = rank / (l.tp * l.cp * l.dp)};
}

std::vector<int> group_ranks(const ParallelLayout& l, GroupKind k, int rank) {
  const int first = rank - rank_coords(l, rank)[k] * l.stride(k);  // coordinate k set to 0
  std::vector<int> ranks;
  for (int i = 0; i < l.size(k); ++i) ranks.push_back(first + i * l.stride(k));
  return ranks;
}

std::vector<std::vector<int>> all_groups(const ParallelLayout& l, GroupKind k) {
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < l.world_size(); ++r)
    if (rank_coords(l, r)[k] == 0) groups.push_back(group_ranks(l, k, r));
  return groups;
}

}  // namespace tally
