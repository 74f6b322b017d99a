// The engine's GPT on a calibrated host: one pipeline stage's kernels per micro-batch and its
// optimizer step, timed by the operator model (issue 10: the engine's TP/PP runs predicted by the
// same core code as the planner's; `tally run 3d --calibration`).
//
// Note [host GPT step]
// The stage's kernels are core's operator inventory (layer_ops, embedding_ops, output_ops) for the
// engine's GPT (engine/runtime/gpt_model.cpp, tp_model.cpp): fp32 (e = 4), materialised attention
// over all T×T scores, no dropout, eager libtorch kernels (Kernels::eager: LayerNorm and GeLU
// single kernels, the attention output's transpose copy) and PyTorch's cross-entropy on the
// logits (Loss::eager) — plus the kernels the engine's own code adds, each from its lines:
//   q, k copies   torch::matmul(q, kᵀ) on (B, a', T, d) transposed views reshapes both into
//                 contiguous (B·a', T, d) batches for bmm: 2e per element of each, forward (and
//                 in every replay of the forward)
//   v copy        torch::matmul(probs, v): the same for v
//   scale, mask   `scores * (1/√d)` and `masked_fill(mask, −∞)` are kernels of their own over
//                 the B·a'·T² scores: 2e per score forward; their backward kernels (the gradient
//                 scaled, then masked) 2e each
//   bias kernels  the row-parallel linears add their bias after the reduction, `(r + b)`: 2e per
//                 element of the T_n × h output, forward; every bias's gradient is a sum over the
//                 tokens (addmm's backward for the column-parallel q/k/v and MLP up: T × 3h/t and
//                 T × f/t; the row-parallel two: T_n × h each): e per element read
// A replay (full recompute: the block's forward again) repeats the forward kernels, extras
// included; the selective policies replay the softmax chain (scale and mask with it). With
// context parallelism the engine's ring attention replaces the materialised attention core and
// its scale and mask kernels (Note [engine ring attention]).
// Per micro-batch: forward = the stage's layers + the embedding (first stage) + the head and loss
// (last stage); backward likewise (with the replays). The optimizer is the engine's Adam
// (Note [host step model] in mlp_step.hpp: 20 streams per element, one kernel per 2^20-element
// chunk) over the rank's own parameters N_r (its shard under ZeRO ≥ 1), as one flat buffer
// (engine/runtime/zero_flat.hpp).
// Contention: with k·t > c (ranks × threads over cores) every kernel time stretches by k·t/c, as
// in Note [host step model]; the α–β collectives were calibrated at the same k.
// What is not counted: the TP, CP, PP and DP communication (the α–β items of core/comm.hpp, timed
// beside this), the gradient-buffer passes of the flat DP buffers, and the pipeline's bubble
// (core/pipeline.hpp on these times).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tally/core/comm.hpp"
#include "tally/core/context_parallel.hpp"
#include "tally/core/hardware.hpp"
#include "tally/core/model.hpp"
#include "tally/core/operators.hpp"
#include "tally/core/types.hpp"

