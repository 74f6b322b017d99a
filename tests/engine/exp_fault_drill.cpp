// `tally run fault-drill` end to end through the real binary (tally/engine/experiments/fault_drill.hpp): the
// seed's fault-tolerance drill at world sizes 2, 3 and 4 — a rank killed mid-step and during a
// save, four kinds of damaged checkpoint — with every number the drill reports asserted. The drill
// starts its own sub-runs with the launcher; each has a deadline, and the test's own limit is the
// backstop. Whether a survivor notices the lost rank before the launcher stops it is a race the
// machine's load decides; both are correct (Note [detection criterion] in fault_drill.hpp), so the
// end-to-end tests accept either and the criterion itself is tested on constructed outcomes.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../support/subprocess.hpp"
#include "drill_checks.hpp"
#include "tally/engine/experiments/fault_drill.hpp"

#ifndef TALLY_BINARY
#error "TALLY_BINARY must name the tally executable"
#endif

namespace exp_fault_drill {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tally::subprocess::Ran;
using tally::subprocess::run_command;

constexpr double kLimit_s = 150;         // the whole drill: ≈22 s at k = 2, 40–85 s at k = 4
using tally::fault_drill::kKillGrace_s;
using tally::fault_drill::kTimeout_s;

// One host's launcher names the rank alone.
void expect_scenario(const json& s, int kill_rank, std::int64_t kill_step, int k) {
  tally::fault_drill::expect_scenario(
      s, kill_rank, kill_step, k,
      "rank " + std::to_string(kill_rank) + " failed (killed by signal 9 (SIGKILL))");
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
  // Each survivor's line: its CommError naming rank 0, or the launcher stopping it first.
  for (const std::string rank : {"1", "2"}) {
    const std::size_t noticed = r.out.find("    rank " + rank + ": CommError ");
    const std::size_t stopped =
        r.out.find("    rank " + rank + ": stopped by the launcher before it noticed (");
    EXPECT_TRUE(noticed != std::string::npos || stopped != std::string::npos) << rank << r.out;
    if (noticed != std::string::npos) {
      EXPECT_NE(r.out.find(": rank " + rank + ": lost rank 0 at step ", noticed),
                std::string::npos)
          << r.out;
    }
  }
  EXPECT_EQ(r.out.find("EXITED WITHOUT REPORTING"), std::string::npos) << r.out;
  for (const std::string& line :
       {std::string("fault-drill: 3 ranks over loopback, 12 steps, checkpoint every 4"),
        std::string("(1) kill rank 0 mid-step at step 7:"),
        std::string("tally launch: rank 0 failed (killed by signal 9 (SIGKILL)); stopped "),
        std::string("after the kill (limit 8 s: timeout + kill grace): ok"),
        std::string("on disk: checkpoint at step 4 verifies"),
        std::string("(2) kill rank 0 after-shard at step 8:"),
        std::string("staging directory left aside (removed on relaunch)"),
        std::string("step 4 = 4, consumed_samples 192 = 192, grad-norm of step 5 "),
        std::string("later losses identical; final params and Adam state bit-identical: ok"),
        std::string("leftover processes: 0; work dir removed"), std::string("fault-drill: ok")})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
}

// The detection criterion on constructed outcomes (Note [detection criterion]): rank 3 of 4
// killed at step 7, as run_kill records it.
using tally::engine::KillScenario;
using tally::engine::SurvivorOutcome;
using tally::engine::SurvivorReport;

constexpr int kLost = 3;

SurvivorReport noticed(int rank, double detection_s) {
  return {.rank = rank,
          .outcome = SurvivorOutcome::noticed,
          .lost_ranks = {kLost},
          .detection_s = detection_s,
          .exit = "exited with status 1",
          .error_line = "tally: error: rank " + std::to_string(rank) +
                        ": lost rank 3 at step 7: all-reduce: Connection closed by peer"};
}

// What the issue saw: stopped by the launcher's signal before its CommError arrived.
SurvivorReport stopped_first(int rank) {
  return {.rank = rank,
          .outcome = SurvivorOutcome::stopped_by_launcher,
          .exit = "killed by signal 9 (SIGKILL)"};
}

KillScenario scenario(std::vector<SurvivorReport> survivors) {
  KillScenario s;
  s.name = "mid-step";
  s.kill_step = 7;
  s.kill_unix_s = 1.7e9;
  s.failed.exit_code = 1;
  s.failed.message =
      "tally launch: rank 3 failed (killed by signal 9 (SIGKILL)); stopped 3 running ranks";
  s.launch_names_lost_rank = true;
  s.all_exited_s = 3.2;
  s.kill_grace_s = kKillGrace_s;
  s.survivors = std::move(survivors);
  for (const SurvivorReport& v : s.survivors)
    s.detection_s = std::max(s.detection_s, v.detection_s);
  return s;
}

TEST(FaultDrillCriterion, EverySurvivorNoticedIsOk) {
  EXPECT_TRUE(scenario({noticed(0, 0.02), noticed(1, 0.03), noticed(2, 0.4)})
                  .detection_ok(kLost, kTimeout_s));
}

TEST(FaultDrillCriterion, SurvivorStoppedByTheLauncherBeforeNoticingIsOk) {
  EXPECT_TRUE(scenario({noticed(0, 0.02), noticed(1, 0.03), stopped_first(2)})
                  .detection_ok(kLost, kTimeout_s));
  SurvivorReport reported_sigterm = stopped_first(1);
  reported_sigterm.exit = "exited with status 1";
  reported_sigterm.error_line = "tally: error: rank 1: stopped by SIGTERM after step 6 (...)";
  EXPECT_TRUE(scenario({noticed(0, 0.02), reported_sigterm, stopped_first(2)})
                  .detection_ok(kLost, kTimeout_s));
  // Nobody noticed: the launcher's line alone names the lost rank, which is enough.
  EXPECT_TRUE(scenario({stopped_first(0), stopped_first(1), stopped_first(2)})
                  .detection_ok(kLost, kTimeout_s));
}

TEST(FaultDrillCriterion, FailsWhenTheRunDoesNotNameTheLostRankOrStopInTime) {
  const std::vector<SurvivorReport> fine = {noticed(0, 0.02), noticed(1, 0.03), stopped_first(2)};
  KillScenario s = scenario(fine);
  s.launch_names_lost_rank = false;  // tally launch named another rank
  EXPECT_FALSE(s.detection_ok(kLost, kTimeout_s));
  s = scenario(fine);
  s.failed.exit_code = 124;  // it timed out instead
  EXPECT_FALSE(s.detection_ok(kLost, kTimeout_s));
  s = scenario(fine);
  s.all_exited_s = kTimeout_s + kKillGrace_s;  // not every rank gone in time
  EXPECT_FALSE(s.detection_ok(kLost, kTimeout_s));
  s = scenario(fine);
  s.kill_unix_s = 0;  // the victim never reported its kill
  EXPECT_FALSE(s.detection_ok(kLost, kTimeout_s));
  EXPECT_FALSE(scenario({}).detection_ok(kLost, kTimeout_s));
}

TEST(FaultDrillCriterion, FailsWhenASurvivorThatNoticedIsWrongOrLateOrOneExitsUnreported) {
  SurvivorReport wrong = noticed(1, 0.03);
  wrong.lost_ranks = {2};
  EXPECT_FALSE(
      scenario({noticed(0, 0.02), wrong, noticed(2, 0.1)}).detection_ok(kLost, kTimeout_s));
  SurvivorReport nobody = noticed(1, 0.03);
  nobody.lost_ranks = {};  // "no rank has exited"
  EXPECT_FALSE(
      scenario({noticed(0, 0.02), nobody, noticed(2, 0.1)}).detection_ok(kLost, kTimeout_s));
  EXPECT_FALSE(scenario({noticed(0, 0.02), noticed(1, kTimeout_s), noticed(2, 0.1)})
                   .detection_ok(kLost, kTimeout_s));
  SurvivorReport silent = noticed(1, 0.03);
  silent.error_line = "tally: error: rank 1: all-reduce: Connection closed by peer";
  EXPECT_FALSE(
      scenario({noticed(0, 0.02), silent, noticed(2, 0.1)}).detection_ok(kLost, kTimeout_s));
  const SurvivorReport unreported = {.rank = 2,
                                     .outcome = SurvivorOutcome::exited_unreported,
                                     .exit = "exited with status 0"};
  EXPECT_FALSE(scenario({noticed(0, 0.02), noticed(1, 0.03), unreported})
                   .detection_ok(kLost, kTimeout_s));
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
}  // namespace exp_fault_drill
