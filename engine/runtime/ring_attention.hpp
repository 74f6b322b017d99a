// Ring attention over a context-parallel group of c ranks (internal: includes torch). Liu et al.
// 2023 "Ring Attention with Blockwise Transformers"; Megatron-LM's context parallelism
// (Transformer Engine's AttnFuncWithCPAndKVP2P). Causal, multi-head, grouped-query (GQA).
//
// Legend: B = micro-batch, a = query heads, g = key/value heads (a % g == 0), d = head dim,
// s = sequence, c = CP ranks, r = this rank's index in the CP group, n = s/(2c) tokens per chunk.
// Every tensor is this rank's share of the sequence, its two chunks cp_chunks(balance, c, r)
// (tally/core/context_parallel.hpp) concatenated: 2n = s/c tokens, local position i·n + t being
// global position chunks[i]·n + t.
//   q, out, dout  (B, a, 2n, d)     k, v  (B, g, 2n, d)     lse  (B, a, 2n)
//
// Note [ring attention]
// Forward: c steps. At step j rank r holds the K,V block of rank (r − j) mod c; it first passes
// that block on (send to r+1, receive the next from r−1; c−1 such shifts) and then combines the
// block's partial attention into each query chunk's running state with flash attention's online
// softmax (Dao et al. 2022, Algorithm 1; Milakov & Gimelshein 2018): for a block's scores S,
// m' = max(m, rowmax S), P = exp(S − m'), ℓ' = ℓ·e^{m−m'} + rowsum P, acc' = acc·e^{m−m'} + P·V;
// finally out = acc/ℓ and lse = m + log ℓ. Causal masking per (query chunk, key chunk) pair from
// their global chunk indices: a later key chunk is skipped, an earlier one is used whole, the same
// chunk is masked above its diagonal (so every row sees at least itself and ℓ > 0).
// Backward (flash attention's, Dao et al. 2022 Algorithm 2, from the saved lse): D = rowsum(dO∘O);
// per pair P = exp(S − lse), dV += Pᵀ·dO, dS = P∘(dO·Vᵀ − D), dQ += dS·K/√d, dK += dSᵀ·Q/√d
// (GQA: the a/g query heads of a group sum into their K,V head). The K,V blocks go round the ring
// again (c−1 shifts); the dK,dV of a block start at zero on the first rank after its owner,
// gather each rank's contribution as they travel with the block, and arrive home after c−1 more
// shifts, where the owner adds its own (diagonal-step) part. Per layer per micro-batch: 3(c−1)
// sends of 2·B·2n·g·d elements each — core's CP item (comm.hpp step_traffic), which the caller
// checks against the CP Comm's counters.
//
// Note [ring shift without deadlock]
// Gloo's send completes only once the peer has posted the matching recv (comm.hpp), so a ring in
// which every rank sends first would wait until the timeout. Even ranks send first and then
// receive, odd ranks receive first and then send: rank 1 receives rank 0's block at once, and the
// chain unwinds round the ring (with c odd, the even rank c−1 sends to the even rank 0, which
// posts its receive as soon as rank 1 has taken its send). The shifts do not overlap the block
// computation; a production ring posts them non-blocking and computes meanwhile.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "tally/core/context_parallel.hpp"
#include "tally/engine/comm.hpp"

namespace tally::engine {

// Measured by one forward or backward on this rank.
struct RingAttentionWork {
  std::int64_t block_pairs = 0;  // (query chunk, key chunk) pairs computed (skipped ones not)
  double compute_s = 0;          // in block computation
  double shift_s = 0;            // in the ring's send / recv
};

struct RingForward {
  at::Tensor out;  // (B, a, 2n, d)
  at::Tensor lse;  // (B, a, 2n): log-sum-exp of each row's scores, for the backward
};

struct RingGrads {
  at::Tensor dq;  // (B, a, 2n, d)
  at::Tensor dk;  // (B, g, 2n, d): this rank's K,V chunks' full gradients (every rank's queries)
  at::Tensor dv;
};

// Scores are scaled by 1/√d. cp's world size is c, its rank r; all tensors on the CPU, one dtype.
RingForward ring_attention_forward(Comm& cp, CpBalance balance, const at::Tensor& q,
                                   const at::Tensor& k, const at::Tensor& v,
                                   RingAttentionWork& work);
RingGrads ring_attention_backward(Comm& cp, CpBalance balance, const at::Tensor& q,
                                  const at::Tensor& k, const at::Tensor& v,
                                  const RingForward& fwd, const at::Tensor& dout,
                                  RingAttentionWork& work);

}  // namespace tally::engine
