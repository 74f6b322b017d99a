// `tally launch` (see launch.hpp). No torch here: the launcher only forks, execs and supervises.
//
// Note [launcher loop]
// One thread, one loop, ticking at most every kTick_ms: poll the ranks' output pipes, forward
// complete lines, reap exited ranks (waitid with WNOHANG|WNOWAIT, then waitpid), then act on the
// first of: a failed rank, a signal to the launcher, the timeout. Acting means SIGTERM to every
// running rank's process group and, kill_grace_s later, SIGKILL. Each rank's process group is
// SIGKILLed as the rank is reaped (its children may outlive it). The loop ends when every rank is
// reaped; the pipes are then drained for at most kDrain_s (a stray that left its group could hold
// them open forever). PR_SET_PDEATHSIG makes the kernel SIGKILL the ranks if the launcher itself
// is SIGKILLed. Across hosts the loop also reads the launchers' store's snapshot (launcher_group.hpp,
// which does the network calls on its own thread) and acts on a failure elsewhere or a host
// missing at the join timeout the same way.
#include "tally/engine/launch.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "launcher_group.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/dist_env.hpp"
#include "tally/engine/temp_directory.hpp"
#include "run_helpers.hpp"

extern char** environ;

namespace tally::engine {

namespace {

constexpr int kTick_ms = 20;          // poll timeout: bounds how late a timeout or exit is seen
constexpr double kDrain_s = 1.0;      // output drain after the last rank is reaped
// A longer line without '\n' is forwarded in pieces (the buffer stays bounded). A rank's --json is
// one line: `run zero --steps 100` over three stages wrote 66 KB, which the 64 KiB this was
// until 2026-12-07 split in two; 1000 steps over all four stages are about 1 MB.
constexpr std::size_t kMaxLine = std::size_t(1) << 24;
constexpr double kLinger_s = 5;       // node 0 keeps the launchers' store up for the others' exit

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_launcher_signal = 0;
void on_launcher_signal(int sig) { g_launcher_signal = sig; }

void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // the reader went away: keep supervising, drop the output
    p += w;
    n -= std::size_t(w);
  }
}

// One output pipe of one rank: bytes in, "[rank r] line\n" out.
struct Stream {
  int fd = -1;
  int out_fd = 1;
  std::string prefix;
  std::string pending;

  void emit(std::string_view line) {
    std::string s = prefix;
    s += line;
    s += '\n';
    write_all(out_fd, s.data(), s.size());
  }
  void feed(const char* data, std::size_t n) {
    pending.append(data, n);
    std::size_t start = 0;
    for (std::size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1)
      emit(std::string_view(pending).substr(start, nl - start));
    pending.erase(0, start);
    while (pending.size() >= kMaxLine) {
      emit(std::string_view(pending).substr(0, kMaxLine));
      pending.erase(0, kMaxLine);
    }
  }
  void close_stream() {
    if (!pending.empty()) emit(pending);
    pending.clear();
    if (fd >= 0) close(fd);
    fd = -1;
  }
  // Reads what is there; closes on EOF or error. Returns false when closed.
  bool read_available() {
    char buf[8192];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n > 0) {
        feed(buf, std::size_t(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      close_stream();
      return false;
    }
  }
};

struct Rank {
  int local_rank = 0;
  int rank = 0;  // global
  pid_t pid = -1;
  bool running = false;
  RankExit exit;
  Stream out, err;
};

std::vector<std::string> rank_environment(const LaunchOptions& o, int local_rank, int port,
                                         const std::filesystem::path& scratch) {
  std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(o.global_rank(local_rank))},
      {"WORLD_SIZE", std::to_string(o.world_size())},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(port)},
  };
  if (!scratch.empty()) ours.emplace_back(kLaunchScratchEnv, scratch.string());
  std::vector<std::string> env;
  bool has_omp = false;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view kv(*e);
    const std::string_view key = kv.substr(0, kv.find('='));
    bool overridden = false;
    for (const auto& [k, v] : ours) overridden = overridden || key == k;
    has_omp = has_omp || key == "OMP_NUM_THREADS";
    if (!overridden) env.emplace_back(kv);
  }
  for (const auto& [k, v] : ours) env.push_back(k + "=" + v);
  // As torchrun: N ranks on one host each get one OpenMP thread unless the user chose otherwise.
  if (!has_omp && o.nproc > 1) env.emplace_back("OMP_NUM_THREADS=1");
  return env;
}

