// The drills' driver (drill_driver.hpp).
#include "drill_driver.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <signal.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <exception>
#include <fstream>
#include <sstream>
#include <system_error>
#include <thread>

#include "tally/core/types.hpp"
#include "tally/engine/dist_env.hpp"
#include "tally/engine/temp_directory.hpp"
#include "run_helpers.hpp"

namespace tally::engine::drill {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// "[rank r] text" → r and text; -1 for other lines.
int split_rank_line(const std::string& line, std::string* text) {
  if (line.rfind("[rank ", 0) != 0) return -1;
  const std::size_t close = line.find("] ");
  if (close == std::string::npos) return -1;
  try {
    const int r = std::stoi(line.substr(6, close - 6));
    *text = line.substr(close + 2);
    return r;
  } catch (const std::exception&) {
    return -1;
  }
}

// The ranks' lines of a launcher's output files, appended to s by global rank.
void read_rank_lines(const fs::path& out_path, const fs::path& err_path, SubRun& s) {
  const int k = int(s.events.size());
  std::istringstream out(read_file(out_path)), err(read_file(err_path));
  std::string text;
  for (std::string line; std::getline(out, line);) {
    const int r = split_rank_line(line, &text);
    if (r < 0 || r >= k) continue;
    json j = json::parse(text, nullptr, false);
    if (!j.is_discarded() && j.is_object()) s.events[std::size_t(r)].push_back(std::move(j));
  }
  for (std::string line; std::getline(err, line);) {
    const int r = split_rank_line(line, &text);
    if (r >= 0 && r < k) s.errors[std::size_t(r)].push_back(text);
  }
}

// Note [gathering the hosts' sub-runs]: sub-run j of node i's files, without the extension.
std::string host_stem(int subrun, int node) {
  return "launch-s" + std::to_string(subrun) + "-node" + std::to_string(node);
}

json exit_json(const DrillLaunch& l) {
  json ranks = json::array();
  for (const RankExit& r : l.ranks)
    ranks.push_back({{"rank", r.rank}, {"exited", r.exited}, {"exit_code", r.exit_code},
                     {"term_signal", r.term_signal},
                     {"stopped_by_launcher", r.stopped_by_launcher}});
  return {{"exit_code", l.exit_code}, {"message", l.message}, {"start_unix_s", l.start_unix_s},
          {"end_unix_s", l.end_unix_s}, {"ranks", ranks}};
}

// engine::launch installs its signal handlers for its duration and puts back what it found; two
// launches in threads of one process can interleave that and leave its handler installed. This
// puts back what the drill found, once the threads are joined.
class SignalDispositions {
 public:
  SignalDispositions() {
    for (std::size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], nullptr, &saved_[i]);
  }
  ~SignalDispositions() {
    for (std::size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &saved_[i], nullptr);
  }
  SignalDispositions(const SignalDispositions&) = delete;
  SignalDispositions& operator=(const SignalDispositions&) = delete;

 private:
  static constexpr std::array<int, 4> kSignals = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
  std::array<struct sigaction, 4> saved_{};
};

}  // namespace

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

const json* SubRun::find(int rank, std::string_view kind) const {
  if (rank < 0 || std::size_t(rank) >= events.size()) return nullptr;
  for (const json& e : events[std::size_t(rank)])
    if (e.value("event", "") == kind) return &e;
  return nullptr;
}

std::string SubRun::error_line(int rank) const {
  if (rank < 0 || std::size_t(rank) >= errors.size()) return "";
  for (const std::string& l : errors[std::size_t(rank)])
    if (l.rfind("tally: error: ", 0) == 0) return l;
  return "";
}

