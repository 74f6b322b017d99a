// `tally run moe` (moe.hpp): the EP MoE layer against the single-process one and core's ledgers.
#include "tally/engine/experiments/moe.hpp"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <span>

#include "comm_torch.hpp"
#include "moe_layer.hpp"
#include "optimizer_torch.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/tracking_allocator.hpp"
#include "run_helpers.hpp"

namespace tally::engine {

namespace {



// max|a − b| / max|b|: one figure per tensor, as run tp compares its shards.
double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}


struct MoeData {
  at::Tensor x, g;  // (ep·T, h) float64: tokens and the loss weights (loss = Σ y ⊙ g)
};

MoeData draw_data(const MoeOptions& o, int ep) {
  at::manual_seed(std::int64_t(o.seed) + 1);
  return {at::randn({ep * o.tokens, o.layer.hidden}, at::kDouble),
          at::randn({ep * o.tokens, o.layer.hidden}, at::kDouble)};
}

// float64: the reference on all ep·T tokens, the EP layer on this rank's T; outputs, drops and
// gradients compared on this rank's share.
void check_f64(const MoeOptions& o, Comm& ep_comm, MoeVariant& v) {
  const int ep = ep_comm.world_size(), r = ep_comm.rank();
  const std::int64_t T = o.tokens;
  const MoeData d = draw_data(o, ep);
  const MoeParams ref = make_moe_params(o.layer, o.seed, at::kDouble);
  const at::Tensor x_ref = d.x.clone().requires_grad_(true);
  const MoeReference want = moe_reference_forward(o.layer, ref, x_ref, T);
  (want.y * d.g).sum().backward();

  EpMoeLayer layer(o.layer, ref, ep_comm);
  const at::Tensor x = d.x.narrow(0, r * T, T).clone().requires_grad_(true);
  const auto start = std::chrono::steady_clock::now();
  const at::Tensor y = layer.forward(x);
  (y * d.g.narrow(0, r * T, T)).sum().backward();
  layer.reduce_replicated_grads();
  v.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  v.capacity = layer.capacity();
  v.dropped = layer.dropped();
  v.reference_dropped = T * o.layer.top_k - want.kept.narrow(0, r * T, T).sum().item<std::int64_t>();
  v.max_output_rel_diff = max_rel_diff(y, want.y.narrow(0, r * T, T));
  const std::vector<NamedParam> grads = moe_rank_share(ref, ep, r, true);
  auto compare = [&](const std::string& name, const at::Tensor& got, const at::Tensor& expected) {
    const double diff = max_rel_diff(got, expected);
    if (diff >= v.max_grad_rel_diff) {
      v.max_grad_rel_diff = diff;
      v.worst_grad = name;
    }
  };
  for (std::size_t i = 0; i < grads.size(); ++i)
    compare(grads[i].name, layer.parameters()[i].tensor.grad(), grads[i].tensor);
  compare("input", x.grad(), x_ref.grad().narrow(0, r * T, T));
  const MoeExchangeCount& ex = layer.exchanges();
  v.all_to_all_calls = ex.calls;
  v.all_to_all_bytes = ex.bytes_sent;
  v.all_to_all_seconds = ex.seconds;
  v.buffer_bytes = double(o.layer.experts * v.capacity * o.layer.hidden) * 8.0;
  v.capacity_exact = double(o.layer.experts * v.capacity) ==
                     double(T * o.layer.top_k) * o.layer.capacity_factor;
}

// fp32: this rank's parameters, one forward + backward, the gradient all-reduce and one Adam step,
// all inside a tracking-allocator scope; what stays allocated afterwards is the model states.
// Note [Gloo's last references]: ProcessGroupGloo's worker thread drops its reference to a
// collective's tensors only after the waiting thread has been woken (runLoop resets its
// work-in-progress slot afterwards), so a count taken right after the step could include the
// last exchange's buffers on a loaded machine. Comm's waits now return only once that reference
// is gone (Note [released tensors] in comm.cpp); as a second guard the group is its own and is
// torn down (its destructor joins the worker threads) before the count — after a world barrier,
// so no peer is still inside its last collective.
double measure_states_f32(const MoeOptions& o, Comm& world, std::span<const int> ranks,
                          const std::string& name) {
  auto ep_comm = std::make_unique<Comm>(world, ranks, name);
  const int ep = ep_comm->world_size(), r = ep_comm->rank();
  const std::int64_t T = o.tokens;
  const MoeData d = draw_data(o, ep);
  const at::Tensor x = d.x.narrow(0, r * T, T).to(at::kFloat);
  const at::Tensor g = d.g.narrow(0, r * T, T).to(at::kFloat);
  const MoeParams full = make_moe_params(o.layer, o.seed, at::kFloat);  // outside the scope
  TrackingAllocatorScope scope({.cache = false});
  EpMoeLayer layer(o.layer, full, *ep_comm);
  {
    const at::Tensor y = layer.forward(x);
    (y * g).sum().backward();
  }
  layer.reduce_replicated_grads();
  std::vector<at::Tensor> params;
  for (NamedParam& p : layer.parameters()) params.push_back(p.tensor);
  Adam adam(params, AdamOptions{});
  adam.step();
  world.barrier();
  ep_comm.reset();  // Note [Gloo's last references]
  return double(scope.counters().allocated_bytes);
}

StepTraffic predict_traffic(const MoeOptions& o, std::int64_t n, double share, int ep) {
  return step_traffic({.params = double(n),
                       .param_bytes = 8,
                       .grad_bytes = 8,
                       .act_bytes = 8,  // float64 tokens on the wire
                       .hidden = o.layer.hidden,
                       .layers = 1,
                       .seq_len = o.tokens,
                       .micro_batch = 1,
                       .micro_batches = 1,
                       .dp = ep,
                       .ep = ep,
                       .expert_share = ep > 1 ? share : 0.0,
                       .moe_layers = 1,
                       .experts_per_token = o.layer.top_k,
                       .capacity_factor = o.layer.capacity_factor});
}

}  // namespace

