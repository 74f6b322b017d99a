// `tally run health-check` end to end through the real binary under `tally launch`: a healthy
// group flags nothing (k = 3, 4, on a loaded 2-core box too, at a threshold for such a box: Note
// [health-check timing under load]), a rank slowed 8× is named as the straggler (and so is its
// outgoing link), a rank whose GEMM result has one flipped bit is named as the wrong result, and
// bad flags exit 2 with one line. Plus the pure parts (flag_stragglers, majority_value) against
// hand-worked cases. And --calibration (Note [health-check against a calibration]): a calibration
// `tally bench gemm|memory` writes here flags no healthy rank, the same figures made 1000× faster
// flag every rank (a 1-rank run too), a slowed rank is named in both verdicts, another thread
// count's calibration is refused.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../support/subprocess.hpp"
#include "../support/temp_dir.hpp"
#include "tally/engine/experiments/health_check.hpp"

#ifndef TALLY_BINARY
#error "TALLY_BINARY must name the tally executable"
#endif

namespace exp_health_check {
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

// --straggler-threshold 1 (flag below 0.5× the median): on this 2-core box, with ctest running a
// 4-rank training test beside it, healthy ranks have read as low as 0.61× (Note [health-check
// timing under load]); the default 0.5 (0.667×) is for hosts whose ranks own their cores. An
// injected 8× slowdown (below) reads about 0.12× either way.
TEST_P(HealthyGroup, NothingFlaggedAndExitZero) {
  const int k = GetParam();
  const Ran r = run_command(launch(k, {"--straggler-threshold", "1"}), kLimit_s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json j = report(r, k);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["world_size"], k);
  EXPECT_EQ(j["straggler_threshold"].get<double>(), 1.0);
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
  const Ran r = run_command(launch(4, {"--inject-slow-rank", "2", "--inject-slow-factor", "8",
                                       "--straggler-threshold", "1"}),  // as HealthyGroup
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

// ---- --calibration -----------------------------------------------------------------------------

json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

void write_json(const std::filesystem::path& p, const json& j) { std::ofstream(p) << j.dump(1); }

// This host's calibration, written by `tally bench gemm|memory --threads 1 --clock cpu` (gemm with
// --cache warm, as the health check times) now (the health check's own clock: at load 12 a
// wall-clock calibration read 9× below it): GEMMs of m, k in {128, 256, 512} at n = 256 (256³ among
// them), working sets 4, 16 (the health check's) and 64 MiB. Then variants built here from its
// figures: `fitted` without the 256³ GEMM and the 16 MiB point (the model's prediction and the DRAM
// rate then stand in) and 100× slower, `fast` with every figure 1000× faster (seconds ÷ 1000,
// bytes/s × 1000), `threads` claiming 2 threads.
TEST(HealthCheckCalibration, OwnCalibrationFlagsSlowRanksTheMedianCannot) {
  tally::test::TempDir tmp;
  const std::string cal = (tmp / "cal.json").string();
  const Ran gemm = run_command({TALLY_BINARY, "bench", "gemm", "--threads", "1", "--clock", "cpu",
                                "--cache", "warm", "--warmup", "1",
                                "--samples", "3", "--m", "128,256,512", "--n", "256", "--k",
                                "128,256,512", "--calibration-out", cal},
                               120);
  ASSERT_EQ(gemm.exit_code, 0) << gemm.out << gemm.err;
  const Ran memory = run_command({TALLY_BINARY, "bench", "memory", "--threads", "1", "--clock",
                                  "cpu", "--warmup", "1", "--samples", "3", "--sizes-mib",
                                  "4,16,64", "--calibration-out", cal},
                                 120);
  ASSERT_EQ(memory.exit_code, 0) << memory.out << memory.err;
  const json measured = read_json(cal);
  double gemm_256_s = 0, memory_16_bps = 0;
  json fitted = measured, fast = measured, threads = measured;
  // `fitted` is also 100× slower than measured (GEMM seconds × 100, bytes/s ÷ 100; the peak stays,
  // so the fitted GEMM efficiency falls 100×): see (2).
  constexpr double kSlow = 100;
  fitted["kernels"]["gemm"] = json::array();
  for (const json& g : measured["kernels"]["gemm"]) {
    if (g["m"] == 256 && g["k"] == 256) gemm_256_s = g["seconds_median"];
    else fitted["kernels"]["gemm"].push_back(g);
  }
  fitted["kernels"]["memory_curve"] = json::array();
  for (const json& p : measured["kernels"]["memory_curve"]) {
    if (p["working_set_bytes"] == 16.0 * 1048576) memory_16_bps = p["bytes_per_s"];
    else fitted["kernels"]["memory_curve"].push_back(p);
  }
  ASSERT_GT(gemm_256_s, 0.0) << measured.dump();
  ASSERT_GT(memory_16_bps, 0.0) << measured.dump();
  const json& k = measured["kernels"];
  fitted["kernels"]["memory_bytes_per_s"] = k["memory_bytes_per_s"].get<double>() / kSlow;
  for (json& g : fitted["kernels"]["gemm"])
    g["seconds_median"] = g["seconds_median"].get<double>() * kSlow;
  for (json& p : fitted["kernels"]["memory_curve"])
    p["bytes_per_s"] = p["bytes_per_s"].get<double>() / kSlow;
  // 1000×, not 100×: a VM whose hypervisor reports no steal time counts time taken by its host
  // as this process's CPU time, so the calibration's own 256³ GEMM once read 11.7× slower than the
  // health check that followed it (the project's CI of df0812e: 0.117 of the 100× figure). (3)
  // needs only the fast figures far above anything this host can do.
  constexpr double kFast = 1000;
  fast["kernels"]["peak_flops"] = kFast * k["peak_flops"].get<double>();
  fast["kernels"]["memory_bytes_per_s"] = kFast * k["memory_bytes_per_s"].get<double>();
  for (json& g : fast["kernels"]["gemm"])
    g["seconds_median"] = g["seconds_median"].get<double>() / kFast;
  for (json& p : fast["kernels"]["memory_curve"])
    p["bytes_per_s"] = kFast * p["bytes_per_s"].get<double>();
  threads["kernels"]["device"] = "cpu, libtorch 2 threads";
  json cold = measured;  // what `bench gemm` writes by default (Note [cold-cache GEMMs])
  cold["kernels"]["device"] = "cpu, libtorch 1 thread, cold caches";
  write_json(tmp / "fitted.json", fitted);
  write_json(tmp / "fast.json", fast);
  write_json(tmp / "threads.json", threads);
  write_json(tmp / "cold.json", cold);

  // (1) Two ranks, rank 1 slowed 100×, against the calibration as measured: rank 1 is named in
  // both verdicts, healthy rank 0 in neither. Its expected figures are the file's own samples.
  // Flagged below expected / 10 (--calibration-threshold 9): 100× is 10× below it, and a healthy
  // rank stays 10× above it through the swings (2) describes.
  Ran r = run_command(launch(2, {"--rounds", "3", "--calibration", cal, "--calibration-threshold",
                                 "9", "--inject-slow-rank", "1", "--inject-slow-factor", "100"}),
                      kLimit_s);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  json j = report(r, 2);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(ints(j["straggler_ranks"]), std::vector<int>{1}) << j.dump();
  EXPECT_EQ(ints(j["below_calibration_ranks"]), std::vector<int>{1}) << j.dump();
  EXPECT_EQ(j["calibration"]["gemm_basis"], "measured");
  EXPECT_EQ(j["calibration"]["memory_basis"], "measured");
  const double n3 = 256.0 * 256 * 256;
  for (int q = 0; q < 2; ++q) {
    const json& h = j["ranks"][q];
    SCOPED_TRACE(h.dump());
    EXPECT_DOUBLE_EQ(h["gemm_expected_flops_per_s"].get<double>(), 2 * n3 / gemm_256_s);
    EXPECT_DOUBLE_EQ(h["memory_expected_bytes_per_s"].get<double>(), memory_16_bps);
    EXPECT_EQ(h["below_calibration"].get<bool>(), q == 1);
  }
  // 100× the work: rank 1 sits far below rank 0 against the same calibration.
  EXPECT_LT(j["ranks"][1]["gemm_vs_calibration"].get<double>(),
            j["ranks"][0]["gemm_vs_calibration"].get<double>() / 10)
      << j.dump();
  EXPECT_NE(r.err.find("health-check: straggler rank 1;"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("; below its own calibration rank 1"), std::string::npos) << r.err;

  // (2) One rank — no median can judge it — against the fitted variant: healthy, nothing flagged.
  // The calibration was measured a moment ago, maybe while ctest ran another test on the SMT
  // sibling: CPU time alone once read 0.49× of it, and on the project's CI of ef757c9 (a VM) the
  // health check's GEMM read 0.087× of the fit to that run's own GEMMs. So the variant is 100×
  // slower than measured and the margin 10× (--calibration-threshold 9): the healthy verdict is a
  // statement about the fitted basis, not about the machine's load; (3) checks the flagging at
  // the default threshold.
  r = run_command({TALLY_BINARY, "launch", "--nproc", "1", "--timeout", "240", "--", TALLY_BINARY,
                   "run", "health-check", "--rounds", "3", "--calibration",
                   (tmp / "fitted.json").string(), "--calibration-threshold", "9"},
                  kLimit_s);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("gemm from the operator model fitted to its GEMMs, memory from its DRAM "
                       "streaming rate"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("verdict: healthy: nothing flagged"), std::string::npos) << r.out;

  // (3) One rank against the 1000× faster figures: flagged below its calibration on both tests
  // (about 0.001×; < 0.1 even when the calibration itself ran 100× slow), while the median sees
  // nothing.
  r = run_command(launch(1, {"--rounds", "3", "--calibration", (tmp / "fast.json").string()}),
                  kLimit_s);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  j = report(r, 1);
  ASSERT_TRUE(j.is_object());
  EXPECT_TRUE(j["straggler_ranks"].empty()) << j.dump();
  EXPECT_EQ(ints(j["below_calibration_ranks"]), std::vector<int>{0}) << j.dump();
  EXPECT_DOUBLE_EQ(j["ranks"][0]["gemm_expected_flops_per_s"].get<double>(),
                   kFast * 2 * n3 / gemm_256_s);
  EXPECT_TRUE(j["ranks"][0]["gemm_below_calibration"].get<bool>());
  EXPECT_TRUE(j["ranks"][0]["memory_below_calibration"].get<bool>());
  EXPECT_LT(j["ranks"][0]["gemm_vs_calibration"].get<double>(), 0.1) << j.dump();

  // (4) Another thread count's calibration: one line, exit 2, nothing measured.
  r = run_command({TALLY_BINARY, "run", "health-check", "--calibration",
                   (tmp / "threads.json").string()},
                  60);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(r.err, "tally: error: --calibration = " + (tmp / "threads.json").string() +
                       ": measured on 'cpu, libtorch 2 threads' at fp32; health-check times "
                       "'cpu, libtorch 1 thread' at fp32 (calibrate with `tally bench gemm "
                       "--threads 1 --clock cpu --cache warm --calibration-out FILE` and `tally "
                       "bench memory` with the same --threads and --clock)\n");

  // (5) A cold-cache GEMM calibration (bench gemm's default): the health check times warm, so it
  // is another device — refused the same way, the fix named.
  r = run_command({TALLY_BINARY, "run", "health-check", "--calibration",
                   (tmp / "cold.json").string()},
                  60);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("measured on 'cpu, libtorch 1 thread, cold caches'"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("--cache warm"), std::string::npos) << r.err;
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
}  // namespace exp_health_check
