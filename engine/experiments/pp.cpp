// `tally run pp` (pp.hpp): the pipeline-parallel GPT against the single-process one and core.
#include "tally/engine/experiments/pp.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "gpt_model.hpp"
#include "pp_model.hpp"
#include "tally/core/comm.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/process_groups.hpp"
#include "run_helpers.hpp"

namespace tally::engine {

namespace {



Gpt reference_model(const PpOptions& o) {
  at::manual_seed(std::int64_t(o.seed));
  Gpt model(o.model);
  model->to(at::kDouble);
  return model;
}

void clear_grads(Gpt& m) {
  for (auto& p : m->parameters()) p.mutable_grad() = at::Tensor();
}

// The single-process run: every micro-batch's loss / M, one backward each (the same mean loss).
double reference_step(Gpt& ref, const at::Tensor& idx, const at::Tensor& targets) {
  const std::int64_t M = idx.size(0);
  double loss = 0;
  for (std::int64_t m = 0; m < M; ++m) {
    const at::Tensor l = ref->forward(idx[m], targets[m]) / double(M);
    l.backward();
    loss += l.item<double>();
  }
  return loss;
}

// Fields of PpStageMeasure in the order the all-gather carries them.
constexpr int kFields = 15;
std::vector<double> pack(const PpStageMeasure& m) {
  return {double(m.layers), m.max_grad_rel_diff, m.order_ok ? 1.0 : 0.0,
          double(m.activation_sends), double(m.gradient_sends), m.min_send_bytes,
          m.max_send_bytes, m.compute_s, m.wait_s, m.elapsed_s, m.forward_s, m.backward_s,
          m.peak_held_bytes, m.bytes_per_forward, 0.0};
}
PpStageMeasure unpack(const double* f) {
  return {.layers = int(f[0]), .max_grad_rel_diff = f[1], .order_ok = f[2] != 0,
          .activation_sends = int(f[3]), .gradient_sends = int(f[4]), .min_send_bytes = f[5],
          .max_send_bytes = f[6], .compute_s = f[7], .wait_s = f[8], .elapsed_s = f[9],
          .forward_s = f[10], .backward_s = f[11], .peak_held_bytes = f[12],
          .bytes_per_forward = f[13]};
}

// Activation bytes held after each operation, less the parameter gradients (they appear at the
// first backward and stay, whatever the schedule): the activations alone.
double peak_activations(const PpStageRecord& rec, const std::vector<double>& grad_bytes_after) {
  double peak = 0;
  for (std::size_t i = 0; i < rec.held_bytes_after_op.size(); ++i)
    peak = std::max(peak, double(rec.held_bytes_after_op[i]) - grad_bytes_after[i]);
  return peak;
}

PpRun run_one(const PpOptions& o, const PpRunSpec& spec, Comm& pp, const std::vector<int>& layers,
              bool progress) {
  const int P = pp.world_size(), s = pp.rank(), M = spec.micro_batches;
  const auto schedule = pipeline_schedule(spec.schedule, P, M, spec.interleave);
  at::manual_seed(std::int64_t(o.seed) + 1);
  const GptConfig& mc = o.model;
  const at::Tensor idx = at::randint(mc.vocab, {M, mc.micro_batch, mc.seq}, at::kLong);
  const at::Tensor targets = at::randint(mc.vocab, {M, mc.micro_batch, mc.seq}, at::kLong);

  PpRun run{.spec = spec};
  Gpt ref = reference_model(o);
  run.reference_loss_f64 = reference_step(ref, idx, targets);
  Gpt model = reference_model(o);
  PpStage stage(model, pp, layers, spec.interleave);

  // The checked step, under the tracking allocator. Its held bytes include this stage's parameter
  // gradients from the first backward on (allocated then, kept after): subtracted, so what is
  // left is activations (for interleaved stages an approximation: a chunk's gradients appear at
  // its own first backward).
  PpStageRecord rec;
  {
    TrackingAllocatorScope memory;
    rec = stage.step(schedule[std::size_t(s)], idx, targets, &memory);
  }
  double grad_bytes = 0;
  for (const auto& name : stage.own_parameters())
    if (const at::Tensor g = model->named_parameters()[name].grad(); g.defined())
      grad_bytes += double(g.nbytes());
  std::vector<double> grad_bytes_after;
  bool backward_seen = false;
  for (const PipelineOp& op : rec.executed) {
    backward_seen = backward_seen || op.kind == PipelineOpKind::backward;
    grad_bytes_after.push_back(backward_seen ? grad_bytes : 0.0);
  }
  stage.reduce_tied_embedding();

  PpStageMeasure me;
  me.layers = layers[std::size_t(s)];
  me.order_ok = rec.executed == schedule[std::size_t(s)];
  me.activation_sends = int(rec.activation_send_bytes.size());
  me.gradient_sends = int(rec.gradient_send_bytes.size());
  std::vector<double> all_sends = rec.activation_send_bytes;
  all_sends.insert(all_sends.end(), rec.gradient_send_bytes.begin(), rec.gradient_send_bytes.end());
  if (!all_sends.empty()) {
    me.min_send_bytes = *std::min_element(all_sends.begin(), all_sends.end());
    me.max_send_bytes = *std::max_element(all_sends.begin(), all_sends.end());
  }
  me.peak_held_bytes = peak_activations(rec, grad_bytes_after);
  me.bytes_per_forward = rec.bytes_per_forward;
  const auto want = ref->named_parameters();
  const auto got = model->named_parameters();
  for (const auto& name : stage.own_parameters()) {
    const at::Tensor& w = want[name].grad();
    const double d = (got[name].grad() - w).abs().max().item<double>() / w.abs().max().item<double>();
    me.max_grad_rel_diff = std::max(me.max_grad_rel_diff, d);
  }
  double loss = stage.last() ? rec.loss : 0;

  // Timed steps (or the checked one when there are none).
  std::vector<PpStageRecord> timed;
  for (int i = 0; i < o.steps; ++i) {
    clear_grads(model);
    timed.push_back(stage.step(schedule[std::size_t(s)], idx, targets, nullptr));
  }
  if (timed.empty()) timed.push_back(rec);
  for (const auto& t : timed) {
    const double n = double(timed.size());
    me.compute_s += t.compute_s / n;
    me.wait_s += t.wait_s / n;
    me.elapsed_s += t.elapsed_s / n;
    me.forward_s += t.forward_s / n / M;
    me.backward_s += t.backward_s / n / M;
  }

  // Gather every stage's figures (and the last stage's loss) to every rank.
  std::vector<double> mine = pack(me);
  mine[kFields - 1] = loss;
  std::vector<double> all(std::size_t(kFields * P));
  pp.all_gather(ConstBuffer(mine), Buffer(all));
  std::vector<double> tf, tb;
  for (int k = 0; k < P; ++k) {
    run.stages.push_back(unpack(&all[std::size_t(k * kFields)]));
    tf.push_back(std::max(run.stages.back().forward_s, 1e-12));
    tb.push_back(std::max(run.stages.back().backward_s, 1e-12));
  }
  run.loss_f64 = all[std::size_t(P * kFields - 1)];

  run.predicted_bubble =
      bubble({.stages = P, .micro_batches = M, .interleave = spec.interleave}).bubble_fraction;
  run.simulated_makespan_s = simulate_pipeline_makespan(spec.schedule, tf, tb, M, spec.interleave);
  run.predicted_in_flight = peak_in_flight(schedule[0]);
  run.predicted_send_bytes = step_traffic({.params = double(count_params(gpt_model_spec(mc)).total()),
                                           .param_bytes = 8,
                                           .grad_bytes = 8,
                                           .act_bytes = 8,  // float64 on the wire
                                           .hidden = mc.hidden,
                                           .layers = mc.layers,
                                           .seq_len = mc.seq,
                                           .micro_batch = mc.micro_batch,
                                           .micro_batches = M,
                                           .pp = P})
                                 .pp.bytes_per_call;
  if (progress) {
    const PpStageMeasure& s0 = run.stages[0];
    std::fprintf(stderr,
                 "pp P=%d %s M=%d v=%d: loss %.10f (single-process %.10f), stage 0 idle %.3f "
                 "(core %.3f), step %.4f s\n",
                 P, std::string(to_string(spec.schedule)).c_str(), M, spec.interleave, run.loss_f64,
                 run.reference_loss_f64, s0.idle_fraction(), run.predicted_bubble,
                 run.makespan_s());
  }
  return run;
}

}  // namespace

void PpOptions::validate(int world_size) const {
  model.validate();
  const int P = pp == 0 ? world_size : pp;
  require(P >= 1 && P == world_size, "--pp", P,
          "must equal the world size " + std::to_string(world_size) +
              " (tally run pp runs one PP group over every rank)");
  require(model.layers >= P, "--pp", P,
          "must be <= --layers = " + std::to_string(model.layers) + " (one layer per stage at least)");
  require(micro_batches >= 0 && micro_batches <= 4096, "--micro-batches", micro_batches,
          "must be in [1, 4096]");
  require(interleave >= 0 && interleave <= 64, "--interleave", interleave, "must be in [1, 64]");
  require(steps >= 0 && steps <= 10000, "--steps", steps, "must be in [0, 10000]");
  if (!(timeout_s > 0 && timeout_s <= 86400))
    throw InvalidInput("--timeout = " + format_number(timeout_s) + ": must be in (0, 86400] s");
  require(threads >= 0 && threads <= 1024, "--threads", threads, "must be in [0, 1024]");
  if (!sweep && schedule != PipelineSchedule::interleaved)
    require(interleave <= 1, "--interleave", interleave,
            "needs --schedule interleaved (gpipe and 1f1b run one chunk per stage)");
  const std::vector<int> layers = stage_layers(int(model.layers), P);
  for (const PpRunSpec& r : runs(world_size)) {
    if (r.schedule != PipelineSchedule::interleaved) continue;
    require(P >= 2, "--pp", P, "must be >= 2 for the interleaved schedule");
    require(r.micro_batches % P == 0, "--micro-batches", r.micro_batches,
            "must be a multiple of --pp = " + std::to_string(P) + " for the interleaved schedule");
    for (int s = 0; s < P; ++s)
      require(layers[std::size_t(s)] % r.interleave == 0, "--interleave", r.interleave,
              "must divide the layers of every stage (stage " + std::to_string(s) + " holds " +
                  std::to_string(layers[std::size_t(s)]) + " of --layers = " +
                  std::to_string(model.layers) + " over --pp = " + std::to_string(P) + ")");
  }
}

std::vector<PpRunSpec> PpOptions::runs(int world_size) const {
  const int P = pp == 0 ? world_size : pp;
  const int v = interleave == 0 ? 2 : interleave;
  if (!sweep) {
    const bool inter = schedule == PipelineSchedule::interleaved;
    return {{schedule, micro_batches == 0 ? 2 * P : micro_batches, inter ? v : 1}};
  }
  std::vector<PpRunSpec> out;
  for (auto k : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b})
    for (int M : {1, P, 2 * P + 1}) out.push_back({k, M, 1});
  if (P >= 2)
    for (int M : {P, 2 * P}) out.push_back({PipelineSchedule::interleaved, M, v});
  return out;
}

