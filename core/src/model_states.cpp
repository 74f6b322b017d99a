#include "tally/core/model_states.hpp"

#include <cmath>
#include <cstdint>
#include <string>

namespace tally {

void StateSetup::validate() const {
  if (zero_stage < 0 || zero_stage > 3)
    throw InvalidInput("zero = " + std::to_string(zero_stage) + ": allowed 0, 1, 2, 3");
  if (shard_degree < 1)
    throw InvalidInput("shard degree k = " + std::to_string(shard_degree) + ": must be >= 1");
  if (tp < 1 || etp < 0)
    throw InvalidInput("tp = " + std::to_string(tp) + ", etp = " + std::to_string(etp) +
                       ": tp must be >= 1, etp >= 1 (0 = tp)");
  if (ep < 1 || (std::int64_t(shard_degree) * tp) % (std::int64_t(expert_tp()) * ep) != 0)
    throw InvalidInput("ep = " + std::to_string(ep) + " x etp = " + std::to_string(expert_tp()) +
                       ": must divide the data-parallel degree x tp = " +
                       std::to_string(shard_degree) + " x " + std::to_string(tp) +
                       " (the expert ranks are a regrouping of the TP x DP ranks)");
  if (!(std::isfinite(scaled_gemms) && scaled_gemms >= 0))
    throw InvalidInput("scaled GEMMs = " + format_number(scaled_gemms) + ": must be >= 0");
  if (compute_capability < 0)
    throw InvalidInput("compute capability = " + std::to_string(compute_capability) +
                       ": must be >= 0 (10 * major + minor; 0 = not known)");
  if (amax_history < 1)
    throw InvalidInput("--amax-history = " + std::to_string(amax_history) + ": must be >= 1");
  if (!(gemm_weight_share >= 0 && gemm_weight_share <= 1))
    throw InvalidInput("gemm weight share = " + format_number(gemm_weight_share) +
                       ": must be in [0, 1]");
  if (fp8_param_gather) require_fp8_param_gather(precision);
  if ((ep > 1 || expert_tp() != tp) && !(expert_share > 0 && expert_share < 1))
    throw InvalidInput("ep = " + std::to_string(ep) + ", etp = " + std::to_string(expert_tp()) +
                       ": needs a mixture-of-experts model (routed experts to shard)");
}

StateItems state_bytes_per_param(Precision p, Optimizer o, Fp8GemmLayouts layouts) {
  StateItems b;
  b.params = b.grads = dtype_bytes(p);
  b.master = p == Precision::fp32 ? 0.0 : 4.0;  // fp32 parameters are their own master copy
  switch (o) {
    case Optimizer::adam:
    case Optimizer::adamw: b.m = b.v = 4.0; break;
    case Optimizer::adam8bit: b.m = b.v = 1.0; break;
    case Optimizer::sgd: b.m = b.v = 0.0; break;
    case Optimizer::sgd_momentum: b.m = 4.0; b.v = 0.0; break;
  }
  b.low_precision = low_precision_copy_bytes(p, layouts);
  return b;
}

// Note [fp8 parameters]
// Megatron-Core's --fp8-param-gather (Megatron-Bridge MixedPrecisionConfig.fp8_param_gather, which
// its bf16_with_fp8_current_scaling_mixed and bf16_with_mxfp8_mixed recipes set True and
// bf16_with_nvfp4_mixed False: src/megatron/bridge/training/mixed_precision.py at c8101293) builds
// the model under Transformer Engine's fp8_model_init: each TE linear's weight *is* its
// low-precision tensor (Float8Tensor per-tensor, MXFP8Tensor with row- and column-wise data), so
// no bf16 copy of a linear weight is held; norms, embeddings, the output layer and the router stay
// bf16. The fp32 master weights, Adam moments and the bf16 gradient buffer are unchanged. Per
// parameter: params 2 B × (1 − gemm_weight_share), the low-precision item as before. The
// distributed optimizer then all-gathers the updated weights in their format (Note [fp8
// all-gather] in comm.cpp): per-tensor fp8 gathers 1 B per linear weight element, routed experts
// included (TE's grouped linears are built under the same fp8_model_init); MXFP8 gathers bf16
// into the gradient buffer and casts after (reuse_grad_buf_for_mxfp8_param_ag, which Megatron-
// Bridge requires with it: megatron/core/distributed/param_and_grad_buffer.py, "param buffer is
// not mapped to model params for MXFP8 case ... cast from bf16 to MXFP8 during copy"), so its
// bytes on the wire stay 2 B and the gather buffer is the gradient buffer, no new item.
// Not modelled: Megatron-FSDP's keep_fp8_transpose_cache = False (Hopper per-tensor fp8 under
// ZeRO-3 re-transposes instead of keeping the transpose; tally keeps it).
ModelStateResult model_states(double n_params, const StateSetup& setup) {
  if (!(n_params > 0))
    throw InvalidInput("params = " + std::to_string(n_params) + ": must be positive");
  setup.validate();
  ModelStateResult r;
  r.setup = setup;
  r.n_params = n_params;
  r.per_param = state_bytes_per_param(setup.precision, setup.optimizer,
                                      fp8_gemm_layouts(setup.compute_capability));

  const double k = setup.zero_stage == 0 ? 1.0 : double(setup.shard_degree);
  const double k_expert = setup.zero_stage == 0 ? 1.0 : double(setup.expert_shard_degree());
  const bool apart = setup.ep > 1 || setup.expert_tp() != setup.tp;  // experts split otherwise
  const double e = apart ? setup.expert_share : 0.0;
  const double dense = n_params * (1 - e);
  const double expert = n_params * e * setup.tp / (double(setup.expert_tp()) * setup.ep);
  const int s = setup.zero_stage;
  const auto shard = [&](double per_param, bool sharded) {
    return per_param * (sharded ? dense / k + expert / k_expert : dense + expert);
  };
  r.local_params = dense + expert;
  r.updated_params = s >= 1 ? dense / k + expert / k_expert : dense + expert;
  // Note [fp8 parameters]: the linear weights' 16-bit bytes are not held.
  r.bytes.params = shard(r.per_param.params, s >= 3) *
                   (setup.fp8_param_gather ? 1 - setup.gemm_weight_share : 1.0);
  r.bytes.grads = shard(r.per_param.grads, s >= 2);
  r.bytes.m = shard(r.per_param.m, s >= 1);
  r.bytes.v = shard(r.per_param.v, s >= 1);
  r.bytes.master = shard(r.per_param.master, s >= 1);
  r.bytes.low_precision = shard(r.per_param.low_precision, s >= 3) * setup.gemm_weight_share;
  if (setup.precision == Precision::fp8)
    r.bytes.scaling_metadata =
        setup.scaled_gemms * delayed_scaling_bytes_per_gemm(setup.amax_history);
  return r;
}

std::string ModelStateResult::convention() const {
  std::string c;
  if (setup.precision == Precision::fp32)
    c = "fp32";
  else if (is_low_precision(setup.precision))
    c = "bf16 mixed + " + std::string(to_string(setup.precision)) + " GEMMs";
  else
    c = std::string(to_string(setup.precision)) + " mixed";
  c += " | ";
  c += to_string(setup.optimizer);
  if (per_param.m > 0) {
    c += per_param.m == 1.0 ? " 8-bit m" : " fp32 m";
    if (per_param.v > 0) c += ",v";
  } else {
    c += " no moments";
  }
  c += " | master ";
  c += per_param.master > 0 ? "fp32 counted" : "none (fp32 params are the master)";
  if (per_param.low_precision > 0)
    c += std::string(" | ") +
         (setup.precision == Precision::fp8     ? "fp8 per-tensor (TE delayed scaling)"
          : setup.precision == Precision::mxfp8 ? "MXFP8 (e8m0 scale per 32)"
                                                : "NVFP4 (e4m3 scale per 16)") +
         " copies of the linear weights, " + format_number(per_param.low_precision) +
         " B each: " + low_precision_copies_label(setup.precision, setup.compute_capability);
  if (setup.fp8_param_gather)
    c += " | fp8 parameters (Megatron-Core --fp8-param-gather): the linear weights held only as "
         "these copies, no bf16 copy";
  if (setup.precision == Precision::fp8 && setup.scaled_gemms > 0)  // 0: not asked, not named
    c += " | delayed-scaling metadata: " + format_number(setup.scaled_gemms) +
         " GEMMs x 5 tensors x fp32 (amax history " + std::to_string(setup.amax_history) +
         " + scale)";
  c += " | ";
  if (setup.zero_stage == 0)
    c += "no sharding (ZeRO-0)";
  else
    c += "ZeRO-" + std::to_string(setup.zero_stage) + " k=" + std::to_string(setup.shard_degree);
  const int etp = setup.expert_tp();
  if (setup.ep > 1 || etp != setup.tp)
    c += " | EP " + std::to_string(setup.ep) +
         (etp != setup.tp ? " x ETP " + std::to_string(etp) + " (TP " +
                                std::to_string(setup.tp) + ")"
                          : std::string()) +
         ": routed experts (" + format_number(100 * setup.expert_share) +
         " % of params) split over " + (etp != setup.tp ? "EP x ETP" : "EP") +
         (setup.zero_stage > 0
              ? ", sharded over expert DP k*tp/(etp*ep)=" +
                    std::to_string(setup.expert_shard_degree())
              : std::string());
  return c;
}

std::string convention_with_unit(const std::string& convention, SizeUnit u) {
  return convention + (u == SizeUnit::GB ? " | GB (1e9 B)" : " | GiB (2^30 B)");
}

}  // namespace tally
