// The planner's per-request invariants and per-shape caches (internal to core/src; planner.cpp
// is their one user): a request's constants computed once, each distinct operator shape's kernel
// times and activation bytes computed once and looked up per layout (Note [planner time model] in
// planner.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tally/core/activations.hpp"
#include "tally/core/operators.hpp"
#include "tally/core/pipeline.hpp"
#include "tally/core/planner.hpp"

namespace tally::detail {

// One micro-batch's kernel times for one operator shape (b, t, SP, c, recompute, attention).
struct MicroTimes {
  double layer_s = 0;           // one transformer layer: forward + backward + recompute
  double layer_backward_s = 0;  // its backward (and recompute) part
  double column_wgrad_s = 0;    // of it, the column-parallel weight gradients (OpsTime)
  double embedding_s = 0;       // first stage
  double output_s = 0;          // last stage
  double output_backward_s = 0;
  // The layer's weight casts (Note [low-precision casts]), counted in the times above: in the
  // forward, and in all passes; cached = the recipe's kernels cast each weight once per step.
  double weight_cast_forward_s = 0, weight_cast_s = 0;
  bool weight_casts_cached = false;
  // The same micro-batch on one GPU (t = c = 1, no SP, e_t = 1): ideal_seconds' kernels. Set by
  // Prepared::micro_times; points into the same node-based map, so it stays valid.
  const MicroTimes* single = nullptr;

  // One layer's time per micro-batch (all passes, or backward + recompute) when a step runs m
  // micro-batches: cached weight casts happen once per step, spread over its micro-batches.
  double layer_per_micro_batch(double m) const {
    return weight_casts_cached ? layer_s - weight_cast_s + weight_cast_forward_s / m : layer_s;
  }
  double backward_per_micro_batch() const {
    return weight_casts_cached ? layer_backward_s - (weight_cast_s - weight_cast_forward_s)
                               : layer_backward_s;
  }
};

// A hash of a tuple of integers (FNV-1a over the fields), for the per-shape caches below.
struct TupleHash {
  template <class... T>
  std::size_t operator()(const std::tuple<T...>& t) const {
    std::size_t h = 1469598103934665603ull;
    std::apply([&](const auto&... v) { ((h = (h ^ std::size_t(v)) * 1099511628211ull), ...); }, t);
    return h;
  }
};

// The kernels expert parallelism does not change, per (b, t, SP, c, recompute, attention): the
// layer of a dense model, or a MoE model's dense leading layer; the end stages' extras.
struct BaseTimes {
  OpsTime plain_layer;
  double embedding_s = 0, output_s = 0, output_backward_s = 0;
};

// Invariants of one request, computed once; operator times are computed once per distinct shape.
struct Prepared {
  const PlanRequest* req = nullptr;
  // evaluate_layout's one layout: validate what the search's layouts satisfy by construction.
  bool check_each = false;
  // Time the pipeline by its schedule (scheduled_makespan) rather than the search's bound: set
  // for the layouts tally prints (Note [priced by the schedule] in plan_stages.cpp).
  bool simulate_pipeline = false;
  double n_state = 0;          // N of the state ledger
  double peak = 0, util = 0;
  double model_flops = 0;      // per step
  double hw_flops[kRecomputePolicies] = {};  // per step, by Recompute
  // Per step, by Recompute: the last stage's FLOPs beyond its layers — the LM head and the
  // multi-token-prediction modules (Note [multi-token prediction], model.cpp).
  double head_flops[kRecomputePolicies] = {};
  double tokens = 0;
  double param_bytes = 0, act_bytes = 0;
  double grad_bytes = 0;       // the state ledger's gradient bytes per parameter
  double expert_share = 0;     // routed experts' share of N (what EP shards)
  double gemm_weight_share = 1;  // linear weights' share of N (low-precision copies)
  double lower_bound_s[kRecomputePolicies] = {};  // step time can't be below this, by Recompute
  ParamCount count;            // the model's itemized parameters (stage shares)
  mutable std::map<std::pair<int, int>, std::pair<int, int>> splits;  // (pp, rc) → (first, last)
  // (pp, v) → Megatron-Core's embedding and loss slots over pp·v virtual stages, or null
  // (slot_split in planner.cpp, Note [uneven virtual stages]).
  mutable std::map<std::pair<int, int>, std::shared_ptr<const std::vector<int>>> slot_splits;
  // A layout's stages as runs (Layout::stage_runs) and their seconds, reused across layouts.
  mutable std::vector<LayerRun> layer_runs;
  mutable std::vector<StageRun> stage_seconds;
  mutable std::unordered_map<std::tuple<std::int64_t, int, bool, int, int, int>, BaseTimes,
                             TupleHash>
      base;
  mutable std::unordered_map<std::tuple<std::int64_t, int, bool, int, int, int, int, int>,
                             MicroTimes, TupleHash>
      micro;
  // One layer's activation bytes per (b, t, SP, c, recompute, attention, e_t): the rest of what
  // layer_activation_bytes_unchecked reads (activations.hpp) is the request's.
  mutable std::unordered_map<std::tuple<std::int64_t, int, bool, int, int, int, int>,
                             LayerActivationBytes, TupleHash>
      layer_activation;

  const LayerActivationBytes& layer_activation_bytes(const ActivationSetup& a) const {
    const auto key = std::make_tuple(a.micro_batch, a.tp, a.sequence_parallel, a.cp,
                                     int(a.recompute), int(a.attention), a.etp);
    if (const auto it = layer_activation.find(key); it != layer_activation.end())
      return it->second;
    return layer_activation.emplace(key, layer_activation_bytes_unchecked(req->model, a))
        .first->second;
  }