SubRun Driver::run(const std::string& what, const fs::path& dir,
                   const std::vector<std::string>& extra, std::int64_t steps,
                   const Topology& where, int subrun) {
  SubRun s;
  s.launch.what = what;
  s.launch.command = {o_.tally_binary, "run", "checkpoint", "--json",
                      "--timeout", format_number(o_.collective_timeout_s),
                      "--dir", dir.string(),
                      "--steps", std::to_string(steps > 0 ? steps : o_.steps),
                      "--save-every", std::to_string(o_.save_every),
                      "--record-batches", "0"};
  s.launch.command.insert(s.launch.command.end(), extra.begin(), extra.end());
  const int n = ++launches_;
  const std::string stem =
      where.nnodes > 1 ? host_stem(subrun, where.node_rank) : "launch-" + std::to_string(n);
  const fs::path out_path = work_ / (stem + ".out"), err_path = work_ / (stem + ".err");
  const fs::path exit_path = work_ / (stem + ".exit.json");
  std::error_code gone;
  fs::remove(exit_path, gone);  // a previous drill's, in a reused work directory
  const int out_fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out_fd < 0 || err_fd < 0) {
    if (out_fd >= 0) ::close(out_fd);
    if (err_fd >= 0) ::close(err_fd);
    throw std::system_error(errno, std::generic_category(), out_path.string() + ": open");
  }
  const LaunchOptions lo{.nproc = where.nproc,
                         .nnodes = where.nnodes,
                         .node_rank = where.node_rank,
                         .timeout_s = o_.launch_timeout_s,
                         .master_port = where.master_port,
                         .master_addr = where.master_addr,
                         .join_timeout_s = where.join_timeout_s,
                         .command = s.launch.command};
  s.launch.start_unix_s = unix_now();
  LaunchResult lr;
  try {
    lr = launch(lo, out_fd, err_fd);
  } catch (...) {
    ::close(out_fd);
    ::close(err_fd);
    throw;
  }
  s.launch.end_unix_s = unix_now();
  ::close(out_fd);
  ::close(err_fd);
  s.launch.exit_code = lr.exit_code;
  s.launch.message = lr.message;
  s.launch.ranks = lr.ranks;
  const int k = where.world_size();
  s.events.resize(std::size_t(k));
  s.errors.resize(std::size_t(k));
  read_rank_lines(out_path, err_path, s);
  if (where.nnodes > 1) {
    const fs::path staged = exit_path.string() + ".tmp";
    std::ofstream(staged, std::ios::binary | std::ios::trunc) << exit_json(s.launch).dump();
    fs::rename(staged, exit_path);
  }
  return s;
}

