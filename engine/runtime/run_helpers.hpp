// Small helpers the engine's models and experiments share (one place, not a copy per file: the
// engine compiles as unity builds, Note [unity build] in the top CMakeLists.txt). Torch-free.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>

#include "tally/core/divisors.hpp"
#include "tally/core/types.hpp"

namespace tally::engine {

// Throws InvalidInput "<flag> = <value>: <allowed>" unless ok (the CLI prints it and exits 2).
inline void require(bool ok, const char* flag, std::int64_t value, const std::string& allowed) {
  if (!ok) throw InvalidInput(std::string(flag) + " = " + std::to_string(value) + ": " + allowed);
}

// |x − ref| / |ref|; |x − ref| where ref is 0.
inline double rel_diff(double x, double ref) {
  return ref != 0 ? std::abs(x - ref) / std::abs(ref) : std::abs(x - ref);
}

// "1, 2, 4, 8": n's divisors (core's, O(√n)), for an error message naming the allowed values.
inline std::string divisors_of(std::int64_t n) {
  std::string s;
  for (const std::int64_t d : divisors(n)) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return s;
}

// Seconds on the steady clock since t0.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Seconds since the Unix epoch (wall clock), as the drills' event logs record them.
inline double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace tally::engine
