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

inline Ran run_command(const std::vector<std::string>& args, double limit_s) {
  Ran ran;
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) return ran;
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const auto start = std::chrono::steady_clock::now();
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
  std::string* sinks[2] = {&ran.out, &ran.err};
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
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
