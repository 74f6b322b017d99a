// ZeRO-3: optimizer states, gradients and parameters sharded (Rajbhandari et al. 2020 §5.3,
// P_os+g+p; PyTorch FSDP's FULL_SHARD; zero_strategy.hpp).
//
// Per rank, between steps, for every unit u (a layer): its parameter shard shard_span(n_u, k, r)
// of the unit's flat buffer, the averaged gradient of that shard, and Adam over it — the
// ledger's 16N/k (fp32: (4 + 4 + 8)N/k; bf16: (2 + 2 + 12)N/k).
// Per step:
//   forward, unit by unit: all-gather the unit's shards into its full flat buffer, run the unit on
//     views of it, free the buffer (Note [gather and free]);
//   backward, unit by unit in reverse: a hook on the unit's output gathers the parameters again
//     just before the unit's backward runs; when autograd has accumulated the unit's full gradient
//     (a post hook on the buffer's gradient accumulator), it is reduce-scattered (average) into
//     the gradient shard and the full gradient and buffer are freed;
//   Adam on each unit's shard (the next forward gathers the updated shards).
// Bytes per step: Σ_u 2·S_u(k−1)/k + S_u(k−1)/k = 3S(k−1)/k, 1.5× DP (ZeRO §7.2.2): two
// all-gathers and one reduce-scatter per unit, 3U calls (core counts 2 + 1 calls of the whole
// model; the bytes are linear in S, so the sums agree).
//
// Note [gather and free]
// The approach is FSDP's (torch/distributed/fsdp/flat_param.py): each unit's parameters are views
// of one flat leaf tensor `full` that requires grad; between uses its storage is resized to zero
// bytes (at::native::resize_bytes_cpu, what Python's storage().resize_(0) calls), so the views
// and the tensors autograd saved for backward keep their shape but hold no memory. Gathering
// resizes the storage back and has the all-gather write the parameters straight into it, through
// a second tensor set_ on the same storage, not through `full`: that tensor has a version counter
// of its own, while writing through `full` (or a view of it) would bump the counter the saved
// views share, and autograd would then refuse the backward ("modified by an inplace
// operation"). (An earlier version gathered into a fresh buffer and memcpy'd it over: one more
// pass over every unit, twice a step.) The values written before backward are
// exactly those the forward used (the shards change only in the optimizer step), so the saved
// views are valid. Nothing is recomputed (unlike an activation-checkpointing design, which would
// re-run each unit's forward inside a custom autograd function). A failure inside a hook (a
// CommError) is recorded and rethrown from step(); it also stops autograd, so no node ever reads
// a freed buffer.
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <exception>

#include "zero_strategy.hpp"

namespace tally::engine::zero {

namespace {

class ZeroStage3 final : public Strategy {
 public:
  using Strategy::Strategy;
  int stage() const override { return 3; }

  ~ZeroStage3() override {
    for (auto& u : units_)
      if (u.accumulator) u.accumulator->del_post_hook(u.hook_key);
  }

  void setup(UnitModel model) override {
    forward_unit_ = std::move(model.forward_unit);
    loss_ = std::move(model.loss);
    units_.resize(model.units.size());  // never resized again: the hooks index into it
    for (std::size_t i = 0; i < units_.size(); ++i) {
      Unit& u = units_[i];
      const at::Tensor flat = flatten(model.units[i], model.units[i].front().scalar_type());
      for (const auto& p : model.units[i]) u.shapes.push_back(p.sizes().vec());
      u.numel = flat.numel();
      u.span = my_span(u.numel);
      u.shard = flat.narrow(0, u.span.offset, u.span.count).clone();
      u.grad_shard = at::zeros({u.span.count}, flat.options());
      u.adam = Adam({u.shard}, ctx_.adam);
      u.full = at::empty({u.numel}, flat.options());
      release(u);
      u.full.requires_grad_(true);
      u.accumulator = torch::autograd::impl::grad_accumulator(u.full);
      u.hook_key =
          u.accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
              [this, i](const torch::autograd::variable_list& outputs,
                        const torch::autograd::variable_list& /*inputs*/) {
                after_backward(i);
                return outputs;
              }));
    }
  }

