// The drills' driver (internal): sub-runs of `tally run checkpoint --json` started through
// engine::launch — one host's launcher, or one of several hosts' (torchrun's numbering) — with
// their output captured in files of the work directory and read back as JSON events, by rank.
// `tally run fault-drill` (fault_drill.hpp) and its --elastic form (elastic_drill.hpp) use it.
//
// Note [gathering the hosts' sub-runs]
// Across hosts each launcher sees only its own ranks, but a drill's verdict needs every rank's
// (the victim's kill time on host 1, the survivors on host 0). Every host's launcher of sub-run j
// writes its ranks' lines to launch-s<j>-node<i>.out / .err in the work directory (which the hosts
// share: it holds the checkpoint) and, once launch() has returned, how each of its ranks ended to
// launch-s<j>-node<i>.exit.json (written to a temporary name, then renamed: never read half
// written). Driver::gather waits, at most the join timeout, for the other hosts' .exit.json and
// merges their ranks into one view, so every host's drill reports the whole sub-run. Times are
// each host's wall clock: across real machines they are as comparable as the hosts' clocks are
// synchronised (NTP: milliseconds); the namespace hosts of the tests share one clock.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tally/engine/experiments/checkpoint.hpp"
#include "tally/engine/experiments/fault_drill.hpp"
#include "tally/engine/launch.hpp"

namespace tally::engine::drill {

// The global batch of every drill's sub-runs (`tally run checkpoint`'s default).
inline const std::int64_t kDrillGlobalBatch = CheckpointRunOptions{}.global_batch;

std::string read_file(const std::filesystem::path& path);

// One sub-run's output, split by global rank: JSON lines of stdout, the lines of stderr. A
// launcher of one host of several holds only its own ranks' lines.
struct SubRun {
  DrillLaunch launch;  // gathered: this launcher's verdict, every host's ranks, start and end
                       // the earliest and latest of the launchers'
  bool gathered = true;  // false: another host's part never arrived (Note [gathering ...])
  std::vector<std::vector<nlohmann::json>> events;  // per rank, in order (the result last)
  std::vector<std::vector<std::string>> errors;     // per rank

  // The rank's first event of this kind, or nullptr.
  const nlohmann::json* find(int rank, std::string_view kind) const;
  std::string error_line(int rank) const;  // its "tally: error: ..." line, or ""
};

// Where a sub-run's ranks run: nnodes hosts of nproc ranks; this launcher is node_rank's.
struct Topology {
  int nnodes = 1;
  int node_rank = 0;
  int nproc = 2;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free one (nnodes = 1 only)
  double join_timeout_s = LaunchOptions{}.join_timeout_s;
  int world_size() const { return nnodes * nproc; }
};

struct DriverOptions {
  std::string tally_binary;
  double collective_timeout_s = 5;
  double launch_timeout_s = 60;
  std::int64_t steps = 12;
  std::int64_t save_every = 4;
};

class Driver {
 public:
  Driver(DriverOptions o, std::filesystem::path work) : o_(std::move(o)), work_(std::move(work)) {}

  // The ranks of `tally run checkpoint --dir dir` plus `extra` that `where` puts on this launcher;
  // `steps` replaces the drill's --steps when > 0. Safe to call from several threads at once (one
  // per host of a drill that plays every host).
  // Across hosts (where.nnodes > 1) `subrun` numbers the sub-run alike on every host (Note
  // [gathering the hosts' sub-runs]).
  SubRun run(const std::string& what, const std::filesystem::path& dir,
             const std::vector<std::string>& extra, std::int64_t steps, const Topology& where,
             int subrun = 0);
  // `mine` (this host's launcher of sub-run `subrun`) merged with every other host's part, each
  // awaited at most where.join_timeout_s; `mine` itself when where.nnodes is 1.
  SubRun gather(SubRun mine, int subrun, const Topology& where) const;

 private:
  DriverOptions o_;
  std::filesystem::path work_;
  std::atomic<int> launches_ = 0;
};

// Sub-run `subrun` of a drill over `base.nnodes` hosts: this process's `hosts` among them, each
// launcher on its own thread (engine::launch's signal handlers put back afterwards), returned in
// the order of `hosts`; the port is base.master_port + 2·subrun or, when that is 0, the first of
// two free ones (the ranks' store, the launchers' at port + 1: Note [free ports] in dist_env.cpp).
std::vector<SubRun> run_hosts(Driver& driver, int subrun, const std::string& what,
                              const std::filesystem::path& dir,
                              const std::vector<std::string>& extra, Topology base,
                              const std::vector<int>& hosts);

// The flags both drills share, checked alike: throws InvalidInput naming the flag, the value and
// the allowed range.
struct DrillSchedule {
  std::int64_t steps = 0;
  std::int64_t save_every = 0;
  std::int64_t kill_at_step = 0;     // after the first save
  double collective_timeout_s = 0;
  double launch_timeout_s = 0;
  void validate() const;
};

// The host flags both drills share, checked alike (--node-rank, --master-port, --work-dir,
// --master-addr, --join-timeout): throws InvalidInput naming the flag, the value and the rule.
struct DrillHosts {
  int nnodes = 1;
  int node_rank = -1;               // -1: this machine plays every host
  int master_port = 0;
  bool work_dir_given = false;
  std::string master_addr;
  double join_timeout_s = 0;
  void validate() const;
};

// Both checks on a drill's options (FaultDrillOptions, ElasticDrillOptions: the same field names).
template <class DrillOptions>
void validate_hosts_and_schedule(const DrillOptions& o) {
  DrillHosts{.nnodes = o.nnodes,
             .node_rank = o.node_rank,
             .master_port = o.master_port,
             .work_dir_given = !o.work_dir.empty(),
             .master_addr = o.master_addr,
             .join_timeout_s = o.join_timeout_s}
      .validate();
  DrillSchedule{.steps = o.steps,
                .save_every = o.save_every,
                .kill_at_step = o.kill_at_step,
                .collective_timeout_s = o.collective_timeout_s,
                .launch_timeout_s = o.launch_timeout_s}
      .validate();
}

// Processes whose command line mentions `work` (a sub-run's rank left behind).
std::vector<int> processes_mentioning(const std::filesystem::path& work);

}  // namespace tally::engine::drill
