// `tally run checkpoint`: data-parallel training that saves sharded checkpoints and resumes from
// them exactly (DESIGN.md §3 "Checkpoints"; the seed's save_sharded / load_sharded, its 验收标准
// ①–⑤, and the 确定性 part of its fault-tolerance plan). One rank of it; start k ranks with
// `tally launch`. The torch-side pieces are internal (engine/runtime).
//
// Legend: k = world size, r = rank, N = parameters, B = global batch (samples per optimizer step),
// n = samples in the data set, s = optimizer steps completed, p = a position in the sample stream.
//
// The run, on every rank:
//   model   an MLP widths[0] → … → widths[L] (mlp.hpp: nn.Linear's init after manual_seed(seed)),
//           ReLU then dropout(p) after each hidden layer, float32.
//   data    n synthetic samples, x ~ N(0, 1) and label = argmax of a fixed random linear teacher,
//           from a generator seeded by `seed`; the order is the sample stream (Note [sample
//           stream]): step s + 1 takes positions [consumed_samples, consumed_samples + B).
//   step    rank r takes rows r, r + k, … of the global batch, in a micro-batches of B/(k·a) rows
//           each (gradient accumulation a, B % (k·a) == 0, so DDP's average of the ranks' mean
//           micro-batch losses is the global batch mean, whatever k and a); dropout masks are
//           drawn for the whole global batch from torch's default generator, the same on every
//           rank (so its state is one value, independent of k and a); DDP (ddp_torch.hpp)
//           averages the gradients (the first a − 1 backward passes under no_sync); Adam
//           (torch.optim.Adam's update, fp32 m and v) with a linear warm-up then cosine learning
//           rate. A run resumed at another k with a' = a·k/k' takes the same global batches.
//   save    every save_every steps and after the last: each rank writes shard_range(N, k, r) of
//           three flat F32 groups — "params", "adam.m", "adam.v" — so the shards together hold the
//           model states once: params + m + v = 12N bytes (fp32 Adam's 16N without the gradients,
//           which a step recomputes). index.json holds step, consumed_samples, seed, the default
//           generator's state (rng_state, hex), the schedule position, the layout and checksums.
//   resume  with `resume`, a checkpoint at dir (after io's recovery of a crashed save) is verified,
//           loaded — resharded when it was saved at another world size — and training continues
//           from its step, consumed_samples, generator state and schedule position.
//
// Criteria the run measures (the test asserts them; seed ①–⑤):
//   ①  after the last save every parameter and optimizer value is zeroed and loaded back:
//       bit-identical (fp32);
//   ②  step, consumed_samples and seed read back from index.json equal what was saved;
//   ③  the shard files' sizes summed ≈ the model-state bytes core predicts for what is saved
//       (within 5 %; safetensors headers are the difference), not k times that;
//   ④  with consumed_samples_override = 0 a resume restarts the data stream (its first batches
//       are those of step 1), while a correct resume continues it — the first batches' sample
//       indices are recorded to show it;
//   ⑤  a checkpoint saved at k loads at k' ≠ k (each rank reads its 1/k' through
//       io::load_flat_range, an all-gather rebuilds the replicas).
// Exactness: n steps, save, exit, resume for n more gives the parameters and losses of 2n steps
// straight, bit for bit (same k, fixed data order, generator state restored).
//
// Directory: with no `dir`, the run uses a fresh temporary one (Note [default checkpoint
// directory]), reported in the started event and removed when the run finishes unless `keep_dir`.
//
// Sampled consistency (the seed's plan 4 ④, silent corruption; Note [consistency check]): every
// consistency_every steps each rank recomputes the loss and gradient norm of a fixed reference
// batch on its own replica, and the ranks compare them bit for bit.
//
// Faults (for `tally run fault-drill`): a rank (or `count` consecutive ranks: a host's, under
// torchrun's numbering) can SIGKILL itself mid-step or right after writing its shard of a save.
// The survivors' CommError is re-thrown naming the lost rank (Note [liveness locks] in
// engine/runtime/rank_liveness.hpp) after an event reports it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tally/engine/dist_env.hpp"
#include "tally/engine/sample_stream.hpp"
#include "tally/engine/temp_directory.hpp"

