// A recorded measurement in tests/data, parsed once (and the median the validation tests print).
// Returned by reference to one object that outlives every loop: a range-for over a member of a
// returned temporary would read freed memory (ASan: heap-use-after-free).
#pragma once

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tally {

inline const nlohmann::json& fixture(const std::string& file) {
  static std::map<std::string, nlohmann::json> cache;
  auto it = cache.find(file);
  if (it == cache.end()) {
    std::ifstream f(std::string(TALLY_DATA) + "/" + file);
    it = cache.emplace(file, nlohmann::json::parse(f)).first;
  }
  return it->second;
}

// The median of the validation tests' errors and ratios (the mean of the middle two for an even
// count).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace tally
