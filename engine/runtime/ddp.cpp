// DistributedDataParallel (ddp_torch.hpp), the bucket plan (ddp.hpp).
//
// Note [bf16 on Gloo]
// ProcessGroupGloo in PyTorch 1.13 all-reduces float32, float64, float16 and integer tensors; a
// bfloat16 tensor fails with "Invalid scalar type" (checked: torch.distributed.all_reduce of a
// bf16 tensor under Gloo, and exp_ddp.cpp's GlooHasNoBFloat16AllReduce). So bf16 gradients are
// widened to float32 for the wire (exact), reduced there, and rounded back to bf16 in .grad. The
// wire carries 4 bytes per gradient element, not 2: DdpStats::wire_dtype says "float32" and
// gradient_bytes_sent counts what was actually sent, so the comm ledger's 2-byte prediction and
// this measurement differ by exactly 2×, labelled. NCCL reduces bf16 natively.
//
// Note [pre-divided average]
// As PyTorch's reducer (mark_variable_ready_dense: mul_out(bucket_view, grad, 1/world)), each
// gradient is multiplied by 1/k while it is packed into its bucket and the bucket is then summed,
// so the average never leaves the float range and matches torch's DDP bit for bit on the same
// Gloo sum. A hand-written all_reduce(g)/k differs from it only by rounding (≈1 ulp).
//
// Note [bucket buffers]
// As c10d's reducer, each bucket has one flat wire-dtype buffer, and each gradient is packed into
// it by its own hook, the moment autograd has accumulated it (mul_out(view, grad, 1/k): one pass,
// spread over the backward pass, on data still in cache). The bucket's all-reduce then starts on
// the buffer without a further copy, and finish_gradient_sync() makes each float32 / float64
// .grad a view of the reduced buffer instead of copying it back (c10d's gradient_as_bucket_view,
// without its aliasing: see below). An earlier version concatenated the gradients into a fresh
// tensor at launch, scaled it in a second pass and copied the result into .grad: three more passes
// over every gradient at the end of the backward pass and a new allocation per bucket per step;
// it measured 5–15% slower than PyTorch's DDP on a 2.6 M-parameter MLP (bench/ddp_vs_pytorch.sh).
// Reuse is safe because (1) a buffer is written only by the hooks of a synchronized backward,
// after finish_gradient_sync() has waited for its previous all-reduce (a second synchronized
// backward before finish is an error), and (2) a buffer is reused only when nothing else refers
// to its storage: after the usual zero_grad (set_to_none) the .grad views are gone; when they are
// not (gradients kept, accumulated into, or held by the caller), pack() gives the bucket a fresh
// buffer and leaves the old one to its holders. So no tensor the caller can see ever changes
// behind its back, and .grad holds exactly what a copy would have held. bfloat16 gradients are
// widened into the float32 bucket and, after the reduction, rounded into one bfloat16 buffer per
// bucket whose views become the .grad; the float32 bucket is then released (the next pack makes
// it again), so between steps the gradients hold the ledger's 2 bytes each, as the ZeRO stages'.
//
// Note [first bucket]
// PyTorch's DDP (1.13) closes its first bucket at 1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES, which
// a user may change) and the rest at bucket_cap_mb, planned in gradient-ready order from the
// second iteration on (Reducer::rebuild_buckets; the first iteration runs one bucket). The first bucket holds the last layers' gradients, ready first, so
// its all-reduce overlaps the rest of the backward pass even when bucket_cap_mb would hold the
// whole model in one bucket (then nothing overlaps). DdpOptions::first_bucket_cap_bytes does the
// same on tally's static reverse-registration plan.
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>

#include "comm_torch.hpp"
#include "ddp_torch.hpp"
#include "tally/core/types.hpp"

