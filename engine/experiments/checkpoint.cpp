// `tally run checkpoint` (tally/engine/experiments/checkpoint.hpp): the options, and the run loop —
// start or resume, train, save, check the round trip, report a lost rank. One rank's state and
// steps are checkpoint_trainer.hpp's.
#include "tally/engine/experiments/checkpoint.hpp"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "checkpoint_trainer.hpp"
#include "rank_liveness.hpp"
#include "term_signal.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/comm.hpp"
#include "tally/engine/temp_directory.hpp"
#include "run_helpers.hpp"

namespace tally::engine {

namespace fs = std::filesystem;
using checkpoint_run::Trainer;
using checkpoint_run::flat_params;
using checkpoint_run::normalized;

namespace {
constexpr double kLostRankProbe_s = 1.0;  // Note [liveness locks]: how long to look for the dead

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size(); ++i)
    s += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  return s;
}

// Note [consistency check]: every rank's reference-batch loss and gradient norm, compared bit for
// bit; the ranks outside the majority are named in the event's message.
CheckpointEvent consistency_check(Trainer& t, Comm& comm) {
  const int k = comm.world_size();
  const auto [loss, grad_norm] = t.reference_loss_and_grad_norm();
  std::vector<double> mine = {loss, grad_norm}, all(std::size_t(2 * k));
  comm.all_gather(mine, all);
  CheckpointEvent e{.kind = CheckpointEvent::Kind::consistency, .step = t.step,
                    .consumed_samples = t.consumed};
  for (int q = 0; q < k; ++q) {
    e.losses.push_back(all[std::size_t(2 * q)]);
    e.grad_norms.push_back(all[std::size_t(2 * q + 1)]);
  }
  const auto same = [&](int p, int q) {  // bit for bit: memcmp, so -0.0 ≠ 0.0 and NaN = NaN
    return std::memcmp(&all[std::size_t(2 * p)], &all[std::size_t(2 * q)], 2 * sizeof(double)) == 0;
  };
  int majority = 0, votes = 0;  // the largest class; the first (lowest rank) on a tie
  for (int p = 0; p < k; ++p) {
    int n = 0;
    for (int q = 0; q < k; ++q) n += same(p, q) ? 1 : 0;
    if (n > votes) majority = p, votes = n;
  }
  for (int q = 0; q < k; ++q)
    if (!same(majority, q)) e.disagreeing_ranks.push_back(q);
  if (e.disagreeing_ranks.empty()) return e;
  const int bad = e.disagreeing_ranks.front();
  const auto g17 = [](double v) {  // every bit of a double
    char text[32];
    std::snprintf(text, sizeof text, "%.17g", v);
    return std::string(text);
  };
  const bool one = e.disagreeing_ranks.size() == 1;
  e.message = "consistency check at step " + std::to_string(t.step) + ": rank" + (one ? " " : "s ") +
              rank_list(e.disagreeing_ranks) + (one ? " disagrees" : " disagree") +
              " with the majority (" + std::to_string(votes) + " of " + std::to_string(k) +
              " ranks" + (2 * votes <= k ? ", no strict majority" : "") +
              ") on the reference batch: rank " + std::to_string(bad) + " loss " +
              g17(e.losses[std::size_t(bad)]) + ", grad-norm " + g17(e.grad_norms[std::size_t(bad)]) +
              " vs " + g17(e.losses[std::size_t(majority)]) + ", " +
              g17(e.grad_norms[std::size_t(majority)]) +
              ": its replica's weights or arithmetic went wrong silently";
  return e;
}
}  // namespace

std::string_view to_string(FaultPhase p) {
  switch (p) {
    case FaultPhase::none: return "none";
    case FaultPhase::mid_step: return "mid-step";
    case FaultPhase::after_shard: return "after-shard";
  }
  return "?";
}

std::optional<FaultPhase> parse_fault_phase(std::string_view s) {
  for (FaultPhase p : {FaultPhase::none, FaultPhase::mid_step, FaultPhase::after_shard})
    if (s == to_string(p)) return p;
  return std::nullopt;
}

