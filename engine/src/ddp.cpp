// DistributedDataParallel and MasterWeightAdam (ddp_torch.hpp), the bucket plan (ddp.hpp).
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
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

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
std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

void DdpOptions::validate() const {
  if (!(bucket_cap_bytes > 0) || !std::isfinite(bucket_cap_bytes))
    throw InvalidInput("bucket_cap_bytes = " + num(bucket_cap_bytes) +
                       ": must be a finite number > 0 bytes");
}

void AdamOptions::validate() const {
  auto bad = [](const char* name, double v, const char* range) {
    throw InvalidInput(std::string(name) + " = " + num(v) + ": must be " + range);
  };
  if (!(lr > 0) || !std::isfinite(lr)) bad("lr", lr, "finite and > 0");
  if (!(beta1 >= 0 && beta1 < 1)) bad("beta1", beta1, "in [0, 1)");
  if (!(beta2 >= 0 && beta2 < 1)) bad("beta2", beta2, "in [0, 1)");
  if (!(eps > 0) || !std::isfinite(eps)) bad("eps", eps, "finite and > 0");
}

std::vector<std::vector<std::size_t>> compute_bucket_assignment_by_size(
    std::span<const double> param_bytes, double cap_bytes) {
  std::vector<std::vector<std::size_t>> buckets;
  std::vector<std::size_t> open;
  double open_bytes = 0;
  for (std::size_t i = param_bytes.size(); i-- > 0;) {
    open.push_back(i);
    open_bytes += param_bytes[i];
    if (open_bytes >= cap_bytes) {
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
  buckets_ = compute_bucket_assignment_by_size(bytes, options_.bucket_cap_bytes);
  bucket_of_.assign(params_.size(), 0);
  ready_.assign(params_.size(), false);
  state_.resize(buckets_.size());
  const double wire_elem_bytes = double(c10::elementSize(wire_type_));
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    state_[b].params = buckets_[b];
    for (std::size_t i : buckets_[b]) {
      bucket_of_[i] = b;
      state_[b].numel += params_[i].numel();
    }
    state_[b].pending = std::int64_t(buckets_[b].size());
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

void DistributedDataParallel::launch(Bucket& b) {
  std::vector<at::Tensor> grads;
  for (std::size_t i : b.params) {
    const at::Tensor g = params_[i].grad();
    if (!g.defined())
      throw std::logic_error("DistributedDataParallel: parameter " + std::to_string(i) +
                             " has no .grad after its accumulator ran");
    grads.push_back(g);
  }
  at::NoGradGuard no_grad;
  b.flat = flatten(grads, wire_type_);
  b.flat.mul_(1.0 / double(comm_.world_size()));  // Note [pre-divided average]
  const double before = comm_.counters()[Collective::all_reduce].bytes_sent;
  b.work = all_reduce_async(comm_, b.flat);
  b.launched = true;
  stats_.bucket_all_reduces += 1;
  stats_.gradient_bytes_sent += comm_.counters()[Collective::all_reduce].bytes_sent - before;
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
      std::int64_t offset = 0;
      for (std::size_t i : b.params) {
        at::Tensor g = params_[i].mutable_grad();
        g.copy_(b.flat.narrow(0, offset, g.numel()).view_as(g));
        offset += g.numel();
      }
    }
  } catch (...) {
    record_error(std::current_exception());  // half the buckets written: unusable from here on
    throw;
  }
  for (Bucket& b : state_) {
    b.launched = false;
    b.flat = at::Tensor();
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

// ---- MasterWeightAdam ----

MasterWeightAdam::MasterWeightAdam(std::vector<at::Tensor> params, const AdamOptions& options)
    : options_(options), params_(std::move(params)) {
  options_.validate();
  at::NoGradGuard no_grad;
  for (const auto& p : params_) {
    if (!p.is_floating_point())
      throw InvalidInput("MasterWeightAdam: parameter dtype " + dtype_name(p.scalar_type()) +
                         ": must be a floating type");
    const bool own = p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble;
    at::Tensor master = own ? p : p.detach().to(at::kFloat);
    master_.push_back(master);
    m_.push_back(at::zeros_like(master));
    v_.push_back(at::zeros_like(master));
  }
}

void MasterWeightAdam::step() {
  at::NoGradGuard no_grad;
  steps_ += 1;
  const double t = double(steps_);
  const double bias_correction1 = 1 - std::pow(options_.beta1, t);
  const double bias_correction2 = 1 - std::pow(options_.beta2, t);
  const double step_size = options_.lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& g_param = params_[i].grad();
    if (!g_param.defined()) continue;
    const at::Tensor g = g_param.to(master_[i].scalar_type());
    m_[i].mul_(options_.beta1).add_(g, 1 - options_.beta1);
    v_[i].mul_(options_.beta2).addcmul_(g, g, 1 - options_.beta2);
    const at::Tensor denom = (v_[i].sqrt() / bias_correction2_sqrt).add_(options_.eps);
    master_[i].addcdiv_(m_[i], denom, -step_size);
    if (!master_[i].is_same(params_[i])) params_[i].copy_(master_[i]);
  }
}

void MasterWeightAdam::zero_grad() {
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
}

double MasterWeightAdam::state_bytes() const {
  double bytes = 0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!master_[i].is_same(params_[i])) bytes += double(master_[i].nbytes());
    bytes += double(m_[i].nbytes() + v_[i].nbytes());
  }
  return bytes;
}

}  // namespace tally::engine
