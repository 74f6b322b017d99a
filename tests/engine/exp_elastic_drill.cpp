// `tally run fault-drill --elastic` end to end through the real binary
// (tally/engine/experiments/elastic_drill.hpp), this machine playing both hosts: 2 hosts × 1 rank
// (the fewest processes: CI's time), host 1 lost mid-step at step 6, host 0 resumes at world size
// 1 with twice the accumulation (the report's checks: drill_checks.hpp). The namespace form (two
// network stacks, each host its own drill process) is in test_multihost.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../support/subprocess.hpp"
#include "drill_checks.hpp"

#ifndef TALLY_BINARY
#error "TALLY_BINARY must name the tally executable"
#endif

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tally::elastic_drill::expect_host0_report;
using tally::subprocess::Ran;
using tally::subprocess::run_command;

constexpr double kLimit_s = 150;  // the drill: three sub-runs of ≈3–10 s each on a loaded box

TEST(ElasticDrill, LosesAHostAndResumesOnTheOther) {
  const Ran r = run_command(
      {TALLY_BINARY, "run", "fault-drill", "--elastic", "--nproc-per-node", "1", "--json"},
      kLimit_s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["hosts_here"], json::array({0, 1}));
  expect_host0_report(j, 1);
  // Both hosts' launchers ran the reference and the loss; host 1's ends by its ranks' SIGKILL.
  ASSERT_EQ(j["reference"].size(), 2u);
  for (const json& l : j["reference"]) EXPECT_EQ(l["exit_code"], 0) << l.dump();
  ASSERT_EQ(j["loss"].size(), 2u);
  EXPECT_EQ(j["loss"][1]["exit_code"], 1);
  EXPECT_NE(j["loss"][1]["message"].get<std::string>().find("killed by signal 9 (SIGKILL)"),
            std::string::npos)
      << j["loss"][1].dump();
  EXPECT_GE(j["loss_to_exit_s"].get<double>(), 0.0);
  EXPECT_TRUE(j["work_dir_removed"].get<bool>());
  EXPECT_FALSE(fs::exists(j["work_dir"].get<std::string>()));
}

// Bad flags: exit 2, one line naming the flag, its value and what is allowed; nothing launched.
// (--steps, --save-every, --kill-at-step and the timeouts are checked by the code the plain
// drill's test covers: drill::DrillSchedule.)
TEST(ElasticDrill, BadFlagsExitTwoWithOneLine) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--elastic", "--nnodes", "5"}, "--nnodes = 5: must be in [2, 4]"},
      {{"--elastic", "--nproc-per-node", "3", "--nnodes", "4"},
       "--nproc-per-node = 3: --nnodes × (--nnodes − 1) × --nproc-per-node = 36 must divide the "
       "batch of 48"},
      {{"--elastic", "--node-rank", "1"}, "--master-port = 0: with --node-rank every host needs"},
      {{"--elastic", "--nproc", "3"}, "--nproc = 3: not with --elastic"},
      // The plain drill across hosts takes the host flags with --nnodes >= 2 only (and checks
      // them with the code above: drill::DrillHosts).
      {{"--nnodes", "2", "--nproc", "4"}, "--nproc = 4: not with --nnodes; give --nproc-per-node"},
      {{"--node-rank", "1"}, "--node-rank = 1: only with --nnodes >= 2 (or --elastic)"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> cmd = {TALLY_BINARY, "run", "fault-drill"};
    cmd.insert(cmd.end(), flags.begin(), flags.end());
    const Ran r = run_command(cmd, 60);
    SCOPED_TRACE(flags[flags.size() - 2] + " " + flags.back());
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

}  // namespace
