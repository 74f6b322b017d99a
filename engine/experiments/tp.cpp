// `tally run tp` (tp.hpp): the TP model against the single-process one and core's TP ledger.
#include "tally/engine/experiments/tp.hpp"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "gpt_model.hpp"
#include "tally/core/activations.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/experiments/memory_profile.hpp"
#include "tally/engine/process_groups.hpp"
#include "tally/engine/tracking_allocator.hpp"
#include "tp_model.hpp"
#include "run_helpers.hpp"

namespace tally::engine {

double bytes_sent(const std::vector<TpCollectiveMeasure>& ms) {
  double b = 0;
  for (const auto& m : ms) b += m.bytes_sent;
  return b;
}

namespace {

Recompute policy_of(const TpVariant& v) {
  return v.full_recompute ? Recompute::full : Recompute::none;
}




std::vector<TpCollectiveMeasure> measures(const CommCounters& c) {
  std::vector<TpCollectiveMeasure> out;
  for (std::size_t i = 0; i < c.by_collective.size(); ++i)
    if (c.by_collective[i].calls > 0)
      out.push_back({.collective = Collective(i),
                     .calls = c.by_collective[i].calls,
                     .bytes_sent = c.by_collective[i].bytes_sent,
                     .seconds = c.by_collective[i].seconds});
  return out;
}

struct Batches {
  at::Tensor idx, targets;  // (steps + 1, B, T) int64; batch 0 is the float64 check's
};

Batches draw_batches(const TpOptions& o) {
  at::manual_seed(std::int64_t(o.seed) + 1);
  const GptConfig& m = o.model;
  return {at::randint(m.vocab, {o.steps + 1, m.micro_batch, m.seq}, at::kLong),
          at::randint(m.vocab, {o.steps + 1, m.micro_batch, m.seq}, at::kLong)};
}

Gpt reference_model(const TpOptions& o, at::ScalarType dtype) {
  at::manual_seed(std::int64_t(o.seed));
  Gpt model(o.model);
  model->to(dtype);
  return model;
}

// float64: one forward and backward of both models on batch 0; gradients compared shard by shard.
void check_f64(const TpOptions& o, Comm& tp, const Batches& data, TpVariant& v) {
  Gpt ref = reference_model(o, at::kDouble);
  const at::Tensor ref_loss = ref->forward(data.idx[0], data.targets[0]);
  ref_loss.backward();
  TpGpt model(ref, tp, v.sequence_parallel, policy_of(v));
  const at::Tensor loss = model.forward(data.idx[0], data.targets[0]);
  loss.backward();
  model.sp_reduce_grads();
  v.loss_f64 = loss.item<double>();
  v.reference_loss_f64 = ref_loss.item<double>();
  v.loss_rel_diff = rel_diff(v.loss_f64, v.reference_loss_f64);
  const std::vector<NamedTensor> want = tp_shards(ref, tp.world_size(), tp.rank(), true);
  for (std::size_t i = 0; i < want.size(); ++i) {
    const at::Tensor& got = model.parameters()[i].tensor.grad();
    const double scale = want[i].tensor.abs().max().item<double>();
    const double d = (got - want[i].tensor).abs().max().item<double>() / scale;
    if (d >= v.max_grad_rel_diff) {
      v.max_grad_rel_diff = d;
      v.worst_grad = want[i].name;
    }
  }
}

void sgd(std::vector<at::Tensor> params, double lr) {
  at::NoGradGuard no_grad;
  for (auto& p : params) {
    p.sub_(p.grad(), lr);
    p.mutable_grad().zero_();
  }
}

// fp32: `steps` SGD steps of both models on batches 1…steps; the first step's collectives kept.
void train_f32(const TpOptions& o, Comm& tp, const Batches& data, TpVariant& v, bool progress) {
  Gpt ref = reference_model(o, at::kFloat);
  TpGpt model(ref, tp, v.sequence_parallel, policy_of(v));
  std::vector<at::Tensor> tp_params;
  for (auto& p : model.parameters()) tp_params.push_back(p.tensor);
  for (int s = 1; s <= o.steps; ++s) {
    const at::Tensor ref_loss = ref->forward(data.idx[s], data.targets[s]);
    ref_loss.backward();
    sgd(ref->parameters(), o.lr);
    model.clear_counts();
    const double before = tp.counters()[Collective::all_reduce].bytes_sent +
                          tp.counters()[Collective::all_gather].bytes_sent +
                          tp.counters()[Collective::reduce_scatter].bytes_sent;
    const auto start = std::chrono::steady_clock::now();
    const at::Tensor loss = model.forward(data.idx[s], data.targets[s]);
    loss.backward();
    model.sp_reduce_grads();
    sgd(tp_params, o.lr);
    v.step_seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    v.losses.push_back(loss.item<double>());
    v.reference_losses.push_back(ref_loss.item<double>());
    v.max_loss_rel_diff = std::max(v.max_loss_rel_diff, rel_diff(v.losses.back(), v.reference_losses.back()));
    if (s == 1) {
      for (TpSite& site : model.layer_sites()) v.per_layer.push_back(measures(site.issued));
      v.edges = measures(model.edge_site().issued);
      CommCounters regather;
      for (const TpSite& site : model.regather_sites())
        for (std::size_t c = 0; c < regather.by_collective.size(); ++c) {
          regather.by_collective[c].calls += site.issued.by_collective[c].calls;
          regather.by_collective[c].bytes_sent += site.issued.by_collective[c].bytes_sent;
          regather.by_collective[c].seconds += site.issued.by_collective[c].seconds;
        }
      v.sp_regather = measures(regather);
      v.sp_grad_reduce = measures(model.grad_site().issued);
      v.tp_comm_bytes = tp.counters()[Collective::all_reduce].bytes_sent +
                        tp.counters()[Collective::all_gather].bytes_sent +
                        tp.counters()[Collective::reduce_scatter].bytes_sent - before;
    }
    if (progress)
      std::fprintf(stderr, "tp t=%d sp=%s recompute=%s: step %d/%d loss %.6f (single-process "
                   "%.6f) %.3f s\n",
                   tp.world_size(), v.sequence_parallel ? "on" : "off",
                   v.full_recompute ? "full" : "none", s, o.steps,
                   v.losses.back(), v.reference_losses.back(), v.step_seconds.back());
  }
}

// Activations of one fp32 forward on batch 1, measured by the tracking allocator at each block
// boundary: what block l leaves alive is the growth of the allocated bytes across it (its output
// stands for the next block's saved input, which the growth of block l − 1 counted), so the mean
// over the L blocks is (allocated after the last − allocated before the first) / L.
void measure_activations(const TpOptions& o, Comm& tp, const Batches& data, TpVariant& v) {
  Gpt ref = reference_model(o, at::kFloat);
  TpGpt model(ref, tp, v.sequence_parallel, policy_of(v));
  std::vector<std::int64_t> allocated;
  at::Tensor loss;
  {
    TrackingAllocatorScope scope({.cache = false});
    model.set_block_observer(
        [&](std::size_t) { allocated.push_back(scope.counters().allocated_bytes); });
    loss = model.forward(data.idx[1], data.targets[1]);
    model.set_block_observer({});
  }
  loss.backward();  // the peers' collectives in backward must be matched; frees the graph
  const auto L = double(o.model.layers);
  v.activation_bytes_per_layer = double(allocated.back() - allocated.front()) / L;
  ActivationSetup a = gpt_activation_setup(o.model, Precision::fp32);
  a.tp = tp.world_size();
  a.sequence_parallel = v.sequence_parallel;
  a.recompute = policy_of(v);
  v.predicted_activation_bytes_per_layer = activations(gpt_model_spec(o.model), a).per_layer_bytes;
  const double tokens = double(o.model.micro_batch * o.model.seq) / (v.sequence_parallel ? a.tp : 1);
  v.layer_norm_stat_bytes = v.full_recompute ? 0.0 : 2 * 2 * 4.0 * tokens;
}

StepTraffic predict(const TpOptions& o, std::int64_t n_params, int t, bool sp, bool full) {
  const GptConfig& m = o.model;
  return step_traffic({.params = double(n_params),
                       .param_bytes = 4,
                       .grad_bytes = 4,
                       .act_bytes = 4,  // fp32 activations on the wire
                       .hidden = m.hidden,
                       .layers = m.layers,
                       .seq_len = m.seq,
                       .micro_batch = m.micro_batch,
                       .micro_batches = 1,
                       .tp = t,
                       .sequence_parallel = sp,
                       .recompute = full ? Recompute::full : Recompute::none});
}

}  // namespace

void TpOptions::validate(int world_size) const {
  model.validate();
  const int t = tp == 0 ? world_size : tp;
  require(t >= 1 && t == world_size, "--tp", t,
          "must equal the world size " + std::to_string(world_size) +
              " (tally run tp runs one TP group over every rank)");
  const std::int64_t ffn = 4 * model.hidden;
  require(model.heads % t == 0 && ffn % t == 0, "--tp", t,
          "must divide --heads = " + std::to_string(model.heads) + " and the FFN width 4 x --hidden = " +
              std::to_string(ffn) + " (allowed: " + divisors_of(std::gcd(model.heads, ffn)) + ")");
  if (sp != SpMode::off)
    require(model.seq % t == 0, "--seq", model.seq,
            "must be divisible by --tp = " + std::to_string(t) + " with --sp (sequence shards)");
  require(steps >= 1 && steps <= 100000, "--steps", steps, "must be in [1, 100000]");
  if (!(lr > 0 && std::isfinite(lr)))
    throw InvalidInput("--lr = " + format_number(lr) + ": must be finite and > 0");
  if (!(timeout_s > 0 && timeout_s <= 86400))
    throw InvalidInput("--timeout = " + format_number(timeout_s) + ": must be in (0, 86400] s");
  require(threads >= 0 && threads <= 1024, "--threads", threads, "must be in [0, 1024]");
}

double TpVariant::measured_bytes_per_layer() const {
  double b = 0;
  for (const auto& l : per_layer) b += bytes_sent(l);
  return per_layer.empty() ? 0 : b / double(per_layer.size());
}
double TpVariant::predicted_bytes_per_layer() const {
  return predicted.tp.bytes_per_rank / double(predicted.setup.layers);
}
double TpVariant::predicted_calls_per_layer() const {
  return predicted.tp.calls / double(predicted.setup.layers);
}

std::vector<TpCheck> tp_checks(const TpResult& r) {
  std::vector<TpCheck> out;
  auto rel = [&](std::string what, double measured, double predicted, double tol) {
    const double d = predicted == 0 ? std::abs(measured) : rel_diff(measured, predicted);
    out.push_back({std::move(what), measured, predicted, tol, d <= tol});
  };
  for (const TpVariant& v : r.variants) {
    const std::string sp = std::string(v.sequence_parallel ? "sp=on " : "sp=off ") +
                           (v.full_recompute ? "recompute=full " : "");
    rel(sp + "loss f64 vs single-process", v.loss_f64, v.reference_loss_f64, kTpF64Tolerance);
    out.push_back({sp + "max gradient difference f64 (" + v.worst_grad + ")", v.max_grad_rel_diff,
                   0, kTpF64Tolerance, v.max_grad_rel_diff <= kTpF64Tolerance});
    out.push_back({sp + "max loss difference fp32 over the steps", v.max_loss_rel_diff, 0,
                   kTpF32LossTolerance, v.max_loss_rel_diff <= kTpF32LossTolerance});
    rel(sp + "activation bytes per layer less LayerNorm statistics",
        v.activation_bytes_per_layer - v.layer_norm_stat_bytes,
        v.predicted_activation_bytes_per_layer, kTpActivationTolerance);
    const TrafficItem& t = v.predicted.tp;
    for (std::size_t l = 0; l < v.per_layer.size(); ++l) {
      const std::string layer = sp + "layer " + std::to_string(l) + " ";
      rel(layer + "bytes", bytes_sent(v.per_layer[l]), v.predicted_bytes_per_layer(),
          kTpBytesTolerance);
      std::int64_t calls = 0;
      for (const auto& m : v.per_layer[l]) {
        calls += m.calls;
        const bool expected_kind = r.world_size == 1 ||
                                   m.collective == t.collective || m.collective == t.paired_with;
        out.push_back({layer + std::string(to_string(m.collective)) + " is core's collective",
                       expected_kind ? 1.0 : 0.0, 1, 0, expected_kind});
        if (r.world_size > 1)
          rel(layer + std::string(to_string(m.collective)) + " bytes per call",
              m.bytes_sent / double(m.calls), t.bytes_per_call, kTpBytesTolerance);
      }
      if (r.world_size > 1) rel(layer + "calls", double(calls), v.predicted_calls_per_layer(), 0);
    }
    if (v.sequence_parallel && r.world_size > 1) {  // Note [SP re-gather]: core's tp_regather
      double calls = 0;
      for (const auto& m : v.sp_regather) calls += double(m.calls);
      rel(sp + "backward re-gather bytes (core tp_regather)", bytes_sent(v.sp_regather),
          v.predicted.tp_regather.bytes_per_rank, kTpBytesTolerance);
      rel(sp + "backward re-gather calls", calls, v.predicted.tp_regather.calls, 0);
      rel(sp + "edge bytes (core engine_sp_traffic)", bytes_sent(v.edges),
          v.predicted_sp.edges.bytes_per_rank, kTpBytesTolerance);
      rel(sp + "sequence-sharded gradient all-reduce bytes (core engine_sp_traffic)",
          bytes_sent(v.sp_grad_reduce), v.predicted_sp.grads.bytes_per_rank, kTpBytesTolerance);
    }
  }
  // Seed plan 2: the SP-on / SP-off activation ratio against core's, for each recompute setting.
  for (const TpVariant& off : r.variants)
    for (const TpVariant& on : r.variants)
      if (!off.sequence_parallel && on.sequence_parallel && off.full_recompute == on.full_recompute)
        rel(std::string("SP-on / SP-off activation ratio") +
                (on.full_recompute ? " (recompute=full)" : ""),
            (on.activation_bytes_per_layer - on.layer_norm_stat_bytes) /
                (off.activation_bytes_per_layer - off.layer_norm_stat_bytes),
            on.predicted_activation_bytes_per_layer / off.predicted_activation_bytes_per_layer,
            kTpActivationTolerance);
  return out;
}

bool tp_ok(const TpResult& r) {
  for (const TpCheck& c : tp_checks(r))
    if (!c.ok) return false;
  return true;
}

TpResult run_tp(const DistEnv& env, const TpOptions& options) {
  env.validate();
  options.validate(env.world_size);
  if (options.threads > 0) at::set_num_threads(options.threads);
  TpResult r{.options = options, .rank = env.rank, .world_size = env.world_size};
  r.options.tp = env.world_size;
  r.n_params = count_params(gpt_model_spec(options.model)).total();
  Comm world(env, {.timeout_s = options.timeout_s});
  ProcessGroups groups(world, ParallelLayout{.tp = env.world_size});
  std::vector<bool> layouts, recomputes;
  if (options.sp != SpMode::on) layouts.push_back(false);
  if (options.sp != SpMode::off) layouts.push_back(true);
  if (options.recompute != RecomputeMode::full) recomputes.push_back(false);
  if (options.recompute != RecomputeMode::none) recomputes.push_back(true);
  const Batches data = draw_batches(options);
  for (const bool full : recomputes)
    for (const bool sp : layouts) {
      TpVariant v{.sequence_parallel = sp, .full_recompute = full};
      check_f64(options, groups.tp(), data, v);
      train_f32(options, groups.tp(), data, v, env.rank == 0);
      measure_activations(options, groups.tp(), data, v);
      v.predicted = predict(options, r.n_params, env.world_size, sp, full);
      v.predicted_sp = engine_sp_traffic(
          {.model = gpt_model_spec(options.model), .seq = options.model.seq,
           .micro_batch = options.model.micro_batch, .tp = env.world_size,
           .sequence_parallel = sp, .stage_layers = int(options.model.layers)});
      r.variants.push_back(std::move(v));
    }
  world.barrier();  // no rank tears its groups down while a peer still reduces
  return r;
}

}  // namespace tally::engine