namespace tally {

struct GptStageSetup {
  ModelSpec model;                    // the engine's GPT (engine::gpt_model_spec)
  std::int64_t seq = 1;               // T, the whole sequence
  std::int64_t micro_batch = 1;       // B
  int tp = 1;                         // t
  bool sequence_parallel = false;
  int cp = 1;                         // c
  Recompute recompute = Recompute::none;
  int stage_layers = 1;               // this stage's layers (all its chunks)
  bool first_stage = true, last_stage = true;  // embedding / head and loss
  int micro_batches = 1;              // M per step
  double own_params = 0;              // N_r: the elements this rank's Adam updates
  int ranks = 1, threads_per_rank = 1, cores = 1;  // k, t, c (contention)
  void validate() const;              // InvalidInput naming the field
};

struct GptStageTime {
  double forward_s = 0, backward_s = 0;  // per micro-batch (backward includes any replay)
  double compute_s = 0;                  // M · (forward + backward)
  double optimizer_s = 0;
  double contention = 1;                 // max(1, k·t/c), already applied to the times above
  std::string convention() const;        // one line: what is counted
};

// The engine's extra kernels of one layer (Note [host GPT step]), forward and backward (and their
// replays under `s.recompute`), appended to `ops`.
void add_engine_gpt_kernels(const ModelSpec& m, const OperatorSetup& s, std::vector<Op>& ops);

// Note [engine ring attention]
// Under CP (c > 1) the engine's GPT computes attention with its ring (engine/runtime/
// ring_attention.cpp, Note [ring attention]), not one materialised T/c × T score matrix: each
// block pair (a query chunk of n = T/(2c) tokens against a key chunk) is a pair of small batched
// GEMMs and a dozen elementwise kernels of the online softmax, and the backward recomputes the
// pair's scores (flash attention's way) before five GEMMs. Counted from the code, per micro-batch
// and layer, with e = 4, b·a' query-head batches, E = b·a'·n² scores of a pair, R = b·a'·n rows
// of a query chunk, KV = b·g'·2n·d elements of this rank's K (or V), bytes read + written:
//   forward, once   state fills e(4R + 2Rd) (m, ℓ, acc of both chunks), K,V stacked 4e·KV; the
//                   output and log-sum-exp normalised and concatenated, 8eRd + 16eR
//   forward, each   QKᵀ GEMM (n, n, d) and P·V (n, d, n), batch b·a'; scale 2eE; the diagonal
//   of the P pairs  pairs' mask 2eE; row max (values and int64 indices) eE + (e+8)R; exp(s − m)
//                   4eE + eR; row sum eE + eR; the running m, ℓ 14eR; acc rescaled 2eRd + eR
//                   and accumulated 3eRd
//   backward, once  D = rowsum(dO∘O) 8eRd + 2eR;
//                   dQ and the two dK,dV buffers zeroed e(2Rd + 4KV); K,V stacked 4e·KV; the
//                   visiting dK,dV added home 6e·KV
//   backward, each  QKᵀ again, dP = dO·Vᵀ (n, n, d), dQ += dS·K, dK += dSᵀ·Q, dV += Pᵀ·dO (n,
//   pair            d, n); scale (and the diagonal's mask) 2eE each; exp(s − lse) 4eE + eR;
//                   dS = P∘(dP − D) 5eE + eR; the three accumulations 3e(Rd + KV)
// and under GQA (a' > g') K and V repeated to the query heads per pair, dK, dV summed back; the
// GPT's autograd wrapper adds a copy making the output gradient contiguous, 4eRd. The
// engine's 3-D runs split the sequence zigzag: P = 2c + 1 pairs, 2 of them diagonal, on every
// rank (cp_causal_block_pairs); full recompute replays the forward kernels; the selective
// policies replay none of the ring's (the engine replays its softmax only without CP), nor op
// SAC's K projection. Every GEMM is its own call, so each pays the host's GEMM overhead — the
// cost of small blocks the materialised count (one (T/c) × T matrix: 6 GEMMs, the masked
// blocks included) left out.
struct RingBlocks {
  std::int64_t pairs = 0;     // P: block pairs this rank computes in one forward
  std::int64_t diagonal = 0;  // of them, masked below the diagonal
};
RingBlocks ring_blocks(CpBalance balance, int cp, int rank);
// The ring's kernels of one layer on one micro-batch (ring_attention_forward and
// ring_attention_backward, nothing around them), forward and backward, appended to `ops`.
// m: heads a, kv_heads g and qk_dim d; s: seq, micro_batch, tp, cp (seq divisible by 2·cp),
// act_bytes.
void add_engine_ring_attention(const ModelSpec& m, const OperatorSetup& s,
                               const RingBlocks& blocks, std::vector<Op>& ops);
// Those kernels timed on a calibrated host, each stretched by `contention` (>= 1; Note [host GPT
// step]): what `tally run cp --calibration` prints beside each rank's measured computation.
struct RingAttentionTime {
  double forward_s = 0, backward_s = 0;
};
RingAttentionTime predict_ring_attention(const ModelSpec& m, const OperatorSetup& s,
                                         const RingBlocks& blocks, const ClusterSpec& host,
                                         double contention = 1);

// The OperatorSetup the engine's GPT runs (fp32, materialised, no dropout, eager).
OperatorSetup engine_gpt_setup(const GptStageSetup& s);
// One stage's kernels on one micro-batch: layer_ops + the engine's kernels for each of its
// layers, the embedding on the first stage, the head and loss on the last.
std::vector<Op> gpt_stage_ops(const GptStageSetup& s);
GptStageTime predict_gpt_stage(const GptStageSetup& s, const ClusterSpec& host);

// Note [engine SP edges]
// Under sequence parallelism the engine's GPT (engine/runtime/tp_model.hpp, Note [conjugate
// operators]) keeps the embedding, ln_f and the tied LM head whole on every TP rank, so beside the
// layers' collectives (core's tp and tp_regather items) its TP group moves, per micro-batch, the
// first stage's split of the embedding output to the sequence shard — its backward all-gathers
// the shards' gradients — and the last stage's all-gather of the last block's output before ln_f
// (its backward keeps this rank's part): one all-gather of S = B·(T/c)·C·4 bytes each, S(t−1)/t
// sent per rank; and one all-reduce of the sequence-sharded parameters' gradients (ln_1 and ln_2
// weights and biases, the out-proj and W2 biases: 6C per layer of the stage, fp32, flattened into
// one call by TpGpt::sp_reduce_grads), 2·S'(t−1)/t, once per step — or after every micro-batch's
// backward (`per_micro_batch`) where the DP gradients are reduced per micro-batch (ZeRO-2/3
// without PP, as core's dp_grad item counts them), so that reduction sees the summed gradients.
// Megatron differs at the edges (its vocabulary-parallel embedding reduce-scatters, its exit
// gather reduce-scatters in backward) and all-reduces the final norm's gradients too; this is the
// engine's. Without SP, or at t = 1, nothing.
struct GptSpTraffic {
  TrafficItem edges;  // the edge all-gathers (TrafficKind::tp)
  TrafficItem grads;  // the sequence-sharded gradients' all-reduce (TrafficKind::tp)
};
GptSpTraffic engine_sp_traffic(const GptStageSetup& s, bool per_micro_batch = false);

// Note [predicted 3-D step]
// One rank's step on the calibrated host: M micro-batches of its stage's forward and backward
// kernels (predict_gpt_stage), each with its share of the TP and CP collectives (their α–β time
// split between forward and backward as the kernels are); the schedule's bubble (P−1)(t_f + t_b)/v
// (core/pipeline.hpp) on those t_f, t_b; the PP sends (Gloo sends block: on the critical path);
// DP/ZeRO traffic (after the backward); Adam. No overlap anywhere (a CPU rank runs its sends and
// kernels on one thread): under SP the TP time includes core's tp_regather item, which Megatron
// overlaps with the input-gradient GEMM and the engine issues blocking, and engine_sp_traffic's
// edges and gradient all-reduce (Note [engine SP edges]). The run's step is the slowest rank's
// (`tally run 3d` takes the maximum).
struct GptStepComm {
  double tp_cp_s = 0;   // the step's TP + CP collectives (α–β), all micro-batches
  double pp_send_s = 0;
  double dp_s = 0;      // DP/ZeRO gradient reduction and parameter gathers
  int stages = 1, interleave = 1;  // P, v
};
struct GptStepTime {
  double forward_s = 0, backward_s = 0;  // t_f, t_b per micro-batch, collectives included
  double bubble_s = 0;
  double step_s = 0;  // M·(t_f + t_b) + bubble + sends + DP + Adam
};
GptStepTime predict_gpt_step(const GptStageTime& stage, int micro_batches, const GptStepComm& c);

}  // namespace tally