std::string_view to_string(CheckpointEvent::Kind k) {
  switch (k) {
    case CheckpointEvent::Kind::started: return "started";
    case CheckpointEvent::Kind::batch: return "batch";
    case CheckpointEvent::Kind::saved: return "saved";
    case CheckpointEvent::Kind::fault_injected: return "fault_injected";
    case CheckpointEvent::Kind::comm_failure: return "comm_failure";
    case CheckpointEvent::Kind::consistency: return "consistency";
  }
  return "?";
}

void CheckpointRunOptions::validate(int world_size) const {
  const auto bad = [](const std::string& flag, const std::string& value, const std::string& rule) {
    throw InvalidInput(flag + " = " + value + ": " + rule);
  };
  const auto i = [](std::int64_t v) { return std::to_string(v); };
  if (steps < 1 || steps > 1'000'000) bad("--steps", i(steps), "must be in [1, 1000000]");
  if (save_every < 0) bad("--save-every", i(save_every), "must be >= 0 (0 = only after the last step)");
  if (consumed_samples_override < -1)
    bad("--consumed-samples-override", i(consumed_samples_override), "must be >= 0 (-1 = keep)");
  if (batches_to_record < 0 || batches_to_record > 1000)
    bad("--record-batches", std::to_string(batches_to_record), "must be in [0, 1000]");
  if (widths.size() < 2 || widths.size() > 16)
    bad("--widths", std::to_string(widths.size()) + " widths", "must be 2 to 16 layer widths");
  for (std::int64_t w : widths)
    if (w < 1 || w > 4096) bad("--widths", i(w), "every width must be in [1, 4096]");
  if (dataset_samples < 1 || dataset_samples > 1'000'000)
    bad("--samples", i(dataset_samples), "must be in [1, 1000000]");
  if (global_batch < 1 || global_batch > 65536)
    bad("--batch", i(global_batch), "must be in [1, 65536]");
  if (grad_accum < 1 || grad_accum > 1024)
    bad("--grad-accum", i(grad_accum), "must be in [1, 1024]");
  if (global_batch % (world_size * grad_accum) != 0)
    bad("--batch", i(global_batch),
        "must be divisible by WORLD_SIZE = " + std::to_string(world_size) + " × --grad-accum = " +
            i(grad_accum) + " (every micro-batch's mean then weighs the same)");
  if (consistency_every < 0)
    bad("--consistency-every", i(consistency_every), "must be >= 0 (0 = never)");
  if (perturb_rank != -1) {
    if (perturb_rank < 0 || perturb_rank >= world_size)
      bad("--inject-perturb-rank", std::to_string(perturb_rank),
          "must be in [0, WORLD_SIZE = " + std::to_string(world_size) + ") or -1 (none)");
    if (perturb_at_step < 1 || perturb_at_step > steps)
      bad("--inject-perturb-at-step", i(perturb_at_step), "must be in [1, --steps = " + i(steps) + "]");
  }
  if (!(dropout >= 0 && dropout < 1)) bad("--dropout", format_number(dropout), "must be in [0, 1)");
  if (!(lr > 0 && lr <= 1e6)) bad("--lr", format_number(lr), "must be in (0, 1e6]");
  if (!(min_lr >= 0 && min_lr <= lr)) bad("--min-lr", format_number(min_lr), "must be in [0, --lr]");
  if (warmup_steps < 1) bad("--warmup", i(warmup_steps), "must be >= 1 step");
  if (schedule_steps <= warmup_steps)
    bad("--schedule-steps", i(schedule_steps), "must be > --warmup = " + i(warmup_steps));
  if (!(timeout_s > 0 && timeout_s <= 86400)) bad("--timeout", format_number(timeout_s), "must be in (0, 86400] s");
  if (fault.rank != -1) {
    if (fault.rank < 0 || fault.rank >= world_size)
      bad("--kill-rank", std::to_string(fault.rank),
          "must be in [0, WORLD_SIZE = " + std::to_string(world_size) + ") or -1 (none)");
    if (fault.count < 1 || fault.count > world_size - fault.rank)
      bad("--kill-count", std::to_string(fault.count),
          "must be in [1, WORLD_SIZE − --kill-rank = " + std::to_string(world_size - fault.rank) +
              "]");
    if (fault.step < 1 || fault.step > steps)
      bad("--kill-at-step", i(fault.step), "must be in [1, --steps = " + i(steps) + "]");
    if (fault.phase == FaultPhase::none)
      bad("--kill-phase", "none", "must be mid-step or after-shard with --kill-rank");
    if (fault.phase == FaultPhase::after_shard && fault.step != steps &&
        !(save_every > 0 && fault.step % save_every == 0))
      bad("--kill-at-step", i(fault.step),
          "with --kill-phase after-shard it must be a save step (a multiple of --save-every, or "
          "--steps)");
  }
}

