// `tally run 3d` (three_d.hpp): DP × TP × PP on the engine's GPT against the single-process model
// and core's ledgers.
#include "tally/engine/experiments/three_d.hpp"

#include <ATen/ATen.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <filesystem>
#include <set>

#include "comm_torch.hpp"
#include "gpt_model.hpp"
#include "optimizer_torch.hpp"
#include "pp_model.hpp"
#include "rank_liveness.hpp"
#include "tally/core/activations.hpp"
#include "tally/core/comm.hpp"
#include "tally/core/gpt_step.hpp"
#include "tally/core/model_states.hpp"
#include "tally/core/sharding.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/bench/harness.hpp"
#include "tally/engine/experiments/memory_profile.hpp"
#include "tally/engine/process_groups.hpp"
#include "tally/engine/temp_directory.hpp"
#include "tally/engine/tracking_allocator.hpp"
#include "tp_model.hpp"
#include "zero_flat.hpp"
#include "run_helpers.hpp"

namespace tally::engine {

namespace {

using Clock = std::chrono::steady_clock;



// A pipeline stage made of TP shards (pp_model.hpp's StageModel over tp_model.hpp's TpGpt).
class TpStageModel final : public StageModel {
 public:
  explicit TpStageModel(TpGpt& m) : m_(m), mask_(causal_mask(m.config().seq)) {}
  at::Tensor embed(const at::Tensor& idx) override { return m_.embed(idx); }
  at::Tensor block(int layer, const at::Tensor& x) override {
    return m_.block(std::size_t(layer), x, mask_);  // with --recompute, checkpointed
  }
  at::Tensor head_loss(const at::Tensor& x, const at::Tensor& targets) override {
    return m_.head_loss(x, targets);
  }
  std::vector<std::int64_t> boundary_shape(std::int64_t B, std::int64_t T) const override {
    return {B, m_.local_seq(), m_.config().hidden};
  }
  at::TensorOptions options() const override { return m_.parameters()[0].tensor.options(); }
  int layers() const override { return int(m_.config().layers); }
  at::Tensor& tied_embedding_grad() override { return m_.parameters()[0].tensor.mutable_grad(); }

 private:
  TpGpt& m_;
  at::Tensor mask_;
};

// The TpGpt parameter names a stage uses: the embedding and positions on the first stage, the
// tied embedding and ln_f on the last, the blocks of its layers.
bool stage_owns(const std::string& name, const std::set<int>& layers, bool first, bool last) {
  if (name == "wte") return first || last;
  if (name == "wpe") return first;
  if (name == "lnf_w" || name == "lnf_b") return last;
  const int l = std::stoi(name.substr(7));  // "blocks.<l>.…"
  return layers.count(l) > 0;
}

// Note [3-D data-parallel step]
// The stage's own parameters (its TP slice) become views of one flat buffer, their gradients
// views of another, and zero_flat.hpp's FlatDataParallel averages them over the DP (× CP) group
// at the run's ZeRO stage: 0 all-reduces the gradient and Adam updates everything; 1
// reduce-scatters it (shard_span, core/sharding.hpp), Adam updates the rank's span in place and
// an all-gather fills in the other ranks' spans; 2 does the same with the full gradient freed
// between steps; 3 holds only the span of the parameters too and gathers the stage when it runs.
// Stages 2–3 follow core's step_traffic: without PP the gradient is reduce-scattered after every
// micro-batch's backward and ZeRO-3 gathers the parameters for each forward and each backward
// (DeepSpeed, FSDP); under PP the stage's gradient accumulates whole and is reduce-scattered
// once per step, and ZeRO-3 gathers the stage once (torchtitan: Note [sharded data parallelism
// under PP] in core/src/comm.cpp). The per-micro-batch work runs between the schedule's
// operations (PpOpHooks), the SP gradient sums with it. One Adam, one sharding rule.

struct Data {
  at::Tensor idx, targets;  // (D·M, B, S) int64: DP rank d takes micro-batches [d·M, (d+1)·M)
};

Data draw(const ThreeDOptions& o, int M, std::uint64_t salt) {
  at::manual_seed(std::int64_t(o.seed + salt));
  const GptConfig& m = o.model;
  return {at::randint(m.vocab, {o.dp * M, m.micro_batch, m.seq}, at::kLong),
          at::randint(m.vocab, {o.dp * M, m.micro_batch, m.seq}, at::kLong)};
}

Gpt reference_model(const ThreeDOptions& o, at::ScalarType dtype) {
  at::manual_seed(std::int64_t(o.seed));
  Gpt model(o.model);
  model->to(dtype);
  return model;
}

double comm_seconds(const Comm& c) {
  double s = 0;
  for (const auto& k : c.counters().by_collective) s += k.seconds;
  return s;
}
double all_bytes(const Comm& c) {
  double b = 0;
  for (const auto& k : c.counters().by_collective) b += k.bytes_sent;
  return b;
}
double all_calls(const Comm& c) {
  double n = 0;
  for (const auto& k : c.counters().by_collective) n += double(k.calls);
  return n;
}

// What one step of a rank did up to its reduced gradient.
struct StepRecord {
  PpStageRecord schedule;
  at::Tensor reduced;          // the averaged gradient Adam reads (all, or the rank's span)
  double tp_in_compute_s = 0;  // TP collectives inside the schedule's computation
  double tied_s = 0, tied_bytes = 0;  // the tied-embedding exchange between the end stages
};

// One rank's model: the TP shards, the stage over them, the DP (ZeRO) wrapper of its parameters.
struct RankModel {
  TpGpt tp;
  TpStageModel stage_model;
  PpStage stage;
  Comm& pp;
  std::vector<std::string> own;  // names, in TpGpt order
  std::unique_ptr<zero::FlatDataParallel> opt;
  PpOpHooks hooks;          // Note [3-D data-parallel step]: the per-micro-batch work
  double hook_tp_s = 0;     // TP seconds inside the hooks (SP gradient sums), this step
  bool die_after_op = false;  // --kill-rank: SIGKILL itself after the schedule's next operation

