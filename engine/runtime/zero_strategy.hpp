// The shape every ZeRO strategy shares (internal: torch types): setup(model) / step(batch) → loss /
// measure(), one strategy per file like nccl-tests' table of collectives —
//   zero_stage0.cpp  DP: full replica, gradients all-reduced by the engine's one data-parallel
//                    reducer (ddp_torch.hpp) with tally's ring, Adam on everything
//   zero_stage1.cpp  + m, v, master sharded: gradients reduce-scattered, own shard updated,
//                    updated parameters all-gathered
//   zero_stage2.cpp  + gradients sharded: the full gradient is freed after the reduce-scatter
//   zero_stage3.cpp  + parameters sharded: each unit gathered before its forward and again before
//                    its backward, freed after each use
// and the pieces they share: the model as a chain of units, a flat parameter replica, the
// collectives wrapped so every call is logged and bf16 travels as float32, and stages 1–2's
// sharded optimizer with its update-and-all-gather tail (ShardedOptimizerStrategy).
//
// Legend: N = parameters, k = ranks, r = this rank, U = units, n_u = parameters of unit u.
// Sharding rule: tally::shard_span (core/sharding.hpp), which is the Comm's chunk_range, so rank
// r's shard of a flat buffer is exactly the chunk a reduce-scatter leaves on it and the chunk an
// all-gather takes from it. Stages 1–2 shard one flat buffer of all N parameters; stage 3 shards
// each unit's flat buffer (FSDP's FlatParameter per wrapped unit), so rank r holds
// Σ_u shard_span(n_u, k, r).count elements (at most U more than N/k).
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tally/core/comm.hpp"
#include "tally/core/model_states.hpp"
#include "tally/core/sharding.hpp"
#include "optimizer_torch.hpp"
#include "tally/engine/comm.hpp"

namespace tally::engine::zero {

// A model as a chain of units: y_u = forward_unit(u, y_{u−1}, params_u), loss(y_U, target). A unit
// is ZeRO-3's gather granularity (one Linear + its ReLU for the MLP).
struct UnitModel {
  std::vector<std::vector<at::Tensor>> units;  // unit u's parameters: initial values, param dtype
  std::function<at::Tensor(std::size_t u, const at::Tensor& x,
                           const std::vector<at::Tensor>& params)>
      forward_unit;
  std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>
      loss;  // fp32 scalar
  std::vector<std::int64_t> unit_numels() const;
  std::int64_t numel() const;  // N
};

// The MLP widths d_0 … d_U (mlp.hpp's nn.Linear initialisation after manual_seed(seed), then cast
// to `dtype`): unit u = Linear(d_u, d_{u+1}) followed by ReLU except on the last; the loss is the
// mean cross-entropy of the fp32-upcast logits.
UnitModel make_mlp_model(const std::vector<std::int64_t>& widths, at::ScalarType dtype,
                         std::uint64_t seed);

struct Batch {
  at::Tensor x;  // (rows, d_0), param dtype: this rank's rows
  at::Tensor y;  // (rows,) int64 class ids
};

// One collective a strategy issued: what the wire-byte tally (zero.hpp's wire_bytes) needs.
struct CallRecord {
  Collective collective = Collective::all_reduce;
  std::int64_t count = 0;    // elements of the full buffer (S / element_bytes)
  double element_bytes = 4;  // on the wire (float32, Note [bf16 on Gloo])
};

struct StrategyContext {
  Comm* comm = nullptr;
  at::ScalarType param_dtype = at::kFloat;  // kFloat or kBFloat16 (mixed)
  AdamOptions adam;
  // Called as the step's optimizer update begins (run_zero's memory phase marker, Note [zero
  // memory phases] in zero.cpp); empty: nothing.
  std::function<void()> before_update;
};

class Strategy {
 public:
  explicit Strategy(const StrategyContext& ctx) : ctx_(ctx), comm_(*ctx.comm) {}
  virtual ~Strategy() = default;
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  virtual int stage() const = 0;
  // Takes the initial model (the same on every rank) and keeps what this rank owns; the initial
  // tensors die with `model` when setup returns.
  virtual void setup(UnitModel model) = 0;
  // One optimizer step on this rank's rows: forward, backward, communication, Adam. Returns this
  // rank's loss (before the update).
  virtual double step(const Batch& batch) = 0;
  // The model-state bytes this rank holds now, itemized as the ledger: Σ nbytes of its own tensors
  // (fp32 parameters are their own master: master = 0, as core counts it).
  virtual StateItems measure() const = 0;
  // Every parameter, flat in unit order, as float64 (gathers sharded ones: communication outside
  // any step). For the equivalence checks.
  virtual at::Tensor gather_parameters() = 0;

  // What the current step did, for run_zero (which calls begin_step() before each step): the
  // collectives it issued, and the seconds its optimizer update took (the step's other phases
  // come from the Comm's counters and the step's wall time: Note [zero phases] in zero.cpp).
  void begin_step() {
    calls_.clear();
    optimizer_s_ = 0;
  }
  const std::vector<CallRecord>& calls() const { return calls_; }
  double optimizer_seconds() const { return optimizer_s_; }