// Note [gathering the hosts' sub-runs].
SubRun Driver::gather(SubRun mine, int subrun, const Topology& where) const {
  if (where.nnodes <= 1) return mine;
  const double deadline = unix_now() + where.join_timeout_s;
  for (int node = 0; node < where.nnodes; ++node) {
    if (node == where.node_rank) continue;
    const fs::path exit_path = work_ / (host_stem(subrun, node) + ".exit.json");
    while (!fs::exists(exit_path) && unix_now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const json x = json::parse(read_file(exit_path), nullptr, false);
    if (x.is_discarded() || !x.is_object()) {
      mine.gathered = false;
      continue;
    }
    read_rank_lines(work_ / (host_stem(subrun, node) + ".out"),
                    work_ / (host_stem(subrun, node) + ".err"), mine);
    for (const json& r : x["ranks"])
      mine.launch.ranks.push_back({.rank = r["rank"],
                                   .exited = r["exited"],
                                   .exit_code = r["exit_code"],
                                   .term_signal = r["term_signal"],
                                   .stopped_by_launcher = r["stopped_by_launcher"]});
    mine.launch.start_unix_s = std::min(mine.launch.start_unix_s, x["start_unix_s"].get<double>());
    mine.launch.end_unix_s = std::max(mine.launch.end_unix_s, x["end_unix_s"].get<double>());
  }
  std::sort(mine.launch.ranks.begin(), mine.launch.ranks.end(),
            [](const RankExit& a, const RankExit& b) { return a.rank < b.rank; });
  return mine;
}

std::vector<SubRun> run_hosts(Driver& driver, int subrun, const std::string& what,
                              const fs::path& dir, const std::vector<std::string>& extra,
                              Topology base, const std::vector<int>& hosts) {
  base.master_port = base.master_port > 0 ? base.master_port + 2 * subrun : find_free_port(2);
  std::vector<SubRun> runs(hosts.size());
  std::vector<std::exception_ptr> errors(hosts.size());
  const auto one = [&](std::size_t h) {
    try {
      Topology where = base;
      where.node_rank = hosts[h];
      runs[h] = driver.run(what, dir, extra, 0, where, subrun);
    } catch (...) {
      errors[h] = std::current_exception();
    }
  };
  {
    const SignalDispositions keep;
    std::vector<std::thread> threads;
    for (std::size_t h = 1; h < hosts.size(); ++h) threads.emplace_back(one, h);
    if (!hosts.empty()) one(0);
    for (std::thread& t : threads) t.join();
  }
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return runs;
}

void DrillSchedule::validate() const {
  const auto bad = [](const std::string& flag, const std::string& value, const std::string& rule) {
    throw InvalidInput(flag + " = " + value + ": " + rule);
  };
  const auto i = [](std::int64_t v) { return std::to_string(v); };
  if (steps < 3 || steps > 1000) bad("--steps", i(steps), "must be in [3, 1000]");
  if (save_every < 1 || save_every >= steps)
    bad("--save-every", i(save_every), "must be in [1, --steps = " + i(steps) + ")");
  if (kill_at_step <= save_every || kill_at_step > steps)
    bad("--kill-at-step", i(kill_at_step),
        "must be in (--save-every = " + i(save_every) + ", --steps = " + i(steps) +
            "]: after the first checkpoint");
  if (!(collective_timeout_s > 0 && collective_timeout_s <= 600))
    bad("--timeout", format_number(collective_timeout_s), "must be in (0, 600] s");
  if (!(launch_timeout_s > 0 && launch_timeout_s <= 3600))
    bad("--launch-timeout", format_number(launch_timeout_s), "must be in (0, 3600] s");
}

void DrillHosts::validate() const {
  const auto bad = [](const std::string& flag, const std::string& value, const std::string& rule) {
    throw InvalidInput(flag + " = " + value + ": " + rule);
  };
  const auto i = [](std::int64_t v) { return std::to_string(v); };
  if (node_rank < -1 || node_rank >= nnodes)
    bad("--node-rank", i(node_rank),
        "must be in [0, --nnodes = " + i(nnodes) + ") or -1 (this machine plays every host)");
  if (node_rank >= 0 && master_port == 0)
    bad("--master-port", "0", "with --node-rank every host needs the same port: must be in [1, " +
                                  i(65535 - 5) + "]");
  if (master_port < 0 || master_port > 65535 - 5)
    bad("--master-port", i(master_port),
        "must be in [0, " + i(65535 - 5) + "] (the drill uses it up to port + 5; 0 = free ports)");
  if (node_rank >= 0 && !work_dir_given)
    bad("--work-dir", "(none)",
        "with --node-rank every host needs the same directory (a shared mount): give it");
  if (master_addr.empty()) bad("--master-addr", "(empty)", "must name host 0");
  if (!(join_timeout_s > 0 && join_timeout_s <= 3600))
    bad("--join-timeout", format_number(join_timeout_s), "must be in (0, 3600] s");
}

std::vector<int> processes_mentioning(const fs::path& work) {
  std::vector<int> pids;
  std::error_code ec;
  const std::string needle = work.string();
  for (fs::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const int pid = std::stoi(name);
    if (pid == ::getpid()) continue;
    std::string cmdline = read_file(it->path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(needle) != std::string::npos) pids.push_back(pid);
  }
  return pids;
}

}  // namespace tally::engine::drill