  OperatorSetup operator_setup(std::int64_t b, int tp, bool sp, int cp, Recompute rc,
                               Attention att) const {
    const PlanRequest& r = *req;
    return {.seq = r.seq, .micro_batch = b, .tp = tp, .sequence_parallel = sp, .cp = cp,
            .recompute = rc, .recompute_modules = r.recompute_modules, .attention = att,
            .flash_kernel = r.flash_kernel,
            .causal = r.causal, .dropout = r.uses_dropout(),
            .act_bytes = act_bytes, .capacity_factor = r.capacity_factor, .kernels = r.kernels,
            .loss = r.loss, .recipe = r.precision,
            .compute_capability = r.cluster.gpu.compute_capability};
  }

  const BaseTimes& base_times(std::int64_t b, int tp, bool sp, int cp, Recompute rc,
                              Attention att) const {
    const auto key = std::make_tuple(b, tp, sp, cp, int(rc), int(att));
    if (const auto it = base.find(key); it != base.end()) return it->second;
    const PlanRequest& r = *req;
    OperatorSetup os = operator_setup(b, tp, sp, cp, rc, att);
    const GpuSpec& gpu = r.cluster.gpu;
    const OpsTime out = time_ops(output_ops(r.model, os), gpu, r.precision);
    BaseTimes t{.embedding_s = time_ops(embedding_ops(r.model, os), gpu, r.precision).total_s(),
                .output_s = out.total_s(), .output_backward_s = out.backward_s};
    os.dense_layer = r.model.is_moe();
    if (!r.model.is_moe() || r.model.dense_layers > 0)
      t.plain_layer = time_ops(layer_ops(r.model, os), gpu, r.precision);
    return base.emplace(key, t).first->second;
  }

  const MicroTimes& micro_times(std::int64_t b, int tp, bool sp, int cp, Recompute rc,
                                Attention att, int ep = 1, int etp = 0) const {
    const auto key = std::make_tuple(b, tp, sp, cp, int(rc), int(att), ep, etp > 0 ? etp : tp);
    const auto it = micro.find(key);
    if (it != micro.end()) return it->second;
    const PlanRequest& r = *req;
    const BaseTimes& bt = base_times(b, tp, sp, cp, rc, att);
    OpsTime layer = bt.plain_layer;
    // Note [multi-token prediction] (model.cpp): each MTP module's layer, of the model's last
    // kind, runs on the last stage beside the head.
    OpsTime last_kind = bt.plain_layer;
    if (r.model.is_moe()) {  // the MoE layer at this EP, mixed with the dense layers
      OperatorSetup os = operator_setup(b, tp, sp, cp, rc, att);
      os.ep = ep;
      os.etp = etp;
      last_kind = time_ops(layer_ops(r.model, os), r.cluster.gpu, r.precision);
      layer = mix_layer_times(r.model, last_kind, bt.plain_layer);
    }
    const double mtp = double(r.model.mtp_layers);
    MicroTimes t{.layer_s = layer.total_s(),
                 .layer_backward_s = layer.backward_s + layer.recompute_s,
                 .column_wgrad_s = layer.column_wgrad_s,
                 .embedding_s = bt.embedding_s,
                 .output_s = bt.output_s + mtp * last_kind.total_s(),
                 .output_backward_s =
                     bt.output_backward_s + mtp * (last_kind.backward_s + last_kind.recompute_s),
                 .weight_cast_forward_s = layer.weight_cast_forward_s,
                 .weight_cast_s = layer.weight_cast_s,
                 .weight_casts_cached =
                     weight_casts_cached(operator_setup(b, tp, sp, cp, rc, att))};
    MicroTimes& entry = micro.emplace(key, t).first->second;
    const bool is_single = tp == 1 && !sp && cp == 1 && (etp > 0 ? etp : tp) == 1;
    entry.single = is_single ? &entry : &micro_times(b, 1, false, 1, rc, att, ep, 1);
    return entry;
  }
};

// The request's invariants (PlanRequest::validate must have passed).
Prepared prepare(const PlanRequest& r);

// core/src/plan_stages.cpp. Note [planner stages]: interleave 1's (first, last) stage layers for
// (pp, recompute), (0, 0) for the even split. Note [planner virtual stages]: Megatron-Core's
// embedding and loss slots over pp·v virtual stages, or null where pp·v doesn't divide L + 2.
std::pair<int, int> choose_split(const Prepared& P, int pp, Recompute rc);
std::shared_ptr<const std::vector<int>> slot_split(const Prepared& P, int pp, int v);

// One micro-batch's parts of a stage's time, as cost_time (planner.cpp) adds them up.
struct StagePieces {
  double layer_s = 0, layer_backward_s = 0;  // one layer's kernels, all passes; the backward's
  double comm_per_layer_s = 0;               // one layer's exposed TP, CP and EP collectives
  double first_extra_s = 0, edge_first_s = 0;  // the embedding; the first stage's TP edges
  double last_extra_s = 0, last_extra_backward_s = 0, edge_last_s = 0;  // LM head and loss
  double accumulate_s = 0;  // a stage's gradient accumulation, in its backward
  double pp_s = 0;          // a stage's point-to-point sends
  double beta = 2.0 / 3.0;  // the backward's share of the collectives and sends
};
// The makespan of one step's micro-batches by the layout's schedule (core/pipeline.hpp
// simulate_virtual_stage_makespan: 1F1B, or interleaved for v > 1), every virtual stage timed
// from its own layers and extras (Note [priced by the schedule]).
double scheduled_makespan(const Layout& L, int model_layers, const StagePieces& x);

}  // namespace tally::detail
