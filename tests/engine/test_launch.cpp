// `tally launch` end to end, through the real tally binary: environment contract, prefixed output,
// failure and timeout handling with nothing left running, bad input, and `tally run gloo-smoke`
// (plus a PyTorch peer when /usr/bin/python3 has torch).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../support/loopback_socket.hpp"
#include "../support/subprocess.hpp"
#include "../support/temp_dir.hpp"

#ifndef TALLY_BINARY
#error "TALLY_BINARY must name the tally executable"
#endif

namespace {

using tally::subprocess::Ran;

// Runs argv with stdout / stderr captured; SIGKILLs it (its process group) after limit_s.
Ran run_command(const std::vector<std::string>& args, double limit_s = 45) {
  return tally::subprocess::run_command(args, limit_s);
}

std::vector<std::string> tally(std::vector<std::string> args) {
  args.insert(args.begin(), TALLY_BINARY);
  return args;
}

int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (std::size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

// True when pid is gone (or a zombie nobody will run again).
bool process_gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  const auto close_paren = line.rfind(')');
  return close_paren != std::string::npos && line.size() > close_paren + 2 &&
         line[close_paren + 2] == 'Z';
}

TEST(Launch, SuccessSetsTorchrunEnvironmentAndPrefixesOutput) {
  const Ran r = run_command(tally(
      {"launch", "--nproc", "3", "--master-port", "29517", "--", "/bin/sh", "-c",
       "echo env $RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE $MASTER_ADDR:$MASTER_PORT; "
       "echo to-stderr $RANK >&2"}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string s = std::to_string(rank);
    EXPECT_NE(r.out.find("[rank " + s + "] env " + s + "/3/" + s + "/3 127.0.0.1:29517\n"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.err.find("[rank " + s + "] to-stderr " + s + "\n"), std::string::npos) << r.err;
  }
  EXPECT_EQ(count_of(r.out, "\n"), 3) << r.out;
}

TEST(Launch, PartialLastLineIsForwardedToo) {
  const Ran r = run_command(tally({"launch", "--nproc", "1", "--", "/bin/sh", "-c", "printf 'a\\nb'"}));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "[rank 0] a\n[rank 0] b\n");
}

// A rank's --json is one line however long (`run zero --steps 100 --json` over three stages is
// 66 KB): a 300,000-character line arrives whole, behind one prefix.
TEST(Launch, LongLineArrivesWhole) {
  const Ran r = run_command(tally({"launch", "--nproc", "1", "--", "/bin/sh", "-c",
                                   "head -c 300000 /dev/zero | tr '\\0' x; echo"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[rank 0] " + std::string(300000, 'x') + "\n");
}

TEST(Launch, FailingRankStopsTheOthersAndIsNamed) {
  const Ran r = run_command(tally({"launch", "--nproc", "3", "--", "/bin/sh", "-c",
                                   "if [ $RANK = 1 ]; then exit 3; fi; sleep 30"}));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("tally launch: rank 1 failed (exited with status 3); stopped 2 running ranks"),
            std::string::npos)
      << r.err;
  EXPECT_LT(r.elapsed_s, 10) << "the sleeping ranks were not stopped promptly";
}

// --master-port on a port something already listens on: rank 0 cannot serve the ranks' store and
// says so in one line — the reason in words, c10d's own words in parentheses — and nothing else
// reaches stderr but the launcher's line (c10d's glog lines are kept to FATAL: Note [c10's log
// lines] in engine/runtime/c10_logging.cpp; they had printed four lines above tally's).
TEST(Launch, MasterPortInUseIsOneLineNamingIt) {
  const int listener = tally::test::loopback_listener();
  ASSERT_GE(listener, 0);
  const std::string port = std::to_string(tally::test::bound_port(listener));
  const Ran r = run_command(tally({"launch", "--nproc", "2", "--master-port", port, "--",
                                   TALLY_BINARY, "run", "gloo-smoke", "--timeout", "10"}));
  close(listener);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("[rank 0] tally: error: rank 0: serving the TCPStore on 127.0.0.1:" + port +
                            " failed: the port is already in use (",
                        0),
            0u)
      << r.err;
  EXPECT_NE(r.err.find("Address already in use"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\ntally launch: rank 0 failed (exited with status 1); stopped 1 running "
                       "rank\n"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(count_of(r.err, "\n"), 2) << r.err;
}

// Note [launch scratch] (temp_directory.hpp): each rank sees TALLY_LAUNCH_SCRATCH, one directory
// under TMPDIR that every rank of the host shares (rank 1 waits there for rank 0's file); after a
// run whose rank 1 failed while rank 0 was stopped mid-sleep, nothing is left under TMPDIR.
TEST(Launch, ScratchDirectoryIsSharedAndRemovedWhenARankFails) {
  const tally::test::TempDir tmp("launch_scratch");
  const Ran r = run_command(
      {"/usr/bin/env", "TMPDIR=" + tmp.path.string(), TALLY_BINARY, "launch", "--nproc", "2", "--",
       "/bin/sh", "-c",
       "S=$TALLY_LAUNCH_SCRATCH; test -d \"$S\" && echo scratch $S; touch $S/from_$RANK; "
       "if [ $RANK = 1 ]; then while [ ! -e $S/from_0 ]; do sleep 0.05; done; exit 3; fi; "
       "sleep 30"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  std::vector<std::string> named;  // each rank's TALLY_LAUNCH_SCRATCH
  for (int rank = 0; rank < 2; ++rank) {
    const std::string prefix = "[rank " + std::to_string(rank) + "] scratch ";
    const std::size_t at = r.out.find(prefix);
    ASSERT_NE(at, std::string::npos) << r.out;
    named.push_back(r.out.substr(at + prefix.size(), r.out.find('\n', at) - at - prefix.size()));
  }
  EXPECT_EQ(named[0].rfind((tmp.path / "tally-launch-").string(), 0), 0u) << named[0];
  EXPECT_EQ(named[0], named[1]);
  EXPECT_EQ(tally::test::names_in(tmp.path), std::vector<std::string>{}) << "left in " << tmp.path;
}

TEST(Launch, RankKilledBySignalIsNamed) {
  const Ran r = run_command(
      tally({"launch", "--nproc", "2", "--", "/bin/sh", "-c", "if [ $RANK = 0 ]; then kill -9 $$; fi"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("rank 0 failed (killed by signal 9 (SIGKILL))"), std::string::npos) << r.err;
}

TEST(Launch, UnknownProgramFailsWithItsName) {
  const Ran r = run_command(tally({"launch", "--nproc", "2", "--", "/nonexistent/prog"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot execute '/nonexistent/prog'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with status 127"), std::string::npos) << r.err;
}

// Rank 1 ignores SIGTERM (and so does its child), so this also exercises the SIGKILL escalation
// after the grace period; the pid files prove no rank's child outlives the launcher.
TEST(Launch, TimeoutStopsEveryRankAndLeavesNothingBehind) {
  const tally::test::TempDir dir("launch_timeout");  // removed however the test ends
  const Ran r = run_command(tally(
      {"launch", "--nproc", "2", "--timeout", "2", "--", "/bin/sh", "-c",
       "if [ $RANK = 1 ]; then trap '' TERM; fi; sleep 60 & echo $! > " + dir.path.string() +
           "/pid_$RANK; wait"}));
  EXPECT_EQ(r.exit_code, 124) << r.err;
  EXPECT_NE(r.err.find("tally launch: timeout after 2 s (--timeout); stopped 2 running ranks"),
            std::string::npos)
      << r.err;
  EXPECT_GE(r.elapsed_s, 2.0);
  EXPECT_LT(r.elapsed_s, 10.0);
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream f(dir / ("pid_" + std::to_string(rank)));
    pid_t pid = 0;
    ASSERT_TRUE(f >> pid) << "rank " << rank << " wrote no pid file";
    // The launcher has exited; give init a moment to reap its adopted zombies.
    for (int i = 0; i < 50 && !process_gone(pid); ++i) usleep(20000);
    EXPECT_TRUE(process_gone(pid)) << "rank " << rank << "'s sleep (pid " << pid << ") survived";
  }
}

TEST(Launch, BadInputIsOneLineAndExitCode2) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"launch", "--nproc", "0", "--", "true"}, "--nproc = 0: must be in [1, 256]"},
      {{"launch", "--nproc", "257", "--", "true"}, "--nproc = 257: must be in [1, 256]"},
      {{"launch", "--nproc", "2", "--timeout", "-1", "--", "true"},
       "--timeout = -1: must be >= 0 s (0 = no limit)"},
      {{"launch", "--nproc", "2", "--master-port", "70000", "--", "true"},
       "--master-port = 70000: must be in [0, 65535] (0 = a free port)"},
      {{"launch", "--nproc", "2"}, "command"},
      {{"launch", "--nproc", "two", "--", "true"}, "--nproc"},
  };
  for (const auto& c : cases) {
    const Ran r = run_command(tally(c.args));
    EXPECT_EQ(r.exit_code, 2) << c.message << ": " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(count_of(r.err, "\n"), 1) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

// torchrun's numbering on node 1 of 3 with 2 ranks each: RANK = 1·2 + l, WORLD_SIZE = 3·2,
// GROUP_RANK = 1. The ranks only print, so no other node is needed.
TEST(Launch, NodeRankSetsTorchrunEnvironmentAcrossHosts) {
  const Ran r = run_command(tally(
      {"launch", "--nnodes", "3", "--node-rank", "1", "--nproc-per-node", "2", "--master-addr",
       "10.0.0.1", "--master-port", "29517", "--", "/bin/sh", "-c",
       "echo env $RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE/$GROUP_RANK "
       "$MASTER_ADDR:$MASTER_PORT"}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[rank 2] env 2/6/0/2/1 10.0.0.1:29517\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 3] env 3/6/1/2/1 10.0.0.1:29517\n"), std::string::npos) << r.out;
  EXPECT_EQ(count_of(r.out, "\n"), 2) << r.out;
}

TEST(Launch, FailingRankOnASecondNodeIsNamedByItsGlobalRank) {
  const Ran r = run_command(tally({"launch", "--nnodes", "2", "--node-rank", "1",
                                   "--nproc-per-node", "2", "--master-addr", "10.0.0.1",
                                   "--master-port", "29517", "--", "/bin/sh", "-c",
                                   "if [ $LOCAL_RANK = 1 ]; then exit 3; fi; sleep 30"}));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  // Across hosts a rank is named with its node and host (node 0 never came: it is named too).
  EXPECT_NE(r.err.find("tally launch: rank 3 on node 1 (host "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(") failed (exited with status 3); stopped 1 running rank; node 0 never joined"),
            std::string::npos)
      << r.err;
}

TEST(Launch, MultiHostBadInputIsOneLineAndExitCode2) {
  const std::vector<std::string> node1 = {"--nnodes", "2", "--node-rank", "1", "--master-addr",
                                          "10.0.0.1", "--master-port", "29500"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"launch"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--", "true"});
    return args;
  };
  auto node1_with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), node1.begin(), node1.end());
    return with(extra);
  };
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {with({"--nproc", "2", "--nproc-per-node", "2"}),
       "--nproc = 2 and --nproc-per-node = 2: give one"},
      {node1_with({"--nproc", "2"}), "--nproc = 2 with --nnodes = 2: --nproc is for one host"},
      {with({}), "--nproc-per-node is required: ranks on this host, in [1, 256]"},
      {with({"--nproc-per-node", "0"}), "--nproc-per-node = 0: must be in [1, 256]"},
      {with({"--nproc-per-node", "2", "--nnodes", "0"}), "--nnodes = 0: must be in [1, 4096]"},
      {with({"--nproc-per-node", "256", "--nnodes", "17", "--master-addr", "10.0.0.1",
             "--master-port", "29500"}),
       "--nnodes = 17 × --nproc-per-node = 256 = 4352 ranks: must be at most 4096"},
      {with({"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "2", "--master-addr",
             "10.0.0.1", "--master-port", "29500"}),
       "--node-rank = 2: must be in [0, 1] (--nnodes = 2)"},
      {with({"--nproc", "2", "--node-rank", "1"}), "--node-rank = 1: must be in [0, 0] (--nnodes = 1)"},
      {with({"--nproc-per-node", "2", "--nnodes", "2", "--master-addr", "10.0.0.1"}),
       "--master-port = 0: with --nnodes = 2 every host needs the same port: must be in [1, 65534]"},
      {with({"--nproc-per-node", "2", "--nnodes", "2", "--master-addr", "10.0.0.1",
             "--master-port", "65535"}),
       "--master-port = 65535: with --nnodes = 2 the launchers also use port + 1: must be in "
       "[1, 65534]"},
      {node1_with({"--nproc-per-node", "2", "--join-timeout", "0"}),
       "--join-timeout = 0: must be in (0, 86400] s"},
      {node1_with({"--nproc-per-node", "2", "--join-timeout", "nan"}), "--join-timeout: 'nan'"},
      {with({"--nproc-per-node", "2", "--nnodes", "2", "--master-port", "29500"}),
       "--nnodes = 2 needs --master-addr"},
      {node1_with({"--nproc-per-node", "x"}), "--nproc-per-node"},
  };
  for (const auto& [args, message] : cases) {
    const Ran r = run_command(tally(args));
    EXPECT_EQ(r.exit_code, 2) << message << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(count_of(r.err, "\n"), 1) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

TEST(RunGlooSmoke, WithoutLauncherNamesTheMissingVariable) {
  const Ran r = run_command({"/usr/bin/env", "-u", "RANK", "-u", "WORLD_SIZE", TALLY_BINARY, "run",
                             "gloo-smoke"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("is not set: start ranks with `tally launch` or torchrun"), std::string::npos)
      << r.err;
}

class LaunchGlooSmoke : public ::testing::TestWithParam<int> {};

TEST_P(LaunchGlooSmoke, EveryRankSumsToTriangularNumber) {
  const int k = GetParam();
  const Ran r = run_command(tally({"launch", "--nproc", std::to_string(k), "--timeout", "40", "--",
                                   TALLY_BINARY, "run", "gloo-smoke", "--timeout", "20"}));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string expected = std::to_string(k * (k + 1) / 2);
  for (int rank = 0; rank < k; ++rank)
    EXPECT_NE(r.out.find("[rank " + std::to_string(rank) + "] gloo-smoke: rank " +
                         std::to_string(rank) + " of " + std::to_string(k) + ": all-reduce sum " +
                         expected + " vs expected k(k+1)/2 = " + expected + ": ok"),
              std::string::npos)
        << r.out;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, LaunchGlooSmoke, ::testing::Values(2, 4),
                         [](const auto& info) { return "k" + std::to_string(info.param); });

// The contract is torchrun's, so PyTorch's own env:// rendezvous works under `tally launch`.
TEST(Launch, PyTorchPeerUnderTorchrunContract) {
  const char* python = "/usr/bin/python3";
  // The peer is part of the test: a missing one fails it (scripts/install-deps.sh installs
  // python3-torch), it is never skipped.
  ASSERT_EQ(access(python, X_OK), 0) << "no " << python;
  const Ran probe = run_command({python, "-c", "import torch.distributed"});
  ASSERT_EQ(probe.exit_code, 0) << python << " has no torch.distributed (install python3-torch)";
  const std::string script =
      "import torch, torch.distributed as d\n"
      "d.init_process_group('gloo')\n"
      "t = torch.tensor([float(d.get_rank() + 1)])\n"
      "d.all_reduce(t)\n"
      "print('sum', int(t.item()), flush=True)\n"
      "d.destroy_process_group()\n";
  const Ran r = run_command(
      tally({"launch", "--nproc", "2", "--timeout", "40", "--", python, "-c", script}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[rank 0] sum 3\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 1] sum 3\n"), std::string::npos) << r.out;
}

}  // namespace