void MoeOptions::validate(int world_size) const {
  const MoeConfig& l = layer;
  require(l.hidden >= 1 && l.hidden <= 4096, "--hidden", l.hidden, "must be in [1, 4096]");
  require(l.ffn >= 1 && l.ffn <= 16384, "--ffn", l.ffn, "must be in [1, 16384]");
  require(l.experts >= 1 && l.experts <= 1024, "--experts", l.experts, "must be in [1, 1024]");
  require(l.top_k >= 1 && l.top_k <= l.experts, "--top-k", l.top_k,
          "must be in [1, --experts = " + std::to_string(l.experts) + "]");
  require(l.shared_ffn >= 0 && l.shared_ffn <= 16384, "--shared-ffn", l.shared_ffn,
          "must be in [0, 16384] (0 = no shared expert)");
  if (!(std::isfinite(l.capacity_factor) && l.capacity_factor >= 1 && l.capacity_factor <= 64))
    throw InvalidInput("--capacity-factor = " + format_number(l.capacity_factor) +
                       ": must be in [1, 64] (core's range; 1 = the balanced share)");
  require(tokens >= 1 && tokens <= 1 << 20, "--tokens", tokens, "must be in [1, 1048576]");
  for (const int ep : this->ep) {
    require(ep >= 1 && world_size % ep == 0, "--ep", ep,
            "must divide the world size " + std::to_string(world_size) +
                " (EP groups of adjacent ranks; allowed: " + divisors_of(world_size) + ")");
    require(l.experts % ep == 0, "--ep", ep,
            "must divide --experts = " + std::to_string(l.experts) +
                " (each rank holds experts/ep; allowed: " + divisors_of(l.experts) + ")");
  }
  if (!(timeout_s > 0 && timeout_s <= 86400))
    throw InvalidInput("--timeout = " + format_number(timeout_s) + ": must be in (0, 86400] s");
  require(threads >= 0 && threads <= 1024, "--threads", threads, "must be in [0, 1024]");
}

