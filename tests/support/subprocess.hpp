// Runs a command with stdout / stderr captured and a hard deadline (header-only, no torch), for
// tests that drive the real tally binary: the child gets its own process group, SIGKILLed as a
// whole at the deadline, so a hung rank can never hang the test.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace tally::subprocess {

struct Ran {
  int exit_code = -1;  // 128 + signal when killed
  std::string out, err;
  double elapsed_s = 0;
  bool killed_at_limit = false;
};

// Starts args[0] (a path) with `args` in a process group of its own, stdout and stderr into pipes
// whose read ends land in out_fd and err_fd; the child's pid, or -1 if no pipe could be made.
inline pid_t spawn(const std::vector<std::string>& args, int& out_fd, int& err_fd) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) return -1;
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  setpgid(pid, pid);
  close(out_pipe[1]);
  close(err_pipe[1]);
  out_fd = out_pipe[0];
  err_fd = err_pipe[0];
  return pid;
}

inline Ran run_command(const std::vector<std::string>& args, double limit_s) {
  Ran ran;
  const auto start = std::chrono::steady_clock::now();
  int out_fd = -1, err_fd = -1;
  const pid_t pid = spawn(args, out_fd, err_fd);
  if (pid < 0) return ran;
  std::string* sinks[2] = {&ran.out, &ran.err};
  pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  const auto deadline = start + std::chrono::duration<double>(limit_s);
  int open = 2;
  while (open > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      kill(-pid, SIGKILL);
      ran.killed_at_limit = true;
      break;
    }
    if (poll(fds, 2, int(std::min<long long>(left.count(), 100))) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, std::size_t(n));
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  int status = 0;
  waitpid(pid, &status, 0);
  ran.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  ran.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return ran;
}

// A program left running (a server): started in its own process group with stdout and stderr
// captured; wait_for_line reads its stdout until a line holds a text; stop sends a signal and waits
// for the exit with a deadline. The destructor SIGKILLs the group if it still runs, so a failed
// test never leaves a server behind.
class Started {
 public:
  explicit Started(const std::vector<std::string>& args) : pid_(spawn(args, out_fd_, err_fd_)) {}
  Started(const Started&) = delete;
  Started& operator=(const Started&) = delete;
  ~Started() {
    if (pid_ > 0 && !exited_) {
      kill(-pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    for (const int fd : {out_fd_, err_fd_})
      if (fd >= 0) close(fd);
  }

  // The first stdout line holding `text` (without its newline), or "" when the program closes its
  // stdout or `limit_s` passes first.
  std::string wait_for_line(const std::string& text, double limit_s) {
    const auto deadline = after(limit_s);
    for (;;) {
      for (std::size_t end; (end = out_.find('\n')) != std::string::npos;) {
        std::string line = out_.substr(0, end);
        out_.erase(0, end + 1);
        if (line.find(text) != std::string::npos) return line;
      }
      if (!read_some(out_fd_, out_, deadline)) return "";
    }
  }

  // Sends `sig` and waits up to `limit_s` for the exit; the exit code (128 + signal when killed by
  // one), or -1 if it was still running at the deadline (then it is SIGKILLed).
  int stop(int sig, double limit_s) {
    if (pid_ <= 0) return -1;
    if (!exited_) kill(pid_, sig);
    const auto deadline = after(limit_s);
    while (running()) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(-pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        exited_ = true;
        return -1;
      }
      usleep(5000);
    }
    while (read_some(err_fd_, err_, deadline)) {
    }
    return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
  }
  // stderr read so far (all of it once stop() returned).
  const std::string& err() const { return err_; }
  bool running() {
    if (pid_ <= 0 || exited_) return false;
    if (waitpid(pid_, &status_, WNOHANG) != pid_) return true;
    exited_ = true;
    return false;
  }

 private:
  static std::chrono::steady_clock::time_point after(double s) {
    return std::chrono::steady_clock::now() +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
               std::chrono::duration<double>(s));
  }
  // Appends what `fd` has before `deadline`; false at end of file or the deadline.
  static bool read_some(int fd, std::string& sink,
                        std::chrono::steady_clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (fd < 0 || left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, int(std::min<long long>(left.count(), 100))) <= 0) return true;
    char buf[4096];
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) return false;
    sink.append(buf, std::size_t(n));
    return true;
  }

  int out_fd_ = -1, err_fd_ = -1;  // before pid_: spawn() sets them while pid_ is initialised
  pid_t pid_ = -1;
  bool exited_ = false;
  int status_ = 0;
  std::string out_, err_;
};

// The lines `tally launch` forwarded from one rank ("[rank r] " prefix removed).
inline std::vector<std::string> rank_lines(const std::string& out, int rank) {
  const std::string prefix = "[rank " + std::to_string(rank) + "] ";
  std::vector<std::string> lines;
  std::size_t pos = 0;
  while (pos < out.size()) {
    std::size_t end = out.find('\n', pos);
    if (end == std::string::npos) end = out.size();
    const std::string line = out.substr(pos, end - pos);
    if (line.rfind(prefix, 0) == 0) lines.push_back(line.substr(prefix.size()));
    pos = end + 1;
  }
  return lines;
}

// `binary run <experiment> flags…` as rank 0 of a world of k, without its peers (MASTER_PORT 1:
// nothing listens there): for bad-input tests, since every `tally run` checks its options before
// the rendezvous and exits 2 with one line.
inline std::vector<std::string> as_rank0_of(const std::string& binary, const std::string& experiment,
                                            int k, const std::vector<std::string>& flags) {
  std::vector<std::string> args = {"/usr/bin/env", "RANK=0", "LOCAL_RANK=0",
                                   "WORLD_SIZE=" + std::to_string(k), "MASTER_ADDR=127.0.0.1",
                                   "MASTER_PORT=1", binary, "run", experiment};
  args.insert(args.end(), flags.begin(), flags.end());
  return args;
}

}  // namespace tally::subprocess
