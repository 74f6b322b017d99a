// Process-group rank arithmetic (parallel_groups.hpp): Megatron-LM's "tp-cp-dp-pp" order.
#include "tally/core/parallel_groups.hpp"

#include <cstdint>
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
              [&] { return "must be in [0, " + std::to_string(l.world_size()) + ")"; });
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

std::string_view to_string(ExpertGroupKind k) {
  switch (k) {
    case ExpertGroupKind::etp: return "etp";
    case ExpertGroupKind::ep: return "ep";
    case ExpertGroupKind::edp: return "edp";
  }
  TALLY_INVARIANT(false && "unknown expert group kind");
  return {};
}

int ExpertLayout::size(ExpertGroupKind k) const {
  return k == ExpertGroupKind::etp ? etp : k == ExpertGroupKind::ep ? ep : edp;
}

int ExpertLayout::stride(ExpertGroupKind k) const {
  return k == ExpertGroupKind::etp ? 1 : k == ExpertGroupKind::ep ? etp : etp * ep;
}

ExpertLayout expert_layout(const ParallelLayout& d, int etp, int ep) {
  const int e_t = etp > 0 ? etp : d.tp;
  require_int(etp >= 0, "--etp", etp, "must be >= 1 (0 = --tp, Megatron-Core's default)");
  require_int(ep >= 1, "--ep", ep, "must be >= 1");
  const std::int64_t stage = std::int64_t(d.tp) * d.cp * d.dp;  // ranks of a pipeline stage
  if (stage % (std::int64_t(e_t) * ep) != 0)
    throw InvalidInput("--ep x --etp = " + std::to_string(ep) + " x " + std::to_string(e_t) +
                       ": must divide --tp x --cp x --dp = " + std::to_string(stage) +
                       " (the expert layer's ETP x EP x expert-DP is a pipeline stage's ranks, "
                       "Megatron-Core's expert rank generator)");
  return {.etp = e_t, .ep = ep, .edp = int(stage / (std::int64_t(e_t) * ep)), .pp = d.pp};
}

std::vector<int> expert_group_ranks(const ExpertLayout& l, ExpertGroupKind k, int rank) {
  require_int(rank >= 0 && rank < l.world_size(), "rank", rank,
              [&] { return "must be in [0, " + std::to_string(l.world_size()) + ")"; });
  const int stage = l.etp * l.ep * l.edp;
  const int local = rank % stage;
  const int coord = k == ExpertGroupKind::etp ? local % l.etp
                    : k == ExpertGroupKind::ep ? (local / l.etp) % l.ep
                                               : local / (l.etp * l.ep);
  const int first = rank - coord * l.stride(k);
  std::vector<int> ranks;
  for (int i = 0; i < l.size(k); ++i) ranks.push_back(first + i * l.stride(k));
  return ranks;
}

int expert_gather_ranks(int tp, int etp, bool sequence_parallel) {
  return sequence_parallel || tp == 1 ? etp : 1;
}

void require_expert_tp(int tp, int etp, bool sequence_parallel) {
  if (etp != tp && tp > 1 && !sequence_parallel)
    throw InvalidInput("--etp = " + std::to_string(etp) + ": an expert TP other than --tp = " +
                       std::to_string(tp) + " needs --sp (Megatron-Core's MoE layer refuses TP "
                       "without sequence parallelism in training)");
}

}  // namespace tally
