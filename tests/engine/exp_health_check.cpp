// `tally run health-check` end to end through the real binary under `tally launch`: a healthy
// group flags nothing (k = 3, 4, on a loaded 2-core box too: Note [health-check timing under
// load]), a rank slowed 8× is named as the straggler (and so is its outgoing link), a rank whose
// GEMM result has one flipped bit is named as the wrong result, and bad flags exit 2 with one
// line. Plus the pure parts (flag_stragglers, majority_value) against hand-worked cases.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../support/subprocess.hpp"
#include "tally/engine/experiments/health_check.hpp"

#ifndef TALLY_BINARY
#error "TALLY_BINARY must name the tally executable"
#endif

namespace {

using nlohmann::json;
using tally::subprocess::rank_lines;
using tally::subprocess::Ran;
using tally::subprocess::run_command;

constexpr double kLimit_s = 250;  // whole launch: ~10 s unloaded, 80 s seen at load 13 on 2 cores

std::vector<std::string> launch(int k, std::vector<std::string> extra) {
  std::vector<std::string> args = {TALLY_BINARY, "launch", "--nproc", std::to_string(k),
                                   "--timeout", "240", "--", TALLY_BINARY, "run", "health-check",
                                   "--json", "--timeout", "60"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// Rank 0's one JSON object; the other ranks print nothing.
json report(const Ran& r, int k) {
  const auto lines = rank_lines(r.out, 0);
  EXPECT_EQ(lines.size(), 1u) << r.out << r.err;
  for (int rank = 1; rank < k; ++rank) EXPECT_TRUE(rank_lines(r.out, rank).empty()) << r.out;
  if (lines.empty()) return json();
  json j = json::parse(lines[0], nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << lines[0];
  return j;
}

std::vector<int> ints(const json& j) { return j.get<std::vector<int>>(); }

// ---- pure parts --------------------------------------------------------------------------------

TEST(HealthCheckFlags, StragglerIsMoreThanThresholdSlowerThanTheMedian) {
  using tally::engine::flag_stragglers;
  // median 100; limit 100 / 1.25 = 80: 80 is not slower by more than 25 %, 79 is.
  EXPECT_EQ(flag_stragglers({100, 100, 80}, 0.25), (std::vector<bool>{false, false, false}));
  EXPECT_EQ(flag_stragglers({100, 100, 79}, 0.25), (std::vector<bool>{false, false, true}));
  // Even count: median (100 + 100) / 2; one rank at a quarter of the speed.
  EXPECT_EQ(flag_stragglers({100, 25, 100, 110}, 0.25),
            (std::vector<bool>{false, true, false, false}));
  // Two ranks: the median is their mean 62.5, limit 50: the 4× slower one (25) is flagged.
  EXPECT_EQ(flag_stragglers({100, 25}, 0.25), (std::vector<bool>{false, true}));
  // A faster rank is never a straggler; one rank alone is its own median.
  EXPECT_EQ(flag_stragglers({100, 1000, 100}, 0.25), (std::vector<bool>{false, false, false}));
  EXPECT_EQ(flag_stragglers({7}, 0.25), (std::vector<bool>{false}));
  EXPECT_TRUE(flag_stragglers({}, 0.25).empty());
}

TEST(HealthCheckFlags, MajorityNeedsMoreThanHalf) {
  using tally::engine::majority_value;
  EXPECT_EQ(majority_value({5, 5, 9}), 5u);
  EXPECT_EQ(majority_value({9, 5, 5, 5}), 5u);
  EXPECT_EQ(majority_value({7}), 7u);
  EXPECT_FALSE(majority_value({5, 9}).has_value());        // a tie names nobody right
  EXPECT_FALSE(majority_value({5, 5, 9, 9}).has_value());
  EXPECT_FALSE(majority_value({}).has_value());
}

// ---- through the binary ------------------------------------------------------------------------

class HealthyGroup : public ::testing::TestWithParam<int> {};

TEST_P(HealthyGroup, NothingFlaggedAndExitZero) {
  const int k = GetParam();
  const Ran r = run_command(launch(k, {}), kLimit_s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json j = report(r, k);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["world_size"], k);
  EXPECT_TRUE(j["ok"].get<bool>()) << j.dump();
  EXPECT_TRUE(j["straggler_ranks"].empty()) << j.dump();
  EXPECT_TRUE(j["straggler_links"].empty()) << j.dump();
  EXPECT_TRUE(j["wrong_result_ranks"].empty()) << j.dump();
  ASSERT_EQ(j["ranks"].size(), std::size_t(k));
  ASSERT_EQ(j["links"].size(), std::size_t(k));
  const std::string sum = j["ranks"][0]["checksum_crc32c"];
  for (int q = 0; q < k; ++q) {
    const json& h = j["ranks"][q];
    SCOPED_TRACE(h.dump());
    EXPECT_EQ(h["rank"], q);
    EXPECT_EQ(h["checksum_crc32c"], sum);  // the same GEMM on one machine: bit for bit
    EXPECT_GT(h["gemm_flops_per_s"].get<double>(), 1e8);      // any CPU core of the last 20 years
    EXPECT_GT(h["memory_bytes_per_s"].get<double>(), 1e8);
    EXPECT_EQ(j["links"][q]["src"], q);
    EXPECT_EQ(j["links"][q]["dst"], (q + 1) % k);
    EXPECT_GT(j["links"][q]["bytes_per_s"].get<double>(), 0.0);
  }
  EXPECT_EQ(j["majority_checksum_crc32c"], sum);
  EXPECT_EQ(j["link_message_bytes"].get<double>(), 4e6);
  EXPECT_GT(j["all_reduce"]["busbw_bps"].get<double>(), 0.0);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, HealthyGroup, ::testing::Values(3, 4),
                         [](const auto& info) { return "k" + std::to_string(info.param); });

TEST(HealthCheckFault, SlowedRankIsNamedAsStraggler) {
  const Ran r = run_command(launch(4, {"--inject-slow-rank", "2", "--inject-slow-factor", "8"}),
                            kLimit_s);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;  // launch: rank 0 failed with the verdict
  const json j = report(r, 4);
  ASSERT_TRUE(j.is_object());
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_EQ(ints(j["straggler_ranks"]), std::vector<int>{2}) << j.dump();
  EXPECT_EQ(ints(j["straggler_links"]), std::vector<int>{2}) << j.dump();  // its link 2→3
  EXPECT_TRUE(j["wrong_result_ranks"].empty()) << j.dump();
  // 8× the work per call: about an eighth of the median (0.5 leaves room for noise).
  EXPECT_LT(j["ranks"][2]["gemm_vs_median"].get<double>(), 0.5) << j.dump();
  EXPECT_LT(j["ranks"][2]["memory_vs_median"].get<double>(), 0.5) << j.dump();
  EXPECT_NE(r.err.find("health-check: straggler rank 2; straggler link 2→3"), std::string::npos)
      << r.err;
}

TEST(HealthCheckFault, CorruptedRankIsNamedAsWrongResult) {
  const Ran r = run_command(launch(3, {"--inject-corrupt-rank", "1"}), kLimit_s);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const json j = report(r, 3);
  ASSERT_TRUE(j.is_object());
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_EQ(ints(j["wrong_result_ranks"]), std::vector<int>{1}) << j.dump();
  EXPECT_TRUE(j["ranks"][1]["wrong_result"].get<bool>());
  EXPECT_NE(j["ranks"][1]["checksum_crc32c"], j["ranks"][0]["checksum_crc32c"]);
  EXPECT_EQ(j["ranks"][2]["checksum_crc32c"], j["ranks"][0]["checksum_crc32c"]);
  EXPECT_EQ(j["majority_checksum_crc32c"], j["ranks"][0]["checksum_crc32c"]);
  EXPECT_NE(r.err.find("wrong result rank 1"), std::string::npos) << r.err;
}

TEST(HealthCheckText, ReportNamesEveryRankAndLink) {
  const Ran r = run_command(
      {TALLY_BINARY, "launch", "--nproc", "2", "--timeout", "240", "--", TALLY_BINARY, "run",
       "health-check", "--timeout", "60", "--inject-corrupt-rank", "0"},
      kLimit_s);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const auto lines = rank_lines(r.out, 0);
  ASSERT_GE(lines.size(), 9u) << r.out;
  EXPECT_EQ(lines[0].rfind("health-check: 2 ranks", 0), 0u) << lines[0];
  // Two ranks that disagree: no majority, so neither can be trusted.
  EXPECT_NE(lines[2].find("WRONG RESULT"), std::string::npos) << lines[2];
  EXPECT_NE(lines[3].find("WRONG RESULT"), std::string::npos) << lines[3];
  EXPECT_NE(r.out.find("majority none"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0→1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1→0"), std::string::npos) << r.out;
  EXPECT_EQ(lines.back().rfind("  verdict: ", 0), 0u) << lines.back();
  EXPECT_NE(lines.back().find("wrong result rank 0, 1"), std::string::npos) << lines.back();
}

TEST(HealthCheckInput, BadThresholdIsOneLineAndExitTwo) {
  const Ran r =
      run_command({TALLY_BINARY, "run", "health-check", "--straggler-threshold", "50"}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(r.err, "tally: error: --straggler-threshold: '50' must be a finite number in "
                   "[0.01, 10]\n");
}

TEST(HealthCheckInput, FaultRankOutsideTheGroupIsBadInput) {
  const Ran r = run_command(launch(2, {"--inject-slow-rank", "2"}), kLimit_s);
  EXPECT_EQ(r.exit_code, 1) << r.err;  // launch: a rank failed (each exits 2)
  EXPECT_NE(r.err.find("--inject-slow-rank = 2: must be -1 (none) or a rank in [0, 1]"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("exited with status 2"), std::string::npos) << r.err;
}

}  // namespace
