// `tally run zero` (issue 4): data parallelism (ZeRO-0) and ZeRO stages 1, 2, 3 trained for real
// over Gloo, each measured beside the core's prediction for the same inputs (DESIGN.md §4):
//   model-state bytes per rank   tracking allocator and the strategy's own tensors vs core
//                                model_states() (ZeRO §5; seed A1's table)
//   bytes sent per optimizer step  Comm counters vs core step_traffic() dp_grad + zero_param_gather
//                                (ZeRO §7; DESIGN.md erratum 4: "ZeRO-2 halves communication")
//   loss trajectory              ZeRO-1/2/3 vs DP, step by step (fp32: the same computation)
//
// Legend: N = parameters of the model, k = ranks (the sharding degree), r = this rank, U = units
// (the model's layers: ZeRO-3 gathers and frees parameters one unit at a time), S = N · bytes per
// element on the wire.
//
// The strategies (engine/runtime/zero_strategy.hpp, one file each: zero_stage0.cpp … zero_stage3.cpp) share
// one shape, setup(model) / step(batch) → loss / measure(). The model is an MLP in plain ATen
// (widths d_0 … d_U, Linear + ReLU, engine/runtime/mlp.hpp's initialisation); all ranks build it from
// the same seed, and rank r trains on rows r, r+k, … of one fixed random batch.
//
// Precision fp32: fp32 parameters, gradients, Adam m and v; the parameters are their own master.
// bf16 (mixed): bf16 parameters and gradients, fp32 master + m + v (seed A1: 2 + 2 + 8 + 4).
// Gloo in PyTorch 1.13 reduces no bfloat16 (Note [bf16 on Gloo] in ddp.cpp), so every collective
// carries bf16 values widened to float32: wire_dtype is "float32" and the bytes sent are twice the
// 2-byte ledger's; both predictions are reported, labelled.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tally/core/comm.hpp"
#include "tally/core/model_states.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/comm.hpp"
#include "tally/engine/dist_env.hpp"
#include "tally/core/mlp_step.hpp"

