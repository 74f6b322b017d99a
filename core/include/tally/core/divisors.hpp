// The divisors of a count: the planner's layouts and the engine's "allowed:" messages (one place).
#pragma once

#include <cstdint>
#include <vector>

namespace tally {

// The divisors of n >= 1 in increasing order, found in O(√n).
std::vector<std::int64_t> divisors(std::int64_t n);

}  // namespace tally
