// The pipeline ledger (流水线账): the idle fraction ("bubble") of a pipeline-parallel schedule.
//
// Legend: P = pipeline stages, M = micro-batches per optimizer step, v = model chunks per stage
// (interleaved 1F1B), t_f / t_b = forward / backward time of one micro-batch on one stage (all of
// its v chunks together).
//
// Convention: bubble fraction = idle time / wall-clock time of a stage (seed §A3: 空闲 / 墙钟),
// i.e. (P−1)/(M+P−1). Narayanan et al. 2021 quote idle / ideal = (P−1)/M instead; both describe
// the same schedule.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tally {

struct PipelineSetup {
  int stages = 1;                        // P
  int micro_batches = 1;                 // M
  int interleave = 1;                    // v, model chunks per stage (1 = GPipe / 1F1B)
  double backward_forward_ratio = 2.0;   // t_b / t_f
  std::optional<double> forward_time_s;  // t_f, per micro-batch per stage; enables the *_s fields
  void validate() const;                 // throws InvalidInput naming the field
};

struct PipelineResult {
  PipelineSetup setup;
  double bubble_fraction = 0;  // idle / wall-clock, in [0, 1)
  // Time slots of one chunk's forward+backward: ideal v·M, total v·M + P − 1.
  double ideal_slots = 0;
  double total_slots = 0;
  // Only with forward_time_s: ideal M·(t_f + t_b), bubble (P−1)(t_f + t_b)/v, total their sum.
  std::optional<double> ideal_time_s;
  std::optional<double> bubble_time_s;
  std::optional<double> total_time_s;
  // e.g. "1F1B, P=8, M=16, bubble = (P-1)/(M+P-1) = idle / wall-clock"
  std::string convention() const;
};

// GPipe / 1F1B bubble (Huang et al. 2019; Narayanan et al. 2021 eq. 1) and its interleaved form
// (Narayanan et al. 2021 §2.2.2). For v > 1, M must be a multiple of P (as Megatron-LM requires).
PipelineResult bubble(const PipelineSetup& setup);

// Smallest M whose bubble is <= max_fraction (in (0, 1]); for v > 1 the smallest such multiple of
// P. Decided with the same arithmetic as bubble(), so bubble(result) <= max_fraction exactly.
int min_micro_batches_for_bubble(int stages, double max_fraction, int interleave = 1);

// Discrete-event simulation of non-interleaved 1F1B (Narayanan et al. 2021 §2.2.1, PipeDream-Flush):
// stage s runs min(P−s−1, M) warm-up forwards, then alternates one forward and one backward, then
// drains the remaining backwards: pipeline_schedule(one_f_one_b) run by simulate_pipeline_makespan.
// Returns stage 0's idle fraction over the makespan.
double simulate_1f1b_bubble(int stages, int micro_batches, double forward_s, double backward_s);
// The same schedule with each stage's own forward and backward time; returns the makespan.
double simulate_1f1b_makespan(const std::vector<double>& forward_s,
                              const std::vector<double>& backward_s, int micro_batches);

// Note [pipeline schedules]
// Which operation each stage runs when: chunk c of stage s is virtual stage c·P + s of the model
// (Megatron-LM's model-chunk order; v = 1: chunk 0 is the whole stage). A forward F(i, c) needs the
// previous virtual stage's F(i); a backward B(i, c) needs the next virtual stage's B(i), or on the
// last virtual stage its own F(i, c).
//   gpipe        every forward, then every backward, both in micro-batch order (Huang et al. 2019
//                Fig. 2c; Narayanan et al. 2021 Fig. 3; torch.distributed.pipelining ScheduleGPipe)
//   1f1b         PipeDream-Flush (Narayanan et al. 2021 §2.2.1, Fig. 4 top): stage s runs
//                min(P − s − 1, M) warm-up forwards, then alternates one forward and one backward,
//                then drains the remaining backwards
//   interleaved  Narayanan et al. 2021 §2.2.2 (Fig. 4 bottom) as Megatron-LM's
//                forward_backward_pipelining_with_interleaving runs it: v·M chunk-operations per
//                direction; forward k runs chunk (k mod P·v) div P of micro-batch (k div P·v)·P +
//                k mod P, backward k the chunk v − 1 − that; min((P − s − 1)·2 + (v − 1)·P, v·M)
//                warm-up forwards, then 1F1B, then the remaining backwards. M must be a multiple
//                of P. The warm-up is Megatron-Core's (core_r0.17.0, schedules.py
//                get_pp_rank_microbatches) and PyTorch's ScheduleInterleaved1F1B's
//                (get_rank_warmup_ops); Megatron-LM of 2021 ran every forward first on every stage
//                when M = P, which stage 0 does anyway (its warm-up reaches v·M there).
enum class PipelineSchedule { gpipe, one_f_one_b, interleaved };
std::string_view to_string(PipelineSchedule s);  // "gpipe", "1f1b", "interleaved"

