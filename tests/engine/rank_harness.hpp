// Runs one test body as k ranks in forked child processes over loopback (header-only, no torch).
//
// The parent forks before touching torch (so no torch or Gloo thread is copied into a child),
// gives every rank the same DistEnv on 127.0.0.1 and a free port, and waits with a deadline: ranks
// still running after limit_s are SIGKILLed and reported, so a broken collective fails the test
// instead of hanging it. A rank's exit status is 0 iff its body returned and recorded no gtest
// failure (EXPECT_* inside the body work as usual and print from the child).
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "tally/engine/dist_env.hpp"

namespace tally::engine::harness {

struct RankExit {
  int rank = 0;
  int status = 0;       // waitpid status
  bool killed = false;  // by the harness, at the deadline
  bool ok() const { return !killed && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  std::string describe() const {
    std::string s = "rank " + std::to_string(rank) + ": ";
    if (killed) return s + "still running at the deadline, killed";
    if (WIFSIGNALED(status)) return s + "killed by signal " + std::to_string(WTERMSIG(status));
    return s + "exit status " + std::to_string(WEXITSTATUS(status));
  }
};

struct RunResult {
  std::vector<RankExit> ranks;
  double elapsed_s = 0;
  bool all_ok() const {
    for (const auto& r : ranks)
      if (!r.ok()) return false;
    return true;
  }
  std::string describe() const {
    std::string s;
    for (const auto& r : ranks) s += r.describe() + "; ";
    return s + "elapsed " + std::to_string(elapsed_s) + " s";
  }
};

// The current test's failed assertions so far (0 outside a test).
inline int failed_parts() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (info == nullptr) return 0;
  const ::testing::TestResult* r = info->result();
  int n = 0;
  for (int i = 0; i < r->total_part_count(); ++i) n += r->GetTestPartResult(i).failed();
  return n;
}

inline RunResult run_ranks(int world_size, double limit_s,
                           const std::function<void(const DistEnv&)>& body) {
  const DistEnv base{.rank = 0, .world_size = world_size, .local_rank = 0,
                     .master_addr = "127.0.0.1", .master_port = find_free_port()};
  const auto start = std::chrono::steady_clock::now();
  std::fflush(nullptr);  // or the children would print the parent's buffered output again
  // A child judges itself by its own failures: it inherits the parent's record of the test so
  // far, so HasFailure() alone would fail every run after the test's first failure.
  const int failed_before = failed_parts();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world_size; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) {
      ADD_FAILURE() << "fork failed";
      break;
    }
    if (pid == 0) {
      DistEnv env = base;
      env.rank = rank;
      env.local_rank = rank;
      try {
        body(env);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << rank << " threw: " << e.what();
      }
      std::fflush(nullptr);
      _exit(failed_parts() > failed_before ? 1 : 0);
    }
    pids.push_back(pid);
  }
  RunResult result;
  for (int r = 0; r < int(pids.size()); ++r) result.ranks.push_back({.rank = r});
  std::vector<bool> done(pids.size(), false);
  const auto deadline = start + std::chrono::duration<double>(limit_s);
  std::size_t running = pids.size();
  while (running > 0 && std::chrono::steady_clock::now() < deadline) {
    for (std::size_t r = 0; r < pids.size(); ++r) {
      if (done[r]) continue;
      if (waitpid(pids[r], &result.ranks[r].status, WNOHANG) == pids[r]) {
        done[r] = true;
        --running;
      }
    }
    if (running > 0) poll(nullptr, 0, 10);
  }
  for (std::size_t r = 0; r < pids.size(); ++r) {
    if (done[r]) continue;
    kill(pids[r], SIGKILL);
    waitpid(pids[r], &result.ranks[r].status, 0);
    result.ranks[r].killed = true;
  }
  result.elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace tally::engine::harness
