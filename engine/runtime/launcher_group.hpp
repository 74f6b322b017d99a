// The launchers of one `tally launch --nnodes N` job, one per host, watching each other (internal;
// torch-free header, c10d's TCPStore inside launcher_group.cpp).
//
// Note [launchers' store]
// Launchers must hear of a failure on another host even when their own ranks are healthy and
// blocked in a collective, and must notice a host that never started. They share a small c10d
// TCPStore of their own, served by node 0's launcher on MASTER_PORT + 1 at MASTER_ADDR:
//   - not the ranks' store at MASTER_PORT: that one is served by rank 0, a child process that starts
//     after the launchers, may be any program (a Python script) and dies with rank 0 — a failure
//     of rank 0 is exactly when the others must still be told;
//   - MASTER_PORT + 1, as torchrun's agents keep their rendezvous apart from the workers' store;
//     every host must be able to reach both ports on node 0 (`tally launch --help` says so).
// Keys:
//   node/<i>     node i's launcher has arrived: "host <hostname>, <its address towards node 0>"
//   failures     a counter; the launcher whose add() returns 1 writes
//   failed       "rank R on node i (host …) failed (…)": the first failure of the job
//   done/<i>     node i's ranks have all ended ("ok" or "failed")
//   left/<i>     node i's launcher is leaving (node 0 serves until every other has left, bounded)
// A background thread does every store call (connect, the keys above, polling every kPoll_s), so
// the launcher loop never blocks on the network: it reads a snapshot and posts requests. When the
// store cannot be reached (node 0 gone) the thread stops and says so; the launcher then relies on
// its ranks' own collectives timing out, as it would on one host.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace tally::engine {

struct LauncherGroupOptions {
  std::string master_addr;   // node 0's address
  int port = 0;              // MASTER_PORT + 1
  int nnodes = 2;
  int node_rank = 0;
  double join_timeout_s = 300;  // connecting to node 0's store; every store call's own timeout
};

struct LauncherGroupState {
  bool connected = false;          // this launcher reached (or serves) the store
  std::vector<int> missing_nodes;  // nodes not yet arrived (all but self until connected)
  std::optional<std::string> failure;  // the job's first failure (`failed`), from any node
  std::vector<int> unfinished_nodes;   // nodes without done/<i>
  bool store_lost = false;         // a store call failed: no more news from the other hosts
  std::string store_error;         // why, when store_lost
};

class LauncherGroup {
 public:
  // Starts the thread (node 0 serves the store at once; others connect, retrying until
  // join_timeout_s). Never throws for network trouble: that shows in state().
  explicit LauncherGroup(const LauncherGroupOptions& options);
  ~LauncherGroup();  // stops the thread (joined once connected; left to finish a connect)
  LauncherGroup(const LauncherGroup&) = delete;
  LauncherGroup& operator=(const LauncherGroup&) = delete;

  // "node 1 (host h, 10.77.0.2)": this launcher, as its messages and node/<i> name it.
  const std::string& self() const;
  LauncherGroupState state() const;
  // Posts this node's first failure ("rank R on node i (…) failed (…)"); written unless another
  // node's failure came first.
  void report_failure(const std::string& description);
  // Posts done/<i>: this node's ranks have all ended.
  void report_done(bool ok);
  // Posts left/<i>; node 0 then keeps serving until every node has left or linger_s passes.
  void leave(double linger_s);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;  // shared with the thread
  std::thread thread_;
};

// "1", "1, 3": node ranks for messages.
std::string node_list(const std::vector<int>& nodes);

}  // namespace tally::engine