 protected:
  // The collectives, logged, with bf16 widened to float32 for the wire (Note [bf16 on Gloo]).
  // This rank's shard_span of the average over ranks of `full` (1-D, contiguous, any float dtype),
  // as float32, for a caller whose full buffer is dead afterwards: a float32 `full` is reduced in
  // place (Comm::reduce_scatter_in_place: no scratch copy, no copy out) and the result is a view of
  // it, every other element left unspecified; other dtypes are reduced in their float32 copy.
  at::Tensor reduce_scatter_average_in_place(at::Tensor& full);
  // full (contiguous, shard's dtype) ← every rank's shard, concatenated. Writes through copy_, so
  // the caller holds a NoGradGuard when `full` requires grad.
  void all_gather_into(const at::Tensor& shard, at::Tensor& full);
  // The same with this rank's shard already in place: my_span(full.numel()) of full holds it.
  void all_gather_in_place(at::Tensor& full);
  // The same into a fresh tensor of n elements (shard's dtype).
  at::Tensor all_gather(const at::Tensor& shard, std::int64_t n);
  ShardSpan my_span(std::int64_t n) const {
    return shard_span(n, comm_.world_size(), comm_.rank());
  }

  // Runs the optimizer update `update`, charged to the step's optimizer phase (once per step;
  // the context's before_update marks its start).
  template <class F>
  void timed_update(F&& update) {
    if (ctx_.before_update) ctx_.before_update();
    const auto start = std::chrono::steady_clock::now();
    update();
    optimizer_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  StrategyContext ctx_;
  Comm& comm_;
  std::vector<CallRecord> calls_;
  double optimizer_s_ = 0;
};

// Every parameter, full, as leaf tensors viewing one flat buffer (stages 0–2). Gradients land in a
// flat buffer too: set_grad_buffer() makes each leaf's .grad a view of it, so autograd accumulates
// in place (AccumulateGrad adds into a defined .grad under no-grad mode: PyTorch DDP's
// gradient_as_bucket_view) and no copy is needed before the collective.
class Replica {
 public:
  Replica() = default;
  explicit Replica(UnitModel model);
  at::Tensor loss(const Batch& batch) const;  // forward through every unit
  at::Tensor& flat() { return flat_; }        // (N,) param dtype; writes under NoGradGuard
  const at::Tensor& flat() const { return flat_; }
  void set_grad_buffer(const at::Tensor& flat_grad);
  void drop_grads();  // every leaf's .grad = undefined
  std::vector<at::Tensor> leaves() const;  // every parameter, in unit order
  std::int64_t numel() const { return flat_.numel(); }

 private:
  UnitModel model_;  // units[u] hold the leaves (views of flat_)
  at::Tensor flat_;
};

// What a flat-buffer strategy holds: its parameter and gradient tensors and its optimizer state.
inline StateItems held_state(const at::Tensor& params, const at::Tensor& grads,
                             const Adam& adam) {
  StateItems s{.params = double(params.nbytes()), .grads = double(grads.nbytes())};
  adam.add_state(s);
  return s;
}

// ZeRO-1 and ZeRO-2's common part (P_os and P_os+g): every parameter in a Replica, Adam over this
// rank's shard_span(N, k, r) of its flat buffer, and the step's tail — update the shard, then
// all-gather the updated shards so every replica holds the new parameters. The stages differ in
// how the averaged gradient shard is made and what gradient memory outlives the step.
class ShardedOptimizerStrategy : public Strategy {
 public:
  using Strategy::Strategy;
  at::Tensor gather_parameters() override { return replica_.flat().to(at::kDouble); }

 protected:
  // replica_ from the model, span_ = my_span(N), adam_ over the flat buffer's span_.
  void setup_replica_and_shard(UnitModel model);
  // Adam on span_ with grad_shard ((span_.count,) gradient dtype), then the all-gather of every
  // rank's updated span into replica_.flat(), in place. The caller holds a NoGradGuard.
  void update_shard_and_all_gather(const at::Tensor& grad_shard);

  Replica replica_;
  ShardSpan span_;
  Adam adam_;
};

// Note [gather and free] (zero_stage3.cpp), its two halves, for ZeRO-3 here and in `tally run 3d`:
// free_storage resizes the storage under `full` to zero bytes (views of it keep their shapes and
// hold nothing); regrow_storage resizes it back to full.numel() elements (contents unspecified)
// and returns a tensor over the whole storage with a version counter of its own, to write the
// gathered parameters through without autograd seeing `full` or its views modified.
void free_storage(const at::Tensor& full);
[[nodiscard]] at::Tensor regrow_storage(const at::Tensor& full);

// Flat copy of tensors in order, in `dtype`.
at::Tensor flatten(const std::vector<at::Tensor>& tensors, at::ScalarType dtype);
// Views of `flat` with these shapes, laid end to end (their numels sum to flat.numel()).
using Shape = std::vector<std::int64_t>;
std::vector<at::Tensor> views_of(const at::Tensor& flat, const std::vector<Shape>& shapes);

// The table (nccl-tests style): stage → factory. Each lives in its own zero_stage<N>.cpp.
std::unique_ptr<Strategy> make_stage0(const StrategyContext& ctx);
std::unique_ptr<Strategy> make_stage1(const StrategyContext& ctx);
std::unique_ptr<Strategy> make_stage2(const StrategyContext& ctx);
std::unique_ptr<Strategy> make_stage3(const StrategyContext& ctx);

struct StrategyEntry {
  int stage;
  const char* name;
  std::unique_ptr<Strategy> (*make)(const StrategyContext&);
};
inline constexpr StrategyEntry kStrategies[] = {
    {0, "DP (ZeRO-0)", make_stage0},
    {1, "ZeRO-1", make_stage1},
    {2, "ZeRO-2", make_stage2},
    {3, "ZeRO-3", make_stage3},
};

}  // namespace tally::engine::zero
