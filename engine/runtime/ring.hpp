// tally's own ring algorithms over point-to-point exchanges (internal; no torch). The transport is
// an interface so the algorithm can be read — and tested — apart from Gloo.
#pragma once

#include "tally/engine/comm.hpp"

namespace tally::engine::detail {

class RingTransport {
 public:
  virtual ~RingTransport() = default;
  // Sends `send` to rank `dst_rank` while receiving `recv_count` elements of send's dtype from
  // rank `src_rank`; returns when both have completed, with the received elements in the
  // transport's own memory (valid until the next exchange), so the ring adds from them or copies
  // them where they belong without a scratch buffer of its own. Either side may hold zero elements
  // (then it moves nothing); the two sides of a link always agree on the count because chunk
  // sizes are a function of (count, k) alone.
  virtual ConstBuffer exchange(ConstBuffer send, int dst_rank, std::int64_t recv_count,
                               int src_rank) = 0;
};

// In place over data (all ranks pass the same count and dtype): on return, chunk_range(count, k,
// rank) of data holds the reduction over all ranks (divided by k for ReduceOp::average); the other
// chunks hold partial sums. k − 1 exchanges.
void ring_reduce_scatter(Buffer data, ReduceOp op, int rank, int ranks, RingTransport& transport);

// In place over data: on entry chunk_range(count, k, rank) is this rank's contribution; on return
// every chunk holds its owner's contribution. k − 1 exchanges.
void ring_all_gather(Buffer data, int rank, int ranks, RingTransport& transport);

}  // namespace tally::engine::detail
