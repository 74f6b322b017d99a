// `tally launch`: start this host's ranks of any program under torchrun's environment contract
// (DESIGN.md §3) and supervise them so a multi-process run never hangs and never leaves
// processes behind (DESIGN.md §5).
//
// Across hosts, as torchrun: N = nnodes hosts each run the same launch with their own node_rank i
// and K = nproc ranks per host; local rank l gets
//   RANK = i·K + l    WORLD_SIZE = N·K    LOCAL_RANK = l    LOCAL_WORLD_SIZE = K    GROUP_RANK = i
// and MASTER_ADDR / MASTER_PORT (node 0's host serves the rendezvous; every host gives the same).
// One host is N = 1, i = 0.
//
// Each rank runs in its own process group with those variables set (plus the launcher's own
// environment). Its stdout and stderr are forwarded line by line with a "[rank r] " prefix (the
// global rank). When a rank fails (non-zero exit or a
// signal) the others are stopped: SIGTERM to every rank's process group, SIGKILL after
// kill_grace_s. When timeout_s passes, all ranks are stopped the same way. Whatever happens, every
// rank's process group is SIGKILLed before launch() returns, so a rank's stray children go too.
//
// Across hosts (N > 1) the launchers watch each other through a store of their own that node 0's
// launcher serves on MASTER_PORT + 1 (Note [launchers' store] in launcher_group.hpp): a rank
// failing on any host stops the ranks on every host (each launcher reads the store every 0.1 s,
// then SIGTERM, SIGKILL after kill_grace_s) and every launcher exits 1 naming the failed rank, its
// node and host; a host whose launcher has not arrived within join_timeout_s stops the others,
// which exit 1 naming the missing node ranks. A launcher whose ranks all succeeded waits (at most
// join_timeout_s) for the other hosts' ranks to end, so a failure there still fails it.
#pragma once

#include <string>
#include <vector>

namespace tally::engine {

inline constexpr int kMaxLaunchRanks = 256;

struct LaunchOptions {
  int nproc = 1;                          // K: ranks on this host, [1, kMaxLaunchRanks]
  int nnodes = 1;                         // N: hosts, N·K <= kMaxWorldSize
  int node_rank = 0;                      // i: this host, [0, N)
  double timeout_s = 0;                   // whole run; 0 = no limit
  int master_port = 0;                    // 0 = a free port on 127.0.0.1 (N = 1 only)
  std::string master_addr = "127.0.0.1";  // node 0's host, as every host reaches it
  double kill_grace_s = 3;                // SIGTERM → SIGKILL
  double join_timeout_s = 300;            // N > 1: every host's launcher must arrive by then
  std::vector<std::string> command;       // program and arguments; the program is looked up in PATH
  // Throws tally::InvalidInput with the flag's name, e.g. "--nproc = 0: must be in [1, 256]",
  // "--node-rank = 2: must be in [0, 1] (--nnodes = 2)".
  void validate() const;
  int world_size() const { return nnodes * nproc; }
  int global_rank(int local_rank) const { return node_rank * nproc + local_rank; }
};

// remote_failed: a rank on another host failed; nodes_missing: a host never arrived (N > 1).
enum class LaunchOutcome { ok, rank_failed, timed_out, interrupted, remote_failed, nodes_missing };

struct RankExit {
  int rank = 0;             // global rank
  bool exited = false;      // true: exit_code is set; false: killed by term_signal
  int exit_code = 0;
  int term_signal = 0;
  bool stopped_by_launcher = false;  // the launcher signalled it after another rank failed
  std::string describe() const;      // "exited with status 3", "killed by signal 9 (SIGKILL)"
};

struct LaunchResult {
  LaunchOutcome outcome = LaunchOutcome::ok;
  int exit_code = 0;          // what `tally launch` exits with: 0, 1 (a rank failed, here or on
                              // another host, or a host never arrived), 124, 128+sig
  int failed_rank = -1;       // the first rank seen failing (rank_failed)
  std::string remote_failure; // remote_failed: "rank 3 on node 1 (host h, 10.0.0.2) failed (...)"
  std::vector<int> missing_nodes;  // nodes_missing (and rank_failed, when some never arrived)
  int master_port = 0;        // the port the ranks were given
  double elapsed_s = 0;
  std::vector<RankExit> ranks;  // this host's, by local rank
  std::string message;        // one line for the user; empty when outcome is ok
};

// Runs the ranks to completion. Forwarded output goes to out_fd / err_fd; the launcher's own
// one-line verdict is in LaunchResult::message (not printed). SIGINT / SIGTERM / SIGHUP sent to the
// launcher while it runs stop the ranks and end it with outcome interrupted. Throws InvalidInput
// for bad options and std::runtime_error when the ranks cannot be started at all.
LaunchResult launch(const LaunchOptions& options, int out_fd = 1, int err_fd = 2);

}  // namespace tally::engine
