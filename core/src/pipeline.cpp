#include "tally/core/pipeline.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tally/core/types.hpp"

namespace tally {

namespace {

// (P−1)/(v·M + P−1): the one expression bubble() and min_micro_batches_for_bubble() share.
double bubble_fraction_of(int P, std::int64_t M, int v) {
  const double idle = double(P - 1);
  return idle / (double(v) * double(M) + idle);
}

}  // namespace

void PipelineSetup::validate() const {
  require_int(stages >= 1, "stages", stages, "must be >= 1");
  require_int(micro_batches >= 1, "micro_batches", micro_batches, "must be >= 1");
  require_int(interleave >= 1, "interleave", interleave, "must be >= 1");
  require_int(interleave == 1 || micro_batches % stages == 0, "micro_batches", micro_batches,
              [&] {
                return "must be a multiple of stages = " + std::to_string(stages) +
                       " for the interleaved schedule (interleave = " +
                       std::to_string(interleave) + ")";
              });
  require_real(std::isfinite(backward_forward_ratio) && backward_forward_ratio >= 0,
               "backward_forward_ratio", backward_forward_ratio, "must be >= 0");
  if (forward_time_s)
    require_real(std::isfinite(*forward_time_s) && *forward_time_s >= 0, "forward_time_s",
                 *forward_time_s, "must be >= 0 s");
}

// Huang et al. 2019 (GPipe) and Narayanan et al. 2021 eq. 1: P−1 idle slots out of M+P−1 per stage;
// interleaving v chunks shrinks each slot v-fold (Narayanan et al. 2021 §2.2.2):
// bubble time (P−1)(t_f + t_b)/v against ideal M(t_f + t_b).
PipelineResult bubble(const PipelineSetup& setup) {
  setup.validate();
  PipelineResult r;
  r.setup = setup;
  const int P = setup.stages, M = setup.micro_batches, v = setup.interleave;
  r.bubble_fraction = bubble_fraction_of(P, M, v);
  r.ideal_slots = double(v) * M;
  r.total_slots = r.ideal_slots + (P - 1);
  if (setup.forward_time_s) {
    const double tf = *setup.forward_time_s;
    const double per_mb = tf * (1.0 + setup.backward_forward_ratio);
    r.ideal_time_s = M * per_mb;
    r.bubble_time_s = (P - 1) * per_mb / v;
    r.total_time_s = *r.ideal_time_s + *r.bubble_time_s;
  }
  return r;
}

std::string PipelineResult::convention() const {
  const auto& s = setup;
  std::string c = s.interleave == 1 ? "1F1B/GPipe" : "interleaved 1F1B";
  c += ", P=" + std::to_string(s.stages) + ", M=" + std::to_string(s.micro_batches);
  if (s.interleave > 1) c += ", v=" + std::to_string(s.interleave);
  c += s.interleave == 1 ? ", bubble = (P-1)/(M+P-1)" : ", bubble = (P-1)/(v*M+P-1)";
  c += " = idle / wall-clock";
  if (s.forward_time_s)
    c += ", t_b = " + format_number(s.backward_forward_ratio) + " t_f, t_f = " + format_number(*s.forward_time_s) +
         " s";
  return c;
}

// (P−1)/(v·M + P−1) <= f  ⇔  v·M >= (P−1)(1−f)/f. The closed form gives a first guess; the
// answer is then settled with bubble_fraction_of() itself so the boundary (e.g. M = 63 at P = 8,
// f = 0.1, where the bubble is exactly 7/70) never depends on rounding in the guess.
int min_micro_batches_for_bubble(int stages, double max_fraction, int interleave) {
  require_int(stages >= 1, "stages", stages, "must be >= 1");
  require_int(interleave >= 1, "interleave", interleave, "must be >= 1");
  require_real(max_fraction > 0 && max_fraction <= 1, "max_fraction", max_fraction,
               "must be in (0, 1]");
  if (stages == 1) return 1;
  const int step = interleave == 1 ? 1 : stages;  // interleaving needs M % P == 0
  const double guess = double(stages - 1) * (1.0 - max_fraction) / max_fraction / interleave;
  require_real(guess < 1e9, "max_fraction", max_fraction,
               "too small: needs more than 1e9 micro-batches");
  const auto ok = [&](std::int64_t M) {
    return bubble_fraction_of(stages, M, interleave) <= max_fraction;
  };
  std::int64_t M = std::max<std::int64_t>(step, std::int64_t(std::ceil(guess / step)) * step);
  while (M > step && ok(M - step)) M -= step;
  while (!ok(M)) M += step;
  return int(M);
}

std::string_view to_string(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::gpipe: return "gpipe";
    case PipelineSchedule::one_f_one_b: return "1f1b";
    case PipelineSchedule::interleaved: return "interleaved";
  }
  return "?";
}

