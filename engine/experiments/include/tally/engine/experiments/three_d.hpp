// `tally run 3d` (issue 11): data × tensor × pipeline (× context) parallelism on the engine's GPT
// decoder, every dimension at once — D·T·P·C ranks in Megatron's rank order (core/
// parallel_groups.hpp: TP fastest, then CP, then DP, then PP), each rank one TP shard (engine/
// runtime/tp_model.hpp, optionally with SP; with CP its zigzag share of the sequence and ring
// attention, Note [TP with context parallelism]) of one pipeline stage (engine/runtime/
// pp_model.hpp, core's schedules; uneven stages with --pp-layers), gradients averaged over the
// DP × CP group at ZeRO stage 0–3 (Note [3-D data-parallel step] in three_d.cpp: ZeRO-0 all-
// reduces; 1 reduce-scatters, runs Adam on the rank's shard_span and all-gathers the updated
// parameters; 2 also frees the full gradient between steps; 3 also holds only the span of the
// parameters and gathers them as core's step_traffic counts), optionally with a recompute policy
// (tp_model.hpp Note [full recompute], Note [selective recompute policies]).
// Checked against the single-process GPT and core:
//   equivalence   float64, one step: the mean loss and every gradient a rank holds after the DP
//                 reduction (its TP slice of its stage's parameters; under ZeRO its shard) equal
//                 the single-process run on all D·M micro-batches to 1e-10 relative; so do the
//                 parameters after one Adam step (the ZeRO all-gather included)
//   bytes         per rank, over the first fp32 step: TP bytes of the stage's layers == core
//                 step_traffic()'s TP item with this stage's layers (exact); every PP send ==
//                 its PP bytes per call (b·s·h·4, /t with SP), exact, and the number of sends by
//                 the schedule; CP bytes and sends == its CP item (3(c−1) ring sends per layer
//                 per micro-batch; 4(c−1) with full recompute); DP bytes == its dp_grad +
//                 zero_param_gather items on this rank's own parameter count (exact; ZeRO-2/3
//                 per micro-batch without PP, once per step under it). With full recompute the
//                 TP item counts 6 collectives per layer (DESIGN.md erratum 2), with the
//                 selective policies 4 (their replays issue none). Beside them, the
//                 layout-level items (N/(t·p) parameters, the busiest stage, 2vM sends) and their
//                 ratio
//   states        the model-state bytes the tracking allocator saw allocated for the rank's flat
//                 parameters, gradients and Adam state == core model_states() on the rank's own
//                 parameters at the ZeRO stage (exact but for the shard's rounding, < 1 element of
//                 each sharded item); beside it model_states(N/(t·p)) for the layout
//   activations   the peak the tracking allocator saw held during the step beside core
//                 activations()' per-layer bytes × the stage's layers / v × peak_in_flight; and
//                 per layer, for each of core's five recompute policies, the bytes one forward of
//                 the stage's layers leaves alive beside core's per-layer bytes — reported, not
//                 checked
//   time          per rank, mean over the fp32 steps: compute, TP comm (the TP Comm's seconds),
//                 CP comm (the ring's shifts), PP wait (receives, posted sends, the tied-
//                 embedding exchange), DP comm (the DP × CP Comm's seconds), beside
//                 core: the bubble (P−1)(t_f + t_b)/v from the measured t_f, t_b; with a host
//                 calibration, the operator model's kernels (core/gpt_step.hpp), the α–β time
//                 of each traffic item and the step they add up to (Note [predicted 3-D
//                 step], core/gpt_step.hpp) — reported
//
// Legend: D = DP ranks, T = TP ranks (t), P = stages, c = CP ranks, v = chunks per stage, M = micro-batches per
// DP rank per step, B = micro-batch, S = sequence, C = hidden, L = layers, N_r = a rank's own
// parameters (its TP slice of its stage).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tally/core/comm.hpp"
#include "tally/core/hardware.hpp"
#include "tally/core/pipeline.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/dist_env.hpp"
#include "tally/engine/gpt.hpp"

