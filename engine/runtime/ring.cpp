// Note [ring all-reduce]
//
// Variables: k = ranks, r = this rank, N = elements in the buffer, C_0 … C_{k−1} = its chunks
// (chunk_range: the first N mod k chunks hold ⌈N/k⌉ elements, the rest ⌊N/k⌋), right = (r+1) mod k
// is where r sends, left = (r−1) mod k is where r receives from, s = step. Chunk indices are
// taken mod k.
//
// Reduce-scatter, s = 0 … k−2: r sends its partial C_{r−s−1} to right and receives left's partial
// C_{r−s−2} (into the transport's buffer), adding it into its own C_{r−s−2}. Chunk C_c starts at rank c+1
// and gains one rank's contribution per hop; after k−1 hops it arrives, complete, at rank c. So
// rank r ends owning the reduced C_r (the layout reduce-scatter promises).
//
// All-gather, s = 0 … k−2: r sends the complete C_{r−s} to right and receives the complete
// C_{r−s−1} from left (it is what left completed or received one step earlier).
//
// Bytes each rank sends: reduce-scatter sends every chunk but C_r, all-gather every chunk but
// C_{r+1}, in total 2·S − |C_r| − |C_{r+1}| (S = N·element bytes). When k divides N that is exactly
// the core's 2S(k−1)/k (collective_bytes_per_rank); otherwise chunk sizes differ by one element
// and a rank sends within 2 elements of it, while the sum over all ranks is exactly k·2S(k−1)/k.
// Averaging divides the owned chunk once, between the two phases, so every rank ends with the
// same bits. With k = 1 both phases are the identity (the average over one rank is the value), so
// they return at once: no exchange, no pass over the data.
#include "ring.hpp"

#include <cstring>

#include "tally/core/types.hpp"

namespace tally::engine::detail {

namespace {

int mod(int a, int k) { return ((a % k) + k) % k; }

template <class T>
void add_into(T* dst, const T* src, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

template <class T>
void divide(T* dst, std::int64_t n, int k) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] /= T(k);
}

char* element(Buffer data, std::int64_t index) {
  return static_cast<char*>(data.data) + index * std::int64_t(dtype_size_bytes(data.dtype));
}

Buffer chunk_of(Buffer data, int ranks, int index) {
  const ShardSpan c = chunk_range(data.count, ranks, index);
  return Buffer(element(data, c.offset), c.count, data.dtype);
}

}  // namespace

void ring_reduce_scatter(Buffer data, ReduceOp op, int rank, int ranks, RingTransport& transport) {
  TALLY_INVARIANT(ranks >= 1 && rank >= 0 && rank < ranks);
  if (ranks == 1) return;
  const int right = mod(rank + 1, ranks);
  const int left = mod(rank - 1, ranks);
  for (int s = 0; s + 1 < ranks; ++s) {
    const Buffer send = chunk_of(data, ranks, mod(rank - s - 1, ranks));
    const Buffer into = chunk_of(data, ranks, mod(rank - s - 2, ranks));
    const ConstBuffer got = transport.exchange(send, right, into.count, left);
    TALLY_INVARIANT(got.count == into.count && got.dtype == data.dtype);
    if (data.dtype == DType::f32)
      add_into(static_cast<float*>(into.data), static_cast<const float*>(got.data), into.count);
    else
      add_into(static_cast<double*>(into.data), static_cast<const double*>(got.data), into.count);
  }
  if (op == ReduceOp::average) {
    const Buffer own = chunk_of(data, ranks, rank);
    if (data.dtype == DType::f32)
      divide(static_cast<float*>(own.data), own.count, ranks);
    else
      divide(static_cast<double*>(own.data), own.count, ranks);
  }
}

void ring_all_gather(Buffer data, int rank, int ranks, RingTransport& transport) {
  TALLY_INVARIANT(ranks >= 1 && rank >= 0 && rank < ranks);
  const int right = mod(rank + 1, ranks);
  const int left = mod(rank - 1, ranks);
  for (int s = 0; s + 1 < ranks; ++s) {
    const Buffer send = chunk_of(data, ranks, mod(rank - s, ranks));
    const Buffer into = chunk_of(data, ranks, mod(rank - s - 1, ranks));
    const ConstBuffer got = transport.exchange(send, right, into.count, left);
    TALLY_INVARIANT(got.count == into.count && got.dtype == data.dtype);
    if (into.count > 0) std::memcpy(into.data, got.data, std::size_t(into.size_bytes()));
  }
}

}  // namespace tally::engine::detail
