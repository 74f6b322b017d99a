// Learning-rate schedules (torch-free): the rate of each optimizer step, and the position a
// checkpoint records (io::LrScheduleState) so a resumed run continues it.
#pragma once

#include <cstdint>

#include "tally/io/checkpoint.hpp"

namespace tally::engine {

// Linear warm-up, then cosine decay (Loshchilov & Hutter 2017, without restarts): for step t
// (1-based) lr·t/W for t <= W, then min_lr + (lr − min_lr)·(1 + cos(π·(t − W)/(T − W)))/2 until
// t = T, min_lr after; 0 for t <= 0.
struct WarmupCosineSchedule {
  static constexpr const char* kName = "warmup-cosine";
  double lr = 0;                  // peak
  double min_lr = 0;              // floor
  std::int64_t warmup_steps = 1;  // W
  std::int64_t total_steps = 2;   // T
  double lr_at(std::int64_t t) const;
  io::LrScheduleState state_at(std::int64_t step) const;  // what a checkpoint records at `step`
};

// Every field equal (exactly: the values are copied, never recomputed differently).
bool same_schedule(const io::LrScheduleState& a, const io::LrScheduleState& b);

}  // namespace tally::engine
