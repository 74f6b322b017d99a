// Context parallelism's causal load balancing: which part of the sequence each CP rank holds, and
// the causal attention work that leaves it (ring attention, Liu et al. 2023; Megatron-LM's
// context parallelism built on Transformer Engine).
//
// Legend: s = sequence, c = CP ranks, r = this rank's index in its CP group, n = s/(2c) tokens per
// chunk. The sequence is cut into 2c chunks of n tokens; every rank holds two of them, 2n = s/c
// tokens (the s/c of core's activation, operator and traffic ledgers).
//
// Note [causal load balancing]
// Under a causal mask, query chunk i attends key chunks 0..i (the last one, i itself, only below
// its diagonal). Handing rank r the contiguous chunks 2r and 2r+1 gives it (2r+1) + (2r+2) = 4r+3
// (query chunk, key chunk) block pairs: rank c−1 computes (4c−1)/3 times as many as rank 0, and
// the ring waits for the slowest. Transformer Engine (transformer_engine/pytorch/attention.py,
// AttnFuncWithCPAndKVP2P; Megatron-LM's get_batch_on_this_cp_rank) gives rank r chunks r and
// 2c−1−r instead ("zigzag"): r+1 + 2c−r = 2c+1 block pairs on every rank, two of them diagonal.
// core assumes this balanced split everywhere it prices CP: each rank's causal attention is half
// of its (s/c)·s score matrix (operators.cpp's 0.5·sq·s), the same on every rank.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace tally {

enum class CpBalance {
  zigzag,      // rank r holds chunks r and 2c−1−r (Transformer Engine; what core assumes)
  contiguous,  // rank r holds chunks 2r and 2r+1 (no balancing; for comparison)
};
std::string_view to_string(CpBalance b);

// The two chunk indices (of 2c, ascending) rank r holds. Throws InvalidInput for c < 1 or r
// outside [0, c).
std::array<int, 2> cp_chunks(CpBalance balance, int cp, int rank);

// Causal (query chunk, key chunk) pairs with key chunk <= query chunk that rank r computes in one
// attention forward (the backward visits the same pairs): (q₁ + 1) + (q₂ + 1) for its chunks
// q₁, q₂ (Note [causal load balancing]). Zigzag: 2c+1 on every rank; contiguous: 4r+3.
std::int64_t cp_causal_block_pairs(CpBalance balance, int cp, int rank);

}  // namespace tally
