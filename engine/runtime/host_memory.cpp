// This host's memory and ranks (host_memory.hpp).
#include "tally/engine/host_memory.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "tally/core/types.hpp"

namespace tally::engine {

double host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page)
                               : std::numeric_limits<double>::infinity();
}

int ranks_on_host() {
  const char* text = std::getenv("LOCAL_WORLD_SIZE");
  const int n = text != nullptr ? std::atoi(text) : 1;
  return std::clamp(n, 1, 1 << 20);
}

void require_fits_host(double bytes_per_rank, const std::string& what) {
  const double host = host_memory_bytes();
  const int ranks = ranks_on_host();
  if (bytes_per_rank * ranks > host)
    throw InvalidInput(what + " " + format_bytes(bytes_per_rank, SizeUnit::GB) + " per rank, " +
                       format_bytes(bytes_per_rank * ranks, SizeUnit::GB) + " on this host's " +
                       std::to_string(ranks) + " rank(s), more than its memory (" +
                       format_bytes(host, SizeUnit::GB) + ")");
}

}  // namespace tally::engine
