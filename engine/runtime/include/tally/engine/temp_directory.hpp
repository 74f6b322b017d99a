// Temporary directories for runs given none (torch-free).
#pragma once

#include <filesystem>
#include <string_view>

#include "tally/engine/comm.hpp"

namespace tally::engine {

// Note [launch scratch]
// `tally launch` makes one directory of its own, <system temp dir>/tally-launch-XXXXXX, names it to
// its ranks in TALLY_LAUNCH_SCRATCH, and removes it with everything in it once every rank on its
// host has been reaped — whether the job succeeded, failed, timed out or was interrupted, and
// whether its ranks exited or were killed. Files that live no longer than the job (`tally run 3d`'s
// liveness locks) go there, so a failed run leaves nothing behind: a rank that dies, or that the
// launcher stops, cannot clean up after itself, and a surviving rank may not (its peers may still
// be probing the locks). What the user may keep (`tally run checkpoint --keep`'s directory) is
// the caller's, in the system temp directory. Ranks started without `tally launch` see no
// TALLY_LAUNCH_SCRATCH and use the system temp directory; then only the caller removes what they
// made.
inline constexpr const char* kLaunchScratchEnv = "TALLY_LAUNCH_SCRATCH";

// Who removes a temporary directory: the code that made it (caller), or — when the rank was started
// by `tally launch` — the launcher, at the end of the job (Note [launch scratch]).
enum class TempOwner { caller, launcher };

// <base>/<prefix>-XXXXXX made by mkdtemp(3): a new directory (mode 0700) that no other process
// chose. <base> is the system temp dir, or under TempOwner::launcher the launcher's scratch
// directory when TALLY_LAUNCH_SCRATCH names a directory. For runs given no directory: `tally run
// checkpoint`'s default and `tally run fault-drill`'s work directory; whoever calls it removes it
// (the launcher too, for TempOwner::launcher). Throws std::system_error naming the path when it
// cannot be created.
std::filesystem::path make_temp_directory(std::string_view prefix,
                                          TempOwner owner = TempOwner::caller);

// Rank 0 makes a temporary directory (make_temp_directory(prefix, owner)) and broadcasts its path
// over the Comm; every rank checks that it sees it, and all fail together with one message if any
// does not (ranks on hosts without a shared file system). Throws InvalidInput naming the directory
// and the ranks that see it, std::runtime_error when rank 0 could not make it.
std::filesystem::path shared_temp_directory(Comm& comm, std::string_view prefix,
                                            TempOwner owner = TempOwner::caller);

// A run's directory: `given` (created when missing, and kept), or — `given` empty — a fresh
// temporary one (make_temp_directory(prefix, owner)), removed by remove() or, failing that, by the
// destructor (an exception or an early return included) — unless `keep`. The fault and elastic
// drills' work directories, `tally run qlora`'s adapters.
class WorkDirectory {
 public:
  WorkDirectory(const std::filesystem::path& given, std::string_view prefix, bool keep,
                TempOwner owner = TempOwner::caller);
  ~WorkDirectory() { remove(); }
  WorkDirectory(const WorkDirectory&) = delete;
  WorkDirectory& operator=(const WorkDirectory&) = delete;
  const std::filesystem::path& path() const { return path_; }
  bool remove();  // true when this call (or an earlier one) removed it

 private:
  std::filesystem::path path_;
  bool temporary_ = false, keep_ = false, removed_ = false;
};

}  // namespace tally::engine
