// One mixture-of-experts layer with expert parallelism over an EP group of ep ranks (internal:
// includes torch), and the single-process layer it must equal.
//
// Legend: T = tokens per rank, h = hidden, f = routed expert FFN width, f_s = shared expert width,
// E = routed experts, k = top-k, ep = EP ranks, E_l = E/ep experts per rank, r = this rank's index
// in the EP group, C = slots per (source rank, expert) = expert_capacity(T, k, E, c_f) (core's
// Note [expert capacity]).
//
// The layer (GShard / Switch / Megatron-Core's token-dropping MoE):
//   router   logits = x·W_r^T (T, E); p = softmax(logits); (w, e) = top-k of p, w unnormalised
//   experts  each a bias-free MLP: GeLU  W2·gelu(W1·x)          W1 (f, h), W2 (h, f)
//                                  SwiGLU W2·(silu(W1·x) ⊙ W3·x) W1, W3 (f, h), W2 (h, f)
//   drop     each rank's routed copies (token t, choice j), in token order, take the next free
//            slot of their expert; copies past C slots are dropped (Megatron-Core's "position"
//            drop policy with pad_to_capacity)
//   output   y_t = Σ_j w_tj · keep_tj · expert_{e_tj}(x_t)  (+ shared MLP(x_t) when f_s > 0)
//
// Note [expert-parallel dispatch]
// Rank r holds the router and the shared expert whole (replicated, as data-parallel weights are)
// and routed experts [r·E_l, (r+1)·E_l). Forward, per rank:
//   1. route its T tokens; copy each kept token into its slot of the dispatch buffer (E, C, h),
//      zero where a slot is empty (every slot travels: the splits are equal);
//   2. all-to-all: block [j·E_l, (j+1)·E_l) of the buffer goes to rank j; rank r receives
//      (ep, E_l, C, h), the slots every rank filled for its experts;
//   3. its E_l experts run on their ep·C rows (an empty slot's zero row gives a zero output);
//   4. all-to-all back (the inverse exchange is the same pairwise pattern);
//   5. combine: each kept copy's output row, times w, added to its token's output.
// Backward is autograd's through the two exchanges, each of whose gradient is one more all-to-all
// of the same size (AllToAll below): 4 per layer per micro-batch, core's count. Every exchange
// scatters E·C·h elements, S = E·C·h·element bytes; core's ledger writes S = T·k·c_f·h·bytes, the
// same when C = T·k·c_f/E exactly (no rounding up in expert_capacity).
// The router's and shared expert's gradients are partial sums over this rank's tokens; their
// data-parallel all-reduce (reduce_replicated_grads) makes them the single-process gradients.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tally/core/model.hpp"
#include "tally/engine/comm.hpp"
#include "tally/engine/moe.hpp"

namespace tally::engine {

// The parameters of the whole layer (every expert), created from `seed` in `dtype`: what every
// rank builds first and slices its share from. Shapes: router (E, h); w1, w3 (E, f, h); w2
// (E, h, f); shared_w1, shared_w3 (f_s, h), shared_w2 (h, f_s). w3 / shared_w3 only for SwiGLU,
// shared_* only when f_s > 0. Leaves that require grad.
struct MoeParams {
  torch::Tensor router, w1, w2, w3, shared_w1, shared_w2, shared_w3;
};
MoeParams make_moe_params(const MoeConfig& c, std::uint64_t seed, torch::ScalarType dtype);

struct NamedParam {
  std::string name;   // "router", "experts.w1", …
  torch::Tensor tensor;
  bool replicated;    // router and shared expert: every EP rank holds all of it
};

// The single-process layer on all ep·T tokens, ep groups of T tokens (group g's tokens are rows
// [g·T, (g+1)·T), the tokens EP rank g holds): dense — every expert runs on every token and a
// gate matrix (T·ep, E) zero outside the kept routed copies weights them — with no slot buffer and
// no exchange. Drops per group by expert_capacity(T, …), its own loop over the tokens.
struct MoeReference {
  torch::Tensor y;     // (ep·T, h)
  torch::Tensor kept;  // (ep·T, k) int64: 1 where routed copy (t, j) holds a slot
};
MoeReference moe_reference_forward(const MoeConfig& c, const MoeParams& p, const torch::Tensor& x,
                                   std::int64_t tokens_per_group);

// Counters of one layer's EP exchanges: the EP Comm's all-to-all counter deltas (core's formula on
// each call's real S), forward and backward together.
struct MoeExchangeCount {
  std::int64_t calls = 0;
  double bytes_sent = 0;
  double seconds = 0;
};

// Rank `rank`'s share of `p` among ep EP ranks (grads = true: of their gradients), in
// EpMoeLayer::parameters() order: router, the experts' slices [r·E_l, (r+1)·E_l) of w1, w2 (, w3),
// the shared expert's tensors. Views, not copies. One rule for the layer and the checks.
std::vector<NamedParam> moe_rank_share(const MoeParams& p, int ep, int rank, bool grads);

class EpMoeLayer {
 public:
  // This rank's share of `full` (copies: leaves of their own): router and shared expert whole,
  // experts [r·E_l, (r+1)·E_l). ep = ep_comm.world_size() must divide E.
  EpMoeLayer(const MoeConfig& c, const MoeParams& full, Comm& ep_comm);

  // x: (T, h), this rank's tokens. Runs the dispatch and combine all-to-alls now and their
  // reverses in the backward of the result.
  torch::Tensor forward(const torch::Tensor& x);
  // Sums the replicated parameters' gradients over the EP group (one all-reduce; the data-parallel
  // reduction of the dense weights, not an EP exchange).
  void reduce_replicated_grads();

  std::vector<NamedParam>& parameters() { return params_; }
  std::int64_t capacity() const { return capacity_; }  // C of the last forward
  std::int64_t dropped() const { return dropped_; }     // routed copies dropped in it, this rank
  MoeExchangeCount& exchanges() { return exchanges_; }

 private:
  MoeConfig config_;
  Comm& comm_;
  std::vector<NamedParam> params_;
  std::int64_t capacity_ = 0, dropped_ = 0;
  MoeExchangeCount exchanges_;
};

}  // namespace tally::engine