enum class PipelineOpKind { forward, backward };
struct PipelineOp {
  PipelineOpKind kind = PipelineOpKind::forward;
  int micro_batch = 0;  // in [0, M)
  int chunk = 0;        // in [0, v)
  bool operator==(const PipelineOp&) const = default;
};
std::string to_string(const PipelineOp& op);  // "F3", "B0"; with chunks "F3.1"

// Every stage's operations in execution order: P lists of 2·v·M operations each. interleave must
// be 1 except for the interleaved schedule (which accepts v >= 1). Throws InvalidInput naming the
// field otherwise.
std::vector<std::vector<PipelineOp>> pipeline_schedule(PipelineSchedule schedule, int stages,
                                                       int micro_batches, int interleave = 1);

// The most (micro-batch, chunk) pairs a stage's list holds forwarded but not yet backwarded, i.e.
// the sets of activations it keeps at once: min(P − s, M) for 1F1B (P on stage 0 once M >= P), M
// for GPipe; interleaved counts chunks (each 1/v of the stage's layers).
int peak_in_flight(const std::vector<PipelineOp>& stage_ops);

// Discrete-event makespan of a schedule (Note [1F1B simulation]): forward_s[s] / backward_s[s]
// are one micro-batch's forward / backward over all of stage s's layers; a chunk operation takes
// 1/v of it. Communication is free. Beyond max(simulate_up_to, 64·P) micro-batches the makespan
// is extrapolated from the simulation of fewer (Note [long pipelines] in pipeline.cpp).
inline constexpr int kSimulatedMicroBatches = 4096;
double simulate_pipeline_makespan(PipelineSchedule schedule, const std::vector<double>& forward_s,
                                  const std::vector<double>& backward_s, int micro_batches,
                                  int interleave = 1,
                                  int simulate_up_to = kSimulatedMicroBatches);
// The same with each virtual stage's own times (Note [uneven virtual stages]): stages·v entries
// in model order, virtual stage j (chunk j div P of stage j mod P) taking forward_s[j] and
// backward_s[j]; interleaved for v > 1, 1F1B for v = 1.
double simulate_virtual_stage_makespan(const std::vector<double>& forward_s,
                                       const std::vector<double>& backward_s, int stages,
                                       int micro_batches,
                                       int simulate_up_to = kSimulatedMicroBatches);

// Makespan of M micro-batches through stages of per-micro-batch time t_s (forward + backward):
// a lower bound that holds each stage to its fill, drain and round-trip waits (Note [uneven stages]
// in pipeline.cpp); β = the backward's share of a stage's time.
double pipeline_makespan(const std::vector<double>& stage_s, int micro_batches, int interleave = 1,
                         double backward_share = 2.0 / 3.0);
// `stages` consecutive pipeline stages of `seconds` each.
struct StageRun {
  double seconds = 0;
  int stages = 1;
};
// The same makespan over runs of equal stages, in stage order: O(runs), not O(P) — the planner's
// form, whose stages take at most four distinct values (stage_layer_runs). Equal to the form above
// on the expanded stages (tests/core/test_pipeline.cpp).
double pipeline_makespan(const std::vector<StageRun>& runs, int micro_batches, int interleave = 1,
                         double backward_share = 2.0 / 3.0);

