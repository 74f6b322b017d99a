// at::Tensor overloads of tally::engine::Comm for engine code that already includes torch
// (internal; never included from a public header). The tensors go to Gloo without a copy when they
// are contiguous (the Gloo work item holds a reference to their storage, so a timed-out operation
// can never write into freed memory); a non-contiguous tensor is reduced through a contiguous copy
// and copied back. Tensors must live on the CPU and hold float32 or float64; anything else throws
// tally::InvalidInput. Semantics, timeouts and counters are those of the Buffer API in comm.hpp.
#pragma once

#include <ATen/core/Tensor.h>

#include "tally/engine/comm.hpp"

namespace tally::engine {

void all_reduce(Comm& comm, at::Tensor& tensor, ReduceOp op = ReduceOp::sum);
// Started, not waited (comm.hpp's PendingCollective): a contiguous tensor is reduced in place by
// Gloo (the handle keeps it alive); a non-contiguous one through a copy written back by wait().
// The tensor must not be read or written until wait() returns.
[[nodiscard]] PendingCollective all_reduce_async(Comm& comm, at::Tensor& tensor,
                                                 ReduceOp op = ReduceOp::sum);
// output: chunk_range(input.numel(), k, rank) of the reduced input.
void reduce_scatter(Comm& comm, const at::Tensor& input, at::Tensor& output,
                    ReduceOp op = ReduceOp::sum);
// Comm::reduce_scatter_in_place on a 1-D tensor whose full contents are dead after the reduction:
// returns the view of it (of a contiguous copy, when it is not contiguous) holding this rank's
// reduced chunk_range(data.numel(), k, rank); the rest of data is left unspecified.
[[nodiscard]] at::Tensor reduce_scatter_in_place(Comm& comm, at::Tensor& data,
                                                 ReduceOp op = ReduceOp::sum);
// input: this rank's chunk_range(output.numel(), k, rank); output: all chunks, concatenated.
void all_gather(Comm& comm, const at::Tensor& input, at::Tensor& output);
// The same with the input already in place: on entry chunk_range(data.numel(), k, rank) of the
// 1-D tensor holds this rank's contribution, on return every chunk holds its owner's. No copy of
// the input; at k = 1 nothing is read or written.
void all_gather_in_place(Comm& comm, at::Tensor& data);
void broadcast(Comm& comm, at::Tensor& tensor, int root_rank);
// Comm::all_to_all with equal splits on flat views: output (numel == input's, a multiple of k)
// receives chunk i from rank i. Output must not share storage with input.
void all_to_all(Comm& comm, const at::Tensor& input, at::Tensor& output);
void send(Comm& comm, const at::Tensor& tensor, int dst_rank, int tag = 0);
void recv(Comm& comm, at::Tensor& tensor, int src_rank, int tag = 0);
void ring_all_reduce(Comm& comm, at::Tensor& tensor, ReduceOp op = ReduceOp::sum);

}  // namespace tally::engine