  double step(const Batch& batch) override {
    error_ = nullptr;
    at::Tensor h = batch.x;
    for (std::size_t i = 0; i < units_.size(); ++i) {
      Unit& u = units_[i];
      TALLY_INVARIANT(!u.full.grad().defined());
      gather(u);
      h = forward_unit_(i, h, views_of(u.full, u.shapes));
      release(u);
      h.register_hook([this, i](const at::Tensor& /*grad*/) { before_backward(i); });
    }
    const at::Tensor loss = loss_(h, batch.y);
    h = at::Tensor();
    try {
      loss.backward();
    } catch (...) {
      if (error_) std::rethrow_exception(error_);
      throw;
    }
    if (error_) std::rethrow_exception(error_);
    timed_update([&] {
      for (Unit& u : units_) {
        TALLY_INVARIANT(u.full.storage().nbytes() == 0 && !u.full.grad().defined());
        u.adam.step_with({u.grad_shard});
      }
    });
    return loss.item<double>();
  }

  StateItems measure() const override {
    StateItems s;
    for (const Unit& u : units_) {
      const StateItems unit = held_state(u.shard, u.grad_shard, u.adam);
      s.params += unit.params;
      s.grads += unit.grads;
      u.adam.add_state(s);
    }
    return s;
  }

  at::Tensor gather_parameters() override {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> parts;
    for (Unit& u : units_) parts.push_back(all_gather(u.shard, u.numel).to(at::kDouble));
    return at::cat(parts);
  }

 private:
  struct Unit {
    std::vector<Shape> shapes;  // its parameters', in order
    std::int64_t numel = 0;     // n_u
    ShardSpan span;             // shard_span(n_u, k, r)
    at::Tensor shard;           // (span.count,) param dtype: the parameters this rank owns
    at::Tensor grad_shard;      // (span.count,) param dtype: their averaged gradient
    Adam adam;                  // over `shard`
    at::Tensor full;  // (n_u,) param dtype, leaf, requires grad; storage empty between uses
    std::shared_ptr<torch::autograd::Node> accumulator;  // keeps the hook alive
    std::uintptr_t hook_key = 0;
  };

  // Note [gather and free].
  void gather(Unit& u) {
    at::NoGradGuard no_grad;
    at::Tensor target = regrow_storage(u.full);
    all_gather_into(u.shard, target);
  }
  static void release(Unit& u) { free_storage(u.full); }

  void before_backward(std::size_t i) {
    try {
      gather(units_[i]);
    } catch (...) {
      if (!error_) error_ = std::current_exception();
      throw;  // stops autograd before the unit's backward reads the empty buffer
    }
  }

  void after_backward(std::size_t i) {
    try {
      Unit& u = units_[i];
      at::NoGradGuard no_grad;
      // Reduced in the full gradient's own memory (it is dropped next); rounded to bf16 for bf16.
      at::Tensor full_grad = u.full.grad();
      u.grad_shard.copy_(reduce_scatter_average_in_place(full_grad));
      full_grad = at::Tensor();
      u.full.mutable_grad() = at::Tensor();
      release(u);
    } catch (...) {
      if (!error_) error_ = std::current_exception();
      throw;
    }
  }

  std::function<at::Tensor(std::size_t, const at::Tensor&, const std::vector<at::Tensor>&)>
      forward_unit_;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> loss_;
  std::vector<Unit> units_;
  std::exception_ptr error_;
};

}  // namespace

std::unique_ptr<Strategy> make_stage3(const StrategyContext& ctx) {
  return std::make_unique<ZeroStage3>(ctx);
}

}  // namespace tally::engine::zero
