// Data-parallel training (DDP): the torch-free half of tally's DistributedDataParallel — options,
// the bucket plan, and the per-rank statistics experiments and tests read. The engine class itself
// takes at::Tensor parameters and lives in engine/runtime/ddp_torch.hpp (internal). It is the
// engine's one data-parallel reducer: `tally run ddp-check|grad-accum|checkpoint`, `tally bench
// ddp` and the ZeRO-0 baseline of `tally run zero` all reduce their gradients through it, each with
// the collective it names (GradientCollective), as c10d's reducer takes a communication hook.
//
// What DDP does, per rank (PyTorch's DistributedDataParallel, c10d/reducer.cpp, on Gloo):
//   1. at construction, every parameter is broadcast from rank 0, so all replicas start equal;
//   2. parameters are grouped into buckets of about bucket_cap_bytes, in reverse registration
//      order (the order backward produces their gradients);
//   3. an autograd hook on each parameter's gradient accumulator counts it ready; when a bucket's
//      gradients are all ready, its all-reduce is started at once (buckets strictly in order), so
//      communication overlaps the rest of the backward pass;
//   4. before the optimizer step, finish_gradient_sync() waits for every bucket and writes the
//      average over ranks into each parameter's .grad.
// Inside a no_sync() scope backward passes only accumulate into .grad (gradient accumulation):
// nothing is sent until the next backward outside it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tally/core/comm.hpp"

namespace tally::engine {

using ::tally::kMiB;  // engine::kMiB, as callers spell it

// The collective a bucket is reduced with (c10d's communication hook, as an algorithm enum):
//   gloo_all_reduce  Gloo's all-reduce, started as soon as the bucket is full, so it overlaps the
//                    rest of the backward pass; each gradient is pre-divided by k while it is packed
//                    and the bucket summed (Note [pre-divided average] in ddp.cpp) — PyTorch's DDP;
//   ring_all_reduce  tally's ring (Comm::ring_all_reduce, Note [ring all-reduce] in ring.cpp) with
//                    ReduceOp::average: the gradient is packed as it is and the ring's reduce-scatter
//                    sums then divides, the same arithmetic as the ZeRO stages' reduce-scatter. It
//                    runs to completion inside the hook of the bucket's last gradient.
enum class GradientCollective { gloo_all_reduce, ring_all_reduce };

struct DdpOptions {
  // A bucket is closed once its gradients reach this many bytes (in the gradients' dtype), so a
  // bucket may overshoot by one tensor; 1 byte gives one parameter per bucket, a huge value one
  // bucket. PyTorch's bucket_cap_mb = 25 means 25 MiB (bucket_cap_mb * 1024 * 1024).
  double bucket_cap_bytes = kDdpBucketBytes;
  // The first bucket in reduction order (the last layers' gradients, ready first) closes at
  // min(first_bucket_cap_bytes, bucket_cap_bytes), so its all-reduce starts early in the backward
  // pass: PyTorch's dist._DEFAULT_FIRST_BUCKET_BYTES = 1 MiB, which its DDP applies from the
  // second iteration on (Reducer::rebuild_buckets; see Note [first bucket] in ddp.cpp).
  double first_bucket_cap_bytes = kDdpFirstBucketBytes;
  GradientCollective collective = GradientCollective::gloo_all_reduce;
  void validate() const;  // throws InvalidInput naming the field and value
};

// Buckets in reduction order; each lists parameter indices (registration order numbering) in the
// order they are packed. Parameters are taken last to first and a bucket closes when its bytes
// reach its cap: first_cap_bytes for the first bucket, cap_bytes for the others (c10d's
// compute_bucket_assignment_by_size with bucket_size_limits {first, cap} applied to the reversed
// parameter list, i.e. PyTorch's plan after its first-iteration rebuild when gradients arrive in
// reverse registration order). The two-argument form uses cap_bytes for every bucket. Pure
// functions, tested alone.
std::vector<std::vector<std::size_t>> compute_bucket_assignment_by_size(
    std::span<const double> param_bytes, double cap_bytes);
std::vector<std::vector<std::size_t>> compute_bucket_assignment_by_size(
    std::span<const double> param_bytes, double cap_bytes, double first_cap_bytes);

// Per-rank counts since construction (or reset_stats()).
//
// Definitions (the grad-accum experiment's criterion ⑤ is stated in them):
//   backward_passes    backward passes in which every parameter's gradient was accumulated,
//                      counted by the hooks, inside or outside no_sync;
//   sync_events        backward passes whose gradients were reduced: each launches every
//                      bucket's all-reduce once. With accumulation over K micro-batches,
//                      sync_events = optimizer steps and backward_passes = K × that;
//   bucket_all_reduces all-reduce calls issued for gradient buckets = sync_events × buckets;
//   gradient_bytes_sent this rank's bytes for those calls, from the Comm counters (core formula
//                      2S(k−1)/k on S = the bytes actually on the wire, in wire_dtype);
//   buckets_done_during_backward  bucket all-reduces already complete when the backward pass's
//                      last gradient arrived: communication measured to overlap computation.
struct DdpStats {
  std::int64_t backward_passes = 0;
  std::int64_t no_sync_backward_passes = 0;
  std::int64_t sync_events = 0;
  std::int64_t bucket_all_reduces = 0;
  double gradient_bytes_sent = 0;
  std::int64_t buckets_done_during_backward = 0;
  double wire_bytes_per_sync = 0;  // S summed over buckets, in wire_dtype
  // Bucket buffers allocated anew because the caller still held the old one's .grad views (or
  // tensors made from them) when the next synchronized backward began; 0 when gradients are set
  // to none between steps (Note [bucket buffers] in engine/runtime/ddp.cpp).
  std::int64_t bucket_buffer_reallocations = 0;
  std::string grad_dtype;          // "float32", "bfloat16", "float64"
  std::string wire_dtype;          // what Gloo reduces: bfloat16 travels as float32 (Note [bf16 on Gloo])
};


}  // namespace tally::engine