std::vector<MoeCheck> moe_checks(const MoeResult& r) {
  std::vector<MoeCheck> out;
  auto rel = [&](std::string what, double measured, double predicted, double tol) {
    const double d = predicted == 0 ? std::abs(measured) : rel_diff(measured, predicted);
    out.push_back({std::move(what), measured, predicted, tol, d <= tol});
  };
  for (const MoeVariant& v : r.variants) {
    const std::string ep = "ep=" + std::to_string(v.ep) + " ";
    out.push_back({ep + "output f64 vs single-process", v.max_output_rel_diff, 0, kMoeF64Tolerance,
                   v.max_output_rel_diff <= kMoeF64Tolerance});
    out.push_back({ep + "max gradient difference f64 (" + v.worst_grad + ")", v.max_grad_rel_diff,
                   0, kMoeF64Tolerance, v.max_grad_rel_diff <= kMoeF64Tolerance});
    rel(ep + "dropped routed copies vs single-process", double(v.dropped),
        double(v.reference_dropped), 0);
    const TrafficItem& e = v.predicted.ep;
    if (v.ep > 1) {
      rel(ep + "all-to-all calls per layer", double(v.all_to_all_calls), e.calls, 0);
      // The padded slots always travel: S = E·C·h·8, by core's all-to-all formula.
      rel(ep + "bytes per all-to-all (S = E*C*h*8)", v.all_to_all_bytes / double(v.all_to_all_calls),
          collective_bytes_per_rank(Collective::all_to_all, v.buffer_bytes, v.ep),
          kMoeBytesTolerance);
      if (v.capacity_exact) {  // C = T·k·c_f/E: core's S = T·k·c_f·h·8 is the same buffer
        rel(ep + "bytes per all-to-all vs core's ep item", v.all_to_all_bytes / double(v.all_to_all_calls),
            e.bytes_per_call, kMoeBytesTolerance);
        rel(ep + "all-to-all bytes per layer vs core's ep item", v.all_to_all_bytes,
            e.bytes_per_rank, kMoeBytesTolerance);
      }
    }
    rel(ep + "fp32 model states per rank (bytes)", v.state_bytes,
        v.predicted_states.bytes.total(), kMoeStateTolerance);
  }
  return out;
}

bool moe_ok(const MoeResult& r) {
  for (const MoeCheck& c : moe_checks(r))
    if (!c.ok) return false;
  return true;
}

MoeResult run_moe(const DistEnv& env, const MoeOptions& options) {
  env.validate();
  MoeOptions o = options;
  if (o.ep.empty()) o.ep = {env.world_size};
  o.validate(env.world_size);
  if (o.threads > 0) at::set_num_threads(o.threads);
  MoeResult r{.options = o, .rank = env.rank, .world_size = env.world_size};
  r.n_params = o.layer.params();
  r.expert_share = double(o.layer.routed_expert_params()) / double(r.n_params);
  Comm world(env, {.timeout_s = o.timeout_s});
  for (const int ep : o.ep) {
    MoeVariant v{.ep = ep, .group = env.rank / ep};
    std::vector<int> ranks;
    for (int i = 0; i < ep; ++i) ranks.push_back(v.group * ep + i);
    const std::string name = "ep" + std::to_string(ep) + "." + std::to_string(v.group) + "." +
                             std::to_string(r.variants.size());
    Comm ep_comm(world, ranks, name);
    check_f64(o, ep_comm, v);
    v.state_bytes = measure_states_f32(o, world, ranks, name + ".states");
    v.predicted = predict_traffic(o, r.n_params, r.expert_share, ep);
    v.predicted_states = model_states(double(r.n_params),
                                      {.precision = Precision::fp32,
                                       .optimizer = Optimizer::adam,
                                       .zero_stage = 0,
                                       .shard_degree = ep,
                                       .ep = ep,
                                       .expert_share = ep > 1 ? r.expert_share : 0.0});
    if (env.rank == 0)
      std::fprintf(stderr,
                   "moe ep=%d: f64 output diff %.2e, gradient diff %.2e; %lld all-to-alls, %.0f "
                   "bytes; dropped %lld of %lld routed copies; %.3f s\n",
                   ep, v.max_output_rel_diff, v.max_grad_rel_diff,
                   static_cast<long long>(v.all_to_all_calls), v.all_to_all_bytes,
                   static_cast<long long>(v.dropped),
                   static_cast<long long>(o.tokens * o.layer.top_k), v.step_seconds);
    world.barrier();  // no rank tears its group down while a peer still exchanges
    r.variants.push_back(std::move(v));
  }
  return r;
}

}  // namespace tally::engine