// In the child, between fork and exec: only async-signal-safe calls.
[[noreturn]] void exec_rank(const std::vector<char*>& argv, const std::vector<char*>& envp,
                            int out_w, int err_w, pid_t launcher) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(125);  // the launcher died before prctl took effect
  dup2(out_w, STDOUT_FILENO);
  dup2(err_w, STDERR_FILENO);
  for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP}) signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execvpe(argv[0], argv.data(), envp.data());
  const char* msg = "tally launch: cannot execute '";
  write_all(STDERR_FILENO, msg, strlen(msg));
  write_all(STDERR_FILENO, argv[0], strlen(argv[0]));
  write_all(STDERR_FILENO, "': ", 3);
  const char* why = strerror(errno);
  write_all(STDERR_FILENO, why, strlen(why));
  write_all(STDERR_FILENO, "\n", 1);
  _exit(127);
}

void start_rank(Rank& r, const LaunchOptions& o, int port, const std::filesystem::path& scratch,
                int out_fd, int err_fd) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) throw std::runtime_error("tally launch: pipe failed");
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    throw std::runtime_error("tally launch: pipe failed");
  }
  // Everything the child needs is built before fork.
  std::vector<std::string> env = rank_environment(o, r.local_rank, port, scratch);
  std::vector<char*> envp, argv;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> command = o.command;
  for (auto& s : command) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t launcher = getpid();
  // Note [signals across fork]: until the child resets them (exec_rank), it runs the launcher's
  // handlers; a SIGTERM that reached it there — the launcher stopping the ranks because another
  // failed while this one was not yet exec'd, which a loaded machine makes likely — ran the
  // launcher's handler in the child and was lost, and the rank lived on to the SIGKILL of the
  // kill grace (`Launch.FailingRankStopsTheOthersAndIsNamed`: 8 of 60 runs took 3–4.6 s instead
  // of 1–1.5 with three busy loops beside it). So the stopping signals are blocked across fork:
  // the child resets their handlers, then unblocks them, and one that arrived meanwhile takes its
  // default action there.
  sigset_t stopping, previous;
  sigemptyset(&stopping);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stopping, sig);
  pthread_sigmask(SIG_BLOCK, &stopping, &previous);
  const pid_t pid = fork();
  if (pid == 0) exec_rank(argv, envp, out_pipe[1], err_pipe[1], launcher);
  const int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0)
    throw std::runtime_error(std::string("tally launch: fork failed: ") + strerror(fork_errno));
  setpgid(pid, pid);  // also in the child; whichever runs first wins, both agree
  close(out_pipe[1]);
  close(err_pipe[1]);
  fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
  fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
  const std::string prefix = "[rank " + std::to_string(r.rank) + "] ";
  r.pid = pid;
  r.running = true;
  r.out = Stream{.fd = out_pipe[0], .out_fd = out_fd, .prefix = prefix};
  r.err = Stream{.fd = err_pipe[0], .out_fd = err_fd, .prefix = prefix};
}

// Polls every open stream once (waiting at most timeout_ms) and forwards what arrived.
// Returns the number of streams still open.
int pump_output(std::vector<Rank>& ranks, int timeout_ms) {
  std::vector<pollfd> fds;
  std::vector<Stream*> streams;
  for (auto& r : ranks)
    for (Stream* s : {&r.out, &r.err})
      if (s->fd >= 0) {
        fds.push_back({.fd = s->fd, .events = POLLIN, .revents = 0});
        streams.push_back(s);
      }
  if (fds.empty()) {
    if (timeout_ms > 0) poll(nullptr, 0, timeout_ms);
    return 0;
  }
  if (poll(fds.data(), fds.size(), timeout_ms) > 0)
    for (std::size_t i = 0; i < fds.size(); ++i)
      if (fds[i].revents != 0) streams[i]->read_available();
  int open = 0;
  for (Stream* s : streams) open += s->fd >= 0 ? 1 : 0;
  return open;
}

bool failed(const RankExit& e) { return !e.exited || e.exit_code != 0; }

// "node 1", "nodes 1, 3"
std::string nodes_named(const std::vector<int>& nodes) {
  return (nodes.size() == 1 ? "node " : "nodes ") + node_list(nodes);
}


