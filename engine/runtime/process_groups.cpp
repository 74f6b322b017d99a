// ProcessGroups (process_groups.hpp): core's group arithmetic, one Comm per group. No torch.
#include "tally/engine/process_groups.hpp"

#include <string>

namespace tally::engine {

ProcessGroups::ProcessGroups(Comm& world, const ParallelLayout& layout)
    : world_(world), layout_(layout) {
  layout_.validate(world.world_size());
  coords_ = rank_coords(layout_, world.rank());
  for (GroupKind k : {GroupKind::tp, GroupKind::cp, GroupKind::dp, GroupKind::pp}) {
    const std::vector<int> ranks = group_ranks(layout_, k, world.rank());
    std::string name(to_string(k));
    for (std::size_t i = 0; i < ranks.size(); ++i)
      name += (i == 0 ? "/" : ",") + std::to_string(ranks[i]);
    groups_[std::size_t(k)] = std::make_unique<Comm>(world, ranks, name);
  }
}

}  // namespace tally::engine
