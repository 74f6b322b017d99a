// A recorded measurement in tests/data, parsed once. Returned by reference to one object that
// outlives every loop: a range-for over a member of a returned temporary would read freed memory
// (ASan: heap-use-after-free).
#pragma once

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

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

}  // namespace tally
