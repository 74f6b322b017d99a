// The model-state ledger (模型状态账): parameters, gradients, optimizer moments m and v, and fp32
// master weights, per GPU, under ZeRO sharding.
//
// Bytes per parameter (seed §A1 table; Rajbhandari et al. 2020 "ZeRO", §3.1 "K = 12"):
//                     params grads  m    v   master  total
//   fp32 Adam            4     4    4    4     0      16
//   mixed Adam           2     2    4    4     4      16   (bf16/fp16 + fp32 master)
//   mixed 8-bit Adam     2     2    1    1     4      10   (Dettmers et al. 2022; block-wise
//                                                          quantisation constants not counted)
//   SGD                  p     p    0    0   0|4           momentum adds m = 4 (fp32)
//   fp8 / mxfp8 / nvfp4 recipes (types.hpp Note [low precision]): bf16 mixed Adam plus the linear
//   weights' low-precision copies, 2, 2.0625 and 1.125 B per weight — fp8 1 B where the GPU
//   takes fp8 GEMMs in any layout (Note [fp8 operand layouts]: compute capability 10.x) — (the
//   `low_precision` item, on gemm_weight_share of the parameters; sharded with the parameters
//   under ZeRO-3); fp8's
//   delayed scaling also keeps per GEMM 5 fp32 amax histories and scales (`scaling_metadata`,
//   delayed_scaling_bytes_per_gemm × the GPU's GEMMs; module buffers, never sharded). With fp8
//   parameters (Note [fp8 parameters] in model_states.cpp) the linear weights have no 16-bit copy:
//   params = 2 B × (1 − gemm_weight_share).
// ZeRO over k ranks (ZeRO §5): stage 1 shards m, v, master; stage 2 also grads; stage 3 also params.
// Expert parallelism over ep ranks with expert TP e_t (Note [expert parallelism],
// core/src/comm.cpp; Note [expert rank groups], parallel_groups.hpp; Megatron-Core): the routed
// experts' share e of the parameters is split over e_t·ep instead of TP's t, and ZeRO shards it
// over the expert-data-parallel group k·t/(e_t·ep); the rest as above. With N the GPU's share under
// TP (N_model/(t·p)), per GPU: N(1−e)/k' + N·e·t/(e_t·ep·k'') per item, k' = k and k'' =
// k·t/(e_t·ep) where the stage shards the item, else 1 (e_t = t: N·e/(ep·k''), k'' = k/ep).

#pragma once

#include <string>

#include "tally/core/types.hpp"

namespace tally {

struct StateSetup {
  Precision precision = Precision::bf16;
  Optimizer optimizer = Optimizer::adam;
  int zero_stage = 0;   // 0..3
  int shard_degree = 1; // k: the ZeRO data-parallel group size (ignored for stage 0)
  int ep = 1;           // expert-parallel degree; e_t·ep must divide k·t
  int tp = 1;           // t: the TP split already applied to the parameters given
  int etp = 0;          // e_t: expert TP (0 = tp, Megatron-Core's default)
  double expert_share = 0;  // e: routed experts' share of the parameters (routed_expert_share)
  // Share of the parameters that are transformer-layer linear weights, which a low-precision
  // recipe copies into its format (gemm_weight_share); 1 when the model is known only by size.
  double gemm_weight_share = 1;
  // fp8 delayed scaling: the GEMMs whose scaling metadata this GPU holds (low_precision_gemms,
  // operators.hpp; 0 = not counted and not named, e.g. a model known only by size, or the fp8
  // run's per-tensor current scaling, which keeps no history) and TE's amax history length.
  double scaled_gemms = 0;
  int amax_history = kTeAmaxHistory;
  // The GPU's compute capability (GpuSpec::compute_capability): whether per-tensor fp8 keeps the
  // weight's transpose (Note [fp8 operand layouts]); 0 = no GPU given: kept, as on Hopper.
  int compute_capability = 0;
  // fp8 parameters (Note [fp8 parameters] in model_states.cpp: Megatron-Core --fp8-param-gather,
  // Transformer Engine's fp8_model_init): the linear weights live only as their low-precision
  // copies, so the params item keeps just the other parameters' 16-bit bytes. fp8 and mxfp8 only.
  bool fp8_param_gather = false;
  int expert_tp() const { return etp > 0 ? etp : tp; }
  // k·t/(e_t·ep): the ranks over which ZeRO shards the routed experts.
  int expert_shard_degree() const { return shard_degree * tp / (expert_tp() * ep); }
  void validate() const;
};

// Bytes (or bytes per parameter) of each item; one struct for both so items never drift apart.
struct StateItems {
  double params = 0, grads = 0, m = 0, v = 0, master = 0;
  double low_precision = 0;  // fp8 / mxfp8 / nvfp4 weight copies (Note [low precision])
  double scaling_metadata = 0;  // fp8 delayed scaling's amax histories and scales (per GPU only)
  double total() const {
    return params + grads + m + v + master + low_precision + scaling_metadata;
  }
};

struct ModelStateResult {
  StateItems per_param;        // bytes per parameter before sharding
  StateItems bytes;            // bytes per GPU after sharding
  StateSetup setup;
  double n_params = 0;
  double local_params = 0;    // held before ZeRO-3: N(1−e) + N·e·t/(e_t·ep)
  double updated_params = 0;  // the optimizer's shard: local_params split as m and v are

  // e.g. "bf16 mixed | adam fp32 m,v | master fp32 counted | ZeRO-2 k=8"
  std::string convention() const;
};

// Bytes per parameter of each item (unsharded) for a precision and optimizer; the low-precision
// copies at the GPU's fp8 operand layouts (Note [fp8 operand layouts]; TN only unless given).
StateItems state_bytes_per_param(Precision p, Optimizer o,
                                 Fp8GemmLayouts layouts = Fp8GemmLayouts::tn_only);

// The per-GPU model-state ledger for n_params parameters. Throws InvalidInput on bad setup.
ModelStateResult model_states(double n_params, const StateSetup& setup);

// The same label with the report unit appended: "... | GB (1e9 B)".
std::string convention_with_unit(const std::string& convention, SizeUnit u);

}  // namespace tally
