// One MoE layer with expert parallelism (moe_layer.hpp, Note [expert-parallel dispatch]).
#include "moe_layer.hpp"

#include <cmath>

#include "comm_torch.hpp"
#include "tally/core/model.hpp"
#include "tally/core/types.hpp"

namespace tally::engine {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The bias-free expert MLP on a batch of experts: x (n, rows, h), w1 / w3 (n, f, h), w2 (n, h, f)
// → (n, rows, h). GeLU: W2·gelu(W1·x) (exact erf form); SwiGLU: W2·(silu(W1·x) ⊙ W3·x).
torch::Tensor expert_mlp(MlpKind kind, const torch::Tensor& x, const torch::Tensor& w1,
                         const torch::Tensor& w2, const torch::Tensor& w3) {
  const torch::Tensor a = x.matmul(w1.transpose(1, 2));
  const torch::Tensor hidden = kind == MlpKind::gelu
                                   ? torch::gelu(a)
                                   : torch::silu(a) * x.matmul(w3.transpose(1, 2));
  return hidden.matmul(w2.transpose(1, 2));
}

torch::Tensor shared_mlp(const MoeConfig& c, const torch::Tensor& x, const torch::Tensor& w1,
                         const torch::Tensor& w2, const torch::Tensor& w3) {
  return expert_mlp(c.mlp, x.unsqueeze(0), w1.unsqueeze(0), w2.unsqueeze(0),
                    w3.defined() ? w3.unsqueeze(0) : w3)
      .squeeze(0);
}

struct Routing {
  torch::Tensor weights;  // (T, k): the top-k probabilities, unnormalised
  torch::Tensor experts;  // (T, k) int64
};

// router → softmax → top-k (the same on both paths: it is the layer's definition, not dispatch).
Routing route(const torch::Tensor& x, const torch::Tensor& router, std::int64_t k) {
  const torch::Tensor probs = torch::softmax(x.matmul(router.t()), -1);
  auto [w, e] = probs.topk(k, -1);
  return {w, e};
}

// The all-to-all with equal splits over the EP group, counted into `count`.
torch::Tensor exchange(Comm& comm, MoeExchangeCount& count, const torch::Tensor& x) {
  const CollectiveCounter before = comm.counters()[Collective::all_to_all];
  torch::Tensor out = torch::empty_like(x, torch::MemoryFormat::Contiguous);
  all_to_all(comm, x.contiguous(), out);
  const CollectiveCounter& after = comm.counters()[Collective::all_to_all];
  count.calls += after.calls - before.calls;
  count.bytes_sent += after.bytes_sent - before.bytes_sent;
  count.seconds += after.seconds - before.seconds;
  return out;
}

// Dispatch or combine: the exchange forward, the same exchange of the gradient backward (with
// equal splits the pairwise exchange is its own transpose: rank i's chunk j goes to rank j's
// chunk i, and the gradient of rank j's chunk i must go back there).
struct AllToAll : torch::autograd::Function<AllToAll> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Comm* comm,
                               MoeExchangeCount* count) {
    ctx->saved_data["comm"] = reinterpret_cast<std::int64_t>(comm);
    ctx->saved_data["count"] = reinterpret_cast<std::int64_t>(count);
    return exchange(*comm, *count, x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto* comm = reinterpret_cast<Comm*>(ctx->saved_data["comm"].toInt());
    auto* count = reinterpret_cast<MoeExchangeCount*>(ctx->saved_data["count"].toInt());
    return {exchange(*comm, *count, g[0]), torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor leaf(const torch::Tensor& t) { return t.detach().clone().requires_grad_(true); }

}  // namespace

MoeParams make_moe_params(const MoeConfig& c, std::uint64_t seed, torch::ScalarType dtype) {
  torch::manual_seed(std::int64_t(seed));
  const auto o = torch::TensorOptions().dtype(torch::kDouble);
  const double in_h = 1.0 / std::sqrt(double(c.hidden));
  const bool swiglu = c.mlp == MlpKind::swiglu;
  MoeParams p;
  // Router weights of the size of the hidden activations' inverse scale: logits of order 1, so
  // the top-k choices are well separated (no near-ties for rounding to flip).
  p.router = torch::randn({c.experts, c.hidden}, o);
  p.w1 = torch::randn({c.experts, c.ffn, c.hidden}, o) * in_h;
  p.w2 = torch::randn({c.experts, c.hidden, c.ffn}, o) / std::sqrt(double(c.ffn));
  if (swiglu) p.w3 = torch::randn({c.experts, c.ffn, c.hidden}, o) * in_h;
  if (c.shared_ffn > 0) {
    p.shared_w1 = torch::randn({c.shared_ffn, c.hidden}, o) * in_h;
    p.shared_w2 = torch::randn({c.hidden, c.shared_ffn}, o) / std::sqrt(double(c.shared_ffn));
    if (swiglu) p.shared_w3 = torch::randn({c.shared_ffn, c.hidden}, o) * in_h;
  }
  for (torch::Tensor* t : {&p.router, &p.w1, &p.w2, &p.w3, &p.shared_w1, &p.shared_w2,
                           &p.shared_w3})
    if (t->defined()) *t = t->to(dtype).requires_grad_(true);
  return p;
}

std::vector<NamedParam> moe_rank_share(const MoeParams& p, int ep, int rank, bool grads) {
  const std::int64_t local = p.w1.size(0) / ep;
  auto pick = [&](const torch::Tensor& t) { return grads ? t.grad() : t; };
  auto slice = [&](const torch::Tensor& t) { return pick(t).narrow(0, rank * local, local); };
  std::vector<NamedParam> out{{"router", pick(p.router), true},
                              {"experts.w1", slice(p.w1), false},
                              {"experts.w2", slice(p.w2), false}};
  if (p.w3.defined()) out.push_back({"experts.w3", slice(p.w3), false});
  if (p.shared_w1.defined()) {
    out.push_back({"shared.w1", pick(p.shared_w1), true});
    out.push_back({"shared.w2", pick(p.shared_w2), true});
    if (p.shared_w3.defined()) out.push_back({"shared.w3", pick(p.shared_w3), true});
  }
  return out;
}

MoeReference moe_reference_forward(const MoeConfig& c, const MoeParams& p, const torch::Tensor& x,
                                   std::int64_t tokens_per_group) {
  const std::int64_t n = x.size(0), k = c.top_k;
  const Routing r = route(x, p.router, k);
  // Which routed copies keep a slot: per group, per expert, the first C in token order.
  const std::int64_t slots = expert_capacity(double(tokens_per_group), k, c.experts,
                                             c.capacity_factor);
  torch::Tensor keep = torch::zeros({n, k}, torch::kLong);
  const auto e = r.experts.accessor<std::int64_t, 2>();
  auto kept = keep.accessor<std::int64_t, 2>();
  std::vector<std::int64_t> used(std::size_t(c.experts), 0);
  for (std::int64_t t = 0; t < n; ++t) {
    if (t % tokens_per_group == 0) std::fill(used.begin(), used.end(), 0);
    for (std::int64_t j = 0; j < k; ++j) kept[t][j] = used[std::size_t(e[t][j])]++ < slots ? 1 : 0;
  }
  const torch::Tensor gate = torch::zeros({n, c.experts}, x.options()).scatter(
      1, r.experts, r.weights * keep.to(x.scalar_type()));
  const torch::Tensor all = expert_mlp(c.mlp, x.unsqueeze(0).expand({c.experts, n, c.hidden}),
                                       p.w1, p.w2, p.w3);  // (E, n, h): every expert, every token
  torch::Tensor y = (gate.t().unsqueeze(2) * all).sum(0);
  if (c.shared_ffn > 0) y = y + shared_mlp(c, x, p.shared_w1, p.shared_w2, p.shared_w3);
  return {y, keep};
}

EpMoeLayer::EpMoeLayer(const MoeConfig& c, const MoeParams& full, Comm& ep_comm)
    : config_(c), comm_(ep_comm) {
  TALLY_INVARIANT(c.experts % ep_comm.world_size() == 0);
  torch::NoGradGuard no_grad;
  params_ = moe_rank_share(full, ep_comm.world_size(), ep_comm.rank(), false);
  for (NamedParam& p : params_) p.tensor = leaf(p.tensor);
}

torch::Tensor EpMoeLayer::forward(const torch::Tensor& x) {
  const MoeConfig& c = config_;
  const std::int64_t T = x.size(0), h = c.hidden, k = c.top_k, E = c.experts;
  const std::int64_t ep = comm_.world_size(), local = E / ep;
  std::size_t i = 0;
  const torch::Tensor& router = params_[i++].tensor;
  const torch::Tensor& w1 = params_[i++].tensor;
  const torch::Tensor& w2 = params_[i++].tensor;
  const torch::Tensor w3 = c.mlp == MlpKind::swiglu ? params_[i++].tensor : torch::Tensor();
  const Routing r = route(x, router, k);
  // Slots: the position of each routed copy (token-major) among its expert's copies, by a running
  // count over a one-hot of the choices; copies at position >= C are dropped.
  capacity_ = expert_capacity(double(T), k, E, c.capacity_factor);
  const torch::Tensor choice = r.experts.reshape({-1});  // (T·k)
  const torch::Tensor position =
      (torch::one_hot(choice, E).cumsum(0) - 1).gather(1, choice.unsqueeze(1)).squeeze(1);
  const torch::Tensor kept = (position < capacity_).nonzero().squeeze(1);  // indices into T·k
  dropped_ = T * k - kept.numel();
  const torch::Tensor token = torch::div(kept, k, "floor");
  const torch::Tensor slot = choice.index_select(0, kept) * capacity_ + position.index_select(0, kept);
  // 1–2: dispatch (E·C, h), block j to rank j; received (ep, E_l, C, h).
  const torch::Tensor dispatch =
      torch::zeros({E * capacity_, h}, x.options()).index_add(0, slot, x.index_select(0, token));
  const torch::Tensor received = AllToAll::apply(dispatch, &comm_, &exchanges_);
  // 3: this rank's E_l experts, ep·C rows each.
  const torch::Tensor rows =
      received.view({ep, local, capacity_, h}).transpose(0, 1).reshape({local, ep * capacity_, h});
  const torch::Tensor out = expert_mlp(c.mlp, rows, w1, w2, w3);
  // 4: back in the dispatch layout of the rank the rows came from.
  const torch::Tensor back =
      out.view({local, ep, capacity_, h}).transpose(0, 1).reshape({E * capacity_, h});
  const torch::Tensor combined = AllToAll::apply(back, &comm_, &exchanges_);
  // 5: combine, weighted by the routing probabilities.
  const torch::Tensor weight = r.weights.reshape({-1}).index_select(0, kept).unsqueeze(1);
  torch::Tensor y = torch::zeros({T, h}, x.options())
                        .index_add(0, token, combined.index_select(0, slot) * weight);
  if (c.shared_ffn > 0) {
    const torch::Tensor s3 = c.mlp == MlpKind::swiglu ? params_[i + 2].tensor : torch::Tensor();
    y = y + shared_mlp(c, x, params_[i].tensor, params_[i + 1].tensor, s3);
  }
  return y;
}

void EpMoeLayer::reduce_replicated_grads() {
  std::vector<torch::Tensor> grads;
  for (NamedParam& p : params_)
    if (p.replicated) grads.push_back(p.tensor.grad().reshape({-1}));
  torch::Tensor flat = torch::cat(grads);
  all_reduce(comm_, flat);
  std::int64_t offset = 0;
  torch::NoGradGuard no_grad;
  for (NamedParam& p : params_)
    if (p.replicated) {
      const std::int64_t n = p.tensor.numel();
      p.tensor.mutable_grad().copy_(flat.narrow(0, offset, n).view_as(p.tensor));
      offset += n;
    }
}

}  // namespace tally::engine
