// The reliability ledger against the seed's figures (seed §A4 and its 方案 section) and
// DESIGN.md §1 erratum 1, each erratum test showing the seed's own formula next to tally's.
#include "tally/core/reliability.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tally/core/types.hpp"

namespace tally::test_reliability {
namespace {

constexpr double kLambda = 3e-6;         // seed §A4: λ ≈ 3e-6 per GPU-hour (需核实)
constexpr double kSaveHours = 56.0 / 3600;  // seed §A4 (2): 112 GB / 2 GB/s = 56 s
constexpr double kRestartHours = 8.0 / 60;  // seed §A4 (3): 5 + 3 minutes lost per failure

// seed §A4 (1): G = 8 → ≈4.2e4 h; 512 → ≈650 h; 8192 → ≈41 h (40.7); 16384 → ≈20 h.
TEST(Reliability, SeedA4_MtbfAtScale) {
  EXPECT_NEAR(mtbf_hours(8, kLambda), 4.2e4, 500);
  EXPECT_NEAR(mtbf_hours(512, kLambda), 651, 1);
  EXPECT_NEAR(mtbf_hours(8192, kLambda), 40.7, 0.05);
  EXPECT_NEAR(mtbf_hours(16384, kLambda), 20.3, 0.1);
  EXPECT_TRUE(std::isinf(mtbf_hours(8192, 0.0)));
}

// seed §A4 (2): sharded 112/2 = 56 s; full 128 × 112 GB = 14,336 GB → 7168 s ≈ 2 h.
TEST(Reliability, SeedA4_SaveTimes) {
  EXPECT_DOUBLE_EQ(save_seconds(112e9, 2e9), 56.0);
  EXPECT_DOUBLE_EQ(save_seconds(112e9, 2e9, 128), 7168.0);
  EXPECT_NEAR(save_seconds(112e9, 2e9, 128) / 3600, 2.0, 0.01);
}

// Erratum 1, f = 0.5/h (MTBF 2 h): the seed's E(T) = 4fT + 55.8/T has its minimum at
// T* = √(55.8 / 4f) = √(13.95/f) ≈ 5.3 h (seed §A4 (3)); with consistent units tally's optimum is
// Young's √(2·C·MTBF) = √(2 × 56/3600 h × 2 h) = 0.2494 h ≈ 15 min (Young 1974).
TEST(Reliability, Erratum1_SeedFormulaVersusYoungAtMtbfTwoHours) {
  const double f = 0.5;
  const double seed_T = 5.28;  // the seed's √(13.95/0.5) = 5.28 h
  const double young = young_interval_hours(kSaveHours, 1 / f);
  EXPECT_NEAR(young, 0.2494, 0.0005);
  EXPECT_NEAR(young * 60, 15.0, 0.3);
  // At its own optimum tally loses less than at the seed's 5.3 h.
  EXPECT_LT(overhead_fraction(young, kSaveHours, kRestartHours, 1 / f),
            overhead_fraction(seed_T, kSaveHours, kRestartHours, 1 / f));
}

// Erratum 1 at 8192 GPUs (MTBF 40.7 h): the seed's T* ≈ 24 h and "E ≈ 7.7 %"; tally: Young
// ≈1.13 h, Daly ≈1.11 h, overhead ≈3.1 % there, and ≈30 % at 24 h — the 7.7 % is wrong.
TEST(Reliability, Erratum1_EightThousandGpus) {
  const double mtbf = mtbf_hours(8192, kLambda);
  const double seed_f = 0.024;  // the seed rounds 1/41
  const double seed_T = std::sqrt(13.95 / seed_f);
  EXPECT_NEAR(seed_T, 24.1, 0.1);
  const double seed_E24 = 0.5 * seed_f * 24 * 8 + 60.0 / 24 * 0.93;  // minutes per hour
  EXPECT_NEAR(seed_E24 / 60, 0.077, 0.001);                          // the seed's "≈7.7 %"

  const double young = young_interval_hours(kSaveHours, mtbf);
  const double daly = daly_interval_hours(kSaveHours, mtbf);
  EXPECT_NEAR(young, 1.13, 0.01);
  EXPECT_NEAR(daly, 1.11, 0.01);
  EXPECT_LT(daly, young);
  EXPECT_NEAR(overhead_fraction(young, kSaveHours, kRestartHours, mtbf), 0.031, 0.002);
  EXPECT_NEAR(overhead_fraction(daly, kSaveHours, kRestartHours, mtbf), 0.031, 0.002);
  const double at24 = overhead_fraction(24, kSaveHours, kRestartHours, mtbf);
  EXPECT_NEAR(at24, 0.30, 0.01);
  EXPECT_GT(at24 - seed_E24 / 60, 0.2);  // the seed's 7.7 % undercounts by > 20 points
}

// seed 方案 section: 8192 GPUs for 30 days → ≈18 interruptions (720/40.7 = 17.7).
TEST(Reliability, SeedThirtyDaysAtEightThousandGpus) {
  EXPECT_NEAR(expected_failures(30 * 24, mtbf_hours(8192, kLambda)), 17.7, 0.1);
}

TEST(Reliability, ReportBundlesTheLedger) {
  const auto r = reliability(ReliabilitySetup{.gpus = 8192, .failure_rate_per_hour = kLambda,
                                              .state_bytes = 112e9, .write_bps = 2e9,
                                              .restart_hours = kRestartHours,
                                              .interval_hours = 24.0, .run_hours = 720.0,
                                              .full_copies = 128});
  EXPECT_NEAR(r.mtbf_hours, 40.7, 0.05);
  EXPECT_DOUBLE_EQ(r.save_seconds, 56.0);
  EXPECT_DOUBLE_EQ(r.full_save_seconds, 7168.0);
  EXPECT_NEAR(r.young_interval_hours, 1.13, 0.01);
  EXPECT_EQ(r.recommended_interval_hours, r.daly_interval_hours);
  EXPECT_NEAR(r.overhead_at_recommended, 0.031, 0.002);
  ASSERT_TRUE(r.overhead_at_given.has_value());
  EXPECT_NEAR(*r.overhead_at_given, 0.30, 0.01);
  ASSERT_TRUE(r.expected_failures.has_value());
  EXPECT_NEAR(*r.expected_failures, 17.7, 0.1);
  EXPECT_NE(r.convention().find("G=8192"), std::string::npos) << r.convention();
  EXPECT_NE(r.convention().find("Daly"), std::string::npos) << r.convention();
  const auto plain = reliability(ReliabilitySetup{.gpus = 8, .state_bytes = 1e9});
  EXPECT_FALSE(plain.overhead_at_given.has_value());
  EXPECT_FALSE(plain.expected_failures.has_value());
}

TEST(Reliability, ZeroFailureRateIsClean) {
  const auto r = reliability(ReliabilitySetup{.gpus = 8, .failure_rate_per_hour = 0,
                                              .state_bytes = 112e9, .restart_hours = 0.1,
                                              .interval_hours = 2.0, .run_hours = 100.0});
  EXPECT_TRUE(std::isinf(r.mtbf_hours));
  EXPECT_TRUE(std::isinf(r.recommended_interval_hours));
  EXPECT_EQ(r.overhead_at_recommended, 0.0);
  EXPECT_DOUBLE_EQ(*r.overhead_at_given, kSaveHours / 2.0);
  EXPECT_EQ(*r.expected_failures, 0.0);
}

// Daly 2006 eq. 37: T = M once C >= 2M.
TEST(Reliability, DalyFallsBackToMtbfForHugeCheckpoints) {
  EXPECT_EQ(daly_interval_hours(5.0, 2.0), 2.0);
  EXPECT_EQ(daly_interval_hours(0.0, 2.0), 0.0);
}

// Property: the overhead is convex with its minimum near Young's interval.
TEST(Reliability, PropertyOverheadMinimalNearYoung) {
  for (double mtbf : {0.5, 2.0, 40.7, 651.0, 4e4})
    for (double C : {10.0 / 3600, kSaveHours, 0.25})
      for (double R : {0.0, kRestartHours, 1.0}) {
        const double y = young_interval_hours(C, mtbf);
        const double at = overhead_fraction(y, C, R, mtbf);
        EXPECT_LE(at, overhead_fraction(0.5 * y, C, R, mtbf));
        EXPECT_LE(at, overhead_fraction(2.0 * y, C, R, mtbf));
        // Convex: the midpoint lies below the chord.
        const double a = overhead_fraction(0.5 * y, C, R, mtbf);
        const double b = overhead_fraction(2.0 * y, C, R, mtbf);
        EXPECT_LE(overhead_fraction(1.25 * y, C, R, mtbf), 0.5 * (a + b));
      }
}

TEST(Reliability, RejectsBadInput) {
  EXPECT_THROW(mtbf_hours(0, kLambda), InvalidInput);
  EXPECT_THROW(mtbf_hours(8, -1), InvalidInput);
  EXPECT_THROW(save_seconds(1e9, 0), InvalidInput);
  EXPECT_THROW(overhead_fraction(0, 0.1, 0.1, 10), InvalidInput);
  EXPECT_THROW(young_interval_hours(0.1, 0), InvalidInput);
  try {
    reliability(ReliabilitySetup{.gpus = 8, .state_bytes = 1e9, .write_bps = -2});
    ADD_FAILURE();
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("write_bps = -2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tally::test_reliability
