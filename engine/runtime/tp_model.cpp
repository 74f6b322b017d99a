// Megatron tensor (and sequence) parallelism on the engine's GPT (tp_model.hpp).
#include "tp_model.hpp"

#include <cmath>
#include <limits>

#include "activation_replay.hpp"
#include "comm_torch.hpp"
#include "ring_attention.hpp"
#include "tally/core/types.hpp"

namespace tally::engine {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Runs fn (one or more collectives on site.comm) and adds the Comm counters' change to the site.
template <class Fn>
void counted(TpSite& site, Fn&& fn) {
  const CommCounters before = site.comm->counters();
  fn();
  const CommCounters& after = site.comm->counters();
  for (std::size_t c = 0; c < before.by_collective.size(); ++c) {
    CollectiveCounter& into = site.issued.by_collective[c];
    into.calls += after.by_collective[c].calls - before.by_collective[c].calls;
    into.bytes_sent += after.by_collective[c].bytes_sent - before.by_collective[c].bytes_sent;
    into.seconds += after.by_collective[c].seconds - before.by_collective[c].seconds;
  }
}

TpSite* site_of(AutogradContext* ctx) {
  return reinterpret_cast<TpSite*>(ctx->saved_data["site"].toInt());
}

void remember(AutogradContext* ctx, TpSite* site) {
  ctx->saved_data["site"] = reinterpret_cast<std::int64_t>(site);
}

torch::Tensor tp_all_reduce(TpSite& site, const torch::Tensor& x) {
  torch::Tensor y = x.contiguous().clone();
  counted(site, [&] { all_reduce(*site.comm, y); });
  return y;
}

// (B, T/t, C) shard → (B, T, C): gathered in the sequence-major layout (T, B, C), where rank r's
// chunk of the flat buffer is exactly its positions [r·T/t, (r+1)·T/t).
torch::Tensor seq_all_gather(TpSite& site, const torch::Tensor& shard) {
  const int t = site.comm->world_size();
  const torch::Tensor in = shard.transpose(0, 1).contiguous();  // (T/t, B, C)
  torch::Tensor out = torch::empty({in.size(0) * t, in.size(1), in.size(2)}, in.options());
  torch::Tensor flat = out.view({-1});
  counted(site, [&] { all_gather(*site.comm, in.view({-1}), flat); });
  return out.transpose(0, 1);  // (B, T, C)
}

// (B, T, C) partial sums → (B, T/t, C): rank r's positions of the sum over the group.
torch::Tensor seq_reduce_scatter(TpSite& site, const torch::Tensor& full) {
  const int t = site.comm->world_size();
  const torch::Tensor in = full.transpose(0, 1).contiguous();  // (T, B, C)
  torch::Tensor out = torch::empty({in.size(0) / t, in.size(1), in.size(2)}, in.options());
  torch::Tensor flat = out.view({-1});
  counted(site, [&] { reduce_scatter(*site.comm, in.view({-1}), flat); });
  return out.transpose(0, 1);  // (B, T/t, C)
}

torch::Tensor seq_split(TpSite& site, const torch::Tensor& full) {
  const std::int64_t n = full.size(1) / site.comm->world_size();
  return full.narrow(1, site.comm->rank() * n, n);
}

// f: identity forward, all-reduce backward (Note [conjugate operators]).
struct CopyToTp : torch::autograd::Function<CopyToTp> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, TpSite* site) {
    remember(ctx, site);
    return x;  // autograd makes it a view of the input (as Megatron's _CopyToModelParallelRegion)
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {tp_all_reduce(*site_of(ctx), g[0]), torch::Tensor()};
  }
};

// g: all-reduce forward, identity backward.
struct ReduceFromTp : torch::autograd::Function<ReduceFromTp> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, TpSite* site) {
    return tp_all_reduce(*site, x);
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], torch::Tensor()}; }
};

