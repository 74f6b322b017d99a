// The engine's optimizers over at::Tensor parameters (internal: torch types; the options are in
// the public tally/engine/optimizer.hpp).
//
// Legend: N_i = elements of parameter i, t = steps taken (1-based inside step()).
//
// Note [mixed-precision Adam]
// Adam (Kingma & Ba 2015, Algorithm 1) exactly as torch.optim.Adam writes it (amsgrad = false,
// weight_decay = 0): m ← β1·m + (1 − β1)·g, v ← β2·v + (1 − β2)·g², then
// θ ← θ − (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + ε). It is elementwise, so a shard updates
// exactly as the same elements of the full vector would (the root of ZeRO's equivalence with DP).
// The state is created eagerly in the constructor — torch.optim.Adam creates m and v lazily at the
// first step(), which would move the "+8N / +12N after optimizer init" of the ledger into the step.
// Per parameter: m and v (N_i elements each, the master's dtype) and, when the parameter is 16-bit,
// an fp32 master copy the update runs on, rounded into the parameter after each step (seed A1:
// 2 + 2 + 8 + 4 bytes). float32 and float64 parameters are their own master. m, v and the masters
// are views of one flat buffer each (Σ N_i elements, parameter order): one allocation apiece, as a
// flat-buffer optimizer (FSDP's, DeepSpeed's) holds them, and the form a checkpoint saves.
// The update walks each parameter in chunks of kAdamChunkElements, so its temporaries (the upcast
// gradient and the denominator) stay under 8 MiB, as in a fused optimizer kernel: the step's own
// peak is the model states plus gradients, not plus two fp32 copies of the largest parameter (the
// GPT's 38.6 M-element tied embedding would add 0.3 GB and move its peak into the step).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "tally/core/mlp_step.hpp"
#include "tally/core/model_states.hpp"
#include "tally/engine/optimizer.hpp"

namespace tally::engine {

// kAdamChunkElements: core/mlp_step.hpp (the host step model counts the chunks too).

class Adam {
 public:
  Adam() = default;
  // params: floating-point tensors of one dtype (any shape, contiguous), updated in place. Throws
  // InvalidInput for bad options, a parameter that is not floating point, or mixed dtypes.
  Adam(std::vector<at::Tensor> params, const AdamOptions& options);

  void step();                 // each parameter's .grad at options.lr; no .grad: skipped
  void step_at(double lr);     // the same at this step's learning rate (a schedule's)
  // Explicit gradients, one per parameter (same numel, any float dtype): a reduced shard (ZeRO).
  void step_with(const std::vector<at::Tensor>& grads);
  void zero_grad();            // drops the parameters' gradients (set_to_none)

  std::int64_t steps() const { return steps_; }
  void set_steps(std::int64_t t) { steps_ = t; }  // a resumed run's step count
  // m and v of every parameter, flat in parameter order: the state itself, not a copy (clone it
  // to keep a value across a step); and the inverse, copying into them.
  const at::Tensor& flat_m() const { return m_; }
  const at::Tensor& flat_v() const { return v_; }
  void load_moments(const at::Tensor& flat_m, const at::Tensor& flat_v);

  double master_bytes() const {  // 0 when the parameters are their own master
    return master_.defined() ? double(master_.nbytes()) : 0.0;
  }
  double m_bytes() const { return m_.defined() ? double(m_.nbytes()) : 0.0; }
  double v_bytes() const { return v_.defined() ? double(v_.nbytes()) : 0.0; }
  double state_bytes() const { return master_bytes() + m_bytes() + v_bytes(); }
  // Adds m, v and master to a state ledger being measured.
  void add_state(StateItems& s) const {
    s.m += m_bytes();
    s.v += v_bytes();
    s.master += master_bytes();
  }

 private:
  void apply(const std::vector<at::Tensor>& grads, double lr);
  struct Slot {
    at::Tensor param;   // the parameter as given
    at::Tensor master;  // same shape: a view of master_ for 16-bit parameters, else the parameter
    at::Tensor m, v;    // same shape, views of m_ and v_
  };
  std::vector<Slot> slots_;
  at::Tensor master_;  // (Σ N_i,) fp32, 16-bit parameters only
  at::Tensor m_, v_;   // (Σ N_i,) the master's dtype
  AdamOptions options_;
  std::int64_t steps_ = 0;
};

// torch.optim.SGD(lr) without momentum: p.add_(p.grad, alpha=-lr); parameters without .grad skipped.
void sgd_step(const std::vector<at::Tensor>& params, double lr);
// Every parameter's .grad = undefined (zero_grad(set_to_none=True)).
void zero_grad(const std::vector<at::Tensor>& params);

}  // namespace tally::engine
