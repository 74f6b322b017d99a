#include "tally/core/plan_points.hpp"

#include <algorithm>
#include <iterator>

namespace tally {

namespace {

PlanPoint point_of(const PlanEval& e, std::uint64_t index) {
  return PlanPoint{.layout = e.layout, .step_s = e.step_s, .total_bytes = e.total_bytes,
                   .fits = e.fits, .index = index};
}

// Keeps every second entry (0, 2, 4, …): halves the frontier evenly along it.
void halve(std::vector<PlanPoint>& v) {
  std::size_t w = 0;
  for (std::size_t i = 0; i < v.size(); i += 2) v[w++] = v[i];
  v.resize(w);
}

// splitmix64 (Steele, Lea & Flood 2014): a small, well-mixed deterministic generator.
std::uint64_t next(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

void PointCollector::add(const PlanEval& e) {
  const std::uint64_t index = seen_++;
  if (cap_ == 0) return;
  // Reservoir sampling, Algorithm R (Vitter 1985): every offered layout ends in the sample with
  // probability cap / seen, whatever the search order (a stride would alias with its loops).
  if (sample_.size() < cap_) {
    sample_.push_back(point_of(e, index));
  } else {
    const std::uint64_t j = next(rng_) % (index + 1);
    if (j < cap_) sample_[j] = point_of(e, index);
  }
  if (!e.fits) return;
  // Frontier insertion. The left neighbour (less memory) is the fastest of the smaller layouts: if
  // it is at least as fast, the new layout is dominated. Otherwise the layouts from the insertion
  // point rightwards that are no faster (a contiguous run, as step time falls to the right) are
  // dominated by the new one.
  auto it = std::lower_bound(frontier_.begin(), frontier_.end(), e.total_bytes,
                             [](const PlanPoint& q, double bytes) { return q.total_bytes < bytes; });
  if (it != frontier_.begin() && std::prev(it)->step_s <= e.step_s) return;
  if (it != frontier_.end() && it->total_bytes == e.total_bytes && it->step_s <= e.step_s) return;
  auto end = it;
  while (end != frontier_.end() && end->step_s >= e.step_s) ++end;
  it = frontier_.erase(it, end);
  frontier_.insert(it, point_of(e, index));
  if (frontier_.size() > cap_) {
    halve(frontier_);
    frontier_thinned_ = true;
  }
}

std::vector<PlanPoint> PointCollector::points() const {
  std::vector<PlanPoint> out = sample_;
  std::sort(out.begin(), out.end(),
            [](const PlanPoint& a, const PlanPoint& b) { return a.index < b.index; });
  std::vector<PlanPoint> front = frontier_;
  for (PlanPoint& p : front) p.frontier = true;
  std::sort(front.begin(), front.end(),
            [](const PlanPoint& a, const PlanPoint& b) { return a.index < b.index; });
  // Merge by search index; a layout in both is kept once, flagged.
  std::vector<PlanPoint> merged;
  merged.reserve(out.size() + front.size());
  std::size_t i = 0, j = 0;
  while (i < out.size() || j < front.size()) {
    if (j == front.size() || (i < out.size() && out[i].index < front[j].index)) {
      merged.push_back(out[i++]);
    } else if (i < out.size() && out[i].index == front[j].index) {
      merged.push_back(front[j++]);
      ++i;
    } else {
      merged.push_back(front[j++]);
    }
  }
  return merged;
}

}  // namespace tally
