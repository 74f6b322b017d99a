// The engine's GPT decoder (gpt_model.hpp) split by Megatron-LM's tensor parallelism over a TP
// group of t ranks (internal: includes torch). Shoeybi et al. 2019 §3; with sequence parallelism
// Korthikanti et al. 2022 §4.2.2.
//
// Legend: B = micro-batch, T = sequence, C = hidden, a = heads, t = TP ranks, r = this rank's
// index in the TP group; C/t and a/t are this rank's share of the hidden width and heads.
//
// Per block, rank r holds (tp_shards() cuts them from the single-process model's parameters, so a
// TP model starts as exact slices of a Gpt built from the same seed):
//   ln_1, ln_2                 replicated (C)
//   QKV   column-parallel      the q, k and v rows of heads [r·a/t, (r+1)·a/t): (3C/t, C), (3C/t)
//   out-proj  row-parallel     the columns of those heads: (C, C/t); bias (C) replicated, added once
//                              after the reduction
//   MLP W1 column-parallel     rows [r·4C/t, (r+1)·4C/t): (4C/t, C), (4C/t)
//   MLP W2 row-parallel        those columns: (C, 4C/t); bias (C) replicated
// Embedding, positions, ln_f and the tied LM head are replicated: every TP rank computes them
// identically (Megatron splits the vocabulary too; tally keeps it whole, so the layer collectives
// below are the only TP traffic without SP).
//
// Note [conjugate operators]
// Without SP, x (B, T, C) is whole on every rank. f before each column-parallel block: identity
// forward, all-reduce of the input gradient backward (each rank's heads contribute a part of it).
// g after each row-parallel block: all-reduce forward (the partial products of the split inner
// dimension), identity backward. Per layer per micro-batch: 2 all-reduces forward (g) and 2
// backward (f) of B·T·C elements — core's TP ledger (comm.hpp step_traffic).
// With SP, x is the sequence shard (B, T/t, C) of rank r (positions [r·T/t, (r+1)·T/t)); LayerNorm,
// residual adds and biases run on it. ḡ before each column-parallel block: all-gather along the
// sequence forward, reduce-scatter backward; g̅ after each row-parallel block: reduce-scatter
// forward, all-gather backward. Same bytes as the all-reduces, twice the calls. The sequence-
// sharded parameters (ln_1, ln_2, the row-parallel biases) get partial gradients: sp_reduce_grads()
// sums them over the group once per step, as Megatron does. At the model's edges the embedding
// output is split to the shard (backward: all-gather) and the last block's output all-gathered
// before ln_f (backward: split).
// Collectives run over the sequence-major layout (T, B, C), so a rank's chunk is its shard.
//
// Note [SP re-gather]
// A column-parallel linear under SP needs the gathered input (B, T, C) for its weight gradient.
// Megatron-LM (LinearWithGradAccumulationAndAsyncCommunication, sequence_parallel=True) keeps only
// the shard (B, T/t, C) and all-gathers it again in backward, overlapped with the input-gradient
// GEMM; Korthikanti 2022 §4.2.2's 34/t·sbh counts the shard, and so does core's activation
// ledger. TpGpt does the same: per layer two extra all-gathers of S in backward, on their own site
// (TpGpt::regather_sites): core's tp_regather item (comm.cpp Note [SP re-gather]), apart from the
// TP item, which holds the collectives on the critical path.
//
// Note [TP with context parallelism]
// With a CP group of c ranks (tally run 3d --cp), the rank holds s/c of every sequence: the two
// zigzag chunks cp_chunks(zigzag, c, r_cp) of 2c (tally/core/context_parallel.hpp), concatenated.
// embed() takes those positions' tokens and position embeddings, head_loss() those positions'
// targets (the loss is the mean over the local tokens: the mean over CP ranks of it is the
// sequence's), and each block's attention is ring attention over the CP group on the rank's a/t
// heads (ring_attention.hpp; its backward as an autograd function). Everything else is per token
// and runs on the local tokens as it is; under SP the TP group shards the local s/c further.
//
// Note [full recompute]
// With full recompute each block runs in forward without keeping anything but its input; in
// backward it is replayed from that input (issuing its forward collectives again: core's 6 instead
// of 4 per layer, DESIGN.md erratum 2) and backpropagated through at once — the reentrant
// checkpoint of torch.utils.checkpoint and Megatron-LM's CheckpointFunction.
//
// Note [selective recompute policies]
// The other policies of core (types.hpp Recompute) keep the saved set core's activation ledger
// names for them (Note [activation inventory]) and recompute the rest just before the backward
// that reads it (activation_replay.hpp, Note [replayed activations]). Per block, of what the
// forward saves (gpt_model.cpp Note [what eager PyTorch saves]):
//   selective     Megatron's attention core (Korthikanti 2022 §5): the softmax output is freed and
//                 recomputed from the kept Q and K (QKᵀ, scale, mask, softmax) before the
//                 attention's backward; Q, K, V stay
//   save-matmuls  the outputs of the matmuls and of the attention are kept — Q, K, V, the QKᵀ
//                 scores, the attention output, the up projection — with the layer input and the
//                 MLP block input; LayerNorm 1's and 2's outputs (the QKV and W1 inputs), the
//                 softmax output (from the scores) and GeLU's output (the W2 input) are replayed
//   op-sac        torchtitan's op-level SAC on this layout: also K (the QKV GEMM's k rows replayed
//                 on the recomputed LayerNorm output) and the MLP block input (the residual sum
//                 x + out-projection + bias, replayed) are freed; Q, V, the scores, the attention
//                 output and the up projection stay with the layer input. At t = 1 the out-
//                 projection GEMM is replayed; at t > 1 its collective's output (the all-reduced
//                 sum, or the reduce-scattered shard under SP) is kept instead, as torchtitan's
//                 policy saves collective outputs (h·s·b/t under SP, h·s·b without, beyond core's
//                 inventory). Under SP the k replay all-gathers the norm output on the layer's
//                 re-gather site and leaves it there (TpSite::gathered) for the QKV weight
//                 gradient, which then gathers nothing: one re-gather per column-parallel input,
//                 as core's tp_regather counts (torchtitan's op SAC saves no all-gather output
//                 and gathers each input once in backward, for the replay and the gradient).
// No replay issues a collective of core's TP item: with these three policies a layer's TP
// traffic is the 4 collectives of no recompute, as core's step_traffic counts. Under CP the
// attention is ring attention, which keeps its own q, k, v, output and log-sum-exp and has no
// materialised softmax: the attention-core replays do not apply (the norm, GeLU and residual ones
// do).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gpt_model.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/comm.hpp"

