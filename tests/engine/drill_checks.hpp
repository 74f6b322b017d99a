// The checks of the drills' JSON reports, shared by the one-machine tests (exp_fault_drill.cpp,
// exp_elastic_drill.cpp) and the namespace tests (test_multihost.cpp).
//
// fault_drill::expect_scenario: one kill scenario of `tally run fault-drill` (Note [detection
// criterion]; the resume exact).
//
// elastic_drill::expect_host0_report: `tally run fault-drill --elastic`'s report from host 0:
// 2 hosts × K ranks, 8 steps, a checkpoint every 4, host 1 lost mid-step at step 6, consistency checks every
// 2 steps (the drill's defaults). Expected values from the run's definition (B = 48 samples per step, so step c = 4 and
// consumed_samples = 48·step), not from the drill; its uninterrupted figures are a separate run,
// checked beside the resumed ones.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace tally::fault_drill {

using nlohmann::json;

inline constexpr double kTimeout_s = 5;         // the drill's collective timeout (its default)
inline constexpr double kKillGrace_s = 3;       // tally launch's SIGTERM → SIGKILL (LaunchOptions)
inline constexpr std::int64_t kBatch = 48;      // tally run checkpoint's default global batch

// k ranks, rank kill_rank killed at kill_step; `launch_names` is what every launcher's line must
// hold: "rank q failed (killed by signal 9 (SIGKILL))" on one host, the rank, its node and host
// across hosts.
inline void expect_scenario(const json& s, int kill_rank, std::int64_t kill_step, int k,
                            const std::string& launch_names) {
  SCOPED_TRACE(s.dump(1));
  EXPECT_EQ(s["kill_step"], kill_step);
  // Detection (Note [detection criterion]): `tally launch` exits 1 naming the dead rank and every
  // rank is gone within the collective timeout + the kill grace; each survivor either noticed —
  // a CommError naming the dead rank within the collective timeout — or was stopped by the
  // launcher first (SIGTERM / SIGKILL, or its report of the SIGTERM), naming nobody.
  EXPECT_EQ(s["failed"]["exit_code"], 1);
  EXPECT_NE(s["failed"]["message"].get<std::string>().find(launch_names), std::string::npos);
  ASSERT_EQ(s["survivors"].size(), std::size_t(k - 1));
  double slowest = -1;
  for (const json& v : s["survivors"]) {
    EXPECT_NE(v["rank"], kill_rank);
    const std::string outcome = v["outcome"], error_line = v["error_line"], exit = v["exit"];
    if (outcome == "noticed") {
      EXPECT_EQ(v["lost_ranks"], json::array({kill_rank}));
      EXPECT_GE(v["detection_s"].get<double>(), 0.0);
      EXPECT_LT(v["detection_s"].get<double>(), kTimeout_s);
      EXPECT_NE(error_line.find("tally: error: rank " + v["rank"].dump() + ": lost rank " +
                                std::to_string(kill_rank) + " at step " +
                                std::to_string(kill_step) + ": "),
                std::string::npos);
      slowest = std::max(slowest, v["detection_s"].get<double>());
    } else {
      EXPECT_EQ(outcome, "stopped_by_launcher");
      EXPECT_EQ(v["lost_ranks"], json::array());
      EXPECT_EQ(v["detection_s"].get<double>(), -1.0);
      const bool by_signal =
          exit == "killed by signal 15 (SIGTERM)" || exit == "killed by signal 9 (SIGKILL)";
      const bool reported_sigterm =
          exit == "exited with status 1" &&
          error_line.rfind("tally: error: rank " + v["rank"].dump() + ": stopped by SIGTERM after "
                           "step ", 0) == 0;
      EXPECT_TRUE(by_signal || reported_sigterm) << exit << ": " << error_line;
    }
  }
  EXPECT_EQ(s["detection_s"].get<double>(), slowest);  // the slowest that noticed; -1: none
  EXPECT_TRUE(s["launch_names_lost_rank"].get<bool>());
  EXPECT_EQ(s["kill_grace_s"].get<double>(), kKillGrace_s);
  EXPECT_GT(s["all_exited_s"].get<double>(), 0.0);
  EXPECT_LT(s["all_exited_s"].get<double>(), kTimeout_s + kKillGrace_s);
  EXPECT_TRUE(s["detection_ok"].get<bool>());
  // Recovery: the last checkpoint (step 4) verifies, the relaunch resumes from it, and at the
  // resume point step, data position and the next grad-norm equal the uninterrupted run's, exactly.
  EXPECT_TRUE(s["checkpoint_verifies"].get<bool>());
  EXPECT_EQ(s["checkpoint_step"], 4);
  EXPECT_EQ(s["relaunch"]["exit_code"], 0);
  EXPECT_EQ(s["resume_step"], 4);
  EXPECT_EQ(s["reference_step"], 4);
  EXPECT_EQ(s["resume_consumed_samples"], 4 * kBatch);
  EXPECT_EQ(s["reference_consumed_samples"], 4 * kBatch);
  EXPECT_GT(s["resume_grad_norm"].get<double>(), 0.0);
  EXPECT_EQ(s["resume_grad_norm"].get<double>(), s["reference_grad_norm"].get<double>());
  EXPECT_TRUE(s["losses_equal"].get<bool>());
  EXPECT_TRUE(s["final_params_equal"].get<bool>());
  EXPECT_GT(s["restart_s"].get<double>(), 0.0);
  EXPECT_GT(s["recovery_s"].get<double>(), s["detection_s"].get<double>());
  EXPECT_TRUE(s["recovery_ok"].get<bool>());
}

}  // namespace tally::fault_drill

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
