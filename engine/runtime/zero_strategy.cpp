// The pieces the ZeRO strategies share (zero_strategy.hpp): the unit model, the flat replica, the
// logged collectives.
#include "zero_strategy.hpp"

#include <ATen/native/Resize.h>

#include <functional>
#include <numeric>

#include "comm_torch.hpp"
#include "mlp.hpp"
#include "tally/core/types.hpp"

namespace tally::engine::zero {

std::vector<std::int64_t> UnitModel::unit_numels() const {
  std::vector<std::int64_t> n;
  for (const auto& u : units) {
    std::int64_t c = 0;
    for (const auto& p : u) c += p.numel();
    n.push_back(c);
  }
  return n;
}

std::int64_t UnitModel::numel() const {
  const auto n = unit_numels();
  return std::accumulate(n.begin(), n.end(), std::int64_t(0));
}

UnitModel make_mlp_model(const std::vector<std::int64_t>& widths, at::ScalarType dtype,
                         std::uint64_t seed) {
  at::manual_seed(seed);
  const mlp::Mlp m = mlp::make_mlp(widths, dtype);
  UnitModel model;
  for (std::size_t l = 0; l < m.weights.size(); ++l)
    model.units.push_back({m.weights[l].detach(), m.biases[l].detach()});
  const std::size_t last = m.weights.size() - 1;
  model.forward_unit = [last](std::size_t u, const at::Tensor& x,
                              const std::vector<at::Tensor>& params) {
    return mlp::Mlp::forward_layer(x, params[0], params[1], u == last);
  };
  model.loss = [](const at::Tensor& logits, const at::Tensor& target) {
    return at::cross_entropy_loss(logits.to(at::kFloat), target);
  };
  return model;
}

at::Tensor flatten(const std::vector<at::Tensor>& tensors, at::ScalarType dtype) {
  std::vector<at::Tensor> parts;
  parts.reserve(tensors.size());
  for (const auto& t : tensors) parts.push_back(t.detach().reshape(-1).to(dtype));
  return at::cat(parts);
}

std::vector<at::Tensor> views_of(const at::Tensor& flat, const std::vector<Shape>& shapes) {
  std::vector<at::Tensor> views;
  std::int64_t offset = 0;
  for (const auto& shape : shapes) {
    const std::int64_t n = std::accumulate(shape.begin(), shape.end(), std::int64_t(1),
                                           std::multiplies<std::int64_t>());
    views.push_back(flat.narrow(0, offset, n).view(shape));
    offset += n;
  }
  TALLY_INVARIANT(offset == flat.numel());
  return views;
}

void free_storage(const at::Tensor& full) {
  at::native::resize_bytes_cpu(full.storage().unsafeGetStorageImpl(), 0);
}

at::Tensor regrow_storage(const at::Tensor& full) {
  TALLY_INVARIANT(full.is_non_overlapping_and_dense() && full.storage_offset() == 0);
  at::native::resize_bytes_cpu(full.storage().unsafeGetStorageImpl(),
                               std::size_t(full.numel()) * full.element_size());
  return at::empty({0}, full.options()).set_(full.storage(), 0, full.sizes(), full.strides());
}

// ---- Strategy: the logged collectives (Note [bf16 on Gloo] in ddp.cpp: float32 on the wire) ----

namespace {
constexpr double kWireElementBytes = 4;  // float32
at::Tensor to_wire(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat ? t.contiguous() : t.to(at::kFloat).contiguous();
}
}  // namespace

at::Tensor Strategy::reduce_scatter_average_in_place(at::Tensor& full) {
  TALLY_INVARIANT(full.dim() == 1 && full.is_contiguous());
  at::Tensor wire = to_wire(full);  // full itself for float32
  at::Tensor shard = engine::reduce_scatter_in_place(comm_, wire, ReduceOp::average);
  calls_.push_back({Collective::reduce_scatter, full.numel(), kWireElementBytes});
  return shard;
}

void Strategy::all_gather_into(const at::Tensor& shard, at::Tensor& full) {
  TALLY_INVARIANT(shard.scalar_type() == full.scalar_type() && full.is_contiguous());
  TALLY_INVARIANT(shard.numel() == my_span(full.numel()).count);
  if (full.scalar_type() == at::kFloat) {
    engine::all_gather(comm_, shard.contiguous(), full);
  } else {
    at::Tensor wire = at::empty({full.numel()}, at::kFloat);
    engine::all_gather(comm_, to_wire(shard), wire);
    full.copy_(wire);  // exact: the values were bf16 before they were widened
  }
  calls_.push_back({Collective::all_gather, full.numel(), kWireElementBytes});
}

void Strategy::all_gather_in_place(at::Tensor& full) {
  TALLY_INVARIANT(full.dim() == 1 && full.is_contiguous());
  const ShardSpan mine = my_span(full.numel());
  if (full.scalar_type() != at::kFloat) {  // the shard's float32 copy is the wire's input anyway
    all_gather_into(full.narrow(0, mine.offset, mine.count), full);
    return;
  }
  engine::all_gather_in_place(comm_, full);
  calls_.push_back({Collective::all_gather, full.numel(), kWireElementBytes});
}

at::Tensor Strategy::all_gather(const at::Tensor& shard, std::int64_t n) {
  at::Tensor full = at::empty({n}, shard.options());
  all_gather_into(shard, full);
  return full;
}

// ---- Replica ----

Replica::Replica(UnitModel model) : model_(std::move(model)) {
  std::vector<at::Tensor> all;
  for (const auto& u : model_.units) all.insert(all.end(), u.begin(), u.end());
  TALLY_INVARIANT(!all.empty());
  flat_ = flatten(all, all.front().scalar_type());
  std::int64_t offset = 0;
  for (auto& u : model_.units) {
    for (auto& p : u) {
      // A leaf that shares flat_'s memory: writes into flat_ (Adam, all-gather) are the parameters.
      p = flat_.narrow(0, offset, p.numel()).view(p.sizes()).detach().requires_grad_(true);
      offset += p.numel();
    }
  }
}

at::Tensor Replica::loss(const Batch& batch) const {
  at::Tensor h = batch.x;
  for (std::size_t u = 0; u < model_.units.size(); ++u)
    h = model_.forward_unit(u, h, model_.units[u]);
  return model_.loss(h, batch.y);
}

void Replica::set_grad_buffer(const at::Tensor& flat_grad) {
  TALLY_INVARIANT(flat_grad.numel() == flat_.numel() &&
                  flat_grad.scalar_type() == flat_.scalar_type());
  std::int64_t offset = 0;
  for (auto& u : model_.units) {
    for (auto& p : u) {
      p.mutable_grad() = flat_grad.narrow(0, offset, p.numel()).view(p.sizes());
      offset += p.numel();
    }
  }
}

std::vector<at::Tensor> Replica::leaves() const {
  std::vector<at::Tensor> all;
  for (const auto& u : model_.units) all.insert(all.end(), u.begin(), u.end());
  return all;
}

void Replica::drop_grads() {
  for (auto& u : model_.units)
    for (auto& p : u) p.mutable_grad() = at::Tensor();
}

void ShardedOptimizerStrategy::setup_replica_and_shard(UnitModel model) {
  replica_ = Replica(std::move(model));
  span_ = my_span(replica_.numel());
  adam_ = Adam({replica_.flat().narrow(0, span_.offset, span_.count)}, ctx_.adam);
}

void ShardedOptimizerStrategy::update_shard_and_all_gather(const at::Tensor& grad_shard) {
  timed_update([&] { adam_.step_with({grad_shard}); });
  all_gather_in_place(replica_.flat());  // the updated span is already in place
}

}  // namespace tally::engine::zero
