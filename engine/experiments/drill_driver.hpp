// The drills' driver (internal): sub-runs of `tally run checkpoint --json` started through
// engine::launch — one host's launcher, or one of several hosts' (torchrun's numbering) — with
// their output captured in files of the work directory and read back as JSON events, by rank.
// `tally run fault-drill` (fault_drill.hpp) and its --elastic form (elastic_drill.hpp) use it.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tally/engine/experiments/fault_drill.hpp"
#include "tally/engine/launch.hpp"

namespace tally::engine::drill {

double unix_now();
std::string read_file(const std::filesystem::path& path);

// One sub-run's output, split by global rank: JSON lines of stdout, the lines of stderr. A
// launcher of one host of several holds only its own ranks' lines.
struct SubRun {
  DrillLaunch launch;
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
  SubRun run(const std::string& what, const std::filesystem::path& dir,
             const std::vector<std::string>& extra, std::int64_t steps, const Topology& where);

 private:
  DriverOptions o_;
  std::filesystem::path work_;
  std::atomic<int> launches_ = 0;
};

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

// A drill's work directory: `given` (created when missing, and kept), or a fresh temporary one
// named after `prefix`, removed by remove() or, failing that, by the destructor — unless `keep`.
class WorkDirectory {
 public:
  WorkDirectory(const std::filesystem::path& given, std::string_view prefix, bool keep);
  ~WorkDirectory() { remove(); }
  WorkDirectory(const WorkDirectory&) = delete;
  WorkDirectory& operator=(const WorkDirectory&) = delete;
  const std::filesystem::path& path() const { return path_; }
  bool remove();  // true when this call (or an earlier one) removed it

 private:
  std::filesystem::path path_;
  bool temporary_ = false, keep_ = false, removed_ = false;
};

// Processes whose command line mentions `work` (a sub-run's rank left behind).
std::vector<int> processes_mentioning(const std::filesystem::path& work);

}  // namespace tally::engine::drill