namespace tally::engine {

namespace {

// A double as a person would write it ("0.5", "1e-06"), for messages.
}  // namespace

void DdpOptions::validate() const {
  if (!(bucket_cap_bytes > 0) || !std::isfinite(bucket_cap_bytes))
    throw InvalidInput("bucket_cap_bytes = " + format_number(bucket_cap_bytes) +
                       ": must be a finite number > 0 bytes");
  if (!(first_bucket_cap_bytes > 0) || !std::isfinite(first_bucket_cap_bytes))
    throw InvalidInput("first_bucket_cap_bytes = " + format_number(first_bucket_cap_bytes) +
                       ": must be a finite number > 0 bytes");
}

std::vector<std::vector<std::size_t>> compute_bucket_assignment_by_size(
    std::span<const double> param_bytes, double cap_bytes) {
  return compute_bucket_assignment_by_size(param_bytes, cap_bytes, cap_bytes);
}

std::vector<std::vector<std::size_t>> compute_bucket_assignment_by_size(
    std::span<const double> param_bytes, double cap_bytes, double first_cap_bytes) {
  std::vector<std::vector<std::size_t>> buckets;
  std::vector<std::size_t> open;
  double open_bytes = 0;
  for (std::size_t i = param_bytes.size(); i-- > 0;) {
    open.push_back(i);
    open_bytes += param_bytes[i];
    if (open_bytes >= (buckets.empty() ? first_cap_bytes : cap_bytes)) {
      buckets.push_back(std::move(open));
      open.clear();
      open_bytes = 0;
    }
  }
  if (!open.empty()) buckets.push_back(std::move(open));
  return buckets;
}

// ---- DistributedDataParallel ----

namespace {

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kBFloat16: return "bfloat16";
    default: return c10::toString(t);
  }
}

at::Tensor flatten(const std::vector<at::Tensor>& tensors, at::ScalarType type) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.reshape(-1).to(type));
  return at::cat(flat);
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(Comm& comm, std::vector<at::Tensor> params,
                                                 const DdpOptions& options)
    : comm_(comm), options_(options), params_(std::move(params)) {
  options_.validate();
  if (params_.empty()) throw InvalidInput("DistributedDataParallel: no parameters");
  const at::ScalarType type = params_[0].scalar_type();
  if (type != at::kFloat && type != at::kDouble && type != at::kBFloat16)
    throw InvalidInput("DistributedDataParallel: parameter dtype " + dtype_name(type) +
                       ": must be float32, float64 or bfloat16");
  std::vector<double> bytes;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    if (p.scalar_type() != type)
      throw InvalidInput("DistributedDataParallel: parameter " + std::to_string(i) + " dtype " +
                         dtype_name(p.scalar_type()) + " vs parameter 0 dtype " +
                         dtype_name(type) + ": all must match");
    if (!p.device().is_cpu() || !p.requires_grad() || !p.is_leaf())
      throw InvalidInput("DistributedDataParallel: parameter " + std::to_string(i) +
                         " must be a leaf CPU tensor that requires grad");
    bytes.push_back(double(p.nbytes()));
  }
  // Note [bf16 on Gloo]: float64 travels as itself, everything else as float32.
  wire_type_ = type == at::kDouble ? at::kDouble : at::kFloat;
  stats_.grad_dtype = dtype_name(type);
  stats_.wire_dtype = dtype_name(wire_type_);

  // 1. Every replica starts from rank 0's parameters (one coalesced broadcast).
  {
    at::NoGradGuard no_grad;
    at::Tensor flat = flatten(params_, wire_type_);
    broadcast(comm_, flat, 0);
    std::int64_t offset = 0;
    for (auto& p : params_) {
      p.copy_(flat.narrow(0, offset, p.numel()).view_as(p));
      offset += p.numel();
    }
  }

  // 2. The bucket plan, in reduction order.
  // Note [first bucket]: PyTorch's first-bucket limit, never above the bucket cap.
  buckets_ = compute_bucket_assignment_by_size(
      bytes, options_.bucket_cap_bytes,
      std::min(options_.first_bucket_cap_bytes, options_.bucket_cap_bytes));
  bucket_of_.assign(params_.size(), 0);
  offset_of_.assign(params_.size(), 0);
  ready_.assign(params_.size(), false);
  state_.resize(buckets_.size());
  const double wire_elem_bytes = double(c10::elementSize(wire_type_));
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    state_[b].params = buckets_[b];
    for (std::size_t i : buckets_[b]) {
      bucket_of_[i] = b;
      offset_of_[i] = state_[b].numel;
      state_[b].numel += params_[i].numel();
    }
    state_[b].pending = std::int64_t(buckets_[b].size());
    // Note [bucket buffers]: one buffer per bucket, reused across steps (made by the first pack
    // when the gradients are not in the wire dtype).
    if (type == wire_type_)
      state_[b].flat = at::empty({state_[b].numel}, at::TensorOptions().dtype(wire_type_));
    stats_.wire_bytes_per_sync += double(state_[b].numel) * wire_elem_bytes;
  }

  // 3. A post hook on each gradient accumulator: it runs right after .grad has been accumulated.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(params_[i]);
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs,
                  const torch::autograd::variable_list& /*inputs*/) {
          on_gradient_ready(i);
          return outputs;
        })));
    accumulators_.push_back(std::move(acc));  // keeps the accumulator (and its hook) alive
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  for (std::size_t i = 0; i < accumulators_.size(); ++i)
    accumulators_[i]->del_post_hook(hook_keys_[i]);
}

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.require_sync_) {
  ddp_.require_sync_ = false;
}

