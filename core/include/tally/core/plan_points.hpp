// The costed layouts `tally plan --html` draws (Note [plan points] in planner.hpp): a bounded,
// deterministic uniform sample of the search plus the feasible Pareto frontier of (step time,
// memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tally/core/planner.hpp"

namespace tally {

class PointCollector {
 public:
  explicit PointCollector(std::size_t max_points) : cap_(max_points) {}
  // Offers one costed layout, in search order.
  void add(const PlanEval& e);
  std::uint64_t seen() const { return seen_; }
  // The sample and the frontier (frontier members flagged; each layout once), in search order.
  std::vector<PlanPoint> points() const;
  // True when points() holds fewer layouts than were offered.
  bool sampled() const { return seen_ > sample_.size(); }
  // True when the frontier outgrew max_points and was thinned (its flags then mark a subset).
  bool frontier_thinned() const { return frontier_thinned_; }

 private:
  std::size_t cap_;
  std::uint64_t seen_ = 0;
  std::uint64_t rng_ = 0x9E3779B97F4A7C15ULL;  // splitmix64 state, fixed: the same search, the same page
  std::vector<PlanPoint> sample_;
  // Sorted by total_bytes ascending, step_s strictly descending: each point is faster than every
  // point to its left (the staircase of non-dominated layouts).
  std::vector<PlanPoint> frontier_;
  bool frontier_thinned_ = false;
};

}  // namespace tally