// g̅ (SP, after a row-parallel block): reduce-scatter forward, all-gather backward.
struct ReduceScatterToSeq : torch::autograd::Function<ReduceScatterToSeq> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, TpSite* site) {
    remember(ctx, site);
    return seq_reduce_scatter(*site, x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {seq_all_gather(*site_of(ctx), g[0]), torch::Tensor()};
  }
};

// SP entry: the replicated embedding output split to this rank's shard; backward all-gathers the
// shards' gradients so the replicated embedding gets the whole gradient on every rank.
struct ScatterToSeq : torch::autograd::Function<ScatterToSeq> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, TpSite* site) {
    remember(ctx, site);
    return seq_split(*site, x).contiguous();
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {seq_all_gather(*site_of(ctx), g[0]), torch::Tensor()};
  }
};

// ḡ and a column-parallel linear under SP, as one operation that keeps only the shard
// (Note [SP re-gather]): forward all-gathers x's shards and applies the linear; backward all-
// gathers them again (on `regather`) for the weight gradient and reduce-scatters the input
// gradient back to the shards.
struct SeqParallelColumnLinear : torch::autograd::Function<SeqParallelColumnLinear> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& shard,
                               const torch::Tensor& w, const torch::Tensor& b, TpSite* site,
                               TpSite* regather) {
    remember(ctx, site);
    ctx->saved_data["regather"] = reinterpret_cast<std::int64_t>(regather);
    ctx->save_for_backward({shard, w});
    return torch::linear(seq_all_gather(*site, shard), w, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &shard = saved[0], &w = saved[1];
    auto* regather = reinterpret_cast<TpSite*>(ctx->saved_data["regather"].toInt());
    torch::Tensor full;  // (B, T, C)
    if (regather->gathered.defined()) {  // op-sac's k replay gathered it (Note [selective …])
      full = regather->gathered;
      regather->gathered = torch::Tensor();
    } else {
      full = seq_all_gather(*regather, shard);
    }
    const torch::Tensor go = g[0].reshape({-1, w.size(0)});       // (B·T, out)
    const torch::Tensor grad_w = go.t().mm(full.reshape({-1, w.size(1)}));
    const torch::Tensor grad_b = go.sum(0);
    const torch::Tensor grad_x = seq_reduce_scatter(*site_of(ctx), g[0].matmul(w));
    return {grad_x, grad_w, grad_b, torch::Tensor(), torch::Tensor()};
  }
};

// Note [full recompute]: forward keeps the block's input only; backward replays the block from it
// with autograd on and backpropagates through the replay at once.
struct RecomputedBlock : torch::autograd::Function<RecomputedBlock> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, TpGpt* model,
                               std::int64_t layer, const torch::Tensor& mask) {
    ctx->save_for_backward({x});
    ctx->saved_data["model"] = reinterpret_cast<std::int64_t>(model);
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["mask"] = mask;
    return model->block_forward(std::size_t(layer), x, mask);  // autograd is off here
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto* model = reinterpret_cast<TpGpt*>(ctx->saved_data["model"].toInt());
    const auto layer = std::size_t(ctx->saved_data["layer"].toInt());
    const torch::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    torch::Tensor y;
    {
      torch::AutoGradMode enable(true);
      y = model->block_forward(layer, x, ctx->saved_data["mask"].toTensor());
    }
    torch::autograd::backward({y}, {g[0]});
    return {x.grad(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// SP exit: all-gather the shards before the replicated ln_f and LM head; their gradient is the
// same on every rank, so backward keeps this rank's part.
struct GatherSeqToReplicated : torch::autograd::Function<GatherSeqToReplicated> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, TpSite* site) {
    remember(ctx, site);
    return seq_all_gather(*site, x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {seq_split(*site_of(ctx), g[0]), torch::Tensor()};
  }
};

// Ring attention over the CP group (Note [TP with context parallelism]): q, k, v (B, a', s/c, d) →
// out (B, a', s/c, d); backward from the saved log-sum-exp.
struct RingAttention : torch::autograd::Function<RingAttention> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, Comm* cp, double* shift_s) {
    RingAttentionWork work;
    const RingForward f = ring_attention_forward(*cp, CpBalance::zigzag, q, k, v, work);
    *shift_s += work.shift_s;
    ctx->saved_data["cp"] = reinterpret_cast<std::int64_t>(cp);
    ctx->saved_data["shift"] = reinterpret_cast<std::int64_t>(shift_s);
    ctx->save_for_backward({q, k, v, f.out, f.lse});
    return f.out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto* cp = reinterpret_cast<Comm*>(ctx->saved_data["cp"].toInt());
    const auto s = ctx->get_saved_variables();
    RingAttentionWork work;
    const RingGrads d = ring_attention_backward(*cp, CpBalance::zigzag, s[0], s[1], s[2],
                                                RingForward{.out = s[3], .lse = s[4]},
                                                g[0].contiguous(), work);
    *reinterpret_cast<double*>(ctx->saved_data["shift"].toInt()) += work.shift_s;
    return {d.dq, d.dk, d.dv, torch::Tensor(), torch::Tensor()};
  }
};