std::string to_string(const PipelineOp& op) {
  return std::string(op.kind == PipelineOpKind::forward ? "F" : "B") +
         std::to_string(op.micro_batch) + (op.chunk > 0 ? "." + std::to_string(op.chunk) : "");
}

namespace {

// Megatron-LM's get_model_chunk_id and micro-batch of chunk-operation k (Note [pipeline
// schedules]): groups of P·v operations walk the chunks in P-sized runs of micro-batches.
PipelineOp interleaved_op(PipelineOpKind kind, int k, int P, int v) {
  const int in_group = k % (P * v);
  const int chunk = in_group / P;
  return {.kind = kind,
          .micro_batch = (k / (P * v)) * P + in_group % P,
          .chunk = kind == PipelineOpKind::forward ? chunk : v - 1 - chunk};
}

// The shape rules of pipeline_schedule, checked before a long schedule is extrapolated from
// shorter ones (Note [long pipelines]).
void require_schedule(PipelineSchedule schedule, int P, int M, int v) {
  require_int(P >= 1, "stages", P, "must be >= 1");
  require_int(M >= 1, "micro_batches", M, "must be >= 1");
  require_int(v >= 1, "interleave", v, "must be >= 1");
  require_int(v == 1 || schedule == PipelineSchedule::interleaved, "interleave", v,
              [&] {
                return "must be 1 for the " + std::string(to_string(schedule)) + " schedule";
              });
  if (schedule == PipelineSchedule::interleaved)
    require_int(M % P == 0, "micro_batches", M,
                "must be a multiple of stages = " + std::to_string(P) +
                    " for the interleaved schedule");
}

}  // namespace

std::vector<std::vector<PipelineOp>> pipeline_schedule(PipelineSchedule schedule, int P, int M,
                                                       int v) {
  require_schedule(schedule, P, M, v);
  using K = PipelineOpKind;
  std::vector<std::vector<PipelineOp>> out(static_cast<std::size_t>(P));
  for (int s = 0; s < P; ++s) {
    auto& ops = out[std::size_t(s)];
    if (schedule == PipelineSchedule::gpipe) {
      for (int i = 0; i < M; ++i) ops.push_back({K::forward, i, 0});
      for (int i = 0; i < M; ++i) ops.push_back({K::backward, i, 0});
      continue;
    }
    // 1F1B is the interleaved schedule at v = 1: warm-up (P − s − 1)·2 there is P − s − 1 here.
    const int total = v * M;
    const int warm = schedule == PipelineSchedule::one_f_one_b ? std::min(P - s - 1, M)
                                                               : interleaved_warmup(P, M, v, s);
    for (int k = 0; k < warm; ++k) ops.push_back(interleaved_op(K::forward, k, P, v));
    for (int k = 0; k < total - warm; ++k) {
      ops.push_back(interleaved_op(K::forward, warm + k, P, v));
      ops.push_back(interleaved_op(K::backward, k, P, v));
    }
    for (int k = total - warm; k < total; ++k) ops.push_back(interleaved_op(K::backward, k, P, v));
  }
  return out;
}

std::vector<int> virtual_stage_layers(const std::vector<int>& list, int P, int v) {
  require_int(P >= 1 && v >= 1, "interleave", v, "must be >= 1");
  if (std::int64_t(list.size()) == std::int64_t(P) * v) return list;
  if (int(list.size()) != P)
    throw InvalidInput("--pp-layers: " + std::to_string(list.size()) + " entries for --pp = " +
                       std::to_string(P) + " × --interleave = " + std::to_string(v) +
                       ": give each stage's layers (" + std::to_string(P) +
                       ") or each virtual stage's (" + std::to_string(std::int64_t(P) * v) + ")");
  std::vector<int> out(std::size_t(P) * std::size_t(v));
  for (int j = 0; j < P * v; ++j) {
    const int n = list[std::size_t(j % P)];
    if (n % v != 0)
      throw InvalidInput("--pp-layers: stage " + std::to_string(j % P) + " holds " +
                         std::to_string(n) + " layers, not a multiple of --interleave = " +
                         std::to_string(v) + " (or give each virtual stage's layers)");
    out[std::size_t(j)] = n / v;
  }
  return out;
}