namespace tally::engine {

// Note [default checkpoint directory]
// Without --dir, rank 0 makes a temporary directory T (make_temp_directory) and broadcasts its
// path over the Comm, so every rank uses the same T/ckpt; each rank then checks that it sees T
// (ranks on hosts without a shared file system would not) and all of them fail together with one
// message if any does not. T holds everything the run writes — the checkpoint, its staging
// directories and the liveness locks (T/ckpt.ranks) — and rank 0 removes T once every rank is done,
// unless keep_dir. A run that fails leaves T in place (it may hold a checkpoint to --resume from;
// the started event names it). Because T is known only after the rendezvous, here the liveness
// lock is opened after the Comm's sockets, the reverse of Note [liveness locks]'s order: a dying
// rank may then close its sockets before its lock, and the survivors' probe, which waits up to a
// second for the lock to be freed, covers the gap.

// Note [consistency check]
// Data-parallel replicas hold the same weights bit for bit (DDP averages the gradients, every rank
// applies the same update), so the same computation on the same data must give the same bits on
// every rank of one machine. Every consistency_every steps, after the update and before any save
// (a state that fails is never committed), each rank takes the reference batch — the first
// kConsistencySamples samples of the data set, no dropout — computes its mean loss and the norm
// of its gradient (torch::autograd::grad: DDP's hooks, which sit on the gradient accumulators, do
// not run, and no .grad is touched), and all-gathers the two float64 values. Each distinct pair
// of bit patterns is a class; the largest class is the majority (ties go to the one holding the
// lowest rank) and every rank outside it is named. A disagreement fails the run: its replica (its
// weights, its memory or its arithmetic) went wrong silently, and training on would average the
// corruption into every replica. Across hosts with different CPUs the kernels (and so the bits)
// may differ; compare like with like, as health-check's checksums.
inline constexpr std::int64_t kConsistencySamples = 64;

// ---- options ------------------------------------------------------------------------------------

enum class FaultPhase {
  none,
  mid_step,     // after the forward pass of step `step`, before its gradients are reduced
  after_shard,  // during the save at step `step`, right after this rank's shard is written
};
std::string_view to_string(FaultPhase p);                     // "none", "mid-step", "after-shard"
std::optional<FaultPhase> parse_fault_phase(std::string_view s);

struct FaultInjection {
  int rank = -1;           // the rank that raises SIGKILL on itself; -1 = no fault
  int count = 1;           // … with the count − 1 ranks after it (a whole host's ranks)
  std::int64_t step = 0;   // optimizer step (1-based) at which it does
  FaultPhase phase = FaultPhase::mid_step;
};

struct CheckpointRunOptions {
  std::filesystem::path dir;       // the checkpoint directory; empty = a fresh temporary one
  bool keep_dir = false;           // keep that temporary directory instead of removing it
  std::int64_t steps = 20;         // train until this many optimizer steps are done
  std::int64_t save_every = 0;     // also save when s % save_every == 0; 0 = only after the last
  bool resume = false;             // continue from dir's checkpoint when there is one
  std::int64_t consumed_samples_override = -1;  // ④: force consumed_samples after loading; -1 keep
  bool roundtrip_check = true;     // ①②③ after the last save
  int batches_to_record = 3;       // sample indices of the first batches after the start

  std::uint64_t seed = 1234;
  std::vector<std::int64_t> widths = {32, 128, 128, 10};
  std::int64_t dataset_samples = 1024;  // n
  std::int64_t global_batch = 48;       // B, divisible by k·a
  std::int64_t grad_accum = 1;          // a: micro-batches per rank and step
  double dropout = 0.1;                 // p after each hidden layer; 0 = none
  double lr = 3e-3;                     // peak learning rate
  std::int64_t warmup_steps = 5;        // linear warm-up from lr / warmup_steps to lr
  std::int64_t schedule_steps = 200;    // cosine decay ends here (the schedule's length, not `steps`)
  double min_lr = 3e-4;

  double timeout_s = 60;  // rendezvous and every collective
  FaultInjection fault;
  std::int64_t consistency_every = 0;   // Note [consistency check] every N steps; 0 = never
  // Test hook: after step perturb_at_step's update, rank perturb_rank flips one bit of its first
  // weight (a silent corruption of its replica); -1 = none.
  int perturb_rank = -1;
  std::int64_t perturb_at_step = 1;

