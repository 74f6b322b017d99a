// The drills' driver (drill_driver.hpp).
#include "drill_driver.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <system_error>

#include "tally/core/types.hpp"
#include "tally/engine/temp_directory.hpp"

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

}  // namespace

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

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
                   const Topology& where) {
  SubRun s;
  s.launch.what = what;
  s.launch.command = {o_.tally_binary, "run", "checkpoint", "--json",
                      "--timeout", format_number(o_.collective_timeout_s),
                      "--dir", dir.string(),
                      "--steps", std::to_string(steps > 0 ? steps : o_.steps),
                      "--save-every", std::to_string(o_.save_every),
                      "--record-batches", "0"};
  s.launch.command.insert(s.launch.command.end(), extra.begin(), extra.end());
  std::string stem = "launch-" + std::to_string(++launches_);
  if (where.nnodes > 1) stem += "-node" + std::to_string(where.node_rank);
  const fs::path out_path = work_ / (stem + ".out"), err_path = work_ / (stem + ".err");
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
  return s;
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

WorkDirectory::WorkDirectory(const fs::path& given, std::string_view prefix, bool keep)
    : path_(given), temporary_(given.empty()), keep_(keep) {
  if (temporary_)
    path_ = make_temp_directory(prefix);
  else
    fs::create_directories(path_);
}

bool WorkDirectory::remove() {
  if (temporary_ && !keep_ && !removed_) {
    std::error_code ec;
    fs::remove_all(path_, ec);
    removed_ = !ec;
  }
  return removed_;
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