int interleaved_warmup(int P, int M, int v, int s) {
  return std::min((P - s - 1) * 2 + (v - 1) * P, v * M);
}

double interleaved_peak_held(const std::vector<double>& chunk_weight, int P, int M, int s) {
  const int v = int(chunk_weight.size());
  require_int(v >= 1, "interleave", v, "must be >= 1");
  require_int(P >= 1 && M >= 1 && M % P == 0, "micro_batches", M,
              "must be a multiple of stages = " + std::to_string(P));
  require_int(s >= 0 && s < P, "stage", s, "must be in [0, stages)");
  const int total = v * M, warm = interleaved_warmup(P, M, v, s);
  auto weight = [&](PipelineOpKind kind, int k) {
    return chunk_weight[std::size_t(interleaved_op(kind, k, P, v).chunk)];
  };
  double held = 0, peak = 0;
  for (int k = 0; k < warm; ++k) peak = std::max(peak, held += weight(PipelineOpKind::forward, k));
  // Steady state: one forward, then one backward. Both walk the chunks with period P·v, each
  // chunk P times a period, so a period adds and releases the same and the held bytes repeat:
  // its first period holds the peak.
  const int steady = std::min(total - warm, P * v);
  for (int k = 0; k < steady; ++k) {
    peak = std::max(peak, held += weight(PipelineOpKind::forward, warm + k));
    held -= weight(PipelineOpKind::backward, k);
  }
  return peak;  // the remaining backwards only release
}