namespace tally::engine {

// Note [default 3-D model]
// h 32, L 4, a 4, V 64, T 16, B 2, M = 2·P: divisible by t = 1, 2, 4 (heads, FFN 128, sequence),
// 4 layers split over P = 1, 2, 4 stages (v = 2 at P = 2), 16 positions in 2c zigzag chunks for
// c = 1, 2, 4, 8 (with SP, 16/c divisible by t); N = V·C + T·C + L·(12C² + 13C) + 2C
// = 53,440. Eight ranks finish a float64 check and 3 fp32 steps in a few seconds on 2 cores.
struct ThreeDOptions {
  int dp = 1, tp = 1, pp = 1, cp = 1;  // dp·tp·pp·cp = the world size (cp: zigzag ring attention)
  bool sp = false;                     // sequence parallelism (needs tp > 1)
  int zero = 0;                        // 0..3, over the DP × CP group
  // none; full (every block's forward replayed in backward); selective, save-matmuls, op-sac
  // (core's saved sets: tp_model.hpp Note [selective recompute policies])
  Recompute recompute = Recompute::none;
  // Layers of each stage (--pp-layers 3,5): pp entries >= 1 summing to the layers (core's
  // check_stage_list), or with interleave v > 1 pp·v entries, every virtual stage's (each >= 0,
  // every stage's sum >= 1); empty = core's even split stage_layers(L, P).
  std::vector<int> pp_layers;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  int interleave = 1;                  // v; > 1 needs the interleaved schedule
  int micro_batches = 0;               // M per DP rank per step; 0 = 2·pp
  GptConfig model{.hidden = 32, .layers = 4, .heads = 4, .vocab = 64, .seq = 16, .micro_batch = 2};
  int steps = 3;                       // fp32 Adam steps (measured; step 1's bytes and memory)
  double lr = 1e-3;                    // Adam
  std::uint64_t seed = 0;              // weights and tokens
  double timeout_s = 60;               // rendezvous and every collective / send / recv
  int threads = 1;                     // torch intra-op threads per rank (0 = libtorch's)
  // A host calibration's cluster (io::host_cluster): enables the compute and comm time predictions.
  std::optional<ClusterSpec> host;
  int host_cores = 1;  // c, the cores the ranks share (Note [host GPT step]: contention)
  // The calibration's own fits of tally's ring reduce-scatter and Gloo's all-gather where it timed
  // them (`bench allreduce --sharded`, Note [sharded collectives]): SP's reduce-scatters and
  // all-gathers are priced on them; unset, on `host`.
  CollectiveLinks host_links;
  // Fault (--kill-rank, --kill-at-step): this global rank SIGKILLs itself after the first
  // operation of its schedule in that fp32 step, so the others must notice (DESIGN.md §5).
  int kill_rank = -1;
  int kill_at_step = 1;
  // InvalidInput naming the flag, the value and the allowed range: a product ≠ the world size,
  // --tp not dividing --heads or 4·--hidden, more stages than layers, --seq not in 2·--cp equal
  // chunks (or, with --sp, --seq/--cp not divisible by --tp), --zero > 3, a bad --pp-layers,
  // interleave constraints as `run pp`'s, …
  void validate(int world_size) const;
  int micro_batches_or_default() const { return micro_batches == 0 ? 2 * pp : micro_batches; }
  std::vector<int> stage_split() const;  // pp_layers (each stage's sum), or core's even split
  // Every virtual stage's layers (pp·v entries, model order): pp_layers when it names them all
  // (Note [uneven virtual stages]), else each stage's split evenly over its chunks.
  std::vector<int> virtual_split() const;
  bool virtual_split_given() const;  // pp_layers holds pp·v entries (interleave > 1)
};

// One rank's figures, gathered to every rank. Bytes are per step (the first fp32 step); times the
// mean over the fp32 steps.
struct ThreeDRank {
  int rank = 0, dp_index = 0, tp_index = 0, pp_index = 0, cp_index = 0;
  int stage_layers = 0;
  double own_params = 0;             // N_r
  // float64 equivalence
  double max_grad_rel_diff = 0;      // after the DP reduction
  double max_param_rel_diff = 0;     // after one Adam step
  double loss = 0;                   // last stages: mean over this DP rank's M micro-batches
  // TP group
  double tp_layer_bytes = 0, tp_layer_calls = 0;  // the stage's layers (core's item)
  double tp_regather_bytes = 0, tp_regather_calls = 0;  // its layers' SP re-gathers
  double tp_regather_predicted_bytes = 0, tp_regather_predicted_calls = 0;  // core's tp_regather
  double tp_other_bytes = 0;         // SP edges, SP gradient all-reduce
  double tp_other_predicted_bytes = 0;  // core's engine_sp_traffic (Note [engine SP edges])
  double tp_predicted_bytes = 0;     // step_traffic TP item, this stage's layers
  double tp_predicted_calls = 0;
  double tp_layout_bytes = 0;        // step_traffic TP item, the layout (busiest stage)
  // PP group
  double pp_sends = 0, pp_min_send = 0, pp_max_send = 0, pp_send_bytes = 0;
  double pp_expected_sends = 0;      // by the schedule: v·M per direction less the ends
  double pp_predicted_per_call = 0;  // step_traffic PP bytes per call
  double pp_layout_bytes = 0;        // step_traffic PP item (2vM sends)
  double pp_embedding_bytes = 0;     // tied-embedding gradient exchange
  double pp_embedding_predicted_bytes = 0;  // core's pp_embedding item (end stages; 0 elsewhere)
  // CP group (ring attention's sends, cp > 1)
  double cp_bytes = 0, cp_sends = 0;
  double cp_predicted_bytes = 0, cp_predicted_sends = 0;  // step_traffic CP item, this stage
  // DP group (DP × CP with cp > 1)
  double dp_bytes = 0, dp_calls = 0;
  double dp_predicted_bytes = 0;     // dp_grad + zero_param_gather at N_r
  double dp_layout_bytes = 0;        // the same at N/(t·p)
  // Model states (fp32 Adam): allocated by the tracking allocator, itemized, and core's
  double state_bytes = 0;
  double state_predicted_bytes = 0;  // model_states(N_r)
  double state_layout_bytes = 0;     // model_states(N/(t·p))
  // Activations (fp32)
  double peak_activation_bytes = 0;
  double predicted_activation_bytes = 0;
  double in_flight = 0;              // core's peak_in_flight of this stage's schedule
  // Per layer, by recompute policy (index: Recompute), one forward of the stage's layers (Note
  // [activations per recompute policy] in three_d.cpp): the bytes the tracking allocator saw a
  // layer leave alive less the LayerNorm statistics, and core's activations().per_layer_bytes.
  double layer_activation_bytes[kRecomputePolicies] = {};
  double layer_activation_predicted[kRecomputePolicies] = {};
  double layer_norm_stat_bytes = 0;  // subtracted above (none under full recompute)
  // Time (s)
  double step_s = 0, compute_s = 0, tp_comm_s = 0, cp_comm_s = 0, pp_wait_s = 0, dp_comm_s = 0;
  double optimizer_s = 0;
  // Of tp_comm_s, the time this rank waited in the TP collectives for its partners to arrive
  // (Note [arrival wait] in comm.cpp): measured when TP > 1 and the group is on one host, else -1.
  double tp_arrival_wait_s = -1;
  // Of dp_comm_s, the same for the gradient group (DP × CP: its reduction and ZeRO gathers), when
  // DP × CP > 1 and the group is on one host, else -1. Times: Note [3-D step times] in three_d.cpp.
  double dp_arrival_wait_s = -1;
  // This rank's main thread's run-queue wait (Note [run-queue wait] in tally/engine/comm.hpp): the
  // time it was runnable with no core, median over the timed steps, and of it the part inside the
  // TP and gradient collectives (woken, then queued); -1 where /proc/thread-self/schedstat cannot
  // be read, the part also where a group's spans are not recorded (ranks on several hosts).
  double runqueue_wait_s = -1;
  double runqueue_wait_in_collectives_s = -1;
  std::vector<double> step_seconds;       // every fp32 step's time, the warm-up step first
  double forward_s = 0, backward_s = 0;  // per micro-batch (all chunks), compute incl. TP comm
  double predicted_pp_wait_s = 0;         // core's bubble on the measured t_f, t_b
  // With a host calibration (-1 without one): core's operator model (core/gpt_step.hpp, Note
  // [host GPT step]) and α–β items, and the step they add up to (Note [predicted 3-D step]).
  double predicted_compute_s = -1;        // M · (forward + backward kernels)
  double predicted_tp_comm_s = -1, predicted_cp_comm_s = -1, predicted_dp_comm_s = -1;
  double predicted_optimizer_s = -1, predicted_pp_send_s = -1;
  double predicted_step_s = -1;
  double predicted_forward_s = -1, predicted_backward_s = -1;  // per micro-batch, TP/CP comm in
};

struct ThreeDResult {
  ThreeDOptions options;
  int rank = 0, world_size = 1;
  int micro_batches = 1;             // M
  std::int64_t n_params = 0;         // N of the single-process model
  std::vector<int> stage_layers;     // stage_split(): --pp-layers or core's even split
  double loss_f64 = 0, reference_loss_f64 = 0;  // mean over the D·M micro-batches
  std::vector<double> losses_fp32;   // per fp32 step, mean over DP
  std::vector<ThreeDRank> ranks;     // world size, in global rank order
};

// float64 sums in another order differ by ulps; 1e-10 leaves room for depth (as tp.hpp, pp.hpp).
inline constexpr double kThreeDF64Tolerance = 1e-10;

struct ThreeDCheck {
  std::string what;  // "rank 3 TP bytes", …
  double measured = 0, predicted = 0, tolerance = 0;  // relative (predicted 0: absolute)
  bool ok = true;
};
std::vector<ThreeDCheck> three_d_checks(const ThreeDResult& r);

// Runs the layout on this rank. Progress: one line per fp32 step on stderr (rank 0). A failed
// collective, send or receive (a lost peer) throws CommError naming the ranks that died when the
// ranks share a temporary directory (Note [naming a lost rank] in three_d.cpp): "rank r: lost
// rank q at fp32 step s: …".
ThreeDResult run_3d(const DistEnv& env, const ThreeDOptions& options);

}  // namespace tally::engine