CheckpointRunResult run_checkpoint(const DistEnv& env, const CheckpointRunOptions& options,
                                   const std::function<void(const CheckpointEvent&)>& on_event) {
  env.validate();
  options.validate(env.world_size);
  const int k = env.world_size, r = env.rank;
  const auto emit = [&](CheckpointEvent e) {
    e.rank = r;
    if (e.unix_s == 0) e.unix_s = unix_now();
    if (on_event) on_event(e);
    return e;
  };
  TermSignalFlag term;
  // No directory given: a temporary one, agreed over the Comm (Note [default checkpoint
  // directory]), which then has to come first.
  CheckpointRunOptions o = options;
  const bool temporary = o.dir.empty();
  fs::path temp_root;
  std::unique_ptr<Comm> comm_first;
  if (temporary) {
    comm_first = std::make_unique<Comm>(env, CommOptions{.timeout_s = o.timeout_s});
    temp_root = shared_temp_directory(*comm_first, "tally-checkpoint");
    o.dir = temp_root / "ckpt";
  }
  // Before the Comm, so its descriptor is closed before the sockets (Note [liveness locks]).
  fs::path ranks_dir = normalized(o.dir);
  ranks_dir += ".ranks";
  RankLiveness liveness(ranks_dir, r, k);
  const std::unique_ptr<Comm> comm_owner =
      temporary ? std::move(comm_first)
                : std::make_unique<Comm>(env, CommOptions{.timeout_s = o.timeout_s});
  Comm& comm = *comm_owner;

  Trainer t(o, k, r);
  CheckpointRunResult res;
  res.rank = r;
  res.world_size = k;
  res.n_params = t.n_params;
  res.dir = t.dir;
  res.dir_temporary = temporary;
  const auto fault_here = [&](FaultPhase phase, std::int64_t s) {
    return o.fault.rank >= 0 && r >= o.fault.rank && r < o.fault.rank + o.fault.count &&
           o.fault.phase == phase && o.fault.step == s;
  };
  const auto die = [&](FaultPhase phase, std::int64_t s) {
    emit({.kind = CheckpointEvent::Kind::fault_injected, .step = s,
          .consumed_samples = t.consumed, .phase = phase});
    ::kill(::getpid(), SIGKILL);
  };
  std::int64_t current_step = 0;  // the step being taken or saved, for the failure message
  try {
    // 1. Start: fresh, or from dir's checkpoint.
    if (o.resume) {
      if (const std::optional<LoadOutcome> loaded = t.load(comm)) {
        res.resumed = true;
        res.loaded_world_size = loaded->index.world_size;
        res.checkpoint_consumed_samples = loaded->index.consumed_samples;
        res.load_s = loaded->seconds;
        res.loaded_params_crc32c = crc32c_of(flat_params(t.params));
        res.loaded_optimizer_crc32c = crc32c_of(at::cat({t.adam.flat_m(), t.adam.flat_v()}));
        if (t.step > o.steps)
          throw InvalidInput("--steps = " + std::to_string(o.steps) + " vs the checkpoint's step " +
                             std::to_string(t.step) + ": must be at least the step resumed from");
        if (o.consumed_samples_override >= 0) {  // ④: the deliberately broken resume
          t.consumed = o.consumed_samples_override;
          res.consumed_overridden = true;
        }
      }
    }
    res.start_step = t.step;
    res.start_consumed_samples = t.consumed;
    emit({.kind = CheckpointEvent::Kind::started, .step = t.step, .consumed_samples = t.consumed,
          .dir = t.dir, .dir_temporary = temporary, .resumed = res.resumed,
          .loaded_world_size = res.loaded_world_size,
          .checkpoint_consumed_samples = res.checkpoint_consumed_samples, .seconds = res.load_s});

    // 2. Train.
    DistributedDataParallel ddp(comm, t.params);
    bool saved_last = false;
    while (t.step < o.steps) {
      if (term.requested())
        throw std::runtime_error("rank " + std::to_string(r) + ": stopped by SIGTERM after step " +
                                 std::to_string(t.step) +
                                 " (the launcher stops every rank when one fails or times out)");
      current_step = t.step + 1;
      const std::vector<std::int64_t> batch = t.batch_indices(t.consumed);
      if (std::int64_t(res.batch_steps.size()) < o.batches_to_record) {
        res.batch_steps.push_back(current_step);
        res.batch_indices.push_back(batch);
        emit({.kind = CheckpointEvent::Kind::batch, .step = current_step,
              .consumed_samples = t.consumed, .sample_indices = batch});
      }
      std::function<void()> mid_step;
      if (fault_here(FaultPhase::mid_step, current_step))
        mid_step = [&] { die(FaultPhase::mid_step, current_step); };
      res.steps.push_back(t.take_step(ddp, comm, batch, mid_step));
      saved_last = false;
      if (o.perturb_rank == r && o.perturb_at_step == t.step) t.perturb_weights();
      if (o.consistency_every > 0 && t.step % o.consistency_every == 0) {
        res.consistency_checks.push_back(emit(consistency_check(t, comm)));
        if (const CheckpointEvent& c = res.consistency_checks.back(); !c.disagreeing_ranks.empty())
          throw std::runtime_error(c.message);
      }
      if (t.is_save_step(t.step)) {
        AfterShardHook after_shard;
        if (fault_here(FaultPhase::after_shard, t.step))
          after_shard = [&] { die(FaultPhase::after_shard, t.step); };
        const SaveOutcome s = save_sharded(comm, t.dir, t.state_index(), t.groups(), after_shard);
        res.saves.push_back(emit({.kind = CheckpointEvent::Kind::saved, .step = t.step,
                                  .consumed_samples = t.consumed, .seconds = s.seconds,
                                  .shard_bytes = s.shard_bytes}));
        saved_last = true;
      }
    }

    // 3. ①②③ on the last save, then the end state.
    current_step = t.step;
    if (o.roundtrip_check && saved_last) res.roundtrip = t.roundtrip(comm);
    res.final_step = t.step;
    res.final_consumed_samples = t.consumed;
    res.params_crc32c = crc32c_of(flat_params(t.params));
    res.optimizer_crc32c = crc32c_of(at::cat({t.adam.flat_m(), t.adam.flat_v()}));
    comm.barrier();  // every rank is done with the directory
  } catch (const CommError& e) {
    const LostRankReport lost = report_lost_ranks(liveness, r, e,
                                                  "step " + std::to_string(current_step),
                                                  kLostRankProbe_s);
    emit({.kind = CheckpointEvent::Kind::comm_failure, .step = current_step,
          .consumed_samples = t.consumed, .lost_ranks = lost.lost, .message = lost.message});
    throw lost.error(e);
  }
  if (r == 0) liveness.remove_all();
  if (r == 0 && temporary && !o.keep_dir) {  // every rank is past the final barrier
    std::error_code ec;
    fs::remove_all(temp_root, ec);
    res.dir_removed = !ec;
  }
  return res;
}

}  // namespace tally::engine