int peak_in_flight(const std::vector<PipelineOp>& stage_ops) {
  int live = 0, peak = 0;
  for (const PipelineOp& op : stage_ops) {
    live += op.kind == PipelineOpKind::forward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

// Note [1F1B simulation]: no resource is shared between stages, so an operation's start time is
// max(its stage's previous finish, its dependency's finish) whatever order we settle the stages in.
// We sweep the stages repeatedly, advancing each as far as its dependencies allow. A sweep that
// advances no stage would mean the schedule deadlocks: an invariant (every schedule above is
// deadlock-free; tests/core/test_pipeline.cpp checks it for many P, M, v).
namespace {

// Virtual stage j = chunk j div P of stage j mod P takes forward_s[j] / backward_s[j]. Every
// operation simulated: O(P·v·M) time and memory.
double simulate_every_op(PipelineSchedule schedule, const std::vector<double>& forward_s,
                         const std::vector<double>& backward_s, int P, int M) {
  require_int(!forward_s.empty() && forward_s.size() == backward_s.size(), "stages",
              std::int64_t(forward_s.size()), "must be >= 1, one forward and backward time each");
  for (std::size_t j = 0; j < forward_s.size(); ++j) {
    // 0 s is a virtual stage with nothing to run (an empty chunk whose sends cost nothing).
    require_real(std::isfinite(forward_s[j]) && forward_s[j] >= 0, "forward_s", forward_s[j],
                 "must be >= 0 s");
    require_real(std::isfinite(backward_s[j]) && backward_s[j] >= 0, "backward_s", backward_s[j],
                 "must be >= 0 s");
  }
  const int v = int(forward_s.size()) / P;
  const auto order = pipeline_schedule(schedule, P, M, v);
  const int V = P * v;  // virtual stages; chunk c of stage s is virtual stage c·P + s
  constexpr double kPending = -1.0;
  std::vector<std::vector<double>> fwd_done(std::size_t(V), std::vector<double>(M, kPending));
  std::vector<std::vector<double>> bwd_done(std::size_t(V), std::vector<double>(M, kPending));
  std::vector<std::size_t> next(std::size_t(P), 0);
  std::vector<double> free_at(std::size_t(P), 0.0);
  std::size_t remaining = std::size_t(2) * V * M;
  while (remaining > 0) {
    bool progressed = false;
    for (int s = 0; s < P; ++s) {
      while (next[s] < order[s].size()) {
        const PipelineOp op = order[s][next[s]];
        const int j = op.chunk * P + s;
        double ready = 0.0;
        if (op.kind == PipelineOpKind::forward)
          ready = j == 0 ? 0.0 : fwd_done[j - 1][op.micro_batch];
        else
          ready = j == V - 1 ? fwd_done[j][op.micro_batch] : bwd_done[j + 1][op.micro_batch];
        if (ready == kPending) break;
        const double start = std::max(ready, free_at[s]);
        free_at[s] = start + (op.kind == PipelineOpKind::backward ? backward_s[j] : forward_s[j]);
        (op.kind == PipelineOpKind::backward ? bwd_done : fwd_done)[j][op.micro_batch] = free_at[s];
        ++next[s];
        --remaining;
        progressed = true;
      }
    }
    TALLY_INVARIANT(progressed);
  }
  return *std::max_element(free_at.begin(), free_at.end());
}

// Note [long pipelines]: a step of 2²⁴ micro-batches (tally's largest --global-batch) would take
// minutes and gigabytes to simulate op by op. It need not: the steady state's finish times obey a
// max-plus linear recurrence (each op ends at the max of its predecessors' ends plus its own time),
// and the warm-up and drain are fixed max-plus maps before and after it, so T(M) is, after a
// transient, periodic: T(M + c·P) = T(M) + c·λ·P for some cyclicity c (the cyclicity theorem of
// max-plus algebra: Baccelli, Cohen, Olsder and Quadrat 1992, "Synchronization and Linearity"; for
// reducible systems De Schutter 2000, Linear Algebra Appl. 307:103–117). So beyond
// max(simulate_up_to, 64·P) micro-batches, tally simulates the 13 counts M₁, M₁ − P, …, M₁ − 12P
// just below the limit (M₁ ≡ M mod 12P), takes the smallest c in {1, 2, 3, 4, 6, 12} whose
// differences T(M₁ − jP) − T(M₁ − (j + c)P) repeat across the window, and adds that difference
// (M − M₁)/(c·P) times. c = 12 always matches (one difference): the window's mean slope. Random
// uneven stages show c = 1 or 2 after transients of at most 58·P; the test
// Pipeline.LongPipelinesExtrapolateTheSimulation compares the result with the full simulation.
double simulate_chunk_makespan(PipelineSchedule schedule, const std::vector<double>& forward_s,
                               const std::vector<double>& backward_s, int P, int M,
                               int simulate_up_to) {
  const std::int64_t limit = std::max<std::int64_t>(simulate_up_to, std::int64_t(64) * P);
  if (M <= limit) return simulate_every_op(schedule, forward_s, backward_s, P, M);
  require_schedule(schedule, P, M, int(forward_s.size()) / P);
  constexpr int kWindow = 12;
  const std::int64_t window = std::int64_t(kWindow) * P;
  const std::int64_t m1 = M - window * ((M - limit + window - 1) / window);
  std::array<double, kWindow + 1> t{};
  for (int j = 0; j <= kWindow; ++j)
    t[std::size_t(j)] =
        simulate_every_op(schedule, forward_s, backward_s, P, int(m1 - std::int64_t(j) * P));
  for (const int c : {1, 2, 3, 4, 6, kWindow}) {
    const double d = t[0] - t[std::size_t(c)];
    bool repeats = true;
    for (int j = 1; j + c <= kWindow; ++j)
      repeats = repeats && std::fabs(t[std::size_t(j)] - t[std::size_t(j + c)] - d) <= 1e-9 * t[0];
    if (repeats) return t[0] + double((M - m1) / (std::int64_t(c) * P)) * d;
  }
  TALLY_INVARIANT(false);  // c = 12 has one difference, which always repeats
  return 0;
}

}  // namespace

double simulate_pipeline_makespan(PipelineSchedule schedule, const std::vector<double>& forward_s,
                                  const std::vector<double>& backward_s, int M, int v,
                                  int simulate_up_to) {
  require_int(!forward_s.empty() && forward_s.size() == backward_s.size(), "stages",
              std::int64_t(forward_s.size()), "must be >= 1, one forward and backward time each");
  require_int(v >= 1, "interleave", v, "must be >= 1");
  // Every chunk of a stage takes 1/v of the stage's time.
  const std::size_t P = forward_s.size();
  std::vector<double> f(P * std::size_t(v)), b(P * std::size_t(v));
  for (std::size_t j = 0; j < f.size(); ++j) {
    f[j] = forward_s[j % P] / v;
    b[j] = backward_s[j % P] / v;
  }
  return simulate_chunk_makespan(schedule, f, b, int(P), M, simulate_up_to);
}

double simulate_virtual_stage_makespan(const std::vector<double>& forward_s,
                                       const std::vector<double>& backward_s, int stages, int M,
                                       int simulate_up_to) {
  require_int(stages >= 1, "stages", stages, "must be >= 1");
  require_int(!forward_s.empty() && forward_s.size() % std::size_t(stages) == 0, "virtual stages",
              std::int64_t(forward_s.size()),
              "must be a multiple of stages = " + std::to_string(stages));
  return simulate_chunk_makespan(forward_s.size() == std::size_t(stages)
                                     ? PipelineSchedule::one_f_one_b
                                     : PipelineSchedule::interleaved,
                                 forward_s, backward_s, stages, M, simulate_up_to);
}

double simulate_1f1b_makespan(const std::vector<double>& forward_s,
                              const std::vector<double>& backward_s, int micro_batches) {
  require_int(micro_batches >= 1, "micro_batches", micro_batches, "must be >= 1");
  return simulate_pipeline_makespan(PipelineSchedule::one_f_one_b, forward_s, backward_s,
                                    micro_batches);
}

double simulate_1f1b_bubble(int stages, int micro_batches, double forward_s, double backward_s) {
  require_int(stages >= 1, "stages", stages, "must be >= 1");
  require_real(forward_s > 0, "forward_s", forward_s, "must be > 0 s");
  require_real(backward_s > 0, "backward_s", backward_s, "must be > 0 s");
  const double makespan =
      simulate_1f1b_makespan(std::vector<double>(std::size_t(stages), forward_s),
                             std::vector<double>(std::size_t(stages), backward_s), micro_batches);
  return 1.0 - micro_batches * (forward_s + backward_s) / makespan;
}

// Note [uneven stages]: two things hold every stage k of a 1F1B schedule back (t = forward +
// backward of one micro-batch, β = the backward's share of it):
//   - it can't start before micro-batch 0's forward has passed stages 0..k−1, then runs its M
//     forwards and backwards, and the last backward must still pass stages k−1..0:
//     Σ_{s<k} t_s + M·t_k;
//   - its first backward waits for micro-batch 0's round trip through stages k+1..P−1, after which
//     it still has M backwards to run: Σ_{s≠k} t_s + (1−β)·t_k + M·β·t_k.
// The makespan is at least the largest of these; for equal stages it is (M + P − 1)·t (Narayanan
// et al. 2021 eq. 1). Against the discrete-event simulation above the bound is within a few per
// cent (tests/core/test_pipeline.cpp). Interleaving v chunks shortens the fill and drain v-fold.
double pipeline_makespan(const std::vector<double>& stage_s, int micro_batches, int interleave,
                         double backward_share) {
  require_int(!stage_s.empty(), "stages", 0, "must be >= 1");
  std::vector<StageRun> runs;
  for (const double t : stage_s) {
    if (!runs.empty() && runs.back().seconds == t)
      ++runs.back().stages;
    else
      runs.push_back({.seconds = t, .stages = 1});
  }
  return pipeline_makespan(runs, micro_batches, interleave, backward_share);
}

// Within a run of equal stages the first bound grows with the stages before, so the run's last
// stage holds it; the second bound is the same on every stage of the run.
double pipeline_makespan(const std::vector<StageRun>& runs, int micro_batches, int interleave,
                         double backward_share) {
  require_int(!runs.empty(), "stages", 0, "must be >= 1");
  require_int(micro_batches >= 1, "micro_batches", micro_batches, "must be >= 1");
  require_int(interleave >= 1, "interleave", interleave, "must be >= 1");
  require_real(backward_share >= 0 && backward_share <= 1, "backward_share", backward_share,
               "must be in [0, 1]");
  double total = 0;
  for (const StageRun& r : runs) {
    require_real(std::isfinite(r.seconds) && r.seconds >= 0, "stage seconds", r.seconds,
                 "must be >= 0");
    require_int(r.stages >= 1, "stages in a run", r.stages, "must be >= 1");
    total += r.stages * r.seconds;
  }
  const double v = interleave, M = micro_batches, beta = backward_share;
  double before = 0, makespan = 0;
  for (const StageRun& r : runs) {
    const double t = r.seconds, others = total - t;
    makespan = std::max({makespan, (before + (r.stages - 1) * t) / v + M * t,
                         others / v + (1 - beta) * t / v + M * beta * t});
    before += r.stages * t;
  }
  return makespan;
}

void check_stage_list(const std::vector<int>& list, int layers, int stages, int interleave) {
  if (interleave > 1 && std::int64_t(list.size()) != std::int64_t(stages) * interleave)
    throw InvalidInput("--pp-layers: " + std::to_string(list.size()) +
                       " entries given for --pp = " + std::to_string(stages) +
                       " × --interleave = " + std::to_string(interleave) +
                       ": give each of the " + std::to_string(std::int64_t(stages) * interleave) +
                       " virtual stages' layers, in model order");
  if (interleave <= 1 && int(list.size()) != stages)
    throw InvalidInput("--pp-layers: " + std::to_string(list.size()) + " stages given for --pp = " +
                       std::to_string(stages));
  // Interleaved, a virtual stage may hold no layer (Megatron-Core's slot split of 126 layers over
  // 16 × 8 virtual stages leaves the first the embedding and the last the loss), a stage not.
  long long sum = 0;
  for (std::size_t s = 0; s < list.size(); ++s) {
    if (list[s] < (interleave > 1 ? 0 : 1))
      throw InvalidInput("--pp-layers: " + std::string(interleave > 1 ? "virtual " : "") +
                         "stage " + std::to_string(s) + " holds " + std::to_string(list[s]) +
                         " layers: every " + (interleave > 1 ? "virtual stage needs >= 0"
                                                             : "stage needs >= 1"));
    sum += list[s];
  }
  for (int s = 0; interleave > 1 && s < stages; ++s)
    if (stage_layer_total(list, stages, s) < 1)
      throw InvalidInput("--pp-layers: stage " + std::to_string(s) +
                         "'s virtual stages hold no layer: every stage needs >= 1");
  if (sum != layers)
    throw InvalidInput("--pp-layers: the stages hold " + std::to_string(sum) +
                       " layers; the model has " + std::to_string(layers));
}

std::vector<int> stage_layers(int layers, int stages, int first, int last) {
  require_int(stages >= 1, "pp", stages, "must be >= 1");
  require_int(layers >= stages, "layers", layers,
              "must be >= pp = " + std::to_string(stages) + " (one layer per stage at least)");
  if (first != 0 || last != 0) {
    require_int(stages >= 2, "pp", stages, "must be >= 2 to give the end stages their own layers");
    const int middle = stages - 2, rest = layers - first - last;
    if (!(first >= 1 && last >= 1 && rest >= middle && (middle > 0 || rest == 0)))
      throw InvalidInput("--pp-layers: first stage " + std::to_string(first) + " and last stage " +
                         std::to_string(last) + " of the model's " + std::to_string(layers) +
                         " layers leave " + std::to_string(rest) + " for " +
                         std::to_string(middle) +
                         " middle stages: every stage needs >= 1 layer and the stages must hold "
                         "all layers");
  }
  std::vector<int> out(static_cast<std::size_t>(stages), 0);
  for (int s = 0; s < stages; ++s)
    out[std::size_t(s)] = layers_of_stage(layers, stages, first, last, s);
  return out;
}

void stage_layer_runs(int layers, int stages, int first, int last, std::vector<LayerRun>& out) {
  out.clear();
  auto add = [&](int n, int count) {
    if (count > 0) out.push_back({.layers = n, .stages = count});
  };
  if (stages == 1) {
    out.push_back({.layers = layers, .stages = 1});
    return;
  }
  // The middle stages 1 .. P − 2 hold `lo` layers, then the last `extra` of them lo + 1
  // (layers_of_stage); the end stages their own counts.
  int head = 0, tail = 0, lo = 0, extra = 0;
  const int middle = stages - 2;
  if (first == 0 && last == 0) {
    lo = layers / stages;
    const int more = layers % stages;  // the last `more` stages hold lo + 1 (more < P)
    head = lo;
    tail = more >= 1 ? lo + 1 : lo;
    extra = std::max(0, std::min(middle, more - 1));
  } else {
    head = first;
    tail = last;
    if (middle > 0) {
      const int rest = layers - first - last;
      lo = rest / middle;
      extra = rest % middle;
    }
  }
  out.push_back({.layers = head, .stages = 1});
  add(lo, middle - extra);
  add(lo + 1, extra);
  out.push_back({.layers = tail, .stages = 1});
}

}  // namespace tally