namespace tally::engine {

// Note [default ZeRO model]
// MLP 512 → 1021 → 1021 → 10: N = 1,577,455 parameters, odd, so N mod k ≠ 0 for every k > 1 and the
// uneven-shard paths run (units of 523,773, 1,043,462 and 10,220 parameters). fp32 states
// 16N ≈ 25 MB per rank at ZeRO-0: large beside the few kilobytes of per-step bookkeeping, so the
// allocator's figure tracks the ledger to well under 1 %; 20 steps of all four stages take a few
// seconds on 2 cores. Adam at lr 1e-4 on 64 random rows keeps the loss O(1) for 20 steps (at 1e-3
// the model memorises the rows and the loss reaches ~1e-7, where a relative loss difference means
// little). Tests use smaller widths.
struct ZeroOptions {
  std::vector<int> stages = {0, 1, 2, 3};  // run one after another, same data and initial weights
  Precision precision = Precision::fp32;   // fp32 or bf16 (mixed); fp16 is refused
  // d_0 … d_U (Note [default ZeRO model])
  std::vector<std::int64_t> widths = {512, 1021, 1021, 10};
  std::int64_t batch = 64;                 // global rows per step; must be divisible by k
  int steps = 20;                          // optimizer steps per stage
  double lr = 1e-4, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // Adam (torch.optim.Adam's update)
  std::uint64_t seed = 0;                  // weights and data
  double timeout_s = 60;                   // rendezvous and every collective
  int threads = 1;                         // torch intra-op threads per rank (0 = libtorch's)
  void validate() const;                   // InvalidInput naming the flag, value and range
  void validate(int world_size) const;     // + the checks that need k (--batch divisible by k)
};

// What one rank's algorithm puts on the wire for one collective on `count` elements of
// `element_bytes` over k ranks (the Comm counters hold the core formula instead; see Note [wire
// bytes] in zero.cpp): tally's ring all-reduce 2S − |C_r| − |C_{r+1}|, tally's ring reduce-scatter
// S − |C_r|, Gloo's ring all-gather with chunks padded to |C_0|: (k − 1)·|C_0| (C = chunk_range).
double wire_bytes(Collective c, std::int64_t count, double element_bytes, int ranks, int rank);

// One rank's model states, itemized as the ledger, plus the allocator's view.
struct RankMemory {
  StateItems held;               // Σ nbytes of the strategy's own tensors after the last step
  double allocator_bytes = 0;    // tracking allocator: allocated after the last step − before the
                                 // model was built (everything the strategy left alive)
  double peak_bytes = 0;         // peak allocated during the steps − that baseline (+ activations,
                                 // transient full gradients / gathered parameters, temporaries)
  // The same readings by phase (Note [zero memory phases] in zero.cpp), each − the baseline:
  double setup_bytes = 0;        // allocated once setup returned: the states before any step
  double peak_forward_backward_bytes = 0;  // peak from a step's start to its optimizer update
                                           // (forward, backward, gradient reduction), max over
                                           // the steps
  double peak_update_bytes = 0;  // peak from the update to the step's end (Adam; ZeRO-1/2: the
                                 // all-gather of the updated shards), max over the steps
};

// Bytes one rank sent in one optimizer step, by collective. all_reduce is tally's ring all-reduce:
// its bytes are what its sends moved; reduce_scatter and all_gather come from Comm's counters (the
// core formula on the real S).
struct RankTraffic {
  CollectiveCounter all_reduce, reduce_scatter, all_gather;
  double wire_bytes = 0;  // wire_bytes() summed over the step's calls
  bool steady = true;     // every step sent exactly these bytes
  double total_bytes() const {
    return all_reduce.bytes_sent + reduce_scatter.bytes_sent + all_gather.bytes_sent;
  }
  std::int64_t calls() const { return all_reduce.calls + reduce_scatter.calls + all_gather.calls; }
};

// One step's phases on one rank, in seconds (Note [zero phases] in zero.cpp); they sum to the
// step's time.
struct ZeroStepPhases {
  double forward_backward_s = 0;  // the rest of the step: forward, backward, the strategy's passes
                                  // over gradient buffers (zeroing, shard copies, bf16 widening)
  double collectives_s = 0;       // inside the Comm's collectives: gradient reduction (DP's ring
                                  // all-reduce, reduce-scatters) and parameter all-gathers
  double optimizer_s = 0;         // the Adam update
  // Of collectives_s, the time this rank waited in them for the last rank to arrive (Note [arrival
  // wait] in comm.cpp), summed over the step's collectives; 0 unless StageResult::arrival_measured.
  double arrival_wait_s = 0;
  // Not a part of the step: the CPU time this rank's process spent in it, all its threads (Gloo's
  // too; CLOCK_PROCESS_CPUTIME_ID). Note [every rank's phases] in zero.cpp.
  double cpu_s = 0;
  // Not a part of the step either: the time in it that this rank's main thread (forward,
  // backward, optimizer, and the waits in its collectives) spent runnable but off a CPU (Note
  // [run-queue wait], tally/engine/comm.hpp); 0 unless StageResult::runqueue_measured.
  double runqueue_wait_s = 0;
  // Of runqueue_wait_s, the part inside the step's collectives (their spans' CallSpan::
  // runqueue_wait_s: woken from a wait, queued for a core); 0 unless StageResult::
  // runqueue_measured and arrival_measured (the spans are recorded on one host).
  double runqueue_in_collectives_s = 0;
};

// One rank's medians over a stage's steps (Note [every rank's phases] in zero.cpp), each of its
// own, so they need not sum to step_s.
struct ZeroRankMedians {
  double step_s = 0;
  double forward_backward_s = 0;
  double arrival_wait_s = 0;  // 0 unless StageResult::arrival_measured
  double collectives_s = 0;   // of each step's collectives_s − arrival_wait_s
  double optimizer_s = 0;
  double cpu_s = 0;
  // The mean over the steps, not the median: a stall hits a few steps (Note [every rank's phases]
  // in zero.cpp); 0 unless StageResult::runqueue_measured.
  double runqueue_wait_mean_s = 0;
  double runqueue_in_collectives_mean_s = 0;  // its part inside collectives, the same way
};

struct StageResult {
  int stage = 0;
  std::string name;                       // "DP (ZeRO-0)", "ZeRO-1", …
  std::vector<double> mean_losses;        // per step, this rank's loss averaged over ranks
  std::vector<double> rank0_losses;       // per step, rank 0's local loss
  std::vector<RankMemory> memory;         // per rank
  std::vector<RankTraffic> traffic;       // per rank, one step
  ModelStateResult predicted_states;      // core model_states(N, {precision, adam, stage, k})
  StepTraffic predicted_traffic;          // core step_traffic() at the wire dtype's bytes
  StepTraffic ledger_traffic;             // the same at the ledger's bytes (2 for bf16)
  // Against stage 0 of the same run (0 when stage 0 did not run or this is stage 0):
  bool compared_to_dp = false;
  double max_rel_loss_diff_vs_dp = 0;     // max over steps and ranks of |l − l_dp| / |l_dp|
  double max_param_diff_vs_dp = 0;        // max |θ − θ_dp| after the last step (all ranks equal)
  double seconds = 0;                     // wall time of the steps on rank 0
  std::vector<double> step_seconds;       // this rank's time of each step (rank 0's in results)
  std::vector<ZeroStepPhases> step_phases;  // this rank's phases of each step (rank 0's)
  std::vector<ZeroRankMedians> rank_medians;  // every rank's, in rank order
  // Every rank's collective spans were compared on one clock: all ranks ran on this host (the
  // rendezvous address is loopback), so step_phases' arrival_wait_s is measured.
  bool arrival_measured = false;
  // Every rank read its main thread's run-queue wait (Note [run-queue wait]).
  bool runqueue_measured = false;

