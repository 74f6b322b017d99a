// comm_torch.hpp's at::Tensor overloads of Comm: contiguous tensors go to Gloo as they are
// (Note [owned tensors] in comm.cpp), others through a contiguous copy written back.
#include <ATen/ATen.h>

#include "comm_impl.hpp"
#include "comm_torch.hpp"

namespace tally::engine {

namespace {

Buffer buffer_of(at::Tensor& t, DType d) { return Buffer(t.data_ptr(), t.numel(), d); }

// Runs fn on a contiguous version of t and copies the result back when that was a copy.
template <class Fn>
void in_place(at::Tensor& t, Fn&& fn) {
  at::Tensor c = t.contiguous();
  fn(c);
  if (!c.is_same(t)) t.copy_(c);
}

}  // namespace

void all_reduce(Comm& comm, at::Tensor& tensor, ReduceOp op) {
  detail::dtype_of_tensor(tensor, "all-reduce");
  in_place(tensor, [&](at::Tensor& c) { comm.impl().all_reduce(c, op); });
}

PendingCollective all_reduce_async(Comm& comm, at::Tensor& tensor, ReduceOp op) {
  detail::dtype_of_tensor(tensor, "all-reduce");
  const at::Tensor c = tensor.contiguous();
  auto state = std::make_unique<PendingCollective::State>(comm.impl().start_all_reduce(c, op));
  if (!c.is_same(tensor)) state->target = tensor;
  return PendingCollective(std::move(state));
}

void reduce_scatter(Comm& comm, const at::Tensor& input, at::Tensor& output, ReduceOp op) {
  const DType d = detail::dtype_of_tensor(input, "reduce-scatter");
  detail::require_same_dtype(d, detail::dtype_of_tensor(output, "reduce-scatter"),
                             "reduce-scatter");
  const at::Tensor in = input.contiguous();
  in_place(output, [&](at::Tensor& c) {
    comm.reduce_scatter(ConstBuffer(in.data_ptr(), in.numel(), d), buffer_of(c, d), op);
  });
}

at::Tensor reduce_scatter_in_place(Comm& comm, at::Tensor& data, ReduceOp op) {
  const DType d = detail::dtype_of_tensor(data, "reduce-scatter");
  const at::Tensor c = data.contiguous().view({-1});  // data's memory when contiguous
  const Buffer own = comm.reduce_scatter_in_place(Buffer(c.data_ptr(), c.numel(), d), op);
  const std::int64_t offset =
      (static_cast<const char*>(own.data) - static_cast<const char*>(c.data_ptr())) /
      std::int64_t(dtype_size_bytes(d));
  return c.narrow(0, offset, own.count);
}

void all_gather(Comm& comm, const at::Tensor& input, at::Tensor& output) {
  const DType d = detail::dtype_of_tensor(input, "all-gather");
  detail::require_same_dtype(d, detail::dtype_of_tensor(output, "all-gather"), "all-gather");
  const at::Tensor in = input.contiguous();
  in_place(output, [&](at::Tensor& c) { comm.impl().all_gather(in, c); });
}

void all_gather_in_place(Comm& comm, at::Tensor& data) {
  detail::dtype_of_tensor(data, "all-gather");
  in_place(data, [&](at::Tensor& c) {
    at::Tensor flat = c.view({-1});
    const ShardSpan mine = chunk_range(flat.numel(), comm.world_size(), comm.rank());
    comm.impl().all_gather(flat.narrow(0, mine.offset, mine.count), flat);
  });
}

void broadcast(Comm& comm, at::Tensor& tensor, int root_rank) {
  detail::dtype_of_tensor(tensor, "broadcast");
  in_place(tensor, [&](at::Tensor& c) { comm.impl().broadcast(c, root_rank); });
}

void all_to_all(Comm& comm, const at::Tensor& input, at::Tensor& output) {
  const DType d = detail::dtype_of_tensor(input, "all-to-all");
  detail::require_same_dtype(d, detail::dtype_of_tensor(output, "all-to-all"), "all-to-all");
  const at::Tensor in = input.contiguous().view({-1});
  if (output.is_contiguous() && !output.storage().is_alias_of(in.storage())) {
    at::Tensor flat = output.view({-1});
    comm.impl().all_to_all(in, flat, {}, {});
    return;
  }
  at::Tensor flat = at::empty({output.numel()}, output.options());
  comm.impl().all_to_all(in, flat, {}, {});
  output.copy_(flat.view(output.sizes()));
}

void send(Comm& comm, const at::Tensor& tensor, int dst_rank, int tag) {
  detail::dtype_of_tensor(tensor, "send");
  comm.impl().checked_send(tensor.contiguous(), dst_rank, tag);
}

PendingCollective send_async(Comm& comm, const at::Tensor& tensor, int dst_rank, int tag) {
  detail::dtype_of_tensor(tensor, "send");
  return PendingCollective(std::make_unique<PendingCollective::State>(
      comm.impl().start_send(tensor.contiguous(), dst_rank, tag)));
}

void recv(Comm& comm, at::Tensor& tensor, int src_rank, int tag) {
  detail::dtype_of_tensor(tensor, "recv");
  in_place(tensor, [&](at::Tensor& c) { comm.impl().checked_recv(c, src_rank, tag); });
}

void ring_all_reduce(Comm& comm, at::Tensor& tensor, ReduceOp op) {
  const DType d = detail::dtype_of_tensor(tensor, "ring all-reduce");
  in_place(tensor, [&](at::Tensor& c) { comm.ring_all_reduce(buffer_of(c, d), op); });
}

}  // namespace tally::engine