// Transformer layers of each pipeline stage. first = last = 0: as even as the layers allow (the
// extra layers on the last stages). Otherwise the first and last stages hold `first` and `last`
// (lighter end stages carry the embedding and the LM head, as Llama 3 puts 126 layers on 16
// stages: 7 + 14 × 8 + 7) and the middle stages share the rest, extra layers toward the end.
// Throws InvalidInput when a stage would get no layer.
std::vector<int> stage_layers(int layers, int stages, int first = 0, int last = 0);
// An explicit split of any shape (`tally compare --pp-layers 5,6,6,…,5`): `stages` entries, each
// >= 1, summing to the model's layers. Throws InvalidInput naming --pp-layers otherwise.
// Interleaved (v > 1): one entry per virtual stage, stages·v of them in model order (Note
// [uneven virtual stages]).
void check_stage_list(const std::vector<int>& list, int layers, int stages, int interleave = 1);
// Note [uneven virtual stages]
// With v model chunks per stage, a split names every virtual stage: entry j holds virtual stage
// j's layers, which is chunk j div P of pipeline stage j mod P (Megatron-LM's chunk order, Note
// [pipeline schedules]). Real runs need it: Megatron-Core's account_for_embedding_in_pipeline_split
// and account_for_loss_in_pipeline_split count the embedding and the loss as one layer each, so the
// first and the last virtual stage hold one layer fewer (Llama 3.1 405B: 126 + 2 slots over
// 8 × 4 virtual stages, 3, 4, …, 4, 3); torchtitan's generate_split_points puts 126 layers on 16
// virtual stages as 7, 8, …, 8, 7. A stage's time and parameters follow its chunks' sum
// (stage_layer_total); its activations follow the chunks in flight (interleaved_peak_held).
// Stage s's layers: the list's entry (v = 1) or its chunks' sum (one entry per virtual stage).
inline int stage_layer_total(const std::vector<int>& list, int stages, int s) {
  int n = 0;
  for (std::size_t j = std::size_t(s); j < list.size(); j += std::size_t(stages)) n += list[j];
  return n;
}
// Every virtual stage's layers (stages·v entries, model order) from a split of either form: the
// list itself when it names every virtual stage, or each stage's entry split evenly over its v
// chunks (each a multiple of v; throws InvalidInput naming --pp-layers otherwise).
std::vector<int> virtual_stage_layers(const std::vector<int>& list, int stages, int interleave);
// Chunk-operations stage s runs forward before its first backward in the interleaved schedule
// (Note [pipeline schedules]): min((P − s − 1)·2 + (v − 1)·P, v·M).
int interleaved_warmup(int stages, int micro_batches, int interleave, int s);
// The chunks stage s holds at once at its peak, equal chunks: its warm-up's and the steady
// state's first forward, never more than the v·M there are (min(warm-up + 1, v·M)).
inline int interleaved_peak_chunks(int stages, int micro_batches, int interleave, int s) {
  return std::min(interleaved_warmup(stages, micro_batches, interleave, s) + 1,
                  interleave * micro_batches);
}
// The most stage s holds at once in the interleaved schedule (v > 1, M a multiple of P), each
// forwarded and not yet backwarded chunk c weighing chunk_weight[c] (its layers, or its saved
// bytes): the order of pipeline_schedule(interleaved), walked in O(v·M) without building it.
double interleaved_peak_held(const std::vector<double>& chunk_weight, int stages,
                             int micro_batches, int s);
// Stage s's entry of stage_layers(layers, stages, first, last), without allocating (the planner's
// hot path: inline, so its per-stage loops hoist the divisions); the arguments must already have
// passed stage_layers' checks.
inline int layers_of_stage(int layers, int stages, int first, int last, int s) {
  if (first == 0 && last == 0)  // as even as possible, the extra layers on the last stages
    return layers / stages + (s >= stages - layers % stages ? 1 : 0);
  if (s == 0) return first;
  if (s == stages - 1) return last;
  const int middle = stages - 2, rest = layers - first - last;
  return rest / middle + (s > middle - rest % middle ? 1 : 0);
}

// stage_layers' values as runs of consecutive stages with equal layer counts, in stage order, with
// stage 0 and stage P − 1 each a run of its own (the end stages carry the embedding and the head):
// at most four runs, whatever P. `out` is cleared and refilled (the planner reuses it).
struct LayerRun {
  int layers = 0;  // on each stage of the run
  int stages = 1;
};
void stage_layer_runs(int layers, int stages, int first, int last, std::vector<LayerRun>& out);

}  // namespace tally
