// Temporary directories for runs given none (torch-free).
#pragma once

#include <filesystem>
#include <string_view>

#include "tally/engine/comm.hpp"

namespace tally::engine {

// <system temp dir>/<prefix>-XXXXXX made by mkdtemp(3): a new directory (mode 0700) that no other
// process chose. For runs given no directory: `tally run checkpoint`'s default and `tally run
// fault-drill`'s work directory; whoever calls it removes it. Throws std::system_error naming the
// path when it cannot be created.
std::filesystem::path make_temp_directory(std::string_view prefix);

// Rank 0 makes a temporary directory (make_temp_directory(prefix)) and broadcasts its path over
// the Comm; every rank checks that it sees it, and all fail together with one message if any does
// not (ranks on hosts without a shared file system). Throws InvalidInput naming the directory and
// the ranks that see it, std::runtime_error when rank 0 could not make it.
std::filesystem::path shared_temp_directory(Comm& comm, std::string_view prefix);

}  // namespace tally::engine
