// `tally run fault-drill`: the seed's fault-tolerance validation (方案 4 — 检错 detection, 恢复
// recovery, 确定性 determinism; 失败判据 ② a resume whose step / data position / RNG state does
// not match; 验证计划 "kill a rank, measure recovery time and consistency"), run on this host.
//
// One driver process starts every sub-run of `tally run checkpoint` (checkpoint.hpp) through
// engine::launch — the code behind `tally launch`, whose exit code and one-line verdict it
// records — over loopback, in a fresh work directory that it removes at the end:
//
//   reference   k ranks train `steps` steps straight, saving every `save_every`;
//   (1) kill    the same run, but rank kill_rank SIGKILLs itself after the forward pass of step
//               kill_at_step. Asserted: the run as a whole names the lost rank and stops within
//               the timeout (Note [detection criterion]); the last checkpoint verifies; a relaunch
//               of the same command with --resume continues from it, and at the resume point
//               step, consumed_samples and the first step's grad-norm equal the reference's
//               exactly (fp32), as do every later loss and the final parameters (CRC-32C of
//               their bytes);
//   (2) kill during a save: rank kill_rank SIGKILLs itself right after writing its shard of the
//               save at step kill_at_save, before the commit. Asserted: the previous checkpoint
//               still verifies, the half-written staging directory is left aside, and a relaunch
//               removes it, resumes from the previous checkpoint and ends equal to the reference;
//   (3) damage  copies of the reference's last checkpoint with a flipped byte in a shard, a
//               truncated shard, a deleted shard, and an edited index.json (consumed_samples):
//               a resume must fail on rank 0 with one line naming the file and the failed check,
//               having loaded nothing.
// Across hosts (nnodes N > 1, `world_size` = N·K ranks, K per host, torchrun's numbering): each
// sub-run is N launchers — threads of this process, or with node_rank ≥ 0 this host's alone, every
// host running the same drill with its own node rank, the same master address and port and a work
// directory they all see (the checkpoint's shared mount), as `tally launch --nnodes` is run. The
// victim may be on any host; every launcher must exit 1 naming it, its node and host (Note
// [launchers' store]), and the relaunch is on every host again. Each host's drill reads the
// others' parts of each sub-run from the work directory (Note [gathering the hosts' sub-runs],
// drill_driver.hpp), so every host reports the whole drill. Only (1) runs across hosts: (2) and
// (3) test what lands in the checkpoint files, which does not depend on where the ranks run.
//
// Reported: how each survivor ended and, for those that noticed, detection time (the kill to its
// CommError, wall clock across processes), the kill to `tally launch` returning, restart time
// (relaunch to checkpoint loaded) and recovery time (the kill to the relaunched job finishing the
// step that was killed), plus the consistency evidence. Every sub-run has a deadline; processes
// left over are looked for and counted.
//
// Note [detection criterion]
// When the victim dies, `tally launch` sees it within a tick and SIGTERMs every other rank (SIGKILL
// after its kill grace). A survivor blocked in a collective usually gets its CommError first and
// reports the lost rank itself, but whether it does so before the launcher's signal ends it is a
// race that the machine's load decides (a survivor waiting on another survivor rather than on the
// dead rank may see its error only once that one has exited). Both outcomes are correct: what a
// user needs is that the run as a whole names the lost rank and stops in bounded time. So:
//   - `tally launch` exits 1 and its line names the lost rank ("rank q failed (...)");
//   - every rank is gone within the collective timeout + the launcher's kill grace of the kill;
//   - each survivor either noticed — its CommError names exactly the lost rank, within the
//     collective timeout — or was stopped by the launcher before it did (the launcher signalled it
//     while it ran, and it ended by that signal or by its SIGTERM report). A survivor that exited
//     on its own without naming the lost rank, or that named another, fails the criterion.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "tally/engine/launch.hpp"

