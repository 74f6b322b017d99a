// Context parallelism's causal load balancing (context_parallel.hpp, Note [causal load balancing]).
#include "tally/core/context_parallel.hpp"

#include "tally/core/types.hpp"

namespace tally {

std::string_view to_string(CpBalance b) {
  switch (b) {
    case CpBalance::zigzag: return "zigzag";
    case CpBalance::contiguous: return "contiguous";
  }
  TALLY_INVARIANT(false && "unknown CP balance");
  return {};
}

std::array<int, 2> cp_chunks(CpBalance balance, int cp, int rank) {
  require_int(cp >= 1, "cp", cp, "must be >= 1");
  require_int(rank >= 0 && rank < cp, "rank", rank, "must be in [0, cp)");
  if (balance == CpBalance::contiguous) return {2 * rank, 2 * rank + 1};
  return {rank, 2 * cp - 1 - rank};
}

std::int64_t cp_causal_block_pairs(CpBalance balance, int cp, int rank) {
  const std::array<int, 2> q = cp_chunks(balance, cp, rank);
  return std::int64_t(q[0]) + 1 + std::int64_t(q[1]) + 1;
}

}  // namespace tally