DistributedDataParallel::NoSync::~NoSync() { ddp_.require_sync_ = previous_; }

void DistributedDataParallel::record_error(std::exception_ptr e) {
  if (!error_) error_ = e;
}

void DistributedDataParallel::on_gradient_ready(std::size_t i) {
  if (error_) return;  // after a failure the hooks stay silent; finish_gradient_sync() rethrows
  try {
    if (ready_count_ == 0) {
      pass_syncs_ = require_sync_;
      if (pass_syncs_ && sync_pending_)
        throw std::logic_error(
            "DistributedDataParallel: a synchronized backward pass started before "
            "finish_gradient_sync() of the previous one (call it before the optimizer step)");
    }
    if (ready_[i])
      throw std::logic_error("DistributedDataParallel: parameter " + std::to_string(i) +
                             " got a second gradient while " +
                             std::to_string(params_.size() - std::size_t(ready_count_)) +
                             " parameters still had none: every parameter must receive a "
                             "gradient in every backward pass");
    ready_[i] = true;
    ++ready_count_;
    if (pass_syncs_) {
      pack(i);
      Bucket& b = state_[bucket_of_[i]];
      if (--b.pending == 0) launch_ready_buckets();
    }
    if (std::size_t(ready_count_) == params_.size()) end_of_backward();
  } catch (...) {
    record_error(std::current_exception());
  }
}

// Buckets start strictly in plan order on every rank (Gloo matches collectives by issue order),
// so a bucket that fills early waits for its predecessors, as in c10d's reducer.
void DistributedDataParallel::launch_ready_buckets() {
  while (next_bucket_ < state_.size() && state_[next_bucket_].pending == 0)
    launch(state_[next_bucket_++]);
}

// Note [bucket buffers], Note [pre-divided average]: view = grad × 1/k, in the wire dtype. For a
// gradient already in the wire dtype that is one mul_out pass (as c10d's
// mark_variable_ready_dense); a bfloat16 one is widened first (Note [bf16 on Gloo]).
void DistributedDataParallel::pack(std::size_t i) {
  const at::Tensor g = params_[i].grad();
  if (!g.defined())
    throw std::logic_error("DistributedDataParallel: parameter " + std::to_string(i) +
                           " has no .grad after its accumulator ran");
  at::NoGradGuard no_grad;
  Bucket& b = state_[bucket_of_[i]];
  // The bucket's first gradient of this backward: is anything outside this object still looking
  // at the buffer (a .grad view from the last finish that was not set to none, a tensor the caller
  // kept)? Then it is left to them and the bucket gets a fresh one.
  if (b.pending == std::int64_t(b.params.size())) {
    if (!b.flat.defined()) {
      b.flat = at::empty({b.numel}, at::TensorOptions().dtype(wire_type_));
    } else if (b.flat.storage().use_count() > 1) {
      b.flat = at::empty({b.numel}, b.flat.options());
      stats_.bucket_buffer_reallocations += 1;
    }
  }
  at::Tensor view = b.flat.narrow(0, offset_of_[i], g.numel()).view(g.sizes());
  if (options_.collective == GradientCollective::ring_all_reduce) {
    view.copy_(g);  // the ring averages (ReduceOp::average)
    return;
  }
  const double inverse_k = 1.0 / double(comm_.world_size());
  if (g.scalar_type() == wire_type_) {
    at::mul_out(view, g, at::scalar_tensor(inverse_k, b.flat.options()));
  } else {
    view.copy_(g);
    view.mul_(inverse_k);
  }
}

