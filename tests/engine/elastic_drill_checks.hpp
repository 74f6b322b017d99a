// The checks of `tally run fault-drill --elastic`'s JSON report from host 0, shared by the
// one-machine test (exp_elastic_drill.cpp) and the namespace test (test_multihost.cpp): 2 hosts ×
// K ranks, 8 steps, a checkpoint every 4, host 1 lost mid-step at step 6, consistency checks every
// 2 steps (the drill's defaults). Expected values from the run's definition (B = 48 samples per step, so step c = 4 and
// consumed_samples = 48·step), not from the drill; its uninterrupted figures are a separate run,
// checked beside the resumed ones.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>

namespace tally::elastic_drill {

using nlohmann::json;

inline constexpr std::int64_t kBatch = 48;  // tally run checkpoint's default global batch
// float32 sums of the same batch in another order, carried through a few Adam steps: a few ulp
// (~1e-7) per step; the drill's default tolerance is 1e-5 relative (≈ 80 ulp).
inline constexpr double kTolerance = 1e-5;

// Host 0's report of 2 hosts × K ranks.
inline void expect_host0_report(const json& j, int K) {
  SCOPED_TRACE(j.dump(1));
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["world_size_before"], 2 * K);
  EXPECT_EQ(j["world_size_after"], K);
  // The same global batch of micro-batches of one size: 2K ranks × 1 before, K ranks × 2 after.
  EXPECT_EQ(j["grad_accum_before"], 1);
  EXPECT_EQ(j["grad_accum_after"], 2);
  EXPECT_EQ(j["global_batch"], kBatch);
  EXPECT_EQ(j["micro_batch"], kBatch / (2 * K));
  json lost = json::array();
  for (int q = K; q < 2 * K; ++q) lost.push_back(q);
  EXPECT_EQ(j["lost_ranks"], lost);
  // The loss: host 0's launcher exits 1 and names a rank of host 1 (or a rank of host 0 failed
  // first, its error naming the lost ranks).
  ASSERT_EQ(j["loss"].size(), j["hosts_here"].size());
  EXPECT_EQ(j["loss"][0]["exit_code"], 1);
  EXPECT_TRUE(j["loss_named"].get<bool>());
  // The last checkpoint before step 6 is step 4's, saved by 2K ranks.
  EXPECT_TRUE(j["checkpoint_verifies"].get<bool>());
  EXPECT_EQ(j["checkpoint_step"], 4);
  EXPECT_EQ(j["checkpoint_world_size"], 2 * K);
  // The resume: resharded from 2K to K ranks, at step 4 with 4·48 samples consumed.
  EXPECT_EQ(j["resume"]["exit_code"], 0);
  EXPECT_EQ(j["loaded_world_size"], 2 * K);
  EXPECT_EQ(j["resumed_world_size"], K);
  EXPECT_EQ(j["resume_step"], 4);
  EXPECT_EQ(j["reference_step"], 4);
  EXPECT_EQ(j["resume_consumed_samples"], 4 * kBatch);
  EXPECT_EQ(j["reference_consumed_samples"], 4 * kBatch);
  EXPECT_GT(j["restart_s"].get<double>(), 0.0);
  // Steps 5–8 after it, each beside the uninterrupted run's.
  ASSERT_EQ(j["resumed_steps"].size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    const json& s = j["resumed_steps"][i];
    const std::int64_t step = 5 + std::int64_t(i);
    EXPECT_EQ(s["step"], step);
    EXPECT_EQ(s["consumed_samples"], step * kBatch);
    EXPECT_EQ(s["reference_consumed_samples"], step * kBatch);
    const double loss = s["loss"], ref_loss = s["reference_loss"];
    const double norm = s["grad_norm"], ref_norm = s["reference_grad_norm"];
    EXPECT_GT(ref_loss, 0.0);
    EXPECT_GT(ref_norm, 0.0);
    EXPECT_LE(std::abs(loss - ref_loss), kTolerance * ref_loss) << "step " << step;
    EXPECT_LE(std::abs(norm - ref_norm), kTolerance * ref_norm) << "step " << step;
    EXPECT_NEAR(s["loss_rel_diff"].get<double>(), std::abs(loss - ref_loss) / ref_loss, 1e-15);
  }
  EXPECT_EQ(j["final_step"], 8);
  // Consistency checks at steps 2, 4, 6, 8 in the reference and 6, 8 after the resume, all agreed.
  EXPECT_EQ(j["reference_consistency_checks"], 4);
  EXPECT_EQ(j["resume_consistency_checks"], 2);
  EXPECT_TRUE(j["consistency_checks_agree"].get<bool>());
  EXPECT_EQ(j["leftover_pids"], json::array());
}

}  // namespace tally::elastic_drill
