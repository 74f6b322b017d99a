// The fine-tuning planner (issue 12): `tally plan --method lora|qlora`. Searches micro-batch and
// gradient checkpointing for a LoRA or QLoRA fine-tune on G GPUs, each holding the whole frozen
// backbone (data parallel over the adapters, as PEFT + DDP or the seed's one-GPU program run it),
// and answers "the longest sequence that fits" directly.
//
// Note [fine-tuning step]
// Memory per GPU: the QLoRA/LoRA ledger's static bytes (core/finetune.hpp: backbone, constants,
// adapters with their gradients and optimizer states, one dequantized layer) + the backbone's
// activations (core/activations.hpp; gradient checkpointing = Megatron's full recompute: the layer
// inputs plus the replayed layer) — held under Note [does it fit]. No DDP buckets: the adapters'
// gradients are a few MB.
// Time per micro-batch, on the operator model (core/operators.hpp), what a frozen backbone runs:
//   - every forward kernel, and in backward the activation gradients (dgrad) and the memory-bound
//     kernels' backward — but no weight gradient of a frozen weight (wgrad of qkv, out-proj, the
//     MLP, the router, the LM head) and no embedding backward; the attention core's backward GEMMs
//     (materialised scores and context) stay, they are activation gradients;
//   - the replayed forward under gradient checkpointing;
//   - the adapters: 6 FLOPs per adapter parameter per token (forward, dgrad, wgrad), as GEMMs
//     T × r with inner dimension h (rank-r GEMMs run far below peak, which the roofline's tile
//     and k½ terms charge);
//   - QLoRA: Linear4bit dequantizes each weight to the compute dtype for every matmul that reads
//     it — the forward, the backward's dgrad and the replay: a memory pass reading the 4-bit
//     weight and its constants and writing the compute-dtype copy, per quantized weight per use.
// Per step: m micro-batches, the adapters' optimizer step (fp32 Adam over the adapters) and one
// all-reduce of the adapters' fp32 gradients over the G GPUs (exposed: it is milliseconds).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tally/core/finetune.hpp"
#include "tally/core/operators.hpp"
#include "tally/core/planner.hpp"

namespace tally {

struct FineTuneEval {
  int gpus = 1;
  std::int64_t micro_batch = 1, grad_accum = 1;
  Recompute recompute = Recompute::none;  // none or full (gradient checkpointing)
  FineTuneLedger ledger;
  double activation_bytes = 0;
  FitCheck fit;
  // seconds per optimizer step
  double compute_s = 0;         // m micro-batches of the kernels (incl. adapters, dequantization)
  double dequant_s = 0;         // QLoRA's dequantization passes (inside compute_s)
  double optimizer_s = 0;       // the adapters' optimizer step
  double allreduce_s = 0;       // the adapters' gradients over the GPUs
  double step_s = 0;
  double tokens_per_s = 0;
  std::string describe() const;  // "micro-batch 4 × accum 4, gradient checkpointing"
};

struct FineTunePlan {
  PlanRequest request;
  LoraSetup lora;
  std::vector<FineTuneEval> best;         // fitting, fastest first (up to `top`)
  std::vector<FineTuneEval> near_misses;  // closest to fitting when none fits
  // The longest sequence (a multiple of 64) that fits at micro-batch 1 with gradient
  // checkpointing; 0 when none does (the static bytes alone overflow).
  std::int64_t max_seq = 0;
  std::string convention;
  bool feasible() const { return !best.empty(); }
};

// Whether a kernel of the backbone runs when its weights are frozen (Note [fine-tuning step]).
bool runs_when_frozen(const Op& op);

// The step of one configuration (Note [fine-tuning step]). Throws InvalidInput on bad input.
FineTuneEval evaluate_finetune(const PlanRequest& r, const LoraSetup& s, std::int64_t micro_batch,
                               Recompute recompute);
// Every micro-batch dividing B/G, with and without gradient checkpointing.
FineTunePlan plan_finetune(const PlanRequest& r, const LoraSetup& s, int top = 5);

}  // namespace tally
