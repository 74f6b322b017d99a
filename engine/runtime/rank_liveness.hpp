// Which rank of a job died: a liveness lock per rank on the job's shared file system (internal,
// torch-free). Used by `tally run checkpoint` to name the lost rank after a CommError, which
// Gloo's "Connection closed by peer [addr]:port" does not do.
//
//   <dir>/rank-<r>.lock    rank r holds an exclusive flock(2) on it while its process lives; the
//                          kernel drops the lock when the process dies, SIGKILL included
//   <dir>/rank-<r>.failed  written by rank r when it detected a failure and is about to exit
//
// Note [liveness locks]
// After a collective fails, a rank probes every peer's lock with LOCK_EX | LOCK_NB: a lock it can
// take belongs to a process that has exited. A peer that exited after detecting the failure
// itself left rank-<r>.failed first (written before its lock is dropped), so the ranks whose lock
// is free and who left no marker are the ones that died without a word — the lost ranks. A hung
// peer (alive, silent) holds its lock: the probe then finds nobody lost, and the message says so.
// The lock file is opened before the Comm's sockets, so its descriptor has the lower number and is
// closed first when a process dies: by the time a peer sees the connection drop, the lock is free.
// Requires the ranks to share <dir>'s file system (the sharded checkpoint needs that anyway).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "tally/engine/comm.hpp"

namespace tally::engine {

class RankLiveness {
 public:
  // Creates <dir>, removes this rank's stale marker, takes this rank's lock. Throws
  // std::system_error naming the path when the lock cannot be taken (another live process holds
  // this rank's lock: two jobs on one checkpoint directory).
  RankLiveness(std::filesystem::path dir, int rank, int world_size);
  ~RankLiveness();  // closes the lock file (drops the lock)
  RankLiveness(const RankLiveness&) = delete;
  RankLiveness& operator=(const RankLiveness&) = delete;

  // Leaves rank-<r>.failed: this rank saw a failure and exits on purpose.
  void mark_failed() const;
  // Peers whose process has exited without leaving a marker, probed every 10 ms for up to wait_s
  // seconds until at least one is found (a dying process drops its lock within microseconds of
  // its sockets; the wait covers a loaded machine).
  std::vector<int> lost_ranks(double wait_s) const;
  // Removes the directory (every rank's files). Call on one rank once the job has finished.
  void remove_all() const;

  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path lock_path(int rank) const;
  std::filesystem::path marker_path(int rank) const;

  std::filesystem::path dir_;
  int rank_ = 0;
  int world_size_ = 1;
  int fd_ = -1;
};

// What a rank says after `e`, one of its collectives failing: it marks itself failed, probes for
// the lost ranks (lost_ranks(wait_s)) and words its one line, "rank r: lost rank q at <at>:
// <e's message without its own leading "rank r: ">", or "no rank has exited (a hung peer or a
// network failure)" in place of the lost ranks.
struct LostRankReport {
  std::vector<int> lost;
  std::string message;
  // The CommError to rethrow: e's operation, the first lost rank as the peer (else e's), message.
  CommError error(const CommError& e) const;
};
LostRankReport report_lost_ranks(const RankLiveness& liveness, int rank, const CommError& e,
                                 const std::string& at, double wait_s);

}  // namespace tally::engine
