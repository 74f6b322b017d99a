// ZeRO-0: plain data parallelism, the baseline every stage is measured against (zero_strategy.hpp).
//
// Per rank: the full parameters (a Replica), the full gradient (a flat buffer the leaves' .grad
// view), Adam's m, v (and the fp32 master for bf16) over all N parameters — the ledger's 16N.
// Per step: forward and backward on this rank's rows, one all-reduce (average) of the flat
// gradient, Adam on everything. Every replica applies the same update to the same parameters, so
// they stay identical.
//
// The all-reduce is tally's ring (Comm::ring_all_reduce, Note [ring all-reduce] in ring.cpp): a
// reduce-scatter then an all-gather, 2S(k−1)/k per rank, and its bytes are counted from the sends
// it made. It is the same reduce-scatter the ZeRO stages run, so DP's averaged gradient has the
// bits of their gradient shards and the fp32 trajectories coincide to rounding of Adam alone.
// (tally's DDP, ddp_torch.hpp, reduces with Gloo's own all-reduce in buckets; the bytes are the
// same formula.) bf16: the gradient is widened to float32 for the wire and the average rounded
// back into the bf16 gradient, as DDP does (Note [bf16 on Gloo] in ddp.cpp).
#include "zero_strategy.hpp"

namespace tally::engine::zero {

namespace {

class DataParallel final : public Strategy {
 public:
  using Strategy::Strategy;
  int stage() const override { return 0; }

  void setup(UnitModel model) override {
    replica_ = Replica(std::move(model));
    grad_ = at::zeros({replica_.numel()}, replica_.flat().options());  // (N,) param dtype
    replica_.set_grad_buffer(grad_);
    adam_ = FlatAdam(replica_.flat(), ctx_.adam);
  }

  double step(const Batch& batch) override {
    {
      at::NoGradGuard no_grad;
      grad_.zero_();
    }
    const at::Tensor loss = replica_.loss(batch);
    loss.backward();  // accumulates into grad_ through the leaves' .grad views
    at::NoGradGuard no_grad;
    if (grad_.scalar_type() == at::kFloat) {
      ring_all_reduce_average(grad_);
    } else {
      at::Tensor wire = grad_.to(at::kFloat);
      ring_all_reduce_average(wire);
      grad_.copy_(wire);  // the average, rounded to bf16
    }
    adam_.step(grad_);
    return loss.item<double>();
  }

  StateItems measure() const override { return held_state(replica_.flat(), grad_, adam_); }

  at::Tensor gather_parameters() override { return replica_.flat().to(at::kDouble); }

 private:
  Replica replica_;
  at::Tensor grad_;
  FlatAdam adam_;
};

}  // namespace

std::unique_ptr<Strategy> make_stage0(const StrategyContext& ctx) {
  return std::make_unique<DataParallel>(ctx);
}

}  // namespace tally::engine::zero
