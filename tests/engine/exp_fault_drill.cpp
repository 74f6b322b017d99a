// `tally run fault-drill` end to end through the real binary (tally/engine/fault_drill.hpp): the
// seed's fault-tolerance drill at world sizes 2, 3 and 4 — a rank killed mid-step and during a
// save, four kinds of damaged checkpoint — with every number the drill reports asserted. The drill
// starts its own sub-runs with the launcher; each has a deadline, and the test's own limit is the
// backstop.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "subprocess.hpp"

#ifndef TALLY_BINARY
#error "TALLY_BINARY must name the tally executable"
#endif

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tally::subprocess::Ran;
using tally::subprocess::run_command;

constexpr double kLimit_s = 150;         // the whole drill: ≈17 s at k = 2, ≈26 s at k = 4
constexpr double kTimeout_s = 5;         // the drill's collective timeout (its default)
constexpr std::int64_t kBatch = 48;      // tally run checkpoint's default global batch

void expect_scenario(const json& s, int kill_rank, std::int64_t kill_step, int k) {
  SCOPED_TRACE(s.dump(1));
  EXPECT_EQ(s["kill_step"], kill_step);
  // Detection: `tally launch` exits 1 naming the dead rank; every survivor exits non-zero within
  // the collective timeout with a CommError naming it.
  EXPECT_EQ(s["failed"]["exit_code"], 1);
  EXPECT_NE(s["failed"]["message"].get<std::string>().find(
                "rank " + std::to_string(kill_rank) + " failed (killed by signal 9 (SIGKILL))"),
            std::string::npos);
  ASSERT_EQ(s["survivors"].size(), std::size_t(k - 1));
  for (const json& v : s["survivors"]) {
    EXPECT_NE(v["rank"], kill_rank);
    EXPECT_EQ(v["lost_ranks"], json::array({kill_rank}));
    EXPECT_GE(v["detection_s"].get<double>(), 0.0);
    EXPECT_LT(v["detection_s"].get<double>(), kTimeout_s);
    EXPECT_NE(v["error_line"].get<std::string>().find("tally: error: rank " +
                                                      v["rank"].dump() + ": lost rank " +
                                                      std::to_string(kill_rank) + " at step " +
                                                      std::to_string(kill_step) + ": "),
              std::string::npos);
  }
  EXPECT_TRUE(s["launch_names_lost_rank"].get<bool>());
  EXPECT_LT(s["all_exited_s"].get<double>(), kTimeout_s + 3);  // + the launcher's kill grace
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

class FaultDrill : public ::testing::TestWithParam<int> {};

TEST_P(FaultDrill, KillDetectRecoverExactlyAndRejectDamage) {
  const int k = GetParam();
  const int kill_rank = k - 1;
  const Ran r = run_command({TALLY_BINARY, "run", "fault-drill", "--json", "--nproc",
                             std::to_string(k), "--kill-rank", std::to_string(kill_rank)},
                            kLimit_s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json d = json::parse(r.out);
  EXPECT_EQ(d["world_size"], k);
  EXPECT_EQ(d["reference"]["exit_code"], 0);

  // (1) killed after the forward pass of step 7: steps 5 and 6 are redone.
  expect_scenario(d["mid_step"], kill_rank, 7, k);
  EXPECT_EQ(d["mid_step"]["steps_redone"], 2);
  EXPECT_FALSE(d["mid_step"]["staging_left"].get<bool>());
  // (2) killed after writing its shard of the step-8 save: the step-4 checkpoint is intact, the
  // interrupted save's staging directory is left aside and removed by the relaunch.
  expect_scenario(d["during_save"], kill_rank, 8, k);
  EXPECT_EQ(d["during_save"]["steps_redone"], 4);
  EXPECT_TRUE(d["during_save"]["staging_left"].get<bool>());
  EXPECT_TRUE(d["during_save"]["staging_removed_on_relaunch"].get<bool>());

  // (3) damage: one line naming the file and the check; nothing loaded.
  const std::vector<std::pair<std::string, std::string>> want = {
      {"shard-00001-of-0000" + std::to_string(k) + ".safetensors: crc32c = ", "the file is corrupt"},
      {"shard-00000-of-0000" + std::to_string(k) + ".safetensors: size = ", "(truncated)"},
      {"shard-0000" + std::to_string(k - 1) + "-of-0000" + std::to_string(k) +
           ".safetensors: missing",
       "index.json lists it"},
      {"index.json: crc32c = ", "index.json was edited or is corrupt"}};
  ASSERT_EQ(d["corruptions"].size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const json& c = d["corruptions"][i];
    SCOPED_TRACE(c.dump(1));
    EXPECT_NE(c["launch"]["exit_code"], 0);
    EXPECT_FALSE(c["loaded_anything"].get<bool>());
    const std::string line = c["error_line"];
    EXPECT_EQ(line.rfind("tally: error: ", 0), 0u);
    EXPECT_EQ(line.find('\n'), std::string::npos);
    EXPECT_NE(line.find(want[i].first), std::string::npos);
    EXPECT_NE(line.find(want[i].second), std::string::npos);
    EXPECT_TRUE(c["ok"].get<bool>());
  }
  // io's own verification catches the damaged shards but not the edited index (io's format has
  // no checksum over index.json; the engine's index.json.crc32c does). When io gains one, this
  // flips and the engine's side file can go.
  EXPECT_TRUE(d["corruptions"][0]["io_verify_alone_rejects"].get<bool>());
  EXPECT_FALSE(d["corruptions"][3]["io_verify_alone_rejects"].get<bool>());

  // Nothing left behind.
  EXPECT_TRUE(d["leftover_pids"].empty());
  EXPECT_TRUE(d["work_dir_removed"].get<bool>());
  EXPECT_FALSE(fs::exists(d["work_dir"].get<std::string>()));
  EXPECT_TRUE(d["ok"].get<bool>());
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, FaultDrill, ::testing::Values(2, 4),
                         [](const auto& info) { return "k" + std::to_string(info.param); });

TEST(FaultDrillText, ReportsDetectionRecoveryAndConsistencyAtThreeRanks) {
  const Ran r =
      run_command({TALLY_BINARY, "run", "fault-drill", "--nproc", "3", "--kill-rank", "0"},
                  kLimit_s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const std::string& line :
       {std::string("fault-drill: 3 ranks over loopback, 12 steps, checkpoint every 4"),
        std::string("(1) kill rank 0 mid-step at step 7:"),
        std::string("tally launch: rank 0 failed (killed by signal 9 (SIGKILL)); stopped 2 "
                    "running ranks"),
        std::string("rank 1: CommError "), std::string("rank 2: CommError "),
        std::string("lost rank 0 at step 7"), std::string("on disk: checkpoint at step 4 verifies"),
        std::string("(2) kill rank 0 after-shard at step 8:"),
        std::string("staging directory left aside (removed on relaunch)"),
        std::string("step 4 = 4, consumed_samples 192 = 192, grad-norm of step 5 "),
        std::string("later losses identical; final params and Adam state bit-identical: ok"),
        std::string("leftover processes: 0; work dir removed"), std::string("fault-drill: ok")})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
}

TEST(FaultDrillInput, BadFlagsExitTwoNamingTheFlag) {
  const Ran r = run_command({TALLY_BINARY, "run", "fault-drill", "--nproc", "5"}, 30);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--nproc = 5: must be 2, 3, 4, 6 or 8"), std::string::npos) << r.err;
  const Ran s = run_command({TALLY_BINARY, "run", "fault-drill", "--kill-at-step", "3"}, 30);
  EXPECT_EQ(s.exit_code, 2);
  EXPECT_NE(s.err.find("--kill-at-step = 3: must be in (--save-every = 4, --steps = 12]"),
            std::string::npos)
      << s.err;
}

}  // namespace
