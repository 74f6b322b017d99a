// Temporary directories (tally/engine/temp_directory.hpp).
#include "tally/engine/temp_directory.hpp"

#include <stdlib.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <system_error>
#include <vector>

#include "tally/core/types.hpp"

namespace tally::engine {

namespace fs = std::filesystem;

namespace {

// Rank 0's `text` on every rank. The Comm carries numbers: the length, then one byte per double
// (exact).
std::string broadcast_text(Comm& comm, const std::string& text) {
  std::vector<double> length = {double(text.size())};
  comm.broadcast(length, 0);
  std::vector<double> bytes(static_cast<std::size_t>(length[0]));
  if (comm.rank() == 0)
    for (std::size_t i = 0; i < text.size(); ++i)
      bytes[i] = double(static_cast<unsigned char>(text[i]));
  if (!bytes.empty()) comm.broadcast(bytes, 0);
  std::string out;
  for (double b : bytes) out.push_back(static_cast<char>(static_cast<unsigned char>(b)));
  return out;
}

}  // namespace

fs::path make_temp_directory(std::string_view prefix, TempOwner owner) {
  fs::path base = fs::temp_directory_path();
  if (owner == TempOwner::launcher)  // Note [launch scratch]
    if (const char* scratch = std::getenv(kLaunchScratchEnv); scratch != nullptr && *scratch) {
      std::error_code ec;
      if (fs::is_directory(scratch, ec)) base = scratch;
    }
  std::string path = (base / (std::string(prefix) + "-XXXXXX")).string();
  if (::mkdtemp(path.data()) == nullptr)
    throw std::system_error(errno, std::generic_category(), path + ": mkdtemp");
  return path;
}

// Rank 0 makes the directory, every rank learns its path and checks that it sees it.
fs::path shared_temp_directory(Comm& comm, std::string_view prefix, TempOwner owner) {
  const int r = comm.rank(), k = comm.world_size();
  std::string made;
  std::exception_ptr error;
  if (r == 0) {
    try {
      made = make_temp_directory(prefix, owner).string();  // < PATH_MAX bytes
    } catch (...) {
      error = std::current_exception();
    }
  }
  const fs::path dir = broadcast_text(comm, made);  // empty: rank 0 failed
  std::error_code ec;
  std::vector<double> seen = {!dir.empty() && fs::is_directory(dir, ec) ? 1.0 : 0.0};
  comm.all_reduce(seen, ReduceOp::sum);
  if (error) std::rethrow_exception(error);
  if (dir.empty())
    throw std::runtime_error("rank " + std::to_string(r) +
                             ": rank 0 could not make a temporary checkpoint directory (its "
                             "message says why): pass --dir");
  if (seen[0] != double(k)) {
    if (r == 0) fs::remove_all(dir, ec);
    throw InvalidInput("rank " + std::to_string(r) + ": the temporary checkpoint directory " +
                       dir.string() + " that rank 0 made is seen by " +
                       std::to_string(std::int64_t(seen[0])) + " of " + std::to_string(k) +
                       " ranks (are they on other hosts?): pass --dir on a file system every "
                       "rank shares");
  }
  return dir;
}

WorkDirectory::WorkDirectory(const fs::path& given, std::string_view prefix, bool keep,
                             TempOwner owner)
    : path_(given), temporary_(given.empty()), keep_(keep) {
  if (temporary_)
    path_ = make_temp_directory(prefix, owner);
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

}  // namespace tally::engine
