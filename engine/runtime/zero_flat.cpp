// FlatDataParallel (zero_flat.hpp): a model part's flat parameters at ZeRO stage 0–3.
#include "zero_flat.hpp"

#include "comm_torch.hpp"
#include "tally/core/types.hpp"
#include "zero_strategy.hpp"

namespace tally::engine::zero {

FlatDataParallel::FlatDataParallel(const std::vector<at::Tensor*>& params, Comm& group,
                                   const FlatDataParallelOptions& options)
    : group_(group), stage_(options.stage), each_micro_batch_(options.reduce_each_micro_batch) {
  TALLY_INVARIANT(stage_ >= 0 && stage_ <= 3 && !params.empty());
  TALLY_INVARIANT(!each_micro_batch_ || stage_ >= 2);
  std::vector<at::Tensor> values;
  std::vector<Shape> shapes;
  for (const at::Tensor* p : params) {
    values.push_back(*p);
    shapes.push_back(p->sizes().vec());
  }
  flat_ = flatten(values, values.front().scalar_type());
  values.clear();
  numel_ = flat_.numel();
  grad_ = at::zeros_like(flat_);
  const auto views = views_of(flat_, shapes);
  const auto grads = views_of(grad_, shapes);
  for (std::size_t i = 0; i < params.size(); ++i) {
    *params[i] = views[i].detach().requires_grad_(true);
    params[i]->mutable_grad() = grads[i];
  }
  span_ = stage_ == 0 ? ShardSpan{0, numel_}
                      : shard_span(numel_, group_.world_size(), group_.rank());
  if (stage_ == 3) {
    shard_ = flat_.narrow(0, span_.offset, span_.count).clone();
    adam_ = Adam({shard_}, options.adam);
    free_storage(flat_);
  } else {
    adam_ = Adam({flat_.narrow(0, span_.offset, span_.count)}, options.adam);
  }
  if (stage_ >= 2) {
    grad_shard_ = at::zeros({span_.count}, flat_.options());
    free_storage(grad_);
  }
}

void FlatDataParallel::gather_parameters() {
  at::Tensor target = regrow_storage(flat_);
  all_gather(group_, shard_, target);
}

void FlatDataParallel::begin_step() {
  at::NoGradGuard no_grad;
  if (stage_ >= 2) {
    at::Tensor g = regrow_storage(grad_);
    g.zero_();
    if (each_micro_batch_) grad_shard_.zero_();
  } else {
    grad_.zero_();
  }
  if (stage_ == 3 && !each_micro_batch_) gather_parameters();
}

void FlatDataParallel::before_op(bool /*backward*/) {
  if (stage_ == 3 && each_micro_batch_) {
    at::NoGradGuard no_grad;
    gather_parameters();
  }
}

void FlatDataParallel::after_op(bool backward) {
  if (!each_micro_batch_) return;
  at::NoGradGuard no_grad;
  if (backward) {
    // Reduced in the full gradient's own memory (zeroed next for the following micro-batch).
    grad_shard_.add_(reduce_scatter_in_place(group_, grad_, ReduceOp::average));
    grad_.zero_();
  }
  if (stage_ == 3) free_storage(flat_);
}

at::Tensor FlatDataParallel::reduce() {
  at::NoGradGuard no_grad;
  switch (stage_) {
    case 0:
      all_reduce(group_, grad_, ReduceOp::average);
      return grad_;
    case 1:
      return reduce_scatter_in_place(group_, grad_, ReduceOp::average);
    default:
      if (!each_micro_batch_) {
        grad_shard_.copy_(reduce_scatter_in_place(group_, grad_, ReduceOp::average));
        if (stage_ == 3) free_storage(flat_);
      }
      free_storage(grad_);
      return grad_shard_;
  }
}

void FlatDataParallel::update(const at::Tensor& grad) {
  at::NoGradGuard no_grad;
  adam_.step_with({grad});
}

void FlatDataParallel::gather() {
  if (stage_ != 1 && stage_ != 2) return;
  at::NoGradGuard no_grad;
  all_gather_in_place(group_, flat_);
}

at::Tensor FlatDataParallel::parameters() {
  if (stage_ != 3) return flat_;
  at::NoGradGuard no_grad;
  at::Tensor full = at::empty({numel_}, shard_.options());
  all_gather(group_, shard_, full);
  return full;
}

}  // namespace tally::engine::zero
