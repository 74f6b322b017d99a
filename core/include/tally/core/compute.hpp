// The compute ledger (计算账): training FLOPs per token and per step, and the time they take.
//
// Legend: N = parameters a token passes through (MoE: active), L = layers, h = hidden size,
// s = sequence length, G = GPUs, peak = dense FLOP/s per GPU, u = utilisation (fraction of peak).
//
// Per token, forward + backward (Kaplan et al. 2020 §2.1; Narayanan et al. 2021 eq. 3;
// Chowdhery et al. 2022 "PaLM" appendix B):
//   matmuls with weights   6N       (forward 2N, backward 4N; the LM head is inside N)
//   attention QKᵀ and AV   12·L·h·s (forward 4·L·h·s, backward 8·L·h·s; counted unmasked, as
//                                    Megatron-LM and PaLM do, although causal kernels skip half);
//                                    h there is a·(d_qk + d_v)/2 with MLA or a stated head_dim;
//                                    a sliding-window layer's s is its window, min(w, s)
// Recompute (Korthikanti et al. 2022 §5): full replays the forward, +2N + 4·L·h·s; selective
// replays only the attention core, +4·L·h·s.
//
// Note [model vs hardware FLOPs]: model FLOPs exclude recompute and define MFU (PaLM appendix B);
// hardware FLOPs include it and are what the GPU executes, so time is hardware FLOPs over the
// achieved rate G·peak·u, and the MFU that results is u·model/hardware.
#pragma once

#include <cstdint>
#include <string>

#include "tally/core/model.hpp"
#include "tally/core/types.hpp"

namespace tally {

// N used by the compute ledger: count_params(m).active(), scaled by nominal/counted when the model
// states a round total (the seed's 7e9), so compute and the state ledger agree on N.
double compute_params(const ModelSpec& m);

// Training FLOPs (forward + backward [+ recompute]) per token at sequence length seq.
// params_only models: 6N (+2N under full recompute; selective adds nothing known).
double flops_per_token(const ModelSpec& m, std::int64_t seq, Recompute r);

// FLOPs per token of the output projection (LM head) alone, forward + backward: 6·V·h. It is
// inside 6N, but a pipeline puts all of it on the last stage, which then bounds the step
// (Narayanan et al. 2021 §3.2 balance discussion). 0 for params_only models.
double lm_head_flops_per_token(const ModelSpec& m);

// FLOPs per token of the multi-token-prediction modules (Note [multi-token prediction] in
// model.cpp), forward + backward [+ recompute]: their layers, projections and their pass through
// the shared head — inside flops_per_token, and all on the last pipeline stage. 0 without them.
double mtp_flops_per_token(const ModelSpec& m, std::int64_t seq, Recompute r);

struct ComputeSetup {
  ModelSpec model;
  std::int64_t seq_len = 0;            // s
  std::int64_t global_batch = 0;       // sequences per optimizer step
  Recompute recompute = Recompute::none;
  int gpus = 1;                        // G
  double peak_flops = 0;               // per GPU, dense, for the training dtype (FLOP/s)
  double utilisation = 0.5;            // u: achieved fraction of peak on hardware FLOPs
  void validate() const;               // throws InvalidInput naming the field
};

struct ComputeResult {
  ComputeSetup setup;
  double tokens_per_step = 0;
  double params_per_token = 0;         // N used (active)
  double model_flops_per_token = 0;    // no recompute: the MFU numerator
  double hardware_flops_per_token = 0; // with recompute: what runs
  double model_flops = 0;              // per step
  double hardware_flops = 0;           // per step
  double seconds = 0;                  // hardware_flops / (G·peak·u)
  double mfu = 0;                      // model_flops / (seconds·G·peak) = u·model/hardware
  double tokens_per_s = 0;
  std::string convention() const;
};

ComputeResult step_compute(const ComputeSetup& setup);

}  // namespace tally
