// `tally launch --nnodes 2` across two hosts with separate network stacks (netns_fixture.hpp), all
// WITHOUT GLOO_SOCKET_IFNAME: each host runs the same launch with its --node-rank, as a user
// would on two machines. ddp-check and ZeRO-3 at 2 hosts × 2 ranks, a checkpoint saved there at
// world size 4 and resumed at world size 2 on one host (resharding), the elastic fault drill with
// the second host's ranks killed (each host running the drill), and a host that never joins
// (the other fails at the rendezvous timeout, naming the address it used), and the plain fault
// drill with a rank of the second host killed. The launchers watch
// each other (Note [launchers' store]): a rank failing on node 1 stops node 0's ranks within a
// bound and both launchers name it; a launcher that never arrives is named by the other at the
// join timeout. Plus two launchers on this host's loopback, which needs no namespaces. No torch
// here: the ranks are processes.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "../support/loopback_socket.hpp"
#include "../support/subprocess.hpp"
#include "../support/temp_dir.hpp"
#include "drill_checks.hpp"
#include "netns_fixture.hpp"
#include "tally/engine/dist_env.hpp"
#include "tally/io/checkpoint.hpp"

#ifndef TALLY_BINARY
#error "TALLY_BINARY must name the tally executable"
#endif

namespace {

using nlohmann::json;
using tally::subprocess::rank_lines;
using tally::subprocess::Ran;
using tally::subprocess::run_command;

constexpr double kLimit_s = 120;  // one host's whole launch (--timeout 90 inside); backstop
// A fresh namespace has no listening sockets, so any port is free there.
constexpr int kPort = 29500;

// `tally launch --nnodes 2 ... [launch_flags] -- program...` (any program).
std::vector<std::string> launch_program(int node_rank, int nproc_per_node, const std::string& master,
                                        int port, const std::vector<std::string>& launch_flags,
                                        const std::vector<std::string>& program) {
  std::vector<std::string> args = {TALLY_BINARY,       "launch",
                                   "--nnodes",         "2",
                                   "--node-rank",      std::to_string(node_rank),
                                   "--nproc-per-node", std::to_string(nproc_per_node),
                                   "--master-addr",    master,
                                   "--master-port",    std::to_string(port),
                                   "--timeout",        "90"};
  args.insert(args.end(), launch_flags.begin(), launch_flags.end());
  args.push_back("--");
  args.insert(args.end(), program.begin(), program.end());
  return args;
}

// Every rank sleeps 60 s, except rank `failing`, which exits 3 after 1 s (the launchers have met
// by then). Without the launchers' store the other host's ranks would sleep on.
std::vector<std::string> one_rank_fails(int failing) {
  return {"/bin/sh", "-c",
          "if [ \"$RANK\" = " + std::to_string(failing) + " ]; then sleep 1; exit 3; fi; exec sleep 60"};
}
constexpr double kStopBound_s = 20;  // 1 s + a 0.1 s poll + the 3 s kill grace, on a loaded box

// `tally launch --nnodes 2 ... -- tally command...`
std::vector<std::string> launch_node(int node_rank, int nproc_per_node, const std::string& master,
                                     int port, const std::vector<std::string>& command) {
  std::vector<std::string> program = {TALLY_BINARY};
  program.insert(program.end(), command.begin(), command.end());
  return launch_program(node_rank, nproc_per_node, master, port, {}, program);
}

// Runs both commands at once (two hosts starting their launch), each with its own deadline.
std::array<Ran, 2> run_together(const std::array<std::vector<std::string>, 2>& commands) {
  std::array<Ran, 2> ran;
  std::thread second([&] { ran[1] = run_command(commands[1], kLimit_s); });
  ran[0] = run_command(commands[0], kLimit_s);
  second.join();
  return ran;
}

class TwoHosts : public tally::netns::TwoHosts {
 protected:
  // Node i runs `tally launch --nnodes 2 --node-rank i --nproc-per-node 2 --master-addr A` in
  // host i's namespace.
  std::vector<std::string> on_node(int i, const std::vector<std::string>& command) const {
    return tally::netns::in_namespace(i == 0 ? a.ns : b.ns,
                                      launch_node(i, 2, a.address, kPort, command));
  }
  void expect_alone_fails(int node, const std::vector<std::string>& messages) const;
  // Node i's launcher of 2 ranks running `program`, with extra launch flags.
  std::vector<std::string> program_on_node(int i, const std::vector<std::string>& launch_flags,
                                           const std::vector<std::string>& program) const {
    return tally::netns::in_namespace(
        i == 0 ? a.ns : b.ns, launch_program(i, 2, a.address, kPort, launch_flags, program));
  }
};

TEST_F(TwoHosts, DdpCheckAcrossTwoHostsOfTwoRanks) {
  const std::vector<std::string> check = {"run", "ddp-check", "--json", "--timeout", "40"};
  const std::array<Ran, 2> ran = run_together({on_node(0, check), on_node(1, check)});
  double grad_norm_rank0 = -1;
  for (int node = 0; node < 2; ++node) {
    const Ran& r = ran[node];
    ASSERT_EQ(r.exit_code, 0) << "node " << node << ":\n" << r.out << r.err;
    for (int local = 0; local < 2; ++local) {
      const int rank = node * 2 + local;  // torchrun: RANK = node_rank·K + local rank
      const auto lines = rank_lines(r.out, rank);
      ASSERT_EQ(lines.size(), 1u) << "rank " << rank << " on node " << node << ":\n" << r.out;
      const json j = json::parse(lines[0]);
      SCOPED_TRACE("rank " + std::to_string(rank) + ": " + j.dump());
      EXPECT_EQ(j["rank"], rank);
      EXPECT_EQ(j["world_size"], 4);
      EXPECT_EQ(j["samples"], 64 / 4);
      EXPECT_LT(j["max_grad_error"].get<double>(), 1e-5);   // ① full-batch gradient
      EXPECT_EQ(j["max_param_diff_vs_rank0"].get<double>(), 0.0);  // ② replicas equal
      EXPECT_TRUE(j["ok"].get<bool>());
      if (rank == 0) grad_norm_rank0 = j["ddp_grad_norm"].get<double>();
      EXPECT_EQ(j["ddp_grad_norm"].get<double>(), grad_norm_rank0);
    }
  }
}

TEST_F(TwoHosts, ZeroStage3AcrossTwoHostsOfTwoRanks) {
  const std::vector<std::string> zero = {"run",      "zero",     "--stage", "3",      "--widths",
                                         "6,33,19,5", "--batch", "8",       "--steps", "3",
                                         "--json",   "--timeout", "40"};
  const std::array<Ran, 2> ran = run_together({on_node(0, zero), on_node(1, zero)});
  ASSERT_EQ(ran[0].exit_code, 0) << ran[0].out << ran[0].err;
  ASSERT_EQ(ran[1].exit_code, 0) << ran[1].out << ran[1].err;
  EXPECT_EQ(ran[1].out, "") << "rank 0 (node 0) reports for every rank";
  const auto lines = rank_lines(ran[0].out, 0);
  ASSERT_EQ(lines.size(), 1u) << ran[0].out;
  const json j = json::parse(lines[0]);
  EXPECT_EQ(j["world_size"], 4);
  EXPECT_TRUE(j["ok"].get<bool>());
  ASSERT_EQ(j["stages"].size(), 1u);
  const json& z3 = j["stages"][0];
  EXPECT_EQ(z3["stage"], 3);
  EXPECT_EQ(z3["ranks"].size(), 4u);
  EXPECT_EQ(z3["mean_losses"].size(), 3u);
  for (const json& c : j["checks"]) EXPECT_TRUE(c["ok"].get<bool>()) << c.dump();
}

// Node `node` alone runs ddp-check with a 5 s rendezvous timeout: launch must exit 1, well within
// the bound, with every message in the ranks' errors.
void TwoHosts::expect_alone_fails(int node, const std::vector<std::string>& messages) const {
  const Ran r = run_command(on_node(node, {"run", "ddp-check", "--timeout", "5"}), kLimit_s);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_LT(r.elapsed_s, 60) << "not bounded by the 5 s rendezvous timeout";
  for (const std::string& m : messages)
    EXPECT_NE(r.err.find(m), std::string::npos) << m << "\n" << r.err;
}

// Node 1 never starts: node 0's ranks serve the store and wait for ranks 2 and 3 until the
// rendezvous timeout, then fail with a message naming the address they used.
TEST_F(TwoHosts, HostThatNeverJoinsFailsTheOtherAtTheRendezvousTimeout) {
  expect_alone_fails(
      0, {"Gloo rendezvous of 4 ranks via 10.77.0.1:29500 failed: timed out after 5 s",
          "this rank uses local address 10.77.0.1 (interface veth-tally-a), its route to "
          "MASTER_ADDR; if another interface reaches the other hosts, set GLOO_SOCKET_IFNAME to it",
          "tally launch: rank "});
}

// Node 0 never starts: node 1's ranks find no store at MASTER_ADDR and fail at the timeout.
TEST_F(TwoHosts, MissingNodeZeroFailsTheOtherAtTheRendezvousTimeout) {
  expect_alone_fails(1, {"reaching rank 0's TCPStore at 10.77.0.1:29500 failed: timed out after 5 s",
                         "this rank uses local address 10.77.0.2 (interface veth-tally-b)"});
}

// Rank 3 (node 1's second rank) exits 3: node 1's launcher stops rank 2 and writes the failure to
// the launchers' store; node 0's launcher reads it and stops ranks 0 and 1, which would otherwise
// sleep for 60 s. Both exit 1 naming rank 3, node 1 and its address.
TEST_F(TwoHosts, RankFailingOnOneHostStopsTheRanksOnEveryHost) {
  const std::array<Ran, 2> ran = run_together(
      {program_on_node(0, {}, one_rank_fails(3)), program_on_node(1, {}, one_rank_fails(3))});
  const std::string failed = "rank 3 on node 1 (host ";
  for (int node = 0; node < 2; ++node) {
    const Ran& r = ran[node];
    SCOPED_TRACE("node " + std::to_string(node) + ":\n" + r.out + r.err);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_LT(r.elapsed_s, kStopBound_s) << "the ranks were not stopped within the bound";
    EXPECT_NE(r.err.find("tally launch: " + failed), std::string::npos);
    EXPECT_NE(r.err.find(", 10.77.0.2) failed (exited with status 3)"), std::string::npos);
  }
  EXPECT_NE(ran[0].err.find("stopped 2 running ranks on node 0"), std::string::npos) << ran[0].err;
  EXPECT_NE(ran[1].err.find("failed (exited with status 3); stopped 1 running rank"),
            std::string::npos)
      << ran[1].err;
}

// A sharded checkpoint saved by 4 ranks on two hosts (2 + 2; the namespaces share the file
// system, as hosts share a checkpoint mount) resumes at world size 2 on one host: the state
// loaded is the state saved (params and Adam m, v by CRC-32C, which rank 0 reported at the save),
// training continues from step 4, and the checkpoint left behind is a verified 2-shard one.
TEST_F(TwoHosts, CheckpointSavedAcrossTwoHostsResumesAtWorldSizeTwoOnOne) {
  tally::test::TempDir tmp;
  const std::string dir = (tmp.path / "ckpt").string();
  const std::vector<std::string> save = {"run",   "checkpoint", "--json",       "--timeout",
                                         "40",    "--dir",      dir,            "--steps",
                                         "4",     "--no-roundtrip"};
  const std::array<Ran, 2> saved = run_together({on_node(0, save), on_node(1, save)});
  ASSERT_EQ(saved[0].exit_code, 0) << saved[0].out << saved[0].err;
  ASSERT_EQ(saved[1].exit_code, 0) << saved[1].out << saved[1].err;
  json saved0;
  for (const std::string& line : rank_lines(saved[0].out, 0))
    if (json j = json::parse(line, nullptr, false); !j.is_discarded() && j["event"] == "result")
      saved0 = j;
  ASSERT_TRUE(saved0.is_object()) << saved[0].out;
  ASSERT_EQ(saved0["world_size"], 4);
  EXPECT_EQ(tally::io::verify_checkpoint(dir).world_size, 4);

  const Ran resumed = run_command(
      tally::netns::in_namespace(
          a.ns, {TALLY_BINARY, "launch", "--nproc", "2", "--timeout", "90", "--", TALLY_BINARY,
                 "run", "checkpoint", "--json", "--timeout", "40", "--dir", dir, "--steps", "6",
                 "--resume"}),
      kLimit_s);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  for (int rank = 0; rank < 2; ++rank) {
    json r;
    for (const std::string& line : rank_lines(resumed.out, rank))
      if (json j = json::parse(line, nullptr, false); !j.is_discarded() && j["event"] == "result")
        r = j;
    SCOPED_TRACE("rank " + std::to_string(rank) + ": " + r.dump());
    ASSERT_TRUE(r.is_object()) << resumed.out;
    EXPECT_TRUE(r["resumed"].get<bool>());
    EXPECT_EQ(r["loaded_world_size"], 4);
    EXPECT_EQ(r["world_size"], 2);
    EXPECT_EQ(r["start_step"], 4);
    EXPECT_EQ(r["loaded_params_crc32c"], saved0["params_crc32c"]);
    EXPECT_EQ(r["loaded_optimizer_crc32c"], saved0["optimizer_crc32c"]);
    EXPECT_EQ(r["steps"].size(), 2u);
    EXPECT_TRUE(r["ok"].get<bool>());
  }
  EXPECT_EQ(tally::io::verify_checkpoint(dir).world_size, 2);
}

// The elastic fault drill across the two hosts, each running it as a user would on two machines
// (`--node-rank i`, the same --master-addr, --master-port and a work directory both see): host
// 1's ranks (2 and 3) all die mid-step at step 6; host 0's drill relaunches alone at world size 2
// with twice the accumulation, resumes from step 4's checkpoint (saved by 4 ranks on two hosts),
// and sets every figure beside the uninterrupted run's (drill_checks.hpp). Host 1's drill
// reports its part: the reference passed, its ranks were killed, its launcher exited 1.
TEST_F(TwoHosts, ElasticFaultDrillLosesTheSecondHostAndResumesOnTheFirst) {
  tally::test::TempDir tmp;
  const auto drill = [&](int node) {
    return tally::netns::in_namespace(
        node == 0 ? a.ns : b.ns,
        {TALLY_BINARY, "run", "fault-drill", "--elastic", "--json", "--node-rank",
         std::to_string(node), "--master-addr", a.address, "--master-port", std::to_string(kPort),
         "--work-dir", tmp.path.string(), "--join-timeout", "40"});
  };
  const std::array<Ran, 2> ran = run_together({drill(0), drill(1)});
  ASSERT_EQ(ran[0].exit_code, 0) << ran[0].out << ran[0].err;
  ASSERT_EQ(ran[1].exit_code, 0) << ran[1].out << ran[1].err;
  const json host0 = json::parse(ran[0].out), host1 = json::parse(ran[1].out);
  EXPECT_EQ(host0["hosts_here"], json::array({0}));
  tally::elastic_drill::expect_host0_report(host0, 2);
  SCOPED_TRACE(host1.dump(1));
  EXPECT_EQ(host1["hosts_here"], json::array({1}));
  EXPECT_TRUE(host1["ok"].get<bool>());
  EXPECT_EQ(host1["reference"][0]["exit_code"], 0);
  EXPECT_EQ(host1["loss"][0]["exit_code"], 1);
  const std::string lost = host1["loss"][0]["message"];
  EXPECT_NE(lost.find(" on node 1 (host "), std::string::npos) << lost;
  EXPECT_NE(lost.find(", 10.77.0.2) failed (killed by signal 9 (SIGKILL))"), std::string::npos)
      << lost;
  EXPECT_EQ(host1["resume"]["command"], json::array()) << "the lost host takes no part";
}

// The plain fault drill across the two hosts, each running it as a user would (`--nnodes 2
// --node-rank i`): rank 3, host 1's second rank, dies mid-step at step 7. Both hosts' reports are
// whole (each reads the other's part from the shared work directory): the launchers exit 1 naming
// rank 3, node 1 and its address; each survivor — two on host 0, one on host 1 — noticed or was
// stopped (Note [detection criterion]); both hosts relaunch from step 4's checkpoint and every
// figure equals the uninterrupted run's exactly (drill_checks.hpp, as the one-host drill).
TEST_F(TwoHosts, FaultDrillKillsARankOnTheSecondHostAndResumesExactly) {
  tally::test::TempDir tmp;
  const auto drill = [&](int node) {
    return tally::netns::in_namespace(
        node == 0 ? a.ns : b.ns,
        {TALLY_BINARY, "run", "fault-drill", "--json", "--nnodes", "2", "--nproc-per-node", "2",
         "--kill-rank", "3", "--steps", "8", "--node-rank", std::to_string(node), "--master-addr",
         a.address, "--master-port", std::to_string(kPort), "--work-dir", tmp.path.string(),
         "--join-timeout", "40"});
  };
  const std::array<Ran, 2> ran = run_together({drill(0), drill(1)});
  for (int node = 0; node < 2; ++node) {
    ASSERT_EQ(ran[node].exit_code, 0) << ran[node].out << ran[node].err;
    const json j = json::parse(ran[node].out);
    SCOPED_TRACE("node " + std::to_string(node));
    EXPECT_EQ(j["hosts_here"], json::array({node}));
    EXPECT_EQ(j["world_size"], 4);
    EXPECT_EQ(j["nnodes"], 2);
    EXPECT_TRUE(j["gathered"].get<bool>());
    EXPECT_EQ(j["reference"]["exit_code"], 0);
    EXPECT_EQ(j["mid_step"]["kill_node"], 1);
    tally::fault_drill::expect_scenario(j["mid_step"], 3, 7, 4, "rank 3 on node 1 (host ");
    const std::string named = j["mid_step"]["failed"]["message"];
    EXPECT_NE(named.find(", 10.77.0.2) failed (killed by signal 9 (SIGKILL))"), std::string::npos)
        << named;
    EXPECT_EQ(j["during_save"], nullptr) << "(2) and (3) run on one host only";
    EXPECT_EQ(j["leftover_pids"], json::array());
    EXPECT_TRUE(j["ok"].get<bool>());
  }
}

// Node 1's launcher never starts: node 0's launcher (its ranks healthy, sleeping) stops them at
// the 5 s join timeout and names the missing node.
TEST_F(TwoHosts, LauncherThatNeverJoinsIsNamedAtTheJoinTimeout) {
  const Ran r = run_command(program_on_node(0, {"--join-timeout", "5"}, {"/bin/sleep", "60"}),
                            kLimit_s);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_LT(r.elapsed_s, 5 + kStopBound_s) << r.err;
  EXPECT_NE(r.err.find("tally launch: node 1 of 2 never joined within 5 s (--join-timeout; the "
                       "launchers' store at 10.77.0.1:29501); stopped 2 running ranks"),
            std::string::npos)
      << r.err;
}

// Node 0's launcher never starts: node 1's finds no store to join and names node 0.
TEST_F(TwoHosts, MissingNodeZeroLauncherIsNamedAtTheJoinTimeout) {
  const Ran r = run_command(program_on_node(1, {"--join-timeout", "5"}, {"/bin/sleep", "60"}),
                            kLimit_s);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_LT(r.elapsed_s, 5 + kStopBound_s) << r.err;
  EXPECT_NE(r.err.find("tally launch: node 0 of 2 never joined within 5 s"), std::string::npos)
      << r.err;
}

// Two launchers on one host (the loopback): the multi-host contract without namespaces.
TEST(TwoNodesOnLoopback, GlooSmokeSumsOverBothLaunchers) {
  unsetenv("GLOO_SOCKET_IFNAME");
  const int port = tally::engine::find_free_port(2);  // port + 1: the launchers' store
  const std::vector<std::string> smoke = {"run", "gloo-smoke", "--timeout", "40"};
  const std::array<Ran, 2> ran = run_together(
      {launch_node(0, 1, "127.0.0.1", port, smoke), launch_node(1, 1, "127.0.0.1", port, smoke)});
  for (int node = 0; node < 2; ++node) {
    ASSERT_EQ(ran[node].exit_code, 0) << ran[node].out << ran[node].err;
    // k = 2 ranks, one per launcher: the sum of rank+1 is k(k+1)/2 = 3.
    EXPECT_NE(ran[node].out.find("[rank " + std::to_string(node) + "] gloo-smoke: rank " +
                                 std::to_string(node) + " of 2: all-reduce sum 3 vs expected "
                                 "k(k+1)/2 = 3: ok"),
              std::string::npos)
        << ran[node].out;
  }
}

// The launchers' store on the loopback: rank 0 (node 0) fails, node 1's launcher stops rank 1.
TEST(TwoNodesOnLoopback, RankFailingUnderOneLauncherStopsTheOther) {
  const int port = tally::engine::find_free_port(2);  // port + 1: the launchers' store
  const std::array<Ran, 2> ran = run_together(
      {launch_program(0, 1, "127.0.0.1", port, {}, one_rank_fails(0)),
       launch_program(1, 1, "127.0.0.1", port, {}, one_rank_fails(0))});
  for (int node = 0; node < 2; ++node) {
    EXPECT_EQ(ran[node].exit_code, 1) << ran[node].err;
    EXPECT_LT(ran[node].elapsed_s, kStopBound_s) << ran[node].err;
    EXPECT_NE(ran[node].err.find("tally launch: rank 0 on node 0 (host "), std::string::npos)
        << ran[node].err;
  }
  EXPECT_NE(ran[1].err.find("failed (exited with status 3); stopped 1 running rank on node 1"),
            std::string::npos)
      << ran[1].err;
}

// Port + 1 held by an established connection (a client bound there, as connect() binds its local
// port): node 0 cannot serve the launchers' store and node 1 cannot reach it. The ranks finish;
// node 1 waits for the store only until --join-timeout and then says, as node 0 does, that
// nothing watched the other host (before, it exited 0 silently at the timeout: Note [free
// ports]).
TEST(TwoNodesOnLoopback, LaunchersStoreUnreachableIsAWarningNotASilentWait) {
  const int port = tally::engine::find_free_port(2);
  const int server = tally::test::loopback_listener();
  ASSERT_GE(server, 0);
  const int client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  // no SO_REUSEADDR
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(std::uint16_t(tally::test::bound_port(server)));
  sockaddr_in b = a;
  b.sin_port = htons(std::uint16_t(port + 1));
  ASSERT_EQ(bind(client, reinterpret_cast<sockaddr*>(&b), sizeof b), 0);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const std::vector<std::string> flags = {"--join-timeout", "3"};
  const std::array<Ran, 2> ran =
      run_together({launch_program(0, 1, "127.0.0.1", port, flags, {"/bin/true"}),
                    launch_program(1, 1, "127.0.0.1", port, flags, {"/bin/true"})});
  close(client);
  close(server);
  const std::string store = "launchers' store at 127.0.0.1:" + std::to_string(port + 1);
  ASSERT_EQ(ran[0].exit_code, 0) << ran[0].err;
  EXPECT_NE(ran[0].err.find("tally launch: warning: serving the " + store + " failed"),
            std::string::npos)
      << ran[0].err;
  ASSERT_EQ(ran[1].exit_code, 0) << ran[1].err;
  EXPECT_NE(ran[1].err.find("tally launch: warning: reaching node 0's " + store + " failed"),
            std::string::npos)
      << ran[1].err;
  EXPECT_NE(ran[1].err.find("; this host's ranks finished, the other hosts' outcomes are not "
                            "known here\n"),
            std::string::npos)
      << ran[1].err;
  EXPECT_LT(ran[1].elapsed_s, 3 + kStopBound_s) << ran[1].err;
  // Only tally's lines: c10d's own glog lines are kept to FATAL (Note [c10's log lines]).
  for (const Ran& r : ran) EXPECT_EQ(r.err.find("socket.cpp"), std::string::npos) << r.err;
}

}  // namespace