// causal_self_attention's layout (gpt_model.cpp) with the scores computed by the ring.
torch::Tensor ring_self_attention(const torch::Tensor& qkv, std::int64_t heads, Comm* cp,
                                  double* shift_s) {
  const std::int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, d = C / heads;
  const auto parts = qkv.split(C, 2);
  auto heads_of = [&](const torch::Tensor& x) {
    return x.view({B, T, heads, d}).transpose(1, 2).contiguous();  // (B, a', T, d)
  };
  const auto y =
      RingAttention::apply(heads_of(parts[0]), heads_of(parts[1]), heads_of(parts[2]), cp, shift_s);
  return y.transpose(1, 2).contiguous().view({B, T, C});
}

torch::Tensor cut(const torch::Tensor& t, std::int64_t dim, int tp, int rank) {
  const std::int64_t n = t.size(dim) / tp;
  return t.narrow(dim, rank * n, n);
}

// Rows of heads [r·a/t, (r+1)·a/t) in each of q, k, v of a (3C, …) QKV weight or bias.
torch::Tensor cut_qkv(const torch::Tensor& t, int tp, int rank) {
  const std::int64_t C = t.size(0) / 3;
  std::vector<torch::Tensor> parts;
  for (std::int64_t j = 0; j < 3; ++j) parts.push_back(cut(t.narrow(0, j * C, C), 0, tp, rank));
  return torch::cat(parts, 0);
}

const char* const kSpReplicated[] = {"ln1_w", "ln1_b", "ln2_w", "ln2_b", "proj_b", "mlp_b"};

}  // namespace

std::vector<NamedTensor> tp_shards(Gpt& full, int tp, int rank, bool grads) {
  const GptConfig& c = full->config;
  TALLY_INVARIANT(tp >= 1 && rank >= 0 && rank < tp && c.heads % tp == 0 && (4 * c.hidden) % tp == 0);
  auto of = [&](const torch::Tensor& p) { return grads ? p.grad() : p; };
  std::vector<NamedTensor> out{{"wte", of(full->wte->weight)}, {"wpe", of(full->wpe)}};
  for (std::size_t l = 0; l < full->blocks->size(); ++l) {
    auto& b = *full->blocks[l]->as<GptBlock>();
    const std::string n = "blocks." + std::to_string(l) + ".";
    out.push_back({n + "ln1_w", of(b.ln_1->weight)});
    out.push_back({n + "ln1_b", of(b.ln_1->bias)});
    out.push_back({n + "qkv_w", cut_qkv(of(b.c_attn->weight), tp, rank)});
    out.push_back({n + "qkv_b", cut_qkv(of(b.c_attn->bias), tp, rank)});
    out.push_back({n + "proj_w", cut(of(b.c_proj->weight), 1, tp, rank)});
    out.push_back({n + "proj_b", of(b.c_proj->bias)});
    out.push_back({n + "ln2_w", of(b.ln_2->weight)});
    out.push_back({n + "ln2_b", of(b.ln_2->bias)});
    out.push_back({n + "fc_w", cut(of(b.c_fc->weight), 0, tp, rank)});
    out.push_back({n + "fc_b", cut(of(b.c_fc->bias), 0, tp, rank)});
    out.push_back({n + "mlp_w", cut(of(b.mlp_proj->weight), 1, tp, rank)});
    out.push_back({n + "mlp_b", of(b.mlp_proj->bias)});
  }
  out.push_back({"lnf_w", of(full->ln_f->weight)});
  out.push_back({"lnf_b", of(full->ln_f->bias)});
  return out;
}

