// ZeRO-0: plain data parallelism, the baseline every stage is measured against (zero_strategy.hpp).
//
// Per rank: the full parameters (a Replica), the full gradient, Adam's m, v (and the fp32 master
// for bf16) over all N parameters — the ledger's 16N. Per step: forward and backward on this rank's
// rows, the gradients averaged over ranks, Adam on everything. Every replica applies the same update
// to the same parameters, so they stay identical.
//
// The averaging is the engine's one data-parallel reducer (DistributedDataParallel, ddp_torch.hpp)
// with one bucket and tally's ring as its collective (GradientCollective::ring_all_reduce): a
// reduce-scatter then an all-gather, 2S(k−1)/k per rank, counted from the sends it made, and the
// same ring reduce-scatter (sum, then ÷ k) the ZeRO stages run, so the fp32 trajectories coincide
// to rounding (the bucket holds the gradients in reverse order, so for k >= 3 the ring's chunks,
// hence the order of the sums, differ). The fp32 gradients are views of the bucket; bf16 ones are
// widened to float32 for the wire and the average rounded back (Note [bf16 on Gloo] in ddp.cpp).
#include "zero_strategy.hpp"

#include <limits>
#include <memory>

#include "ddp_torch.hpp"

namespace tally::engine::zero {

namespace {

// One bucket: the whole gradient is one ring all-reduce, as the ledger's DP counts it.
constexpr double kOneBucket = std::numeric_limits<double>::max();

class DataParallel final : public Strategy {
 public:
  using Strategy::Strategy;
  int stage() const override { return 0; }

  void setup(UnitModel model) override {
    replica_ = Replica(std::move(model));
    const std::vector<at::Tensor> params = replica_.leaves();
    reducer_ = std::make_unique<DistributedDataParallel>(
        comm_, params,
        DdpOptions{.bucket_cap_bytes = kOneBucket,
                   .first_bucket_cap_bytes = kOneBucket,
                   .collective = GradientCollective::ring_all_reduce});
    adam_ = Adam(params, ctx_.adam);
  }

  double step(const Batch& batch) override {
    adam_.zero_grad();
    const at::Tensor loss = replica_.loss(batch);
    loss.backward();  // the reducer's hooks pack the gradients; the last one runs the ring
    reducer_->finish_gradient_sync();
    calls_.push_back({Collective::all_reduce, replica_.numel(), kWireElementBytes});
    timed_update([&] { adam_.step(); });
    return loss.item<double>();
  }

  StateItems measure() const override {
    StateItems s{.params = double(replica_.flat().nbytes())};
    for (const at::Tensor& p : reducer_->parameters()) s.grads += double(p.grad().nbytes());
    adam_.add_state(s);
    return s;
  }

  at::Tensor gather_parameters() override { return replica_.flat().to(at::kDouble); }

 private:
  static constexpr double kWireElementBytes = 4;  // float32 (Note [bf16 on Gloo])
  Replica replica_;
  std::unique_ptr<DistributedDataParallel> reducer_;  // after replica_: dies first (its hooks)
  Adam adam_;
};

}  // namespace

std::unique_ptr<Strategy> make_stage0(const StrategyContext& ctx) {
  return std::make_unique<DataParallel>(ctx);
}

}  // namespace tally::engine::zero
