// ActivationReplay (activation_replay.hpp): Note [replayed activations].
#include "activation_replay.hpp"

#include "tally/core/types.hpp"
#include "zero_strategy.hpp"

namespace tally::engine {

ActivationReplay::ActivationReplay() : active_(at::GradMode::is_enabled()) {}

int ActivationReplay::add(const at::Tensor& target, std::function<at::Tensor()> recompute) {
  if (!active_) return -1;
  TALLY_INVARIANT(target.is_non_overlapping_and_dense() && target.storage_offset() == 0 &&
                  std::size_t(target.numel() * target.element_size()) ==
                      target.storage().nbytes());
  entries_.push_back(std::make_shared<Entry>(Entry{target.detach(), std::move(recompute)}));
  return int(entries_.size()) - 1;
}

void ActivationReplay::before_backward(const at::Tensor& output, const std::vector<int>& entries) {
  if (!active_ || !output.requires_grad()) return;
  std::vector<std::shared_ptr<Entry>> mine;
  for (const int i : entries)
    if (i >= 0) mine.push_back(entries_[std::size_t(i)]);
  if (mine.empty()) return;
  output.register_hook([mine](const at::Tensor&) {
    for (const auto& e : mine) restore(*e);
  });
}

void ActivationReplay::release() {
  for (const auto& e : entries_) zero::free_storage(e->target);
}

void ActivationReplay::restore(Entry& e) {
  if (!e.recompute) return;  // restored already
  at::NoGradGuard no_grad;
  const at::Tensor values = e.recompute();
  TALLY_INVARIANT(values.sizes() == e.target.sizes());
  zero::regrow_storage(e.target).copy_(values);
  e.recompute = nullptr;  // drops the captured handles
  e.target = at::Tensor();
}

}  // namespace tally::engine
