// The planner's per-request invariants (plan_prepared.hpp).
#include "plan_prepared.hpp"

#include <algorithm>

#include "tally/core/compute.hpp"
#include "tally/core/model_states.hpp"
#include "tally/core/roofline.hpp"

namespace tally::detail {

Prepared prepare(const PlanRequest& r) {
  Prepared p;
  p.req = &r;
  p.n_state = state_params(r.model);
  p.peak = r.cluster.gpu.peak_flops(r.precision);
  p.util = r.cluster.mfu;
  p.tokens = double(r.global_batch) * double(r.seq);
  p.model_flops = flops_per_token(r.model, r.seq, Recompute::none) * p.tokens;
  for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full,
                       Recompute::save_matmuls, Recompute::op_sac})
    if (recompute_applies(rc, r.model)) {
      p.hw_flops[int(rc)] = flops_per_token(r.model, r.seq, rc) * p.tokens;
      p.head_flops[int(rc)] =
          (lm_head_flops_per_token(r.model) + mtp_flops_per_token(r.model, r.seq, rc)) * p.tokens;
    }
  p.count = count_params(r.model);
  p.param_bytes = dtype_bytes(r.precision);
  p.act_bytes = dtype_bytes(r.precision);
  p.grad_bytes = state_bytes_per_param(r.precision, r.optimizer).grads;
  p.expert_share = routed_expert_share(r.model);
  p.gemm_weight_share = gemm_weight_share(r.model);
  const double G = double(r.gpus);
  for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full,
                       Recompute::save_matmuls, Recompute::op_sac}) {
    if (!recompute_applies(rc, r.model)) continue;  // never searched (plan() skips it)
    if (r.time_model == TimeModel::utilisation) {
      p.lower_bound_s[int(rc)] = p.hw_flops[int(rc)] / (G * p.peak * p.util);
      continue;
    }
    // Note [planner pruning] cut 2 under the operator model: the GEMM and attention FLOPs every
    // layout executes (the same total whatever b, t, c split them), each at no more than the
    // GPU's best kernel fraction; the slowest GPU is at least the average one.
    const KernelPerf& k = r.cluster.gpu.kernels;
    double ceiling = std::max({k.gemm_fraction, k.attention_forward_fraction,
                               k.attention_backward_fraction});
    for (const auto* table : {&k.attention_table, &k.cudnn_attention_table})
      for (const auto& a : *table) ceiling = std::max({ceiling, a.forward, a.backward});
    double per_sequence = 1e300;
    // A MoE model's expert GEMMs pad the fewest rows when each rank holds one expert (ep = E).
    for (Attention att : {Attention::flash, Attention::materialized}) {
      const OperatorSetup os{.seq = r.seq, .micro_batch = 1, .recompute = rc, .attention = att,
                             .causal = r.causal, .dropout = r.uses_dropout(), .act_bytes = p.act_bytes,
                             .ep = r.model.is_moe() ? int(r.model.experts) : 1,
                             .capacity_factor = r.capacity_factor};
      const double layer_flops =
          average_layer_time(r.model, os, r.cluster.gpu, r.precision).flops;  // memory kernels carry none
      double out_flops = 0;
      for (const Op& op : output_ops(r.model, os))
        if (op.kind != OpKind::memory) out_flops += op.flops;
      per_sequence = std::min(per_sequence, layer_flops * double(r.model.layers) + out_flops);
    }
    p.lower_bound_s[int(rc)] =
        per_sequence * double(r.global_batch) / (G * p.peak * ceiling);
  }
  return p;
}

}  // namespace tally::detail