  RankModel(Gpt& ref, ProcessGroups& g, const ThreeDOptions& o)
      : tp(ref, g.tp(), o.sp, o.recompute, &g.cp()), stage_model(tp),
        stage(stage_model, g.pp(), o.virtual_split(), o.interleave), pp(g.pp()) {}
  RankModel(const RankModel&) = delete;  // the hooks hold `this`

  // The stage's own parameters into the DP wrapper's flat buffers (what its model states are);
  // grad: the group the gradients are averaged over (DP, or DP × CP).
  void make_optimizer(Comm& grad, const ThreeDOptions& o, std::optional<AdamOptions> adam = {}) {
    const std::vector<int> mine = stage.own_layers();
    const std::set<int> mine_set(mine.begin(), mine.end());
    std::vector<at::Tensor*> params;
    for (auto& p : tp.parameters()) {
      if (stage_owns(p.name, mine_set, stage.first(), stage.last())) {
        own.push_back(p.name);
        params.push_back(&p.tensor);
      }
    }
    // Core's rule (step_traffic): stages 2–3 reduce per micro-batch only without PP.
    opt = std::make_unique<zero::FlatDataParallel>(
        params, grad,
        zero::FlatDataParallelOptions{.stage = o.zero,
                                      .reduce_each_micro_batch = o.zero >= 2 && o.pp == 1,
                                      .adam = adam.value_or(AdamOptions{.lr = o.lr})});
    hooks.before = [this](const PipelineOp& op) {
      opt->before_op(op.kind == PipelineOpKind::backward);
    };
    hooks.after = [this](const PipelineOp& op) {
      const bool backward = op.kind == PipelineOpKind::backward;
      if (backward && opt->reduces_each_micro_batch()) {  // the micro-batch's SP sums first
        const double t0 = comm_seconds(tp.tp_comm());
        tp.sp_reduce_grads();
        hook_tp_s += comm_seconds(tp.tp_comm()) - t0;
      }
      opt->after_op(backward);
      if (die_after_op) {
        std::fflush(nullptr);
        ::kill(::getpid(), SIGKILL);
      }
    };
  }

  // One step on this DP rank's micro-batches: the schedule, the SP and tied-embedding gradient
  // sums, the DP reduction (Note [3-D data-parallel step]).
  StepRecord backward_step(const std::vector<PipelineOp>& ops, const Data& d, int dp_index, int M,
                           const TrackingAllocatorScope* memory) {
    StepRecord r;
    opt->begin_step();
    hook_tp_s = 0;
    const double tp0 = comm_seconds(tp.tp_comm());
    r.schedule = stage.step(ops, d.idx.narrow(0, dp_index * M, M),
                            d.targets.narrow(0, dp_index * M, M), memory, &hooks);
    // A TP group of one only copies (its identity "collectives"): compute, not TP comm.
    if (tp.tp_comm().world_size() > 1)
      r.tp_in_compute_s = comm_seconds(tp.tp_comm()) - tp0 - hook_tp_s;
    if (!opt->reduces_each_micro_batch()) tp.sp_reduce_grads();
    const double pp0 = all_bytes(pp);
    const auto t = Clock::now();
    stage.reduce_tied_embedding();
    r.tied_s = seconds_since(t);
    r.tied_bytes = all_bytes(pp) - pp0;
    r.reduced = opt->reduce();
    return r;
  }

