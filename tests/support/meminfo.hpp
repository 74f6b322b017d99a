// The host's memory as /proc/meminfo's MemTotal says (tests of the engine's host-memory checks,
// which read sysconf: an independent figure, a little below the physical memory).
#pragma once

#include <fstream>
#include <string>

namespace tally::test_support {

// Bytes; 0 where /proc/meminfo is unreadable.
inline double mem_total_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  double kib = 0;
  while (in >> key >> kib) {
    if (key == "MemTotal:") return kib * 1024;
    std::getline(in, unit);
  }
  return 0;
}

}  // namespace tally::test_support