namespace tally::engine {

// One place in the model that issues TP collectives, with what it issued: the deltas of the TP
// Comm's counters over each of its calls (so the bytes are the Comm's, i.e. core's formula on the
// real S of each call; comm.hpp).
struct TpSite {
  Comm* comm = nullptr;
  CommCounters issued;
  // A re-gather site's input already gathered in this backward (op-sac's k replay under SP), for
  // the next SeqParallelColumnLinear backward on the site to take instead of gathering again.
  torch::Tensor gathered;
};

struct NamedTensor {
  std::string name;  // "blocks.0.qkv_w", …
  torch::Tensor tensor;
};

// The TP-rank-r slices of the single-process model's parameters (grads = false) or of their
// gradients (grads = true), in TpGpt::parameters() order. tp must divide a and 4C.
std::vector<NamedTensor> tp_shards(Gpt& full, int tp, int rank, bool grads);

class TpGpt {
 public:
  // Copies of tp_shards(full, comm.world_size(), comm.rank(), false), leaves requiring grad.
  // With sequence_parallel, T must be divisible by t. recompute: Note [full recompute], Note
  // [selective recompute policies]. cp: Note [TP with context parallelism] (nullptr: the whole
  // sequence; s divisible by 2c).
  TpGpt(Gpt& full, Comm& tp_comm, bool sequence_parallel, Recompute recompute = Recompute::none,
        Comm* cp = nullptr);

  // Called by forward() at each block boundary: 0 before the first block (after the embedding and
  // the causal mask), l + 1 after block l. For measuring what each block leaves alive.
  void set_block_observer(std::function<void(std::size_t)> observer) {
    observer_ = std::move(observer);
  }

  // idx, targets: (B, T) int64, the same on every TP rank. Returns the mean cross-entropy (every
  // rank the same value). Collectives run now (forward) and in backward() of the result.
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets);
  // forward()'s two ends, for a pipeline stage (pp_model.hpp's StageModel): the embedding (with SP
  // split to this rank's shard (B, T/t, C)) and, after the last block, ln_f, the tied LM head and
  // the loss (with SP after gathering the shards).
  torch::Tensor embed(const torch::Tensor& idx);
  torch::Tensor head_loss(const torch::Tensor& x, const torch::Tensor& targets);
  // With SP: all-reduce (sum) the gradients of the sequence-sharded parameters, one call (those
  // with a gradient: a pipeline stage's own layers). Else nothing.
  void sp_reduce_grads();
  const GptConfig& config() const { return config_; }
  // Tokens of one sequence this rank's blocks see between TP collectives: s, s/c with CP, ÷t with SP.
  std::int64_t local_seq() const;
  bool sequence_parallel() const { return sp_; }
  Comm& tp_comm() { return comm_; }

  std::vector<NamedTensor>& parameters() { return params_; }
  std::vector<TpSite>& layer_sites() { return layer_sites_; }  // one per block
  TpSite& edge_site() { return edge_site_; }                   // SP split / gather at the edges
  TpSite& grad_site() { return grad_site_; }                   // sp_reduce_grads
  std::vector<TpSite>& regather_sites() { return regather_sites_; }  // Note [SP re-gather]
  void clear_counts();                                         // every site's `issued`, CP time
  // Seconds ring attention spent in its K,V (and dK,dV) shifts since clear_counts (CP only).
  double cp_shift_seconds() const { return cp_shift_s_; }

  // Block l's forward on x (its input), with the selective policies' replays; with full
  // recompute, what backward replays.
  torch::Tensor block_forward(std::size_t l, const torch::Tensor& x, const torch::Tensor& mask);
  // Block l as forward() runs it: block_forward, or with full recompute its checkpointed form
  // (Note [full recompute]). A pipeline stage's blocks (three_d.cpp) run through this.
  torch::Tensor block(std::size_t l, const torch::Tensor& x, const torch::Tensor& mask);
  Recompute recompute() const { return recompute_; }

 private:
  torch::Tensor& p(std::size_t block, const char* name);

  GptConfig config_;
  Comm& comm_;
  Comm* cp_;
  torch::Tensor cp_positions_;  // (s/c,) int64: the global positions this CP rank holds
  bool sp_;
  Recompute recompute_;
  std::vector<NamedTensor> params_;
  std::vector<TpSite> layer_sites_, regather_sites_;
  std::function<void(std::size_t)> observer_;
  TpSite edge_site_, grad_site_;
  double cp_shift_s_ = 0;
};

}  // namespace tally::engine
