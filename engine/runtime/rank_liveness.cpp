// RankLiveness (rank_liveness.hpp; Note [liveness locks]).
#include "rank_liveness.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <system_error>
#include <thread>

namespace tally::engine {

namespace fs = std::filesystem;

namespace {

std::string rank_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d", rank);
  return buf;
}

// True when no live process holds the lock on `path` (or the file does not exist yet: the rank
// never started, which a CommError after the rendezvous rules out).
bool lock_is_free(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);  // drops the probe's lock at once
  return free;
}

}  // namespace

RankLiveness::RankLiveness(fs::path dir, int rank, int world_size)
    : dir_(std::move(dir)), rank_(rank), world_size_(world_size) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw std::system_error(ec, dir_.string() + ": create");
  fs::remove(marker_path(rank_), ec);
  const fs::path path = lock_path(rank_);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), path.string() + ": open");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw std::system_error(err, std::generic_category(),
                            path.string() + ": rank " + std::to_string(rank_) +
                                "'s liveness lock is held by another live process (is another "
                                "job using this checkpoint directory?)");
  }
}

RankLiveness::~RankLiveness() {
  if (fd_ >= 0) ::close(fd_);
}

fs::path RankLiveness::lock_path(int rank) const { return dir_ / (rank_name(rank) + ".lock"); }
fs::path RankLiveness::marker_path(int rank) const {
  return dir_ / (rank_name(rank) + ".failed");
}

void RankLiveness::mark_failed() const {
  const fs::path path = marker_path(rank_);
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fprintf(f, "rank %d detected a failure\n", rank_);
    std::fclose(f);
  }
}

std::vector<int> RankLiveness::lost_ranks(double wait_s) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  for (;;) {
    std::vector<int> lost;
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_) continue;
      std::error_code ec;
      // Marker first: a peer writes it before its lock drops, so "free and no marker" is never
      // a peer caught between the two.
      if (fs::exists(marker_path(r), ec)) continue;
      if (lock_is_free(lock_path(r)) && !fs::exists(marker_path(r), ec)) lost.push_back(r);
    }
    if (!lost.empty() || std::chrono::steady_clock::now() >= deadline) return lost;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void RankLiveness::remove_all() const {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

LostRankReport report_lost_ranks(const RankLiveness& liveness, int rank, const CommError& e,
                                 const std::string& at, double wait_s) {
  liveness.mark_failed();
  LostRankReport r{.lost = liveness.lost_ranks(wait_s)};
  std::string who;
  for (int q : r.lost) who += (who.empty() ? "" : ", ") + std::to_string(q);
  // The Comm's message starts "rank r: " too; say it once.
  std::string what = e.what();
  if (const std::string self = "rank " + std::to_string(rank) + ": "; what.rfind(self, 0) == 0)
    what.erase(0, self.size());
  const std::string lost =
      r.lost.empty() ? "no rank has exited (a hung peer or a network failure)"
                     : std::string(r.lost.size() == 1 ? "lost rank " : "lost ranks ") + who;
  r.message = "rank " + std::to_string(rank) + ": " + lost + " at " + at + ": " + what;
  return r;
}

CommError LostRankReport::error(const CommError& e) const {
  return CommError(e.op(), lost.empty() ? e.peer_rank() : lost.front(), message);
}

}  // namespace tally::engine