  // Flat copy, in own order, of the reference's TP slices (its parameters or their gradients).
  at::Tensor reference_flat(Gpt& ref, bool grads) {
    std::vector<at::Tensor> parts;
    for (const auto& s : tp_shards(ref, tp.tp_comm().world_size(), tp.tp_comm().rank(), grads))
      if (std::find(own.begin(), own.end(), s.name) != own.end())
        parts.push_back(s.tensor.detach().reshape(-1));
    return at::cat(parts);
  }
  // Per element, the largest |value| of its tensor (the relative scale, as run tp's check).
  at::Tensor reference_scale(Gpt& ref, bool grads) {
    std::vector<at::Tensor> parts;
    for (const auto& s : tp_shards(ref, tp.tp_comm().world_size(), tp.tp_comm().rank(), grads))
      if (std::find(own.begin(), own.end(), s.name) != own.end())
        parts.push_back(at::full({s.tensor.numel()}, s.tensor.abs().max().item<double>(),
                                 s.tensor.options()));
    return at::cat(parts);
  }
};

// The float64 check's Adam: ε = 1e-4 instead of 1e-8. Adam's first step is lr·g/(|g| + ε), whose
// slope lr·ε/(|g| + ε)² is lr/ε at g → 0: with ε = 1e-8 an ulp-level difference in a near-zero
// gradient element (the reduction's summation order) would move its parameter by up to 1e-10 of a
// tensor whose values are lr-sized (a zero-initialised bias), the tolerance itself. The check is of
// the sharded update and its all-gather, which this conditioning leaves as exacting.
constexpr AdamOptions kCheckAdam{.lr = 1e-3, .eps = 1e-4};

double max_scaled_diff(const at::Tensor& got, const at::Tensor& want, const at::Tensor& scale) {
  if (got.numel() == 0) return 0;
  return ((got - want).abs() / scale).max().item<double>();
}

// The single-process step on all D·M micro-batches: loss_m / (D·M) each, one backward each.
double reference_step(Gpt& ref, const Data& d) {
  const std::int64_t n = d.idx.size(0);
  double loss = 0;
  for (std::int64_t m = 0; m < n; ++m) {
    const at::Tensor l = ref->forward(d.idx[m], d.targets[m]) / double(n);
    l.backward();
    loss += l.item<double>();
  }
  return loss;
}

// float64: one step of both, gradients after the DP reduction and parameters after one Adam step.
void check_f64(const ThreeDOptions& o, ProcessGroups& g, Comm& grad, const std::vector<int>& layers,
               const std::vector<PipelineOp>& ops, int M, ThreeDRank& me, double& reference_loss) {
  const Data d = draw(o, M, 1);
  Gpt ref = reference_model(o, at::kDouble);
  RankModel rm(ref, g, o);
  rm.make_optimizer(grad, o, kCheckAdam);
  reference_loss = reference_step(ref, d);
  const StepRecord step = rm.backward_step(ops, d, g.coords().dp, M, nullptr);
  me.loss = rm.stage.last() ? step.schedule.loss : 0;
  const ShardSpan span = rm.opt->span();
  const at::Tensor want = rm.reference_flat(ref, true).narrow(0, span.offset, span.count);
  const at::Tensor scale = rm.reference_scale(ref, true).narrow(0, span.offset, span.count);
  me.max_grad_rel_diff = max_scaled_diff(step.reduced, want, scale);
  rm.opt->update(step.reduced);
  rm.opt->gather();
  Adam ref_adam(ref->parameters(), kCheckAdam);
  ref_adam.step();
  me.max_param_rel_diff = max_scaled_diff(rm.opt->parameters(), rm.reference_flat(ref, false),
                                          rm.reference_scale(ref, false));
}

StepTrafficSetup traffic_setup(const ThreeDOptions& o, double params, int M) {
  const GptConfig& m = o.model;
  return {.params = params,
          .param_bytes = 4,
          .grad_bytes = 4,
          .act_bytes = 4,  // fp32 on the wire
          .hidden = m.hidden,
          .layers = m.layers,
          .seq_len = m.seq,
          .micro_batch = m.micro_batch,
          .micro_batches = M,
          .dp = o.dp,
          .tp = o.tp,
          .pp = o.pp,
          .cp = o.cp,
          .interleave = o.interleave,
          // Note [tied embedding under PP]: the engine keeps wte whole on every TP rank
          .tied_embedding_elements = double(m.vocab) * double(m.hidden),
          .zero_stage = o.zero,
          .sequence_parallel = o.sp,
          .recompute = o.recompute,
          .kv_hidden = m.hidden};  // a_kv = a
}

// Note [activations per recompute policy]
// For each of core's recompute policies a TpGpt of that policy runs one forward of the stage's own
// layers on a (B, s_local, C) input (s_local: the sequence this rank's blocks see, ÷c with CP, ÷t
// with SP) under the tracking allocator. What the layers leave alive, divided by their number, is
// a layer's saved set (its output stands for the first layer's input, allocated before; tp.cpp's
// measure_activations), less the LayerNorm statistics core's inventory omits (mean and rstd of
// both norms, fp32 per token; none under full recompute). No backward: the graph is dropped, so
// its replays never run. Every rank of a TP (and CP) group runs the same forwards, so their
// collectives pair up; no PP traffic, and outside the steps whose bytes are checked.
void measure_policies(const ThreeDOptions& o, ProcessGroups& g, const std::vector<int>& own,
                      ThreeDRank& me) {
  Gpt ref = reference_model(o, at::kFloat);
  const at::Tensor mask = causal_mask(o.model.seq);
  ActivationSetup a = gpt_activation_setup(o.model, Precision::fp32);
  a.tp = o.tp;
  a.sequence_parallel = o.sp;
  a.cp = o.cp;
  for (int i = 0; i < kRecomputePolicies; ++i) {
    const auto policy = Recompute(i);
    TpGpt tp(ref, g.tp(), o.sp, policy, &g.cp());
    at::manual_seed(std::int64_t(o.seed) + 7);
    const at::Tensor x =
        at::randn({o.model.micro_batch, tp.local_seq(), o.model.hidden}).requires_grad_(true);
    std::int64_t grown = 0;
    {
      TrackingAllocatorScope memory({.cache = false});
      const std::int64_t before = memory.counters().allocated_bytes;
      at::Tensor h = x;
      for (const int l : own) h = tp.block(std::size_t(l), h, mask);
      grown = memory.counters().allocated_bytes - before;
    }
    const double tokens = double(o.model.micro_batch * tp.local_seq());
    const double stats = policy == Recompute::full ? 0.0 : 2 * 2 * 4.0 * tokens;
    if (policy == Recompute::none) me.layer_norm_stat_bytes = stats;
    me.layer_activation_bytes[i] = double(grown) / double(own.size()) - stats;
    a.recompute = policy;
    me.layer_activation_predicted[i] = activations(gpt_model_spec(o.model), a).per_layer_bytes;
  }
}

// Note [3-D step times]
// The first fp32 step is a warm-up for the clock: it records the bytes and the memory (the
// tracking allocator's reading after every op), allocates the activations' blocks and starts each
// rank when its own setup ends. So with --steps 2 or more the times are the later steps', and each
// figure is the median of its per-step values over them (as `run zero` reports its phases): a
// prediction has no warm-up term, and one descheduled step of a few moves no median. With one step
// its figures are that step's. The arrival waits (Note [arrival wait] in comm.cpp) are split per
// step the same way: TP's and, where DP × CP > 1, the gradient group's (its ZeRO gathers included).
// So is the rank's main thread's run-queue wait (Note [run-queue wait] in comm.hpp), read at the
// step's start and just before its end, and its part inside the TP and gradient collectives (their
// spans' shares): the rest fell in the compute, the PP waits and the optimizer.
struct StepTimes {
  double step_s = 0, compute_s = 0, tp_comm_s = 0, cp_comm_s = 0, pp_wait_s = 0, dp_comm_s = 0;
  double optimizer_s = 0, forward_s = 0, backward_s = 0, tp_wait_s = 0, dp_wait_s = 0;
  double runqueue_s = 0, runqueue_in_collectives_s = 0;
};

// Each field's median over the timed steps (Note [3-D step times]).
StepTimes median_times(const std::vector<StepTimes>& all) {
  const std::size_t first = all.size() > 1 ? 1 : 0;
  StepTimes out;
  const auto med = [&](double StepTimes::*f) {
    std::vector<double> v;
    for (std::size_t i = first; i < all.size(); ++i) v.push_back(all[i].*f);
    out.*f = time_stats(v).median_s;
  };
  for (double StepTimes::*f :
       {&StepTimes::step_s, &StepTimes::compute_s, &StepTimes::tp_comm_s, &StepTimes::cp_comm_s,
        &StepTimes::pp_wait_s, &StepTimes::dp_comm_s, &StepTimes::optimizer_s,
        &StepTimes::forward_s, &StepTimes::backward_s, &StepTimes::tp_wait_s,
        &StepTimes::dp_wait_s, &StepTimes::runqueue_s, &StepTimes::runqueue_in_collectives_s})
    med(f);
  return out;
}

// fp32: `steps` Adam steps; the first one's bytes and memory, the later ones' time (Note [3-D step
// times]). step: the fp32 step under way (for the lost-rank message).
void train_f32(const ThreeDOptions& o, ProcessGroups& g, Comm& grad, const std::vector<int>& layers,
               const std::vector<PipelineOp>& ops, int M, std::int64_t n_params, ThreeDRank& me,
               std::vector<double>& losses, bool progress, int& step) {
  Gpt ref = reference_model(o, at::kFloat);
  RankModel rm(ref, g, o);
  measure_policies(o, g, rm.stage.own_layers(), me);
  // Opened after the TP shards are cut (every layer's, the engine's models being tiny) and before
  // the stage's own ones move into the optimizer's flat buffers: what it sees allocated then is
  // the rank's model states.
  TrackingAllocatorScope memory({.cache = false});
  const std::int64_t before_states = memory.counters().allocated_bytes;
  rm.make_optimizer(grad, o);
  me.state_bytes = double(memory.counters().allocated_bytes - before_states);
  me.own_params = double(rm.opt->numel());
  me.stage_layers = layers[std::size_t(g.coords().pp)];
  // Note [arrival wait] in comm.cpp: the TP and gradient collectives' spans, split after the steps.
  const bool tp_arrival = o.tp > 1 && g.tp().on_one_host();
  const bool dp_arrival = grad.world_size() > 1 && grad.on_one_host();
  std::vector<std::vector<CallSpan>> tp_spans, dp_spans;  // per step
  // Every collective of a group of 2 or more records its span, so their run-queue shares add up
  // to the part inside the collectives.
  const bool spans_cover = (o.tp == 1 || tp_arrival) && (grad.world_size() == 1 || dp_arrival);
  bool runqueue_read = true;  // every step read its run-queue wait
  std::vector<StepTimes> times;
  for (int s = 1; s <= o.steps; ++s) {
    step = s;
    const Data d = draw(o, M, 100 + std::uint64_t(s));
    rm.tp.clear_counts();
    rm.die_after_op = o.kill_rank == g.world().rank() && o.kill_at_step == s;
    const double tp0 = all_bytes(g.tp()), dp0 = all_bytes(grad), cp0 = all_bytes(g.cp());
    const double dpc0 = all_calls(grad), cpc0 = all_calls(g.cp());
    const double tps0 = comm_seconds(g.tp()), dps0 = comm_seconds(grad);
    const auto start = Clock::now();
    const std::optional<double> queued0 = thread_runqueue_wait_s();
    g.tp().record_spans(tp_arrival);
    grad.record_spans(dp_arrival);
    const StepRecord step = rm.backward_step(ops, d, g.coords().dp, M, s == 1 ? &memory : nullptr);
    const PpStageRecord& rec = step.schedule;
    const double cp_in_schedule = rm.tp.cp_shift_seconds();  // the ring's sends, inside compute
    const auto t = Clock::now();
    rm.opt->update(step.reduced);
    const double opt_s = seconds_since(t);
    rm.opt->gather();
    const std::optional<double> queued1 = thread_runqueue_wait_s();  // inside the step's window
    const double step_s = seconds_since(start);
    runqueue_read = runqueue_read && queued0 && queued1;
    g.tp().record_spans(false);
    grad.record_spans(false);
    tp_spans.push_back(g.tp().take_spans());
    dp_spans.push_back(grad.take_spans());
    const double queued_in_collectives =
        runqueue_wait_in(tp_spans.back()) + runqueue_wait_in(dp_spans.back());
    const std::vector<double> loss{rm.stage.last() && g.coords().tp == 0 ? rec.loss : 0};
    std::vector<double> all_loss(std::size_t(g.world().world_size()));
    g.world().all_gather(ConstBuffer(loss), Buffer(all_loss));
    losses.push_back(std::accumulate(all_loss.begin(), all_loss.end(), 0.0) / (o.dp * o.cp));

    times.push_back({.step_s = step_s,
                     .compute_s = rec.compute_s - step.tp_in_compute_s - cp_in_schedule,
                     .tp_comm_s = o.tp > 1 ? comm_seconds(g.tp()) - tps0 : 0,
                     .cp_comm_s = cp_in_schedule,
                     .pp_wait_s = rec.wait_s + step.tied_s,
                     .dp_comm_s = comm_seconds(grad) - dps0,
                     .optimizer_s = opt_s,
                     .forward_s = rec.forward_s / M,
                     .backward_s = rec.backward_s / M,
                     .runqueue_s = queued0 && queued1 ? *queued1 - *queued0 : 0.0,
                     .runqueue_in_collectives_s = queued_in_collectives});
    if (s == 1) {
      // A TP group of one issues identity calls that move nothing: no collectives (core's 0).
      for (int l : rm.stage.own_layers())
        for (const auto& c : rm.tp.layer_sites()[std::size_t(l)].issued.by_collective) {
          me.tp_layer_bytes += c.bytes_sent;
          if (o.tp > 1) me.tp_layer_calls += double(c.calls);
        }
      for (int l : rm.stage.own_layers())  // Note [SP re-gather]: core's tp_regather
        for (const auto& c : rm.tp.regather_sites()[std::size_t(l)].issued.by_collective) {
          me.tp_regather_bytes += c.bytes_sent;
          if (o.tp > 1) me.tp_regather_calls += double(c.calls);
        }
      me.tp_other_bytes = all_bytes(g.tp()) - tp0 - me.tp_layer_bytes - me.tp_regather_bytes;
      std::vector<double> sends = rec.activation_send_bytes;
      sends.insert(sends.end(), rec.gradient_send_bytes.begin(), rec.gradient_send_bytes.end());
      me.pp_sends = double(sends.size());
      me.pp_send_bytes = std::accumulate(sends.begin(), sends.end(), 0.0);
      if (!sends.empty()) {
        me.pp_min_send = *std::min_element(sends.begin(), sends.end());
        me.pp_max_send = *std::max_element(sends.begin(), sends.end());
      }
      me.pp_embedding_bytes = step.tied_bytes;
      me.dp_bytes = all_bytes(grad) - dp0;
      me.dp_calls = all_calls(grad) - dpc0;
      if (o.cp > 1) {  // a CP group of one runs no ring
        me.cp_bytes = all_bytes(g.cp()) - cp0;
        me.cp_sends = all_calls(g.cp()) - cpc0;
      }
      double peak = 0;
      for (const std::int64_t h : rec.held_bytes_after_op)
        peak = std::max(peak, double(h));
      // held_bytes_after_op counts from the step's start; the gradients are preallocated in the
      // flat buffer, so what grows is activations (and the received boundary tensors).
      me.peak_activation_bytes = peak;
    }
    if (progress)
      std::fprintf(stderr, "3d dp=%d tp=%d pp=%d%s%s zero=%d: step %d/%d loss %.6f %.3f s\n",
                   o.dp, o.tp, o.pp, o.cp > 1 ? (" cp=" + std::to_string(o.cp)).c_str() : "",
                   o.sp ? " sp" : "", o.zero, s, o.steps, losses.back(), step_s);
  }
  // Each a part of its comm time: the spans open a few instructions before the counters' timers.
  if (tp_arrival) {
    const std::vector<double> w = arrival_waits(g.tp(), tp_spans);
    for (std::size_t i = 0; i < w.size(); ++i)
      times[i].tp_wait_s = std::min(w[i], times[i].tp_comm_s);
  }
  if (dp_arrival) {
    const std::vector<double> w = arrival_waits(grad, dp_spans);
    for (std::size_t i = 0; i < w.size(); ++i)
      times[i].dp_wait_s = std::min(w[i], times[i].dp_comm_s);
  }
  const StepTimes med = median_times(times);
  for (const StepTimes& x : times) me.step_seconds.push_back(x.step_s);
  me.step_s = med.step_s, me.compute_s = med.compute_s, me.tp_comm_s = med.tp_comm_s;
  me.cp_comm_s = med.cp_comm_s, me.pp_wait_s = med.pp_wait_s, me.dp_comm_s = med.dp_comm_s;
  me.optimizer_s = med.optimizer_s, me.forward_s = med.forward_s, me.backward_s = med.backward_s;
  if (tp_arrival) me.tp_arrival_wait_s = med.tp_wait_s;
  if (dp_arrival) me.dp_arrival_wait_s = med.dp_wait_s;
  if (runqueue_read) {
    me.runqueue_wait_s = med.runqueue_s;
    if (spans_cover) me.runqueue_wait_in_collectives_s = med.runqueue_in_collectives_s;
  }

  // core, for this rank and for the layout
  const double t = o.tp, p = o.pp;
  StepTrafficSetup exact = traffic_setup(o, me.own_params * t * p, M);
  exact.busiest_stage_layers = me.stage_layers;
  const StepTraffic mine = step_traffic(exact);
  StepTrafficSetup layout_setup = traffic_setup(o, double(n_params), M);
  layout_setup.busiest_stage_layers = *std::max_element(layers.begin(), layers.end());
  const StepTraffic layout = step_traffic(layout_setup);
  me.tp_predicted_bytes = mine.tp.bytes_per_rank;
  me.tp_predicted_calls = mine.tp.calls;
  me.tp_regather_predicted_bytes = mine.tp_regather.bytes_per_rank;
  me.tp_regather_predicted_calls = mine.tp_regather.calls;
  me.tp_layout_bytes = layout.tp.bytes_per_rank;
  me.pp_predicted_per_call = mine.pp.bytes_per_call;
  me.cp_predicted_bytes = mine.cp.bytes_per_rank;
  me.cp_predicted_sends = mine.cp.calls;
  me.pp_layout_bytes = layout.pp.bytes_per_rank;
  // Note [tied embedding under PP]: core's item is an end stage's; middle stages hold no copy.
  const bool end_stage = rm.stage.first() || rm.stage.last();
  me.pp_embedding_predicted_bytes = end_stage ? mine.pp_embedding.bytes_per_rank : 0.0;
  const int v = o.interleave;
  me.pp_expected_sends = o.pp == 1 ? 0
                                   : 2.0 * v * M - (rm.stage.first() ? M : 0) -
                                         (rm.stage.last() ? M : 0);
  me.dp_predicted_bytes = mine.dp_grad.bytes_per_rank + mine.zero_param_gather.bytes_per_rank;
  me.dp_layout_bytes = layout.dp_grad.bytes_per_rank + layout.zero_param_gather.bytes_per_rank;
  const StateSetup states{.precision = Precision::fp32, .optimizer = Optimizer::adam,
                          .zero_stage = o.zero, .shard_degree = o.dp * o.cp};
  me.state_predicted_bytes = model_states(me.own_params, states).bytes.total();
  me.state_layout_bytes = model_states(double(n_params) / (t * p), states).bytes.total();
  ActivationSetup a = gpt_activation_setup(o.model, Precision::fp32);
  a.tp = o.tp;
  a.sequence_parallel = o.sp;
  a.cp = o.cp;
  a.recompute = o.recompute;
  me.in_flight = peak_in_flight(ops);
  // Interleaved: the layers of the chunks held at once, each its own (Note [uneven virtual
  // stages]); equal chunks give stage_layers / v × in_flight.
  std::vector<double> chunk_layers;
  const std::vector<int> chunks = o.virtual_split();
  for (std::size_t j = std::size_t(g.coords().pp); j < chunks.size(); j += std::size_t(o.pp))
    chunk_layers.push_back(chunks[j]);
  const double held_layers = v > 1 ? interleaved_peak_held(chunk_layers, o.pp, M, g.coords().pp)
                                   : double(me.stage_layers) * me.in_flight;
  me.predicted_activation_bytes =
      activations(gpt_model_spec(o.model), a).per_layer_bytes * held_layers;
  const GptStageSetup stage{
      .model = gpt_model_spec(o.model), .seq = o.model.seq, .micro_batch = o.model.micro_batch,
      .tp = o.tp, .sequence_parallel = o.sp, .cp = o.cp, .recompute = o.recompute,
      .stage_layers = me.stage_layers, .first_stage = rm.stage.first(),
      .last_stage = rm.stage.last(), .micro_batches = M, .own_params = me.own_params,
      .ranks = g.world().world_size(),
      .threads_per_rank = o.threads > 0 ? o.threads : at::get_num_threads(),
      .cores = o.host_cores};
  // Note [engine SP edges]; ZeRO-2/3 without PP sum the SP gradients after each micro-batch
  const GptSpTraffic sp = engine_sp_traffic(stage, rm.opt->reduces_each_micro_batch());
  me.tp_other_predicted_bytes = sp.edges.bytes_per_rank + sp.grads.bytes_per_rank;
  if (o.host) {  // a host calibration: core's operator and α–β times on this host
    const GptStageTime k = predict_gpt_stage(stage, *o.host);
    me.predicted_compute_s = k.compute_s;
    me.predicted_optimizer_s = k.optimizer_s;
    // With SP the re-gathers (core's tp_regather item) and the edges and gradient all-reduce are
    // on the critical path here: the engine issues them blocking (Note [predicted 3-D step]).
    // SP's reduce-scatters and all-gathers on their own fits where the calibration has them.
    const auto host_s = [&](const TrafficItem& item) {
      return traffic_seconds(item, *o.host, o.host_links);
    };
    me.predicted_tp_comm_s = host_s(mine.tp) + host_s(mine.tp_regather) + host_s(sp.edges) +
                             host_s(sp.grads);
    me.predicted_cp_comm_s = traffic_seconds(mine.cp, *o.host);
    me.predicted_dp_comm_s = traffic_seconds(mine.dp_grad, *o.host) +
                             traffic_seconds(mine.zero_param_gather, *o.host);
    // The tied embedding's exchange blocks like the schedule's sends (PpStage).
    me.predicted_pp_send_s = traffic_seconds(mine.pp, *o.host) +
                             (end_stage ? traffic_seconds(mine.pp_embedding, *o.host) : 0.0);
    // Note [predicted 3-D step] (core/gpt_step.hpp)
    const GptStepTime whole = predict_gpt_step(
        k, M,
        {.tp_cp_s = me.predicted_tp_comm_s + me.predicted_cp_comm_s,
         .pp_send_s = me.predicted_pp_send_s, .dp_s = me.predicted_dp_comm_s, .stages = o.pp,
         .interleave = o.interleave});
    me.predicted_forward_s = whole.forward_s;
    me.predicted_backward_s = whole.backward_s;
    me.predicted_step_s = whole.step_s;
  }
  if (o.pp > 1 && me.forward_s > 0)
    me.predicted_pp_wait_s = *bubble({.stages = o.pp,
                                      .micro_batches = M,
                                      .interleave = v,
                                      .backward_forward_ratio = me.backward_s / me.forward_s,
                                      .forward_time_s = me.forward_s})
                                  .bubble_time_s;
}

// Every field of ThreeDRank, in one order, for the all-gather.
template <class F>
void fields(ThreeDRank& m, F&& f) {
  f(m.rank), f(m.dp_index), f(m.tp_index), f(m.pp_index), f(m.cp_index), f(m.stage_layers);
  f(m.own_params);
  f(m.cp_bytes), f(m.cp_sends), f(m.cp_predicted_bytes), f(m.cp_predicted_sends), f(m.cp_comm_s);
  f(m.predicted_cp_comm_s);
  f(m.max_grad_rel_diff), f(m.max_param_rel_diff), f(m.loss);
  f(m.tp_layer_bytes), f(m.tp_layer_calls), f(m.tp_other_bytes), f(m.tp_other_predicted_bytes);
  f(m.tp_predicted_bytes);
  f(m.tp_predicted_calls), f(m.tp_layout_bytes);
  f(m.tp_regather_bytes), f(m.tp_regather_calls), f(m.tp_regather_predicted_bytes);
  f(m.tp_regather_predicted_calls);
  f(m.pp_sends), f(m.pp_min_send), f(m.pp_max_send), f(m.pp_send_bytes), f(m.pp_expected_sends);
  f(m.pp_predicted_per_call), f(m.pp_layout_bytes), f(m.pp_embedding_bytes);
  f(m.pp_embedding_predicted_bytes);
  f(m.dp_bytes), f(m.dp_calls), f(m.dp_predicted_bytes), f(m.dp_layout_bytes);
  f(m.state_bytes), f(m.state_predicted_bytes), f(m.state_layout_bytes);
  f(m.peak_activation_bytes), f(m.predicted_activation_bytes), f(m.in_flight);
  for (int i = 0; i < kRecomputePolicies; ++i)
    f(m.layer_activation_bytes[i]), f(m.layer_activation_predicted[i]);
  f(m.layer_norm_stat_bytes);
  f(m.step_s), f(m.compute_s), f(m.tp_comm_s), f(m.pp_wait_s), f(m.dp_comm_s), f(m.optimizer_s);
  f(m.tp_arrival_wait_s), f(m.dp_arrival_wait_s);
  f(m.runqueue_wait_s), f(m.runqueue_wait_in_collectives_s);
  f(m.forward_s), f(m.backward_s), f(m.predicted_pp_wait_s), f(m.predicted_compute_s);
  f(m.predicted_tp_comm_s), f(m.predicted_dp_comm_s), f(m.predicted_optimizer_s);
  f(m.predicted_pp_send_s), f(m.predicted_step_s), f(m.predicted_forward_s);
  f(m.predicted_backward_s);
}

std::vector<ThreeDRank> gather_ranks(Comm& world, ThreeDRank me) {
  std::vector<double> mine;
  fields(me, [&](auto& x) { mine.push_back(double(x)); });
  const std::size_t n = mine.size();
  std::vector<double> all(n * std::size_t(world.world_size()));
  world.all_gather(ConstBuffer(mine), Buffer(all));
  // Every rank ran the same steps, so its step_seconds have one length.
  const std::size_t steps = me.step_seconds.size();
  std::vector<double> all_steps(steps * std::size_t(world.world_size()));
  world.all_gather(ConstBuffer(me.step_seconds), Buffer(all_steps));
  std::vector<ThreeDRank> out(std::size_t(world.world_size()));
  for (std::size_t r = 0; r < out.size(); ++r) {
    std::size_t i = r * n;
    fields(out[r], [&](auto& x) { x = std::remove_reference_t<decltype(x)>(all[i++]); });
    out[r].step_seconds.assign(all_steps.begin() + std::ptrdiff_t(r * steps),
                               all_steps.begin() + std::ptrdiff_t((r + 1) * steps));
  }
  return out;
}

// Note [naming a lost rank]
// The ranks take liveness locks (rank_liveness.hpp, Note [liveness locks]) in a temporary directory
// rank 0 makes and every rank must see (one host, or a shared file system; without one the run
// goes on without them, and a lost rank ends it with the Comm's own message). A rank whose
// collective, send or receive fails probes the locks and names, in its one line, the ranks that
// died without a word — as `tally run checkpoint` does (report_lost_ranks). The locks are taken
// after the Comm (the directory's path travels over it), so a dead rank's sockets may close
// before its lock is dropped: the probe waits up to kLostRankProbe_s for it.
constexpr double kLostRankProbe_s = 2.0;

struct Liveness {
  std::filesystem::path dir;
  std::unique_ptr<RankLiveness> locks;  // null without a shared directory
};

Liveness take_liveness_locks(Comm& world) {
  Liveness l;
  try {
    // Removed by the launcher however the run ends (Note [launch scratch]); by rank 0 at the end
    // of a run that succeeded.
    l.dir = shared_temp_directory(world, "tally-3d", TempOwner::launcher);
    l.locks = std::make_unique<RankLiveness>(l.dir / "ranks", world.rank(), world.world_size());
  } catch (const CommError&) {
    throw;
  } catch (const std::exception&) {  // no common directory, or rank 0 could not make one
    l.locks.reset();
  }
  world.barrier();  // every lock is held before any rank can fail
  return l;
}


}  // namespace

namespace {

// run_3d's work on its world: the groups, the float64 check, the fp32 steps, the gathered figures.
void run_layout(const DistEnv& env, const ThreeDOptions& options, Comm& world, int M,
                ThreeDResult& r, int& step) {
  ProcessGroups g(world, ParallelLayout{.dp = options.dp, .tp = options.tp, .pp = options.pp,
                                        .cp = options.cp});
  // Gradients are averaged over DP × CP (Megatron-LM's "dp-cp" group; core's dp_grad over dp·cp):
  // the ranks sharing this rank's TP and PP coordinates, in global order.
  std::unique_ptr<Comm> dp_cp;
  if (options.cp > 1) {
    std::vector<int> ranks;
    std::string name = "dp-cp";
    const RankCoords& c = g.coords();
    for (int d = 0; d < options.dp; ++d)
      for (int k = 0; k < options.cp; ++k) {
        ranks.push_back(c.tp + options.tp * (k + options.cp * (d + options.dp * c.pp)));
        name += (ranks.size() == 1 ? "/" : ",") + std::to_string(ranks.back());
      }
    dp_cp = std::make_unique<Comm>(world, ranks, name);
  }
  Comm& grad = dp_cp ? *dp_cp : g.dp();
  const auto schedule = pipeline_schedule(options.schedule, options.pp, M, options.interleave);
  const std::vector<PipelineOp>& ops = schedule[std::size_t(g.coords().pp)];
  ThreeDRank me{.rank = env.rank, .dp_index = g.coords().dp, .tp_index = g.coords().tp,
                .pp_index = g.coords().pp, .cp_index = g.coords().cp};
  check_f64(options, g, grad, r.stage_layers, ops, M, me, r.reference_loss_f64);
  train_f32(options, g, grad, r.stage_layers, ops, M, r.n_params, me, r.losses_fp32,
            env.rank == 0, step);
  r.ranks = gather_ranks(world, me);
  // Note [predicted 3-D step] (core/gpt_step.hpp): the step ends when the slowest rank's does.
  double slowest = -1;
  for (const ThreeDRank& x : r.ranks) slowest = std::max(slowest, x.predicted_step_s);
  for (ThreeDRank& x : r.ranks) x.predicted_step_s = slowest;
  // The f64 loss: the mean over DP and CP of the last stage's (TP rank 0's) mean over its
  // micro-batches and tokens.
  for (const ThreeDRank& m : r.ranks)
    if (m.pp_index == options.pp - 1 && m.tp_index == 0)
      r.loss_f64 += m.loss / (options.dp * options.cp);
  world.barrier();  // no rank tears its groups down while a peer still receives
}

}  // namespace

ThreeDResult run_3d(const DistEnv& env, const ThreeDOptions& options) {
  env.validate();
  options.validate(env.world_size);
  if (options.threads > 0) at::set_num_threads(options.threads);
  ThreeDResult r{.options = options, .rank = env.rank, .world_size = env.world_size};
  const int M = options.micro_batches_or_default();
  r.micro_batches = M;
  r.n_params = count_params(gpt_model_spec(options.model)).total();
  r.stage_layers = options.stage_split();
  Comm world(env, {.timeout_s = options.timeout_s});
  const Liveness liveness = take_liveness_locks(world);
  int step = 0;  // 0: the float64 check
  try {
    run_layout(env, options, world, M, r, step);
  } catch (const CommError& e) {  // Note [naming a lost rank]
    if (!liveness.locks) throw;
    throw report_lost_ranks(*liveness.locks, env.rank, e,
                            step == 0 ? "the float64 check" : "fp32 step " + std::to_string(step),
                            kLostRankProbe_s)
        .error(e);
  }
  if (liveness.locks && env.rank == 0) {  // every rank is past the final barrier
    liveness.locks->remove_all();
    std::error_code ec;
    std::filesystem::remove_all(liveness.dir, ec);
  }
  return r;
}

}  // namespace tally::engine
