// Learning-rate schedules (tally/engine/lr_schedule.hpp).
#include "tally/engine/lr_schedule.hpp"

#include <algorithm>
#include <cmath>

namespace tally::engine {

double WarmupCosineSchedule::lr_at(std::int64_t t) const {
  if (t <= 0) return 0;
  if (t <= warmup_steps) return lr * double(t) / double(warmup_steps);
  if (t >= total_steps) return min_lr;
  const double progress =
      double(t - warmup_steps) / double(std::max<std::int64_t>(1, total_steps - warmup_steps));
  return min_lr + (lr - min_lr) * 0.5 * (1 + std::cos(M_PI * progress));
}

io::LrScheduleState WarmupCosineSchedule::state_at(std::int64_t step) const {
  return {.name = kName,
          .step = step,
          .base_lr = lr,
          .lr = lr_at(step),
          .warmup_steps = warmup_steps,
          .total_steps = total_steps,
          .min_lr = min_lr};
}

bool same_schedule(const io::LrScheduleState& a, const io::LrScheduleState& b) {
  return a.name == b.name && a.step == b.step && a.base_lr == b.base_lr && a.lr == b.lr &&
         a.warmup_steps == b.warmup_steps && a.total_steps == b.total_steps && a.min_lr == b.min_lr;
}

}  // namespace tally::engine