// After this host's ranks all succeeded: wait (at most join_timeout_s) until every host's ranks
// have ended, so that a failure elsewhere still fails this launch. Returns that failure, if any.
std::optional<std::string> wait_for_other_hosts(const LauncherGroup& group, double limit_s) {
  const auto start = Clock::now();
  while (seconds_since(start) < limit_s && g_launcher_signal == 0) {
    const LauncherGroupState s = group.state();
    if (s.failure) return s.failure;
    if (s.store_lost || s.unfinished_nodes.empty()) return std::nullopt;
    poll(nullptr, 0, kTick_ms);
  }
  return std::nullopt;
}

}  // namespace

std::string RankExit::describe() const {
  if (exited) return "exited with status " + std::to_string(exit_code);
  const char* name = sigabbrev_np(term_signal);
  return "killed by signal " + std::to_string(term_signal) +
         (name != nullptr ? std::string(" (SIG") + name + ")" : std::string());
}

void LaunchOptions::validate() const {
  if (nproc < 1 || nproc > kMaxLaunchRanks)
    throw InvalidInput("--nproc = " + std::to_string(nproc) + ": must be in [1, " +
                       std::to_string(kMaxLaunchRanks) + "]");
  if (!std::isfinite(timeout_s) || timeout_s < 0)
    throw InvalidInput("--timeout = " + format_number(timeout_s) + ": must be >= 0 s (0 = no limit)");
  if (nnodes < 1 || nnodes > kMaxWorldSize)
    throw InvalidInput("--nnodes = " + std::to_string(nnodes) + ": must be in [1, " +
                       std::to_string(kMaxWorldSize) + "]");
  if (std::int64_t(nnodes) * nproc > kMaxWorldSize)
    throw InvalidInput("--nnodes = " + std::to_string(nnodes) + " × --nproc-per-node = " +
                       std::to_string(nproc) + " = " + std::to_string(std::int64_t(nnodes) * nproc) +
                       " ranks: must be at most " + std::to_string(kMaxWorldSize));
  if (node_rank < 0 || node_rank >= nnodes)
    throw InvalidInput("--node-rank = " + std::to_string(node_rank) + ": must be in [0, " +
                       std::to_string(nnodes - 1) + "] (--nnodes = " + std::to_string(nnodes) + ")");
  if (master_port < 0 || master_port > 65535)
    throw InvalidInput("--master-port = " + std::to_string(master_port) +
                       ": must be in [0, 65535] (0 = a free port)");
  if (nnodes > 1 && master_port == 0)
    throw InvalidInput("--master-port = 0: with --nnodes = " + std::to_string(nnodes) +
                       " every host needs the same port: must be in [1, 65534]");
  if (nnodes > 1 && master_port > 65534)
    throw InvalidInput("--master-port = " + std::to_string(master_port) + ": with --nnodes = " +
                       std::to_string(nnodes) + " the launchers also use port + 1: must be in "
                       "[1, 65534]");
  if (!std::isfinite(join_timeout_s) || join_timeout_s <= 0 || join_timeout_s > 86400)
    throw InvalidInput("--join-timeout = " + format_number(join_timeout_s) +
                       ": must be in (0, 86400] s");
  if (!std::isfinite(kill_grace_s) || kill_grace_s < 0)
    throw InvalidInput("kill grace = " + format_number(kill_grace_s) + " s: must be >= 0 s");
  if (master_addr.empty()) throw InvalidInput("master address is empty");
  if (command.empty() || command[0].empty())
    throw InvalidInput(
        "no command given: put the program after --, e.g. tally launch --nproc 2 -- python3 train.py");
}