void DistributedDataParallel::launch(Bucket& b) {
  const bool ring = options_.collective == GradientCollective::ring_all_reduce;
  const auto sent = [&] {
    return ring ? comm_.counters().ring_all_reduce.bytes_sent
                : comm_.counters()[Collective::all_reduce].bytes_sent;
  };
  const double before = sent();
  if (ring)
    ring_all_reduce(comm_, b.flat, ReduceOp::average);  // done when it returns: b.work stays empty
  else
    b.work = all_reduce_async(comm_, b.flat);
  b.launched = true;
  stats_.bucket_all_reduces += 1;
  stats_.gradient_bytes_sent += sent() - before;
}

void DistributedDataParallel::end_of_backward() {
  stats_.backward_passes += 1;
  if (pass_syncs_) {
    stats_.sync_events += 1;
    sync_pending_ = true;
    for (const Bucket& b : state_)
      if (b.work.done()) stats_.buckets_done_during_backward += 1;
  } else {
    stats_.no_sync_backward_passes += 1;
  }
  ready_.assign(params_.size(), false);
  ready_count_ = 0;
  next_bucket_ = 0;
  for (std::size_t b = 0; b < state_.size(); ++b)
    state_[b].pending = std::int64_t(state_[b].params.size());
}

void DistributedDataParallel::finish_gradient_sync() {
  if (error_) std::rethrow_exception(error_);
  if (ready_count_ != 0)
    throw std::logic_error("finish_gradient_sync: the backward pass is incomplete: " +
                           std::to_string(ready_count_) + " of " +
                           std::to_string(params_.size()) +
                           " parameters got a gradient (every parameter must get one in every "
                           "backward pass)");
  if (!sync_pending_)
    throw std::logic_error(
        "finish_gradient_sync: no synchronized backward pass since the last call (backward "
        "passes inside no_sync() only accumulate)");
  at::NoGradGuard no_grad;
  try {
    for (Bucket& b : state_) {
      TALLY_INVARIANT(b.launched);
      b.work.wait();  // CommError on failure or timeout
      b.work = PendingCollective();  // Gloo's work item lets go of the buffer
      // Note [bucket buffers]: .grad becomes a view of the bucket, no copy — for bfloat16 of the
      // bucket rounded back (Note [bf16 on Gloo]) into one buffer of the gradients' dtype.
      const at::ScalarType grad_type = params_[b.params.front()].scalar_type();
      const at::Tensor source = grad_type == wire_type_ ? b.flat : b.flat.to(grad_type);
      for (std::size_t i : b.params) {
        at::Tensor& g = params_[i].mutable_grad();
        g = source.narrow(0, offset_of_[i], g.numel()).view(g.sizes());
      }
    }
  } catch (...) {
    record_error(std::current_exception());  // half the buckets written: unusable from here on
    throw;
  }
  for (Bucket& b : state_) {
    b.launched = false;  // b.flat is reused (Note [bucket buffers]) ...
    // ... unless the gradients were rounded back out of it (bfloat16): then it is needed only
    // while a bucket is reduced, and is made again by the next pack — the ledger's 2-byte
    // gradients, not 2 + 4.
    if (wire_type_ != params_[0].scalar_type()) b.flat = at::Tensor();
  }
  sync_pending_ = false;
}

void DistributedDataParallel::reset_stats() {
  DdpStats fresh;
  fresh.wire_bytes_per_sync = stats_.wire_bytes_per_sync;
  fresh.grad_dtype = stats_.grad_dtype;
  fresh.wire_dtype = stats_.wire_dtype;
  stats_ = fresh;
}

}  // namespace tally::engine
