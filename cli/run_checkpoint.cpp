// `tally run checkpoint`: one rank of engine::run_checkpoint (tally/engine/experiments/checkpoint.hpp).
// Text: rank 0 reports the run; every rank reports its own faults and failures. --json: one JSON
// object per line — each event as it happens ({"event": "started" | "batch" | "saved" |
// "fault_injected" | "comm_failure" | "consistency", ...}) and a final {"event": "result", ...}
// — so `tally launch`'s "[rank r] " prefixes keep ranks apart. Bad input exits 2, a failed criterion or a
// failed peer 1.
#include <fmt/core.h>
#include <fmt/format.h>

#include <cmath>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common.hpp"
#include "run_registry.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/experiments/checkpoint.hpp"

namespace tally::cli::run_checkpoint {

namespace {

using engine::CheckpointEvent;
using nlohmann::json;

struct Flags {
  engine::CheckpointRunOptions run;
  std::string dir;
  std::string kill_phase = "mid-step";
  bool no_roundtrip = false;
  bool json = false;
};

constexpr std::size_t kIndicesShown = 8;  // of a batch's sample indices, in text

std::string indices_text(const std::vector<std::int64_t>& idx) {
  std::string s = "[";
  for (std::size_t i = 0; i < idx.size() && i < kIndicesShown; ++i)
    s += (i ? ", " : "") + std::to_string(idx[i]);
  return s + (idx.size() > kIndicesShown ? ", …]" : "]");
}

std::string bytes_text(double b) { return fmt::format("{} B", std::int64_t(std::llround(b))); }

json event_json(const CheckpointEvent& e) {
  json j = {{"event", engine::to_string(e.kind)}, {"rank", e.rank}, {"step", e.step},
            {"consumed_samples", e.consumed_samples}, {"unix_s", e.unix_s}};
  switch (e.kind) {
    case CheckpointEvent::Kind::started:
      j["dir"] = e.dir.string();
      j["dir_temporary"] = e.dir_temporary;
      j["resumed"] = e.resumed;
      j["loaded_world_size"] = e.loaded_world_size;
      j["checkpoint_consumed_samples"] = e.checkpoint_consumed_samples;
      j["load_s"] = e.seconds;
      break;
    case CheckpointEvent::Kind::batch: j["sample_indices"] = e.sample_indices; break;
    case CheckpointEvent::Kind::saved:
      j["save_s"] = e.seconds;
      j["shard_bytes"] = e.shard_bytes;
      break;
    case CheckpointEvent::Kind::fault_injected: j["phase"] = engine::to_string(e.phase); break;
    case CheckpointEvent::Kind::comm_failure:
      j["lost_ranks"] = e.lost_ranks;
      j["message"] = e.message;
      break;
    case CheckpointEvent::Kind::consistency:
      j["losses"] = e.losses;
      j["grad_norms"] = e.grad_norms;
      j["disagreeing_ranks"] = e.disagreeing_ranks;
      j["message"] = e.message;
      break;
  }
  return j;
}

void print_event_text(const CheckpointEvent& e, const Flags& f) {
  using K = CheckpointEvent::Kind;
  if (e.kind == K::fault_injected) {
    fmt::print("fault: rank {} raises SIGKILL on itself at step {} ({}), unix time {:.6f}\n",
               e.rank, e.step, engine::to_string(e.phase), e.unix_s);
  } else if (e.kind == K::comm_failure) {
    std::string lost;
    for (int q : e.lost_ranks) lost += (lost.empty() ? "" : ", ") + std::to_string(q);
    fmt::print("failure: rank {} detected it at step {} at unix time {:.6f}; ranks dead without a "
               "word: [{}] (the error line says what failed)\n",
               e.rank, e.step, e.unix_s, lost);
  } else if (e.rank != 0) {
    return;
  } else if (e.kind == K::started) {
    if (!e.resumed)
      fmt::print("checkpoint: fresh start (seed {}); checkpoint directory {}{}\n", f.run.seed,
                 e.dir.string(),
                 !e.dir_temporary ? ""
                 : f.run.keep_dir ? " (temporary, kept: --keep)"
                                  : " (temporary: removed when the run finishes, kept if it "
                                    "fails; --keep keeps it)");
    else
      fmt::print("checkpoint: resumed from {} at step {} (consumed_samples {}), saved at world "
                 "size {}, verified and loaded in {:.3f} s\n",
                 e.dir.string(), e.step, e.checkpoint_consumed_samples, e.loaded_world_size,
                 e.seconds);
    if (e.resumed && e.consumed_samples != e.checkpoint_consumed_samples)
      fmt::print("  ④ consumed_samples forced to {} (the checkpoint says {}): the data stream "
                 "restarts at position {} — the next batches are not the ones the run would "
                 "have seen\n",
                 e.consumed_samples, e.checkpoint_consumed_samples, e.consumed_samples);
  } else if (e.kind == K::batch) {
    fmt::print("  ④ step {} takes samples {} (stream position {})\n", e.step,
               indices_text(e.sample_indices), e.consumed_samples);
  } else if (e.kind == K::consistency) {
    if (e.disagreeing_ranks.empty())
      fmt::print("  consistency at step {}: {} ranks agree bit for bit on the reference batch "
                 "(loss {:.9g}, grad-norm {:.9g})\n",
                 e.step, e.losses.size(), e.losses[0], e.grad_norms[0]);
  } else if (e.kind == K::saved) {
    fmt::print("  saved step {} (consumed_samples {}): {} in shards, {:.3f} s\n", e.step,
               e.consumed_samples, bytes_text(e.shard_bytes), e.seconds);
  }
  std::fflush(stdout);
}

json result_json(const engine::CheckpointRunResult& r) {
  json steps = json::array();
  for (const auto& s : r.steps)
    steps.push_back({{"step", s.step}, {"consumed_samples", s.consumed_samples}, {"loss", s.loss},
                     {"grad_norm", s.grad_norm}, {"lr", s.lr}, {"end_unix_s", s.end_unix_s}});
  json batches = json::array();
  for (std::size_t i = 0; i < r.batch_steps.size(); ++i)
    batches.push_back({{"step", r.batch_steps[i]}, {"sample_indices", r.batch_indices[i]}});
  json j = {{"event", "result"},
            {"rank", r.rank},
            {"world_size", r.world_size},
            {"n_params", r.n_params},
            {"dir", r.dir.string()},
            {"dir_temporary", r.dir_temporary},
            {"dir_removed", r.dir_removed},
            {"resumed", r.resumed},
            {"loaded_world_size", r.loaded_world_size},
            {"start_step", r.start_step},
            {"start_consumed_samples", r.start_consumed_samples},
            {"checkpoint_consumed_samples", r.checkpoint_consumed_samples},
            {"consumed_overridden", r.consumed_overridden},
            {"load_s", r.load_s},
            {"loaded_params_crc32c", r.loaded_params_crc32c},
            {"loaded_optimizer_crc32c", r.loaded_optimizer_crc32c},
            {"steps", steps},
            {"batches", batches},
            {"saves", json::array()},
            {"final_step", r.final_step},
            {"final_consumed_samples", r.final_consumed_samples},
            {"params_crc32c", r.params_crc32c},
            {"optimizer_crc32c", r.optimizer_crc32c},
            {"ok", r.ok()}};
  for (const auto& s : r.saves) j["saves"].push_back(event_json(s));
  j["consistency_checks"] = json::array();
  for (const auto& c : r.consistency_checks) j["consistency_checks"].push_back(event_json(c));
  const auto& t = r.roundtrip;
  if (t.done)
    j["roundtrip"] = {{"params_bit_exact", t.params_bit_exact},
                      {"optimizer_bit_exact", t.optimizer_bit_exact},
                      {"max_abs_diff", t.max_abs_diff},
                      {"step_saved", t.step_saved}, {"step_read", t.step_read},
                      {"consumed_saved", t.consumed_saved}, {"consumed_read", t.consumed_read},
                      {"seed_saved", t.seed_saved}, {"seed_read", t.seed_read},
                      {"rng_state_equal", t.rng_state_equal},
                      {"lr_schedule_equal", t.lr_schedule_equal},
                      {"shard_bytes_on_disk", t.shard_bytes_on_disk},
                      {"index_bytes_on_disk", t.index_bytes_on_disk},
                      {"predicted_bytes", t.predicted_bytes},
                      {"bytes_ratio", t.bytes_ratio()},
                      {"bytes_tolerance", t.bytes_tolerance},
                      {"full_copy_bytes", t.full_copy_bytes},
                      {"convention", t.convention},
                      {"criteria", {{"1_bit_exact", t.exact_ok()},
                                    {"2_metadata", t.metadata_ok()},
                                    {"3_bytes", t.bytes_ok()}}}};
  return j;
}

void print_result_text(const engine::CheckpointRunResult& r) {
  const auto mark = [](bool ok) { return ok ? "ok" : "FAILED"; };
  if (r.steps.empty()) {
    fmt::print("checkpoint: rank {} of {}: nothing to train (at step {}); params crc32c {}\n",
               r.rank, r.world_size, r.final_step, r.params_crc32c);
    return;
  }
  fmt::print("checkpoint: rank {} of {}: N = {} parameters; steps {}–{}, loss {:.6f} → {:.6f}, "
             "consumed_samples {}; params crc32c {}\n",
             r.rank, r.world_size, r.n_params, r.steps.front().step, r.steps.back().step,
             r.steps.front().loss, r.steps.back().loss, r.final_consumed_samples,
             r.params_crc32c);
  if (r.rank != 0 || !r.roundtrip.done) return;
  const auto& t = r.roundtrip;
  fmt::print("  ① every parameter and Adam m, v zeroed, loaded back: params bit-exact {}, "
             "optimizer bit-exact {} (max |diff| {:g}): {}\n",
             t.params_bit_exact, t.optimizer_bit_exact, t.max_abs_diff, mark(t.exact_ok()));
  fmt::print("  ② index.json: step {} = {}, consumed_samples {} = {}, seed {} = {}, rng_state "
             "{}, lr schedule {}: {}\n",
             t.step_read, t.step_saved, t.consumed_read, t.consumed_saved, t.seed_read,
             t.seed_saved, t.rng_state_equal ? "equal" : "DIFFERS",
             t.lr_schedule_equal ? "equal" : "DIFFERS", mark(t.metadata_ok()));
  fmt::print("  ③ shards on disk {} vs predicted {} (12N: params + m + v): ratio {:.4f} (±{:.0f} "
             "%): {}; every rank writing everything would be {} ({}×); index files {}\n",
             bytes_text(t.shard_bytes_on_disk), bytes_text(t.predicted_bytes), t.bytes_ratio(),
             t.bytes_tolerance * 100, mark(t.bytes_ok()), bytes_text(t.full_copy_bytes),
             r.world_size, bytes_text(t.index_bytes_on_disk));
  fmt::print("     convention: {}\n", t.convention);
}

void run(const Flags& f) {
  engine::CheckpointRunOptions o = f.run;
  o.dir = f.dir;
  o.roundtrip_check = !f.no_roundtrip;
  if (o.fault.rank >= 0) {
    const auto phase = engine::parse_fault_phase(f.kill_phase);
    if (!phase) throw InvalidInput("--kill-phase = " + f.kill_phase + ": must be mid-step or after-shard");
    o.fault.phase = *phase;
  }
  const auto on_event = [&f](const CheckpointEvent& e) {
    if (f.json) {
      std::cout << event_json(e).dump() << std::endl;  // flushed: a fault event precedes SIGKILL
    } else {
      print_event_text(e, f);
    }
  };
  const engine::CheckpointRunResult r =
      engine::run_checkpoint(engine::DistEnv::from_environment(), o, on_event);
  if (f.json)
    std::cout << result_json(r).dump() << std::endl;
  else
    print_result_text(r);
  if (!f.json && r.rank == 0 && r.dir_temporary)
    fmt::print("checkpoint: temporary directory {} {}\n", r.dir.parent_path().string(),
               r.dir_removed ? "removed" : "kept");
  if (!r.ok()) {
    const auto& t = r.roundtrip;
    const std::string why =
        !t.exact_ok()      ? "① loaded values differ from the saved ones (max |diff| " +
                                 std::to_string(t.max_abs_diff) + ")"
        : !t.metadata_ok() ? std::string("② index.json's training state differs from the saved one")
                           : "③ shard bytes on disk / predicted = " +
                                 std::to_string(t.bytes_ratio()) + ", outside 1 ± " +
                                 std::to_string(t.bytes_tolerance);
    throw std::runtime_error("checkpoint: rank " + std::to_string(r.rank) + ": criterion " + why);
  }
}

const RegisterRun reg{[](CLI::App& run_cmd) {
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = run_cmd.add_subcommand(
      "checkpoint",
      "data-parallel training (MLP, Adam, dropout) that saves sharded checkpoints (each rank 1/k "
      "of params, m, v) and resumes from them bit-exactly; start it with `tally launch --nproc N "
      "-- tally run checkpoint --dir D`");
  cmd->footer(
      "Trains until --steps, saving every --save-every steps and after the last one; then checks "
      "① zero + load is bit-exact, ② step / consumed_samples / seed round-trip, ③ shard bytes ≈ "
      "12N (fp32 params + Adam m, v; ±5 %). --resume continues from D's checkpoint (resharding "
      "when saved at another world size); --consumed-samples-override 0 shows what a resume "
      "without the data position does (④). --kill-rank/--kill-count/--kill-at-step/--kill-phase "
      "inject a fault (tally run fault-drill uses them); --consistency-every N compares the "
      "replicas bit for bit every N steps (--inject-perturb-rank corrupts one to show it).");
  auto& o = f->run;
  cmd->add_option("--dir", f->dir,
                  "checkpoint directory (shards + index.json); default: a fresh temporary one, "
                  "removed when the run finishes");
  cmd->add_flag("--keep", o.keep_dir, "keep the temporary checkpoint directory (no --dir)");
  cmd->add_option("--steps", o.steps, "train until this many optimizer steps are done")
      ->capture_default_str();
  cmd->add_option("--save-every", o.save_every, "also save every N steps (0 = only at the end)")
      ->capture_default_str();
  cmd->add_flag("--resume", o.resume, "continue from --dir's checkpoint when there is one");
  cmd->add_option("--consumed-samples-override", o.consumed_samples_override,
                  "④ after loading, force consumed_samples to this value (-1 = keep)")
      ->capture_default_str();
  cmd->add_option("--record-batches", o.batches_to_record,
                  "print the sample indices of this many batches after the start")
      ->capture_default_str();
  cmd->add_flag("--no-roundtrip", f->no_roundtrip, "skip the ①②③ check after the last save");
  cmd->add_option("--seed", o.seed, "seed of the weights, the data and its order")
      ->capture_default_str();
  cmd->add_option("--widths", o.widths, "MLP layer widths, input first")->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--samples", o.dataset_samples, "samples in the synthetic data set")
      ->capture_default_str();
  cmd->add_option("--batch", o.global_batch,
                  "global batch (samples per step, divisible by k × --grad-accum)")
      ->capture_default_str();
  cmd->add_option("--grad-accum", o.grad_accum,
                  "micro-batches per rank and step (a resume at another k keeps --batch with "
                  "another --grad-accum)")
      ->capture_default_str();
  cmd->add_option("--consistency-every", o.consistency_every,
                  "every N steps the ranks compare a reference batch's loss and grad-norm bit "
                  "for bit; a rank that disagrees fails the run (0 = never)")
      ->capture_default_str();
  cmd->add_option("--inject-perturb-rank", o.perturb_rank,
                  "test hook: this rank flips one bit of its first weight (-1 = none)")
      ->capture_default_str();
  cmd->add_option("--inject-perturb-at-step", o.perturb_at_step,
                  "test hook: after this step's update")
      ->capture_default_str();
  cmd->add_option("--dropout", o.dropout, "dropout after each hidden layer")
      ->check(finite_in(0, 1, Ends::open_hi))
      ->capture_default_str();
  cmd->add_option("--lr", o.lr, "peak Adam learning rate")
      ->check(finite_in(0, 1e6, Ends::open_lo))
      ->capture_default_str();
  cmd->add_option("--warmup", o.warmup_steps, "linear warm-up steps")->capture_default_str();
  cmd->add_option("--schedule-steps", o.schedule_steps, "length of the cosine schedule, steps")
      ->capture_default_str();
  cmd->add_option("--min-lr", o.min_lr, "learning rate at the schedule's end (at most --lr)")
      ->check(finite_in(0, 1e6))
      ->capture_default_str();
  cmd->add_option("--timeout", o.timeout_s, "seconds for the rendezvous and each collective")
      ->check(finite_in(0, 86400, Ends::open_lo))
      ->capture_default_str();
  cmd->add_option("--kill-rank", o.fault.rank, "fault: this rank SIGKILLs itself (-1 = none)")
      ->capture_default_str();
  cmd->add_option("--kill-count", o.fault.count,
                  "fault: ranks --kill-rank … --kill-rank + N − 1 die together (a host's ranks)")
      ->capture_default_str();
  cmd->add_option("--kill-at-step", o.fault.step, "fault: at this step")->capture_default_str();
  cmd->add_option("--kill-phase", f->kill_phase,
                  "fault: mid-step (after the forward pass) or after-shard (during the save, "
                  "after writing its shard)")
      ->check(one_of({"mid-step", "after-shard"}))
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "one JSON object per event and a final result, one per line");
  cmd->callback([f] { run(*f); });
}};

}  // namespace

}  // namespace tally::cli::run_checkpoint
