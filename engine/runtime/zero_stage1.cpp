// ZeRO-1: the optimizer states (Adam's m, v and the fp32 master weights) sharded over the k ranks
// (Rajbhandari et al. 2020 §5.1, P_os; zero_strategy.hpp).
//
// Per rank: the full parameters (a Replica, param dtype), the full gradient buffer, and Adam over
// its shard only: shard_span(N, k, r) of the flat parameter buffer — the ledger's
// params + grads + 12N/k (fp32: 4N + 4N + 8N/k, the parameters being their own master).
// Per step:
//   1. forward and backward on this rank's rows; the gradient accumulates into the full buffer;
//   2. reduce-scatter (average) of the flat gradient: rank r receives the averaged shard
//      shard_span(N, k, r), the only part of the gradient its optimizer reads;
//   3. Adam updates the shard (in place for fp32; the fp32 master, rounded into the bf16
//      parameters, for bf16);
//   4. all-gather of the updated shards into the full parameter buffer, so every replica holds
//      the new parameters for the next forward.
// Bytes: S(k−1)/k + S(k−1)/k = 2S(k−1)/k, exactly DP's all-reduce (which is itself a
// reduce-scatter followed by an all-gather): sharding the optimizer costs no communication
// (ZeRO §7.2.1). An all-reduce in step 2 would be correct too but send 3S(k−1)/k in all.
// The full gradient stays allocated between steps (zeroed before each backward): sharding it is
// ZeRO-2. The reduce-scatter runs in it (its other shards hold partial sums until the zeroing), and
// the all-gather writes the other ranks' shards around the updated one in place: no staging copy.
#include "zero_strategy.hpp"

namespace tally::engine::zero {

namespace {

class ZeroStage1 final : public ShardedOptimizerStrategy {
 public:
  using ShardedOptimizerStrategy::ShardedOptimizerStrategy;
  int stage() const override { return 1; }

  void setup(UnitModel model) override {
    setup_replica_and_shard(std::move(model));
    grad_ = at::zeros({replica_.numel()}, replica_.flat().options());  // (N,) param dtype
    replica_.set_grad_buffer(grad_);
  }

  double step(const Batch& batch) override {
    {
      at::NoGradGuard no_grad;
      grad_.zero_();
    }
    const at::Tensor loss = replica_.loss(batch);
    loss.backward();
    at::NoGradGuard no_grad;
    // (shard_span(N, k, r),) float32, reduced in grad_'s own memory (it is zeroed before the next
    // backward); rounded to the gradient dtype as DP's average is.
    update_shard_and_all_gather(reduce_scatter_average_in_place(grad_).to(grad_.scalar_type()));
    return loss.item<double>();
  }

  StateItems measure() const override { return held_state(replica_.flat(), grad_, adam_); }

 private:
  at::Tensor grad_;
};

}  // namespace

std::unique_ptr<Strategy> make_stage1(const StrategyContext& ctx) {
  return std::make_unique<ZeroStage1>(ctx);
}

}  // namespace tally::engine::zero