  // Throws InvalidInput naming the flag, the value and the allowed range.
  void validate(int world_size) const;
};

// ---- what the run reports -------------------------------------------------------------------------

// Something that happened, reported as it happens (a fault is reported before the rank dies).
struct CheckpointEvent {
  enum class Kind { started, batch, saved, fault_injected, comm_failure, consistency };
  Kind kind = Kind::started;
  int rank = 0;
  std::int64_t step = 0;              // steps completed (started, saved) or the step being taken
  std::int64_t consumed_samples = 0;  // position in the sample stream at that moment
  double unix_s = 0;                  // wall clock (CLOCK_REALTIME), for times across processes
  // started
  std::filesystem::path dir;          // the checkpoint directory in use
  bool dir_temporary = false;         // made for this run (Note [default checkpoint directory])
  bool resumed = false;
  int loaded_world_size = 0;          // k of the loaded checkpoint (0: fresh start)
  std::int64_t checkpoint_consumed_samples = 0;  // as saved, before any override
  double seconds = 0;                 // started: load time; saved: save time
  // batch: the global batch's sample indices
  std::vector<std::int64_t> sample_indices;
  // saved
  double shard_bytes = 0;
  // fault_injected
  FaultPhase phase = FaultPhase::none;
  // comm_failure
  std::vector<int> lost_ranks;        // empty: nobody died (a hang or a network failure)
  std::string message;                // the CommError's message (consistency: the verdict)
  // consistency: every rank's reference-batch loss and gradient norm, by rank; the ranks outside
  // the majority (Note [consistency check])
  std::vector<double> losses, grad_norms;
  std::vector<int> disagreeing_ranks;
};
std::string_view to_string(CheckpointEvent::Kind k);

struct StepRecord {
  std::int64_t step = 0;              // this step's number (1-based)
  std::int64_t consumed_samples = 0;  // after the step
  double loss = 0;                    // global-batch mean (average of the ranks' means)
  double grad_norm = 0;               // ‖averaged gradient‖₂, in float64 from the fp32 gradients
  double lr = 0;                      // the learning rate this step used
  double end_unix_s = 0;
};

// ①②③, measured after the last save.
struct RoundTrip {
  bool done = false;
  // ① every value of params, m and v zeroed, then loaded
  bool params_bit_exact = false;
  bool optimizer_bit_exact = false;
  double max_abs_diff = 0;
  // ② as saved vs as read back from index.json
  std::int64_t step_saved = 0, step_read = 0;
  std::int64_t consumed_saved = 0, consumed_read = 0;
  std::uint64_t seed_saved = 0, seed_read = 0;
  bool rng_state_equal = false;
  bool lr_schedule_equal = false;
  // ③
  double shard_bytes_on_disk = 0;     // shard files' sizes, summed over ranks (stat of each file)
  double index_bytes_on_disk = 0;     // index.json + index.json.crc32c
  double predicted_bytes = 0;         // core model_states(N, fp32 Adam) without grads = 12N
  double full_copy_bytes = 0;         // k × predicted: every rank writing everything
  std::string convention;             // core's label for the prediction
  double bytes_tolerance = 0.05;

  double bytes_ratio() const { return predicted_bytes > 0 ? shard_bytes_on_disk / predicted_bytes : 0; }
  bool exact_ok() const { return params_bit_exact && optimizer_bit_exact; }
  bool metadata_ok() const {
    return step_saved == step_read && consumed_saved == consumed_read && seed_saved == seed_read &&
           rng_state_equal && lr_schedule_equal;
  }
  bool bytes_ok() const {
    return bytes_ratio() > 1 - bytes_tolerance && bytes_ratio() < 1 + bytes_tolerance;
  }
  bool ok() const { return done && exact_ok() && metadata_ok() && bytes_ok(); }
};

struct CheckpointRunResult {
  int rank = 0;
  int world_size = 1;
  std::int64_t n_params = 0;
  std::filesystem::path dir;               // the checkpoint directory used
  bool dir_temporary = false;              // made for this run (see the started event's)
  bool dir_removed = false;                // … and removed at the end (rank 0; not with keep_dir)
  // the start
  bool resumed = false;
  int loaded_world_size = 0;               // 0: fresh start
  std::int64_t start_step = 0;
  std::int64_t start_consumed_samples = 0;  // after any override
  std::int64_t checkpoint_consumed_samples = 0;
  bool consumed_overridden = false;
  double load_s = 0;
  std::string loaded_params_crc32c;        // right after loading (empty: fresh start)
  std::string loaded_optimizer_crc32c;     // of m then v
  // training
  std::vector<StepRecord> steps;           // steps taken by this run
  std::vector<std::int64_t> batch_steps;   // the first batches_to_record steps …
  std::vector<std::vector<std::int64_t>> batch_indices;  // … and their global batches' samples
  std::vector<CheckpointEvent> saves;      // kind saved
  std::vector<CheckpointEvent> consistency_checks;  // kind consistency (all agreed, or it threw)
  // the end
  std::int64_t final_step = 0;
  std::int64_t final_consumed_samples = 0;
  std::string params_crc32c;               // CRC-32C of the flat fp32 parameters' bytes
  std::string optimizer_crc32c;
  RoundTrip roundtrip;
  bool ok() const { return !roundtrip.done || roundtrip.ok(); }
};

// Runs one rank. `on_event` (optional) sees each event as it happens, on this rank. Throws
// InvalidInput for bad env / options / checkpoint, CommError when a peer fails (naming the lost
// rank when one died).
CheckpointRunResult run_checkpoint(const DistEnv& env, const CheckpointRunOptions& options,
                                   const std::function<void(const CheckpointEvent&)>& on_event = {});

}  // namespace tally::engine