TpGpt::TpGpt(Gpt& full, Comm& tp_comm, bool sequence_parallel, Recompute recompute, Comm* cp)
    : config_(full->config), comm_(tp_comm), cp_(cp && cp->world_size() > 1 ? cp : nullptr),
      sp_(sequence_parallel), recompute_(recompute) {
  const int t = comm_.world_size();
  if (cp_) {
    const int c = cp_->world_size();
    TALLY_INVARIANT(config_.seq % (2 * c) == 0);
    const std::int64_t n = config_.seq / (2 * c);
    std::vector<std::int64_t> pos;
    for (const int chunk : cp_chunks(CpBalance::zigzag, c, cp_->rank()))
      for (std::int64_t i = 0; i < n; ++i) pos.push_back(chunk * n + i);
    cp_positions_ = torch::tensor(pos, torch::kLong);
  }
  TALLY_INVARIANT(!sp_ || local_seq() * t == config_.seq / (cp_ ? cp_->world_size() : 1));
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : tp_shards(full, t, comm_.rank(), false))
    params_.push_back({name, tensor.detach().clone().set_requires_grad(true)});
  layer_sites_.assign(std::size_t(config_.layers), TpSite{.comm = &comm_});
  regather_sites_.assign(std::size_t(config_.layers), TpSite{.comm = &comm_});
  edge_site_.comm = &comm_;
  grad_site_.comm = &comm_;
}

torch::Tensor& TpGpt::p(std::size_t block, const char* name) {
  const std::size_t per_block = 12, first = 2 + block * per_block;
  for (std::size_t i = first; i < first + per_block; ++i)
    if (params_[i].name.ends_with(std::string(".") + name)) return params_[i].tensor;
  TALLY_INVARIANT(false && "no such block parameter");
  return params_[0].tensor;
}