double PpRun::makespan_s() const {
  double m = 0;
  for (const auto& s : stages) m = std::max(m, s.elapsed_s);
  return m;
}

std::vector<PpCheck> pp_checks(const PpResult& r) {
  std::vector<PpCheck> out;
  for (const PpRun& run : r.runs) {
    const std::string name = std::string(to_string(run.spec.schedule)) + " M=" +
                             std::to_string(run.spec.micro_batches) +
                             (run.spec.interleave > 1 ? " v=" + std::to_string(run.spec.interleave) : "");
    const double dl = rel_diff(run.loss_f64, run.reference_loss_f64);
    out.push_back({name + " loss f64 vs single-process", run.loss_f64, run.reference_loss_f64,
                   kPpF64Tolerance, dl <= kPpF64Tolerance});
    for (std::size_t s = 0; s < run.stages.size(); ++s) {
      const PpStageMeasure& m = run.stages[s];
      const std::string st = name + " stage " + std::to_string(s) + " ";
      out.push_back({st + "max gradient difference f64", m.max_grad_rel_diff, 0, kPpF64Tolerance,
                     m.max_grad_rel_diff <= kPpF64Tolerance});
      out.push_back({st + "executed order == core's schedule", m.order_ok ? 1.0 : 0.0, 1, 0,
                     m.order_ok});
      if (m.activation_sends + m.gradient_sends > 0) {
        out.push_back({st + "smallest send bytes", m.min_send_bytes, run.predicted_send_bytes, 0,
                       m.min_send_bytes == run.predicted_send_bytes});
        out.push_back({st + "largest send bytes", m.max_send_bytes, run.predicted_send_bytes, 0,
                       m.max_send_bytes == run.predicted_send_bytes});
      }
    }
  }
  return out;
}

PpResult run_pp(const DistEnv& env, const PpOptions& options) {
  env.validate();
  options.validate(env.world_size);
  if (options.threads > 0) at::set_num_threads(options.threads);
  PpResult r{.options = options, .rank = env.rank, .world_size = env.world_size};
  r.options.pp = env.world_size;
  r.n_params = count_params(gpt_model_spec(options.model)).total();
  r.stage_layers = stage_layers(int(options.model.layers), env.world_size);
  Comm world(env, {.timeout_s = options.timeout_s});
  ProcessGroups groups(world, ParallelLayout{.pp = env.world_size});
  const auto runs = options.runs(env.world_size);
  for (const PpRunSpec& spec : runs)
    r.runs.push_back(run_one(options, spec, groups.pp(), r.stage_layers, env.rank == 0));
  world.barrier();  // no rank tears its groups down while a peer still receives
  return r;
}

}  // namespace tally::engine
