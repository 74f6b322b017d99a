// Non-blocking point-to-point on a Comm, for pipeline stages (internal: includes ATen). Beside the
// blocking send / recv of comm_torch.hpp; defined in comm.cpp (Note [non-blocking send]).
#pragma once

#include <ATen/core/Tensor.h>

#include "tally/engine/comm.hpp"

namespace tally::engine {

// The send posted, not waited: returns at once; the handle's wait() blocks until the peer has
// received it (or the Comm's timeout, counted from wait(), passes: CommError). The handle keeps the
// (contiguous) tensor alive; the caller must not write it before wait(). Counted in the send_recv
// counter as send() is, when posted. A PendingCollective like all_reduce_async's (comm.hpp).
[[nodiscard]] PendingCollective send_async(Comm& comm, const at::Tensor& tensor, int dst_rank,
                                           int tag = 0);

}  // namespace tally::engine
