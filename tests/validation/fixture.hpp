// A recorded measurement in tests/data, parsed once (and the median the validation tests print).
// Returned by reference to one object that outlives every loop: a range-for over a member of a
// returned temporary would read freed memory (ASan: heap-use-after-free).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tally/core/planner.hpp"

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

// The median and range of predicted / published over a group of judged rows, and the goal the
// kept-aside judgements wrote down before their first prediction (test_published_fsdp.cpp,
// test_published_bridge.cpp): median |error| <= 25 % and every row within a factor 2.
struct Spread {
  std::size_t n = 0;
  double median_ratio = 0, median_abs_error = 0, low = 0, high = 0;
  bool met() const { return median_abs_error <= 0.25 && low >= 0.5 && high <= 2; }
};
inline Spread spread(const std::vector<double>& ratios) {
  Spread s{.n = ratios.size()};
  if (ratios.empty()) return s;
  std::vector<double> err;
  for (double r : ratios) err.push_back(r > 1 ? r - 1 : 1 - r);
  s.median_ratio = median(ratios);
  s.median_abs_error = median(err);
  const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
  s.low = *lo;
  s.high = *hi;
  return s;
}

// Note [error band]: a printed band is its rows' observed measured / predicted — the range, the
// median and the largest spread within one table — rounded outward, and tight (it moves with the
// model).
inline void expect_band_is(const ErrorBand& band, double lo, double hi, double med,
                           double rank_spread) {
  EXPECT_LE(band.low, lo);
  EXPECT_GE(band.high, hi);
  EXPECT_GT(band.low, lo - 0.01);
  EXPECT_LT(band.high, hi + 0.01);
  EXPECT_NEAR(band.median, med, 0.01);
  EXPECT_GE(band.rank_spread, rank_spread);
  EXPECT_LT(band.rank_spread, rank_spread + 0.005);
}

}  // namespace tally
