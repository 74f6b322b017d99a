// tally::engine::ProcessGroups — one rank's TP, CP, DP and PP process groups for a (dp, tp, pp, cp)
// layout, each its own Comm (Gloo process group with its own byte counters) over the world's
// TCPStore, keys prefixed per group ("tp/0,1", "dp/0,2", …). Which ranks form which group is
// core's rank arithmetic (tally/core/parallel_groups.hpp: Megatron-LM's "tp-cp-dp-pp" order, TP
// fastest, then CP, then DP, then PP), so the planner's link choice and the engine agree.
//
// Every rank builds its groups in the order tp, cp, dp, pp: each Gloo rendezvous waits only on the
// group's members, who all reach that kind after finishing the previous one, so no cycle of waits
// can form. A group of one rank is built too (its collectives are the identity; comm.hpp).
// No torch in this header.
#pragma once

#include <array>
#include <memory>

#include "tally/core/parallel_groups.hpp"
#include "tally/engine/comm.hpp"

namespace tally::engine {

class ProcessGroups {
 public:
  // world: this rank's Comm over all ranks; layout.validate(world.world_size()) first (InvalidInput
  // naming the flag). world must outlive the groups.
  ProcessGroups(Comm& world, const ParallelLayout& layout);

  const ParallelLayout& layout() const { return layout_; }
  const RankCoords& coords() const { return coords_; }  // this rank's
  Comm& world() { return world_; }
  Comm& group(GroupKind k) { return *groups_[std::size_t(k)]; }
  Comm& tp() { return group(GroupKind::tp); }
  Comm& cp() { return group(GroupKind::cp); }
  Comm& dp() { return group(GroupKind::dp); }
  Comm& pp() { return group(GroupKind::pp); }

 private:
  Comm& world_;
  ParallelLayout layout_;
  RankCoords coords_;
  std::array<std::unique_ptr<Comm>, 4> groups_;  // indexed by GroupKind
};

}  // namespace tally::engine