LaunchResult launch(const LaunchOptions& options, int out_fd, int err_fd) {
  options.validate();
  LaunchResult result;
  result.master_port = options.master_port != 0 ? options.master_port : find_free_port();

  // Signals to the launcher stop the ranks (handled in the loop); a closed stdout must not kill
  // the launcher before it has cleaned up. Previous dispositions come back on return.
  g_launcher_signal = 0;
  struct sigaction on_signal{}, ignore{}, saved[4];
  on_signal.sa_handler = on_launcher_signal;
  sigemptyset(&on_signal.sa_mask);
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  const int handled[3] = {SIGINT, SIGTERM, SIGHUP};
  for (int i = 0; i < 3; ++i) sigaction(handled[i], &on_signal, &saved[i]);
  sigaction(SIGPIPE, &ignore, &saved[3]);

  const auto start = Clock::now();
  // The launcher's scratch directory (Note [launch scratch] in temp_directory.hpp), made before the
  // ranks start and removed on every way out of this function, after the ranks are reaped. Without
  // one (the temp directory refuses), the ranks get no TALLY_LAUNCH_SCRATCH and the job runs on.
  std::optional<WorkDirectory> scratch;
  try {
    scratch.emplace(std::filesystem::path(), "tally-launch", /*keep=*/false);
  } catch (const std::exception&) {
  }
  const std::filesystem::path scratch_path = scratch ? scratch->path() : std::filesystem::path();
  std::unique_ptr<LauncherGroup> group;  // N > 1 (Note [launchers' store])
  if (options.nnodes > 1)
    group = std::make_unique<LauncherGroup>(LauncherGroupOptions{
        .master_addr = options.master_addr, .port = result.master_port + 1,
        .nnodes = options.nnodes, .node_rank = options.node_rank,
        .join_timeout_s = options.join_timeout_s});
  // "rank 3" on one host, "rank 3 on node 1 (host h, 10.77.0.2)" across hosts.
  const std::string on_node = group ? " on " + group->self() : "";
  const auto rank_named = [&](int rank) { return "rank " + std::to_string(rank) + on_node; };
  bool warned = false;  // node 0 could not serve the launchers' store
  std::vector<Rank> ranks(std::size_t(options.nproc));
  for (int l = 0; l < options.nproc; ++l) {
    ranks[l].local_rank = l;
    ranks[l].rank = ranks[l].exit.rank = options.global_rank(l);
  }
  std::size_t failed_local = 0;  // index of the failed rank in `ranks`
  bool stopping = false, killed = false;
  Clock::time_point kill_at{};
  auto begin_stop = [&] {
    stopping = true;
    kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(options.kill_grace_s));
    for (auto& r : ranks)
      if (r.running) {
        kill(-r.pid, SIGTERM);
        r.exit.stopped_by_launcher = true;
      }
  };

  try {
    for (auto& r : ranks) start_rank(r, options, result.master_port, scratch_path, out_fd, err_fd);
  } catch (...) {
    for (auto& r : ranks)
      if (r.running && r.pid > 0) {
        kill(-r.pid, SIGKILL);
        waitpid(r.pid, nullptr, 0);
        r.out.close_stream();
        r.err.close_stream();
      }
    for (int i = 0; i < 3; ++i) sigaction(handled[i], &saved[i], nullptr);
    sigaction(SIGPIPE, &saved[3], nullptr);
    throw;
  }

  const bool has_deadline = options.timeout_s > 0;
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(options.timeout_s));
  int running = options.nproc;
  int launcher_signal = 0;
  while (running > 0) {
    pump_output(ranks, kTick_ms);
    for (auto& r : ranks) {
      if (!r.running) continue;
      // Peek without reaping: while the zombie holds its pid, its process group id cannot be
      // reused, so SIGKILLing the group (the rank's leftover children) is safe. Then reap.
      siginfo_t info{};
      if (waitid(P_PID, id_t(r.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
          info.si_pid != r.pid)
        continue;
      kill(-r.pid, SIGKILL);
      int status = 0;
      waitpid(r.pid, &status, 0);
      r.running = false;
      --running;
      r.exit.rank = r.rank;
      r.exit.exited = WIFEXITED(status);
      r.exit.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
      r.exit.term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      if (failed(r.exit) && !stopping) {
        result.outcome = LaunchOutcome::rank_failed;
        result.failed_rank = r.rank;
        failed_local = std::size_t(r.local_rank);
        if (group)
          group->report_failure(rank_named(r.rank) + " failed (" + r.exit.describe() + ")");
        begin_stop();
      }
    }
    if (running == 0) break;
    if (group && !stopping) {
      const LauncherGroupState s = group->state();
      // Node 0 cannot serve (its port + 1 is taken): the job runs on, unwatched, and says so.
      const bool not_serving = options.node_rank == 0 && s.store_lost;
      if (not_serving && !warned) {
        const std::string line = "tally launch: warning: " + s.store_error +
                                 "; a failure on another host will not stop this host's ranks\n";
        write_all(err_fd, line.data(), line.size());
        warned = true;
      }
      if (s.failure) {
        result.outcome = LaunchOutcome::remote_failed;
        result.remote_failure = *s.failure;
        begin_stop();
      } else if (!s.missing_nodes.empty() && !not_serving &&
                 seconds_since(start) >= options.join_timeout_s) {
        result.outcome = LaunchOutcome::nodes_missing;
        result.missing_nodes = s.missing_nodes;
        begin_stop();
      }
    }
    if (!stopping && g_launcher_signal != 0) {
      launcher_signal = g_launcher_signal;
      result.outcome = LaunchOutcome::interrupted;
      begin_stop();
    }
    if (!stopping && has_deadline && Clock::now() >= deadline) {
      result.outcome = LaunchOutcome::timed_out;
      begin_stop();
    }
    if (stopping && !killed && Clock::now() >= kill_at) {
      for (auto& r : ranks)
        if (r.running) kill(-r.pid, SIGKILL);
      killed = true;
    }
  }

  // Every rank is reaped (and its group killed): drain the pipes, for a bounded time.
  const auto drain_until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(kDrain_s));
  while (pump_output(ranks, kTick_ms) > 0 && Clock::now() < drain_until) {
  }
  for (auto& r : ranks) {
    r.out.close_stream();
    r.err.close_stream();
  }
  std::string group_note;  // why the launchers' store said nothing more, when that matters
  if (group) {
    group->report_done(result.outcome == LaunchOutcome::ok);
    if (result.outcome == LaunchOutcome::ok) {
      if (auto failure = wait_for_other_hosts(*group, options.join_timeout_s)) {
        result.outcome = LaunchOutcome::remote_failed;
        result.remote_failure = *failure;
      }
    }
    const LauncherGroupState s = group->state();
    if (result.outcome == LaunchOutcome::rank_failed && !s.missing_nodes.empty())
      result.missing_nodes = s.missing_nodes;
    if (s.store_lost && result.outcome != LaunchOutcome::ok) group_note = "; " + s.store_error;
    // Ranks done, the group never heard: say so, as node 0 does when it cannot serve.
    if (s.store_lost && result.outcome == LaunchOutcome::ok && !warned) {
      const std::string line = "tally launch: warning: " + s.store_error +
                               "; this host's ranks finished, the other hosts' outcomes are not "
                               "known here\n";
      write_all(err_fd, line.data(), line.size());
    }
    group->leave(kLinger_s);
    group.reset();
  }
  for (int i = 0; i < 3; ++i) sigaction(handled[i], &saved[i], nullptr);
  sigaction(SIGPIPE, &saved[3], nullptr);

  result.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  int stopped = 0;
  for (auto& r : ranks) {
    result.ranks.push_back(r.exit);
    stopped += r.exit.stopped_by_launcher ? 1 : 0;
  }
  const std::string others = "stopped " + std::to_string(stopped) + " running rank" +
                             (stopped == 1 ? "" : "s");
  switch (result.outcome) {
    case LaunchOutcome::ok:
      result.exit_code = 0;
      break;
    case LaunchOutcome::rank_failed:
      result.exit_code = 1;
      result.message = "tally launch: " + rank_named(result.failed_rank) + " failed (" +
                       result.ranks[failed_local].describe() + "); " + others;
      if (!result.missing_nodes.empty())
        result.message += "; " + nodes_named(result.missing_nodes) + " never joined";
      break;
    case LaunchOutcome::remote_failed:
      result.exit_code = 1;
      result.message = "tally launch: " + result.remote_failure + "; " + others + " on node " +
                       std::to_string(options.node_rank);
      break;
    case LaunchOutcome::nodes_missing:
      result.exit_code = 1;
      result.message = "tally launch: " + nodes_named(result.missing_nodes) + " of " +
                       std::to_string(options.nnodes) + " never joined within " +
                       format_number(options.join_timeout_s) + " s (--join-timeout; the " +
                       "launchers' store at " + options.master_addr + ":" +
                       std::to_string(result.master_port + 1) + "); " + others;
      break;
    case LaunchOutcome::timed_out:
      result.exit_code = 124;
      result.message = "tally launch: timeout after " + format_number(options.timeout_s) +
                       " s (--timeout); " + others;
      break;
    case LaunchOutcome::interrupted:
      result.exit_code = 128 + launcher_signal;
      result.message = std::string("tally launch: interrupted by SIG") +
                       (sigabbrev_np(launcher_signal) ? sigabbrev_np(launcher_signal) : "?") +
                       "; " + others;
      break;
  }
  result.message += group_note;
  return result;
}

}  // namespace tally::engine