torch::Tensor TpGpt::block_forward(std::size_t l, const torch::Tensor& x, const torch::Tensor& mask) {
  TpSite* site = &layer_sites_[l];
  TpSite* regather = &regather_sites_[l];
  const std::int64_t C = config_.hidden;
  const std::int64_t local_heads = config_.heads / comm_.world_size();
  // f + column-parallel linear, or ḡ + it with SP (Note [SP re-gather])
  auto column = [&](const torch::Tensor& a, const char* w, const char* b) {
    return sp_ ? SeqParallelColumnLinear::apply(a, p(l, w), p(l, b), site, regather)
               : torch::linear(CopyToTp::apply(a, site), p(l, w), p(l, b));
  };
  auto row_out = [&](const torch::Tensor& o) {  // g, or g̅ with SP
    return sp_ ? ReduceScatterToSeq::apply(o, site) : ReduceFromTp::apply(o, site);
  };
  // Note [selective recompute policies]: which tensors this block frees and replays.
  const bool op_sac = recompute_ == Recompute::op_sac;
  const bool norms = op_sac || recompute_ == Recompute::save_matmuls;  // + GeLU
  const bool softmax = norms || recompute_ == Recompute::selective;
  ActivationReplay replay;
  const torch::Tensor ln1_w = p(l, "ln1_w").detach(), ln1_b = p(l, "ln1_b").detach();
  const auto a = torch::layer_norm(x, {C}, p(l, "ln1_w"), p(l, "ln1_b"));
  const auto qkv = column(a, "qkv_w", "qkv_b");
  const int a_entry = norms ? replay.add(a, [x = x.detach(), ln1_w, ln1_b, C] {
    return torch::layer_norm(x, {C}, ln1_w, ln1_b);
  }) : -1;
  replay.before_backward(qkv, {a_entry});
  torch::Tensor y;
  if (cp_) {
    y = ring_self_attention(qkv, local_heads, cp_, &cp_shift_s_);
  } else if (!softmax || !replay.active()) {
    y = causal_self_attention(qkv, local_heads, mask);
  } else {  // causal_self_attention's steps (gpt_model.cpp), with q, k, v, QKᵀ and softmax named
    const std::int64_t B = qkv.size(0), T = qkv.size(1), Cl = qkv.size(2) / 3;
    const std::int64_t d = Cl / local_heads;
    const auto parts = qkv.split(Cl, 2);
    auto heads_of = [B, T, local_heads, d](const torch::Tensor& t) {  // (B, a', T, d), own storage
      return t.view({B, T, local_heads, d}).transpose(1, 2).clone(at::MemoryFormat::Contiguous);
    };
    const auto q = heads_of(parts[0]), k = heads_of(parts[1]), v = heads_of(parts[2]);
    auto probs_of = [mask, d](const torch::Tensor& scores) {
      return torch::softmax((scores * (1.0 / std::sqrt(double(d))))
                                .masked_fill(mask, -std::numeric_limits<double>::infinity()),
                            -1);
    };
    const auto scores = torch::matmul(q, k.transpose(-2, -1));  // (B, a', T, T)
    const auto probs = probs_of(scores);
    const auto context = torch::matmul(probs, v);  // (B, a', T, d)
    y = context.transpose(1, 2).contiguous().view({B, T, Cl});
    // selective keeps Q and K and replays QKᵀ; the others keep the scores (a matmul output).
    const int p_entry =
        recompute_ == Recompute::selective
            ? replay.add(probs, [q = q.detach(), k = k.detach(), probs_of] {
                return probs_of(torch::matmul(q, k.transpose(-2, -1)));
              })
            : replay.add(probs, [s = scores.detach(), probs_of] { return probs_of(s); });
    replay.before_backward(context, {p_entry});
    if (op_sac) {  // K: the QKV GEMM's k rows on the replayed norm output (gathered under SP)
      const torch::Tensor wk = p(l, "qkv_w").narrow(0, Cl, Cl).detach();
      const torch::Tensor bk = p(l, "qkv_b").narrow(0, Cl, Cl).detach();
      const int k_entry = replay.add(k, [this, regather, a = a.detach(), wk, bk, heads_of] {
        if (!sp_) return heads_of(torch::linear(a, wk, bk));
        regather->gathered = seq_all_gather(*regather, a);  // the QKV weight gradient's too
        return heads_of(torch::linear(regather->gathered, wk, bk));
      });
      replay.before_backward(scores, {a_entry, k_entry});
    }
  }
  const torch::Tensor proj_w = p(l, "proj_w"), proj_b = p(l, "proj_b");
  const auto r = row_out(torch::linear(y, proj_w));
  const auto h = x + (r + proj_b);
  const torch::Tensor ln2_w = p(l, "ln2_w").detach(), ln2_b = p(l, "ln2_b").detach();
  const auto m = torch::layer_norm(h, {C}, p(l, "ln2_w"), p(l, "ln2_b"));
  const auto u = column(m, "fc_w", "fc_b");
  const auto z = torch::gelu(u, "tanh");
  const auto o = torch::linear(z, p(l, "mlp_w"));
  const auto out = h + (row_out(o) + p(l, "mlp_b"));
  if (norms) {
    std::vector<int> before_up;  // the MLP block input (op-sac), then LayerNorm 2's output
    const bool one = comm_.world_size() == 1;  // t = 1: replay the GEMM; else keep its sum
    if (op_sac)
      before_up.push_back(replay.add(
          h, [x = x.detach(), y = y.detach(), kept = one ? torch::Tensor() : r.detach(), one,
              w = proj_w.detach(), b = proj_b.detach()] {
            return x + ((one ? torch::linear(y, w) : kept) + b);
          }));
    before_up.push_back(replay.add(m, [h = h.detach(), ln2_w, ln2_b, C] {
      return torch::layer_norm(h, {C}, ln2_w, ln2_b);
    }));
    replay.before_backward(u, before_up);
    replay.before_backward(o, {replay.add(z, [u = u.detach()] { return torch::gelu(u, "tanh"); })});
  }
  replay.release();
  return out;
}

