// `tally run fault-drill` (tally/engine/experiments/fault_drill.hpp): sub-runs of `tally run checkpoint` through
// engine::launch, their JSON lines read back, the checkpoint directory inspected with io.
#include "tally/engine/experiments/fault_drill.hpp"

#include <signal.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "drill_driver.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/experiments/checkpoint.hpp"
#include "tally/engine/launch.hpp"
#include "tally/engine/temp_directory.hpp"
#include "tally/io/checkpoint.hpp"

namespace tally::engine {

namespace fs = std::filesystem;
using drill::Driver;
using drill::kDrillGlobalBatch;
using drill::read_file;
using drill::SubRun;
using drill::Topology;
using nlohmann::json;

namespace {


// The uninterrupted run's per-step records (rank 0's), by step.
struct DrillReference {
  std::map<std::int64_t, json> steps;
  std::string params_crc32c, optimizer_crc32c;
};

bool has_staging(const fs::path& dir) {
  std::error_code ec;
  const std::string prefix = dir.filename().string() + ".tmp-";
  for (fs::directory_iterator it(dir.parent_path(), ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().rfind(prefix, 0) == 0) return true;
  return false;
}

// The rank ended because of the launcher's stop: killed by its SIGTERM or SIGKILL, or exited
// reporting the SIGTERM (run_checkpoint turns SIGTERM into a flag checked between steps).
bool ended_by_launcher_signal(const RankExit& exit, const std::string& error_line) {
  if (!exit.exited) return exit.term_signal == SIGTERM || exit.term_signal == SIGKILL;
  return exit.exit_code != 0 && error_line.find("stopped by SIGTERM") != std::string::npos;
}

// The drill's sub-runs: one launcher of every rank, or across hosts this process's launchers
// (drill::run_hosts), gathered into one view of every rank (Note [gathering the hosts' sub-runs]).
class Runner {
 public:
  Runner(const FaultDrillOptions& o, const fs::path& work, std::vector<int> hosts)
      : o_(o),
        driver_({.tally_binary = o.tally_binary,
                 .collective_timeout_s = o.collective_timeout_s,
                 .launch_timeout_s = o.launch_timeout_s,
                 .steps = o.steps,
                 .save_every = o.save_every},
                work),
        hosts_(std::move(hosts)) {}

  // `steps` > 0 replaces the drill's --steps (one host only).
  SubRun run(const std::string& what, const fs::path& dir, const std::vector<std::string>& extra,
             std::int64_t steps = 0) {
    const int index = subruns_++;
    if (o_.nnodes == 1)
      return driver_.run(what, dir, extra, steps, Topology{.nproc = o_.world_size});
    Topology where{.nnodes = o_.nnodes,
                   .nproc = o_.nproc_per_node(),
                   .master_addr = o_.master_addr,
                   .master_port = o_.master_port,
                   .join_timeout_s = o_.join_timeout_s};
    std::vector<SubRun> runs = drill::run_hosts(driver_, index, what, dir, extra, where, hosts_);
    where.node_rank = hosts_.front();
    SubRun all = driver_.gather(std::move(runs.front()), index, where);
    gathered_ = gathered_ && all.gathered;
    return all;
  }
  bool gathered() const { return gathered_; }

 private:
  const FaultDrillOptions& o_;
  Driver driver_;
  std::vector<int> hosts_;
  int subruns_ = 0;
  bool gathered_ = true;
};

// How rank r ended, as its launcher saw it.
RankExit exit_of(const DrillLaunch& l, int r) {
  for (const RankExit& e : l.ranks)
    if (e.rank == r) return e;
  return RankExit{.rank = r};
}

// The launcher's line names the lost rank: "rank q failed" on one host, "rank q on node i (host
// …) failed" across hosts (launch.hpp).
bool names_rank(const std::string& message, const FaultDrillOptions& o, int q) {
  const std::string rank = "rank " + std::to_string(q);
  if (o.nnodes == 1) return message.find(rank + " failed") != std::string::npos;
  return message.find(rank + " on node " + std::to_string(o.node_of(q)) + " (host ") !=
             std::string::npos &&
         message.find(") failed (") != std::string::npos;
}

KillScenario run_kill(const FaultDrillOptions& o, Runner& runner, const fs::path& work,
                      FaultPhase phase, std::int64_t kill_step, const DrillReference& ref) {
  KillScenario sc;
  sc.name = std::string(to_string(phase));
  sc.kill_step = kill_step;
  const fs::path dir = work / ("ckpt-" + sc.name);
  const SubRun failed =
      runner.run("kill rank " + std::to_string(o.kill_rank) + " " + sc.name + " at step " +
                     std::to_string(kill_step),
                 dir,
                 {"--kill-rank", std::to_string(o.kill_rank), "--kill-at-step",
                  std::to_string(kill_step), "--kill-phase", sc.name});
  sc.failed = failed.launch;

  // Detection: the victim's last word; each survivor's CommError, or the launcher's signal that
  // ended it first (Note [detection criterion]).
  if (const json* e = failed.find(o.kill_rank, "fault_injected")) sc.kill_unix_s = (*e)["unix_s"];
  for (int r = 0; r < o.world_size; ++r) {
    if (r == o.kill_rank) continue;
    SurvivorReport s{.rank = r, .error_line = failed.error_line(r)};
    const RankExit exit = exit_of(failed.launch, r);
    s.exit = exit.describe();
    if (const json* e = failed.find(r, "comm_failure")) {
      s.outcome = SurvivorOutcome::noticed;
      s.lost_ranks = (*e)["lost_ranks"].get<std::vector<int>>();
      s.detection_s = (*e)["unix_s"].get<double>() - sc.kill_unix_s;
      sc.detection_s = std::max(sc.detection_s, s.detection_s);
      s.line_cut_by_launcher = exit.stopped_by_launcher &&
                               ended_by_launcher_signal(exit, s.error_line) &&
                               s.error_line.find("lost rank") == std::string::npos;
    } else if (exit.stopped_by_launcher && ended_by_launcher_signal(exit, s.error_line)) {
      s.outcome = SurvivorOutcome::stopped_by_launcher;
    }
    sc.survivors.push_back(s);
  }
  sc.all_exited_s = sc.failed.end_unix_s - sc.kill_unix_s;
  sc.launch_names_lost_rank = names_rank(sc.failed.message, o, o.kill_rank);

  // What the failure left on disk.
  try {
    sc.checkpoint_step = io::verify_checkpoint(dir).step;
    sc.checkpoint_verifies = true;
  } catch (const InvalidInput&) {
  }
  sc.staging_left = has_staging(dir);
  const std::int64_t last_completed = phase == FaultPhase::mid_step ? kill_step - 1 : kill_step;
  sc.steps_redone = last_completed - sc.checkpoint_step;

  // Recovery: the same command, with --resume.
  const SubRun again = runner.run("relaunch with --resume", dir, {"--resume"});
  sc.relaunch = again.launch;
  sc.staging_removed_on_relaunch = !has_staging(dir);
  const json* started = again.find(0, "started");
  const json* result = again.find(0, "result");
  if (started == nullptr || result == nullptr || !(*started)["resumed"].get<bool>()) return sc;
  sc.restart_s = (*started)["unix_s"].get<double>() - sc.relaunch.start_unix_s;
  sc.resume_step = (*started)["step"];
  sc.resume_consumed = (*started)["consumed_samples"];
  sc.reference_step = sc.resume_step;
  if (auto it = ref.steps.find(sc.resume_step); it != ref.steps.end())
    sc.reference_consumed = it->second["consumed_samples"];
  if (auto it = ref.steps.find(sc.resume_step + 1); it != ref.steps.end())
    sc.reference_grad_norm = it->second["grad_norm"];
  const json& steps = (*result)["steps"];
  if (!steps.empty()) sc.resume_grad_norm = steps[0]["grad_norm"];
  sc.losses_equal = !steps.empty();
  for (const json& s : steps) {
    const auto it = ref.steps.find(s["step"].get<std::int64_t>());
    sc.losses_equal = sc.losses_equal && it != ref.steps.end() &&
                      s["loss"].get<double>() == it->second["loss"].get<double>() &&
                      s["grad_norm"].get<double>() == it->second["grad_norm"].get<double>() &&
                      s["consumed_samples"] == it->second["consumed_samples"];
    if (s["step"] == kill_step) sc.recovery_s = s["end_unix_s"].get<double>() - sc.kill_unix_s;
  }
  sc.final_params_equal = (*result)["params_crc32c"] == ref.params_crc32c &&
                          (*result)["optimizer_crc32c"] == ref.optimizer_crc32c;
  return sc;
}

// Copies `source` to <work>/<name>/ckpt and damages one file; returns the copy.
fs::path damaged_copy(const fs::path& source, const fs::path& work, const std::string& name) {
  const fs::path dir = work / name / "ckpt";
  fs::create_directories(dir.parent_path());
  fs::copy(source, dir, fs::copy_options::recursive);
  return dir;
}

void flip_byte(const fs::path& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  const auto size = std::streamoff(fs::file_size(file));
  f.seekg(size / 2);
  char c = 0;
  f.read(&c, 1);
  c = char(c ^ 0x01);  // one bit of a value in the data section
  f.seekp(size / 2);
  f.write(&c, 1);
}

CorruptionCase run_corruption(const FaultDrillOptions& o, Runner& runner, const fs::path& work,
                              const fs::path& source, int index) {
  CorruptionCase c;
  const int k = o.world_size;
  const fs::path dir = damaged_copy(source, work, "damage-" + std::to_string(index));
  switch (index) {
    case 0:
      c.damage = "flip one bit in the middle of shard 1";
      c.file = io::shard_file_name(1, k);
      c.expected_check = "crc32c = ";
      flip_byte(dir / c.file);
      break;
    case 1:
      c.damage = "truncate shard 0 by 100 bytes";
      c.file = io::shard_file_name(0, k);
      c.expected_check = "(truncated)";
      fs::resize_file(dir / c.file, fs::file_size(dir / c.file) - 100);
      break;
    case 2:
      c.damage = "delete the last shard";
      c.file = io::shard_file_name(k - 1, k);
      c.expected_check = "missing";
      fs::remove(dir / c.file);
      break;
    default: {
      c.damage = "edit index.json: consumed_samples + " + std::to_string(kDrillGlobalBatch);
      c.file = "index.json";
      c.expected_check = "crc32c = ";
      std::string text = read_file(dir / c.file);
      const std::string key = "\"consumed_samples\": ";
      const std::size_t at = text.find(key);
      if (at != std::string::npos) {
        const std::size_t begin = at + key.size(), end = text.find(',', begin);
        const std::int64_t v = std::stoll(text.substr(begin, end - begin));
        text.replace(begin, end - begin, std::to_string(v + kDrillGlobalBatch));
      }
      std::ofstream(dir / c.file, std::ios::binary | std::ios::trunc) << text;
      break;
    }
  }
  try {
    (void)io::verify_checkpoint(dir);
  } catch (const InvalidInput&) {
    c.io_verify_alone_rejects = true;
  }
  const SubRun s = runner.run("resume from damage: " + c.damage, dir, {"--resume"}, o.steps + 1);
  c.launch = s.launch;
  c.error_line = s.error_line(0);
  c.loaded_anything = false;
  for (int r = 0; r < k; ++r) {
    const json* started = s.find(r, "started");
    c.loaded_anything = c.loaded_anything || (started && (*started)["resumed"].get<bool>());
  }
  return c;
}

}  // namespace

std::string_view to_string(SurvivorOutcome o) {
  switch (o) {
    case SurvivorOutcome::noticed: return "noticed";
    case SurvivorOutcome::stopped_by_launcher: return "stopped_by_launcher";
    case SurvivorOutcome::exited_unreported: return "exited_unreported";
  }
  return "?";
}

// Note [detection criterion].
bool KillScenario::detection_ok(int kill_rank, double timeout_s) const {
  if (kill_unix_s <= 0 || failed.exit_code != 1 || !launch_names_lost_rank || survivors.empty())
    return false;
  if (!(all_exited_s >= 0 && all_exited_s < timeout_s + kill_grace_s)) return false;
  for (const SurvivorReport& s : survivors) {
    switch (s.outcome) {
      case SurvivorOutcome::noticed:
        if (s.lost_ranks != std::vector<int>{kill_rank} || s.detection_s < 0 ||
            s.detection_s >= timeout_s ||
            (!s.line_cut_by_launcher &&
             s.error_line.find("lost rank " + std::to_string(kill_rank)) == std::string::npos))
          return false;
        break;
      case SurvivorOutcome::stopped_by_launcher:
        break;
      case SurvivorOutcome::exited_unreported:
        return false;
    }
  }
  return true;
}

bool KillScenario::recovery_ok() const {
  const bool staging = name != "after-shard" || (staging_left && staging_removed_on_relaunch);
  return checkpoint_verifies && staging && relaunch.exit_code == 0 &&
         resume_step == checkpoint_step && resume_consumed == reference_consumed &&
         resume_grad_norm == reference_grad_norm && losses_equal && final_params_equal;
}

bool CorruptionCase::ok() const {
  return launch.exit_code != 0 && !loaded_anything &&
         error_line.find(file) != std::string::npos &&
         error_line.find(expected_check) != std::string::npos;
}

bool FaultDrillResult::ok() const {
  const FaultDrillOptions& o = options;
  bool all = reference.exit_code == 0 && leftover_pids.empty() && gathered &&
             mid_step.ok(o.kill_rank, o.collective_timeout_s);
  if (o.nnodes > 1) return all;  // (2) and (3): one host only
  all = all && during_save.ok(o.kill_rank, o.collective_timeout_s) && !corruptions.empty();
  for (const CorruptionCase& c : corruptions) all = all && c.ok();
  return all;
}

void FaultDrillOptions::validate() const {
  const auto bad = [](const std::string& flag, const std::string& value, const std::string& rule) {
    throw InvalidInput(flag + " = " + value + ": " + rule);
  };
  const auto i = [](std::int64_t v) { return std::to_string(v); };
  if (nnodes < 1 || nnodes > 4) bad("--nnodes", i(nnodes), "must be in [1, 4]");
  if (nnodes == 1 && (world_size < 2 || world_size > 8 || kDrillGlobalBatch % world_size != 0))
    bad("--nproc", i(world_size), "must be 2, 3, 4, 6 or 8 (it divides the batch of 48)");
  if (nnodes > 1 && (world_size % nnodes != 0 || world_size < 2 || world_size > 8 ||
                     kDrillGlobalBatch % world_size != 0))
    bad("--nproc-per-node", i(world_size / nnodes),
        "--nnodes × --nproc-per-node = " + i(world_size) +
            " must be 2, 3, 4, 6 or 8 (it divides the batch of 48)");
  if (node_rank >= 0 && nnodes == 1) bad("--node-rank", i(node_rank), "only with --nnodes >= 2");
  drill::validate_hosts_and_schedule(*this);
  if (kill_rank < 0 || kill_rank >= world_size)
    bad("--kill-rank", i(kill_rank), "must be in [0, --nproc = " + i(world_size) + ")");
  if (kill_at_save <= save_every || kill_at_save > steps || kill_at_save % save_every != 0)
    bad("--kill-at-save", i(kill_at_save),
        "must be a multiple of --save-every = " + i(save_every) + " in (" + i(save_every) +
            ", --steps = " + i(steps) + "]");
}

FaultDrillResult run_fault_drill(const FaultDrillOptions& options) {
  options.validate();
  FaultDrillResult res;
  res.options = options;
  FaultDrillOptions& o = res.options;
  if (o.tally_binary.empty()) o.tally_binary = fs::read_symlink("/proc/self/exe").string();

  for (int h = 0; h < o.nnodes; ++h)
    if (o.node_rank < 0 || o.node_rank == h) res.hosts_here.push_back(h);
  WorkDirectory work_dir(o.work_dir, "tally-fault-drill", o.keep_work_dir);
  o.work_dir = res.work_dir = work_dir.path();
  const fs::path work = o.work_dir;
  {
    Runner runner(o, work, res.hosts_here);
    // DrillReference: uninterrupted.
    const fs::path ref_dir = work / "ckpt-reference";
    const SubRun ref_run = runner.run("reference (uninterrupted)", ref_dir, {});
    res.reference = ref_run.launch;
    const json* ref_result = ref_run.find(0, "result");
    if (ref_run.launch.exit_code != 0 || ref_result == nullptr)
      throw std::runtime_error("fault-drill: the uninterrupted reference run failed: " +
                               ref_run.launch.message + " " + ref_run.error_line(0));
    DrillReference ref;
    for (const json& s : (*ref_result)["steps"]) ref.steps[s["step"].get<std::int64_t>()] = s;
    ref.params_crc32c = (*ref_result)["params_crc32c"];
    ref.optimizer_crc32c = (*ref_result)["optimizer_crc32c"];
    res.reference_params_crc32c = ref.params_crc32c;

    res.mid_step = run_kill(o, runner, work, FaultPhase::mid_step, o.kill_at_step, ref);
    if (o.nnodes == 1) {
      res.during_save = run_kill(o, runner, work, FaultPhase::after_shard, o.kill_at_save, ref);
      for (int i = 0; i < 4; ++i)
        res.corruptions.push_back(run_corruption(o, runner, work, ref_dir, i));
    }
    res.gathered = runner.gathered();
    // Across hosts the other hosts' drills mention the work directory too: only the sub-runs'
    // checkpoint directories name a rank left behind.
    res.leftover_pids = drill::processes_mentioning(o.nnodes == 1 ? work : work / "ckpt-");
  }
  res.work_dir_removed = work_dir.remove();
  return res;
}

}  // namespace tally::engine