namespace tally::engine {

struct FaultDrillOptions {
  std::string tally_binary;           // the executable the ranks run; empty = this process's
  int world_size = 2;                 // k, [2, 8]
  std::int64_t steps = 12;
  std::int64_t save_every = 4;
  int kill_rank = 1;
  std::int64_t kill_at_step = 7;      // (1): mid-step; must come after the first save
  std::int64_t kill_at_save = 8;      // (2): a save step after the first save
  double collective_timeout_s = 5;    // each rank's rendezvous and collectives
  double launch_timeout_s = 60;       // each sub-run as a whole
  std::filesystem::path work_dir;     // empty = a fresh directory under the system temp dir
  bool keep_work_dir = false;         // keep it (for inspection) instead of removing it
  // Across hosts: N = nnodes, K = world_size / N ranks per host.
  int nnodes = 1;                     // N, [1, 4]
  int node_rank = -1;                 // -1: play every host here; i: only host i
  std::string master_addr = "127.0.0.1";  // host 0, as every host reaches it
  int master_port = 0;                // sub-run j: port + 2j, + 2j + 1; 0: free (node_rank -1)
  double join_timeout_s = 60;         // the hosts' launchers meeting
  // Throws InvalidInput naming the flag, the value and the allowed range.
  void validate() const;
  int nproc_per_node() const { return world_size / nnodes; }
  int node_of(int rank) const { return rank / nproc_per_node(); }
};

// A sub-run: one engine::launch of k ranks.
struct DrillLaunch {
  std::string what;                // "reference", "kill mid-step", "relaunch", ...
  std::vector<std::string> command;  // what each rank runs
  int exit_code = 0;               // `tally launch`'s: 0, 1 (a rank failed), 124 (timeout)
  std::string message;             // its one-line verdict ("tally launch: rank 1 failed (...)")
  std::vector<RankExit> ranks;     // how each rank ended, as the launcher saw it
  double start_unix_s = 0, end_unix_s = 0;
};

// How a survivor of the kill ended (Note [detection criterion]).
enum class SurvivorOutcome {
  noticed,              // it reported the failure itself: a CommError naming the lost ranks
  stopped_by_launcher,  // the launcher's SIGTERM / SIGKILL ended it before it noticed
  exited_unreported,    // it exited on its own without reporting the failure: a fault
};
std::string_view to_string(SurvivorOutcome o);  // "noticed", "stopped_by_launcher", ...

struct SurvivorReport {
  int rank = 0;
  SurvivorOutcome outcome = SurvivorOutcome::exited_unreported;
  std::vector<int> lost_ranks;     // as the survivor named them (noticed)
  double detection_s = -1;         // the victim's kill → this rank's CommError; -1: not noticed
  std::string exit;                // the launcher's description ("exited with status 1", ...)
  std::string error_line;          // its "tally: error: ..." line
  // Noticed (its comm_failure event is recorded) but ended by the launcher's signal before its
  // error line was whole: the event, not the line, is the evidence (Note [detection criterion]).
  bool line_cut_by_launcher = false;
};

struct KillScenario {
  std::string name;                // "mid-step", "after-shard"
  std::int64_t kill_step = 0;
  DrillLaunch failed, relaunch;
  // detection
  double kill_unix_s = 0;
  std::vector<SurvivorReport> survivors;
  double detection_s = -1;         // the slowest survivor that noticed; -1: none did
  double all_exited_s = 0;         // the kill → `tally launch` returned (every rank gone)
  double kill_grace_s = LaunchOptions{}.kill_grace_s;  // the launcher's SIGTERM → SIGKILL
  bool launch_names_lost_rank = false;
  // what the failure left on disk
  bool checkpoint_verifies = false;
  std::int64_t checkpoint_step = -1;
  bool staging_left = false;        // a <dir>.tmp-* (the interrupted save) beside it
  bool staging_removed_on_relaunch = false;
  // recovery
  double restart_s = 0;             // relaunch start → checkpoint verified and loaded (rank 0)
  double recovery_s = 0;            // the kill → the relaunched job finished kill_step
  std::int64_t steps_redone = 0;    // completed steps the failure threw away
  // consistency at the resume point vs the uninterrupted reference (exact, fp32)
  std::int64_t resume_step = -1, reference_step = -1;
  std::int64_t resume_consumed = -1, reference_consumed = -1;
  double resume_grad_norm = -1, reference_grad_norm = -2;  // of the first step after the resume
  bool losses_equal = false;        // every step after the resume
  bool final_params_equal = false;  // CRC-32C of the final parameters and optimizer state

  // Note [detection criterion]; timeout_s is each rank's collective timeout. The launcher's line
  // names "rank q failed" (one host) or "rank q on node i (host …) failed" (across hosts).
  bool detection_ok(int kill_rank, double timeout_s) const;
  bool recovery_ok() const;
  bool ok(int kill_rank, double timeout_s) const {
    return detection_ok(kill_rank, timeout_s) && recovery_ok();
  }
};

struct CorruptionCase {
  std::string damage;               // "flip a byte in shard 1", ...
  std::string file;                 // the damaged file's name
  std::string expected_check;       // what the error must say, e.g. "crc32c = "
  DrillLaunch launch;
  std::string error_line;           // rank 0's "tally: error: ..." line
  bool loaded_anything = true;      // a rank reported a resumed start
  bool io_verify_alone_rejects = false;  // io::verify_checkpoint without the index checksum
  bool ok() const;
};

struct FaultDrillResult {
  FaultDrillOptions options;
  std::filesystem::path work_dir;
  std::vector<int> hosts_here;     // the hosts this process played (0 alone on one host)
  bool gathered = true;            // every host's part of every sub-run was read back
  DrillLaunch reference;
  std::string reference_params_crc32c;
  KillScenario mid_step, during_save;  // during_save: one host only
  std::vector<CorruptionCase> corruptions;  // one host only
  std::vector<int> leftover_pids;  // processes still running a sub-run's command
  bool work_dir_removed = false;
  bool ok() const;
};

// Runs the drill. Throws InvalidInput for bad options, std::runtime_error when a sub-run cannot be
// started at all or the reference run fails.
FaultDrillResult run_fault_drill(const FaultDrillOptions& options);

}  // namespace tally::engine
