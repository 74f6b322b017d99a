// `tally run grad-accum`: the seed's gradient-accumulation check (grads_of(model, X, y, K,
// normalize)) on tally's DDP, one rank of it; start k ranks with `tally launch`.
//
//   model, data  as ddp-check (16→32→4 MLP after manual_seed(1234); manual_seed(7), X = randn(64,
//                16), y = randint(0, 4, (64,))), in float64; rank r takes rows r, r+k, …, and
//                micro-batch j of K takes rows j, j+K, … of those. Backward passes 1..K−1 run
//                inside DDP's no_sync(); the K-th all-reduces.
//   ①  normalized (loss / K) accumulation equals the one-big-batch gradient: < 1e-6
//   ②  unnormalized accumulation is exactly K times it: relative error < 1e-5
//   ③  counters after 3 effective steps at K = 4: 3 optimizer steps, 12 backward passes
//   ④  20 SGD steps (lr 0.1): mean loss of the last 5 < mean of the first 5
//   ⑤  gradient all-reduce "sync events" = optimizer steps (the no-sync scope works), and the
//      Comm's all-reduce calls over training = sync events × buckets
#pragma once

#include <cstdint>
#include <vector>

#include "tally/engine/comm.hpp"
#include "tally/engine/ddp.hpp"
#include "tally/engine/dist_env.hpp"

namespace tally::engine {

struct GradAccumOptions {
  double timeout_s = 60;                 // rendezvous and every collective
  int micro_batches = 4;                 // K
  int steps = 20;                        // effective (optimizer) steps of training for ④ and ⑤
  int counted_steps = 3;                 // ③ reads the counters after this many steps
  double lr = 0.1;                       // SGD
  double bucket_cap_bytes = kDdpBucketBytes;  // DDP bucket size
  // Throws InvalidInput naming the flag: K in [1, 64], steps >= 10 (④ compares two disjoint
  // windows of 5), counted_steps in [1, steps], lr > 0, world size × K dividing the 64 samples.
  void validate(int world_size) const;
};

struct GradAccumResult {
  int rank = 0;
  int world_size = 1;
  int micro_batches = 4;
  int micro_batch_samples = 0;  // rows per micro-batch on this rank

  // ①
  double max_accum_vs_big_batch = 0;   // max|g_acc(K, loss/K) − g_big(K = 1)|
  double max_accum_vs_full_batch = 0;  // max|g_acc − g_full|, g_full from one process on all rows
  double accum_tolerance = 1e-6;
  // ②
  double unnormalized_relative_error = 0;  // ‖g_raw − K·g_big‖∞ / ‖K·g_big‖∞
  double unnormalized_tolerance = 1e-5;
  // ③ after counted_steps effective steps
  int counted_steps = 3;
  std::int64_t optimizer_steps_counted = 0;   // the wrapper around the SGD step
  std::int64_t backward_calls_counted = 0;    // the wrapper around backward()
  std::int64_t ddp_backward_passes_counted = 0;  // DDP's hooks, for comparison
  // ④ the loss of each effective step, averaged over ranks
  std::vector<double> step_losses;
  double first5_mean_loss = 0;
  double last5_mean_loss = 0;
  // ⑤ over the whole training run
  std::int64_t optimizer_steps = 0;
  std::int64_t backward_calls = 0;
  DdpStats ddp;                          // sync_events, bucket_all_reduces, bytes
  std::int64_t comm_all_reduce_calls = 0;  // the Comm's counter over the same window
  std::size_t buckets = 0;
  double gradient_bytes_per_optimizer_step = 0;

  bool accum_ok() const {
    return max_accum_vs_big_batch < accum_tolerance && max_accum_vs_full_batch < accum_tolerance;
  }
  bool unnormalized_ok() const { return unnormalized_relative_error < unnormalized_tolerance; }
  bool counters_ok() const {
    return optimizer_steps_counted == counted_steps &&
           backward_calls_counted == std::int64_t(counted_steps) * micro_batches &&
           ddp_backward_passes_counted == backward_calls_counted;
  }
  bool loss_ok() const { return last5_mean_loss < first5_mean_loss; }
  bool sync_ok() const {
    return ddp.sync_events == optimizer_steps &&
           ddp.bucket_all_reduces == optimizer_steps * std::int64_t(buckets) &&
           comm_all_reduce_calls == ddp.bucket_all_reduces;
  }
  bool ok() const {
    return accum_ok() && unnormalized_ok() && counters_ok() && loss_ok() && sync_ok();
  }
};

// Throws InvalidInput for bad env / options, CommError when the group fails.
GradAccumResult run_grad_accum(const DistEnv& env, const GradAccumOptions& options = {});

}  // namespace tally::engine
