// `tally run pp` (issue 11): pipeline parallelism — GPipe, 1F1B and interleaved 1F1B — on the
// engine's GPT decoder split into stages (engine/runtime/pp_model.hpp), one PP group of P = world
// size ranks, checked against the single-process model and core's pipeline and PP ledgers:
//   equivalence   float64: the mean loss over M micro-batches and every gradient a stage holds
//                 equal a single-process run of the same model and data to 1e-10 relative
//   order         each stage's executed operations == core's pipeline_schedule(), exactly
//   bytes         each activation / gradient send == core step_traffic()'s PP bytes per call
//                 (b·s·h·bytes), exactly
//   bubble        each stage's idle fraction (1 − compute / elapsed) beside core's bubble()
//                 (P−1)/(v·M+P−1) and the makespan core's simulator predicts from the measured
//                 t_f and t_b — reported, never asserted (timing)
//   memory        stage 0's peak activations held, in forwards' worth (tracking allocator),
//                 beside core's peak_in_flight() — reported
//
// Legend: P = stages, M = micro-batches, v = chunks per stage, B = micro-batch, T = sequence,
// C = hidden, L = layers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tally/core/pipeline.hpp"
#include "tally/engine/dist_env.hpp"
#include "tally/engine/gpt.hpp"

namespace tally::engine {

struct PpRunSpec {
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  int micro_batches = 1;  // M
  int interleave = 1;     // v (interleaved only)
};

// Note [default PP model]
// h 64, L 8, a 8, V 256, T 32, B 2: L = 8 splits over P = 2, 4 and 8 stages and into v = 2
// chunks at P = 2 and 4; N = V·C + T·C + L·(12C² + 13C) + 2C = 418,432 parameters. S = B·T·C·8 = 32,768 bytes per float64 send.
struct PpOptions {
  int pp = 0;  // stages; 0 = the world size. Must equal the world size.
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  int micro_batches = 0;  // M; 0 = 2·P
  int interleave = 0;     // v; 0 = 2 for the interleaved schedule, else 1
  // Every schedule at M ∈ {1, P, 2P+1} (interleaved: M ∈ {P, 2P}), one after another: the
  // issue's equivalence sweep in one launch.
  bool sweep = false;
  GptConfig model{.hidden = 64, .layers = 8, .heads = 8, .vocab = 256, .seq = 32, .micro_batch = 2};
  int steps = 3;            // timed float64 steps after the checked one (0: time the checked one)
  std::uint64_t seed = 0;   // weights and tokens
  double timeout_s = 60;    // rendezvous and every send / recv
  int threads = 1;          // torch intra-op threads per rank (0 = libtorch's)
  // InvalidInput naming the flag, the value and the allowed range: --pp ≠ world size, more stages
  // than layers, --interleave not dividing a stage's layers, M not a multiple of P (interleaved),
  // --interleave with another schedule, …
  void validate(int world_size) const;
  std::vector<PpRunSpec> runs(int world_size) const;  // what the run executes, in order
};

// One stage's figures in one run, gathered to every rank.
struct PpStageMeasure {
  int layers = 0;                       // of this stage (all chunks)
  double max_grad_rel_diff = 0;         // its parameters, vs the single-process gradients
  bool order_ok = false;                // executed == core's schedule
  int activation_sends = 0, gradient_sends = 0;
  double min_send_bytes = 0, max_send_bytes = 0;  // over all its sends (0 when none)
  double compute_s = 0, wait_s = 0, elapsed_s = 0;  // mean over the timed steps
  double forward_s = 0, backward_s = 0;             // per micro-batch (all chunks), mean
  double peak_held_bytes = 0;           // activations held between operations, max (checked step)
  double bytes_per_forward = 0;         // what one chunk-forward adds, mean
  double in_flight() const { return bytes_per_forward > 0 ? peak_held_bytes / bytes_per_forward : 0; }
  double idle_fraction() const { return elapsed_s > 0 ? 1 - compute_s / elapsed_s : 0; }
};

struct PpRun {
  PpRunSpec spec;
  double loss_f64 = 0, reference_loss_f64 = 0;  // last stage's mean loss, single-process's
  std::vector<PpStageMeasure> stages;           // P
  // core
  double predicted_bubble = 0;        // bubble(): (P−1)/(v·M+P−1)
  double simulated_makespan_s = 0;    // simulate_pipeline_makespan on the measured t_f, t_b
  double predicted_send_bytes = 0;    // step_traffic().pp.bytes_per_call (float64)
  int predicted_in_flight = 0;        // peak_in_flight(stage 0's schedule)
  double makespan_s() const;          // max over stages of elapsed
};

struct PpResult {
  PpOptions options;
  int rank = 0, world_size = 1;
  std::int64_t n_params = 0;
  std::vector<int> stage_layers;      // core's split
  std::vector<PpRun> runs;
};

// float64 sums in another order differ by ulps; 1e-10 leaves room for depth (as tp.hpp).
inline constexpr double kPpF64Tolerance = 1e-10;

struct PpCheck {
  std::string what;  // "1f1b M=4 stage 2 gradients f64", …
  double measured = 0, predicted = 0, tolerance = 0;
  bool ok = true;
};
std::vector<PpCheck> pp_checks(const PpResult& r);

// Runs options.runs() on this rank. Progress: one line per run on stderr (rank 0).
PpResult run_pp(const DistEnv& env, const PpOptions& options);

}  // namespace tally::engine
