// A model part's own parameters as one flat buffer, averaged over a data-parallel group at ZeRO
// stage 0–3 (internal: torch types). `tally run 3d` wraps each rank's TP slice of its pipeline
// stage in one (Note [3-D data-parallel step] in three_d.cpp); `tally run zero`'s strategies
// (zero_strategy.hpp) are the same stages on a unit model, with the same sharding rule
// (shard_span, core/sharding.hpp: the chunk a reduce-scatter leaves on rank r), the same Adam
// (optimizer_torch.hpp) and the same gather-and-free of ZeRO-3 (free_storage / regrow_storage).
//
// Legend: N = the part's parameters, k = ranks of the group, r = this rank, m = micro-batches per
// step; span = shard_span(N, k, r) (stage 0: all of N).
//
// The caller's parameters become views of the flat buffer and their .grad views of a flat
// gradient buffer, so autograd accumulates in place. Held between steps (the model-state ledger,
// core model_states): stage 0 params + grads + Adam on N; 1 params + grads + Adam on the span;
// 2 params + the span's gradient + Adam on the span; 3 the span's params, gradient and Adam.
// A step, in the caller's order:
//   begin_step()      gradients zeroed (stages 2–3: the full gradient buffer allocated); stage 3
//                     per step: the parameters all-gathered (the stage stays whole for the step)
//   before_op / after_op around every forward and backward, with reduce_each_micro_batch:
//                     stage 3 gathers the parameters before each and frees them after; after a
//                     backward, stages 2–3 reduce-scatter (average) the micro-batch's gradient
//                     into the span's and zero the full one
//   reduce()          the averaged gradient Adam reads: stage 0 all-reduces all of it; 1
//                     reduce-scatters it; 2–3 reduce-scatter it (once per step) or take the
//                     per-micro-batch sums, then free the full gradient (3: and parameters)
//   update(grad)      Adam on the span
//   gather()          stages 1–2: all-gather of the updated spans into every replica
// Bytes per step, S = N·element bytes (core step_traffic's dp_grad + zero_param_gather):
//   stage 0: 2S(k−1)/k; 1: S(k−1)/k + S(k−1)/k; 2: (m or 1)·S(k−1)/k + S(k−1)/k;
//   3 per micro-batch: 2m·S(k−1)/k gathers + m·S(k−1)/k; 3 per step: S(k−1)/k + S(k−1)/k.
// reduce_each_micro_batch is core's rule for stages 2–3 without pipeline parallelism; under PP
// they reduce once per step (Note [sharded data parallelism under PP] in core/src/comm.cpp).
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "optimizer_torch.hpp"
#include "tally/core/sharding.hpp"
#include "tally/engine/comm.hpp"

namespace tally::engine::zero {

struct FlatDataParallelOptions {
  int stage = 0;                         // ZeRO 0..3
  bool reduce_each_micro_batch = false;  // stages 2–3: per micro-batch (no PP), else per step
  AdamOptions adam;
};

class FlatDataParallel {
 public:
  // params: the part's parameters (same dtype, float32 or float64), replaced by views of the flat
  // buffer that require grad. Stage 3 frees the full buffer before returning.
  FlatDataParallel(const std::vector<at::Tensor*>& params, Comm& group,
                   const FlatDataParallelOptions& options);
  FlatDataParallel(const FlatDataParallel&) = delete;
  FlatDataParallel& operator=(const FlatDataParallel&) = delete;

  void begin_step();
  void before_op(bool backward);
  void after_op(bool backward);
  at::Tensor reduce();  // (span.count,) the averaged gradient of the span
  void update(const at::Tensor& grad);
  void gather();

  // Every parameter, flat (N,) in the caller's order: the buffer itself for stages 0–2, a fresh
  // all-gather of the spans for stage 3 (communication outside any step; for checks).
  at::Tensor parameters();
  ShardSpan span() const { return span_; }
  std::int64_t numel() const { return numel_; }
  int stage() const { return stage_; }
  bool reduces_each_micro_batch() const { return each_micro_batch_; }

 private:
  void gather_parameters();  // stage 3: flat_ ← every rank's span

  Comm& group_;
  int stage_;
  bool each_micro_batch_;
  std::int64_t numel_ = 0;
  at::Tensor flat_;        // (N,) the parameters; stage 3: storage freed between uses
  at::Tensor grad_;        // (N,) their gradient; stages 2–3: storage freed between steps
  at::Tensor shard_;       // stage 3: (span.count,) the span's parameters
  at::Tensor grad_shard_;  // stages 2–3: (span.count,) the span's averaged gradient
  ShardSpan span_;
  Adam adam_;
};

}  // namespace tally::engine::zero
