// tally's DistributedDataParallel over at::Tensor parameters — the engine's one data-parallel
// reducer (internal: torch types; the options, the collective, the bucket plan and the statistics
// are in the public tally/engine/ddp.hpp, which describes the algorithm).
//
// Use, per rank (every rank does the same calls in the same order):
//
//   DistributedDataParallel ddp(comm, params);        // broadcasts params from rank 0
//   for (...) {
//     { auto scope = ddp.no_sync();                   // K − 1 micro-batches: accumulate only
//       for (k < K − 1) loss_k.backward(); }
//     loss_last.backward();                           // buckets all-reduce while backward runs
//     ddp.finish_gradient_sync();                     // .grad = average over ranks
//     optimizer.step(); zero the grads;
//   }
//
// Contract: params are leaf CPU tensors that require grad, all of one dtype (float32, float64 or
// bfloat16), and every parameter receives a gradient in every backward pass (there is no
// find_unused_parameters). A broken contract, a second synchronized backward before
// finish_gradient_sync(), or finishing without a synchronized backward throws std::logic_error
// from finish_gradient_sync(); communication failures throw CommError from there too (the hooks
// never throw into autograd: they record the error and stop communicating).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "tally/engine/comm.hpp"
#include "tally/engine/ddp.hpp"

namespace torch::autograd {
struct Node;
}

namespace tally::engine {

class DistributedDataParallel {
 public:
  DistributedDataParallel(Comm& comm, std::vector<at::Tensor> params,
                          const DdpOptions& options = {});
  ~DistributedDataParallel();  // removes the hooks; abandons (does not wait for) pending buckets
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // While the returned scope lives, backward passes only accumulate gradients (torch's
  // DDP.no_sync()). Scopes nest.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  // Waits for every bucket of the last synchronized backward and sets each parameter's .grad to
  // the average over ranks: for float32 / float64 a view into the bucket's buffer (no copy; the
  // buffer is reused only once nothing refers to it, Note [bucket buffers] in ddp.cpp), for
  // bfloat16 a view into the bucket rounded back to bfloat16 (one buffer per bucket and step).
  void finish_gradient_sync();

  const std::vector<at::Tensor>& parameters() const { return params_; }
  const std::vector<std::vector<std::size_t>>& buckets() const { return buckets_; }
  const DdpStats& stats() const { return stats_; }
  void reset_stats();
  Comm& comm() { return comm_; }

 private:
  struct Bucket {
    std::vector<std::size_t> params;  // indices into params_, packing order
    std::int64_t numel = 0;
    std::int64_t pending = 0;        // gradients not yet ready in this backward
    PendingCollective work;
    // [numel] wire dtype, reused across steps: each gradient is packed into it (times 1/k for
    // Gloo) by its hook, the collective reduces it in place (Gloo's work holds it too), finish
    // points .grad at it (Note [bucket buffers]); undefined between steps for bf16 gradients.
    at::Tensor flat;
    bool launched = false;
  };

  void on_gradient_ready(std::size_t param);   // the autograd hook
  void pack(std::size_t param);                // .grad × 1/k into its bucket's buffer
  void launch_ready_buckets();
  void launch(Bucket& bucket);
  void end_of_backward();
  void record_error(std::exception_ptr e);

  Comm& comm_;
  DdpOptions options_;
  std::vector<at::Tensor> params_;
  std::vector<std::vector<std::size_t>> buckets_;  // the plan
  std::vector<Bucket> state_;                      // one per plan entry
  std::vector<std::size_t> bucket_of_;             // param index → bucket index
  std::vector<std::int64_t> offset_of_;            // param index → element offset in its bucket
  std::vector<bool> ready_;                        // param index → ready in this backward
  std::int64_t ready_count_ = 0;
  std::size_t next_bucket_ = 0;                    // first bucket not launched yet
  at::ScalarType wire_type_ = at::kFloat;
  bool require_sync_ = true;
  bool pass_syncs_ = true;      // require_sync_ when this backward's first gradient arrived
  bool sync_pending_ = false;   // a synchronized backward ended, finish not called yet
  std::exception_ptr error_;    // first error seen in a hook; rethrown by finish
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<std::uintptr_t> hook_keys_;
  DdpStats stats_;
};

}  // namespace tally::engine