std::int64_t TpGpt::local_seq() const {
  const std::int64_t s = cp_ ? config_.seq / cp_->world_size() : config_.seq;
  return sp_ ? s / comm_.world_size() : s;
}

torch::Tensor TpGpt::embed(const torch::Tensor& idx) {
  const std::int64_t T = idx.size(1);
  const torch::Tensor& wte = params_[0].tensor;
  torch::Tensor x;
  if (cp_)  // this CP rank's positions (Note [TP with context parallelism]): (B, s/c, C)
    x = torch::embedding(wte, idx.index_select(1, cp_positions_)) +
        params_[1].tensor.index_select(0, cp_positions_);
  else
    x = torch::embedding(wte, idx) + params_[1].tensor.narrow(0, 0, T);  // (B, T, C)
  if (sp_) x = ScatterToSeq::apply(x, &edge_site_);                     // (B, T/t, C)
  return x;
}

torch::Tensor TpGpt::head_loss(const torch::Tensor& x, const torch::Tensor& all_targets) {
  const torch::Tensor targets = cp_ ? all_targets.index_select(1, cp_positions_) : all_targets;
  const torch::Tensor full = sp_ ? GatherSeqToReplicated::apply(x, &edge_site_) : x;  // (B, T, C)
  const auto& lnf_w = params_[params_.size() - 2].tensor;
  const auto& lnf_b = params_[params_.size() - 1].tensor;
  return lm_loss(torch::matmul(torch::layer_norm(full, {config_.hidden}, lnf_w, lnf_b),
                               params_[0].tensor.t()),
                 targets);
}

torch::Tensor TpGpt::forward(const torch::Tensor& idx, const torch::Tensor& targets) {
  auto x = embed(idx);
  const auto mask = causal_mask(idx.size(1));
  if (observer_) observer_(0);
  for (std::size_t l = 0; l < layer_sites_.size(); ++l) {
    x = block(l, x, mask);
    if (observer_) observer_(l + 1);
  }
  return head_loss(x, targets);
}

torch::Tensor TpGpt::block(std::size_t l, const torch::Tensor& x, const torch::Tensor& mask) {
  return recompute_ == Recompute::full ? RecomputedBlock::apply(x, this, std::int64_t(l), mask)
                    : block_forward(l, x, mask);
}

void TpGpt::sp_reduce_grads() {
  if (!sp_) return;
  std::vector<torch::Tensor> grads;
  for (std::size_t l = 0; l < layer_sites_.size(); ++l)
    for (const char* name : kSpReplicated)
      if (const torch::Tensor& g = p(l, name).grad(); g.defined()) grads.push_back(g);
  if (grads.empty()) return;
  torch::Tensor flat = torch::cat(grads).contiguous();
  counted(grad_site_, [&] { all_reduce(comm_, flat); });
  std::int64_t offset = 0;
  torch::NoGradGuard no_grad;
  for (auto& g : grads) {
    g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
}

void TpGpt::clear_counts() {
  for (auto& s : layer_sites_) s.issued = {};
  for (auto& s : regather_sites_) s.issued = {};
  edge_site_.issued = {};
  grad_site_.issued = {};
  cp_shift_s_ = 0;
}

}  // namespace tally::engine