  double predicted_bytes_per_step() const { return predicted_traffic.dp_total_bytes(); }
};

struct ZeroResult {
  ZeroOptions options;
  int rank = 0;
  int world_size = 1;
  std::int64_t n_params = 0;              // N
  std::vector<std::int64_t> unit_params;  // n_u per unit (layer)
  std::string param_dtype, wire_dtype;    // "float32" / "bfloat16"; "float32" always
  std::vector<StageResult> stages;        // in options.stages order

  const StageResult* find(int stage) const;
};

// Tolerances (stated next to their reason in Note [zero tolerances], zero.cpp).
inline constexpr double kZeroMemoryTolerance = 0.05;     // allocator bytes vs core, relative
inline constexpr double kZeroLossTolerance = 1e-5;       // fp32 loss vs DP per step, relative
inline constexpr double kZeroTrafficTolerance = 1e-12;   // counters vs core (same formula), rel.

// What a ZeroCheck compares (measured vs predicted; tolerance as stated).
enum class ZeroCheckKind {
  allocator_vs_model_states,   // RankMemory::allocator_bytes vs core model_states total (±5 %)
  held_vs_model_states,        // RankMemory::held total vs core model_states total (±5 %)
  bytes_vs_step_traffic,       // RankTraffic::total_bytes vs core step_traffic dp_grad +
                               // zero_param_gather (Note [zero tolerances])
  collective_calls,            // collectives per step: DP 1, ZeRO-1/2 2, ZeRO-3 3 per unit (k > 1)
  steady_bytes,                // the same bytes every step: measured 1 or 0, predicted 1
  loss_vs_dp,                  // max relative loss difference vs DP, every rank and step
                               // (fp32 stages compared to DP); predicted 0, tolerance absolute
};

// One acceptance check of a run, evaluated on the gathered data (so every rank agrees);
// cli/run_zero.cpp words it.
struct ZeroCheck {
  ZeroCheckKind kind = ZeroCheckKind::allocator_vs_model_states;
  int stage = 0;          // StageResult::stage
  int rank = -1;          // the rank measured; -1 for loss_vs_dp (over every rank)
  double measured = 0;
  double predicted = 0;
  double tolerance = 0;   // on |measured/predicted − 1|, or the absolute bound for differences
  bool ok = false;
};
// Per stage, per rank: allocator, held, bytes, calls (k > 1), steady; then the stage's loss_vs_dp.
std::vector<ZeroCheck> zero_checks(const ZeroResult& r);

// The measured per-step bytes of `stage` over DP's (rank 0), 0 when either did not run. The seed's
// claims (ZeRO-1 unchanged, "ZeRO-2 halves", ZeRO-3 ≈1.5×) are settled by these ratios.
double traffic_ratio_vs_dp(const ZeroResult& r, int stage);
// The seed's claims about ZeRO's traffic (ZeRO-1 "unchanged", ZeRO-2 "halves", ZeRO-3 "≈1.5×"),
// settled on rank 0's measured bytes per step over DP's. cli/run_zero.cpp words the conclusion.
inline constexpr double kZeroClaimTolerance = 0.01;  // a claim holds within 1 % of its ratio
struct ZeroSeedClaim {
  int stage = 1;
  double claimed_ratio = 1;         // the seed's: 1 (stage 1), 0.5 (stage 2), 1.5 (stage 3)
  double measured_ratio = 0;        // bytes per step ÷ DP's
  double reduce_scatter_ratio = 0;  // the stage's reduce-scatter bytes alone ÷ DP's
  bool holds = false;               // |measured − claimed| <= kZeroClaimTolerance · claimed
};
struct ZeroSeedClaims {
  // true: DP's bytes were measured (stage 0 ran); false: core's all-reduce 2S(k−1)/k stands in.
  bool against_measured_dp = false;
  std::vector<ZeroSeedClaim> claims;  // stages 1, 2, 3 that ran; none for k = 1
};
ZeroSeedClaims zero_seed_claims(const ZeroResult& r);

// Runs every requested stage in this process as rank env.rank (all ranks call it with the same
// options). Installs the tracking allocator for the duration (no other scope may be active).
// Throws InvalidInput for bad options, CommError when the group fails.
ZeroResult run_zero(const DistEnv& env, const ZeroOptions& options);

}  // namespace tally::engine
