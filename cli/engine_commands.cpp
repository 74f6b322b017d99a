// `tally launch` and `tally run gloo-smoke`. Bad input throws tally::InvalidInput (main prints one
// line and exits 2); a failed run exits with the launcher's code (1 a rank failed, 124 timeout).
#include "engine_commands.hpp"

#include "flags.hpp"
#include "run_registry.hpp"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "tally/core/types.hpp"
#include "tally/engine/dist_env.hpp"
#include "tally/engine/gloo_smoke.hpp"
#include "tally/engine/launch.hpp"

namespace tally::cli {

namespace {

// "gloo-smoke: rank 0 of 2: all-reduce sum 3 vs expected k(k+1)/2 = 3: ok (1 call, 8 bytes sent)"
std::string gloo_smoke_report(const engine::GlooSmokeResult& r) {
  std::ostringstream os;
  os << "gloo-smoke: rank " << r.rank << " of " << r.world_size << ": all-reduce sum " << r.sum
     << " vs expected k(k+1)/2 = " << r.expected << ": " << (r.ok() ? "ok" : "WRONG") << " ("
     << r.all_reduce.calls << " call, " << r.all_reduce.bytes_sent << " bytes sent)";
  return os.str();
}

[[noreturn]] void exit_now(int code) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::exit(code);
}

// The launch flags as typed: --nproc (one host) and --nproc-per-node (its name with --nnodes) are
// one value, so which was given is the parser's answer, never a sentinel.
struct LaunchFlags {
  engine::LaunchOptions options;
  std::optional<int> nproc, nproc_per_node;
  std::optional<std::string> master_addr;

  // Throws InvalidInput naming the flags when they conflict; LaunchOptions::validate does the rest.
  engine::LaunchOptions resolve() const {
    engine::LaunchOptions o = options;
    if (nproc && nproc_per_node)
      throw InvalidInput("--nproc = " + std::to_string(*nproc) + " and --nproc-per-node = " +
                         std::to_string(*nproc_per_node) +
                         ": give one (--nproc-per-node is --nproc's name across hosts)");
    if (nproc && o.nnodes > 1)
      throw InvalidInput("--nproc = " + std::to_string(*nproc) + " with --nnodes = " +
                         std::to_string(o.nnodes) +
                         ": --nproc is for one host; give --nproc-per-node (ranks on each host)");
    if (!nproc && !nproc_per_node)
      throw InvalidInput("--nproc-per-node is required: ranks on this host, in [1, " +
                         std::to_string(engine::kMaxLaunchRanks) + "] (--nproc on one host)");
    if (nproc_per_node && (*nproc_per_node < 1 || *nproc_per_node > engine::kMaxLaunchRanks))
      throw InvalidInput("--nproc-per-node = " + std::to_string(*nproc_per_node) +
                         ": must be in [1, " + std::to_string(engine::kMaxLaunchRanks) + "]");
    if (o.nnodes > 1 && !master_addr)
      throw InvalidInput("--nnodes = " + std::to_string(o.nnodes) +
                         " needs --master-addr: node 0's address, as every host reaches it");
    o.nproc = nproc_per_node.value_or(nproc.value_or(0));
    if (master_addr) o.master_addr = *master_addr;
    return o;
  }
};

void register_launch(CLI::App& app) {
  auto flags = std::make_shared<LaunchFlags>();
  engine::LaunchOptions& opts = flags->options;
  CLI::App* cmd = app.add_subcommand(
      "launch", "start this host's ranks of a program under torchrun's environment and supervise them");
  cmd->footer(
      "one host:   tally launch --nproc K [--timeout S] [--master-port P] -- <command...>\n"
      "each host:  tally launch --nnodes N --node-rank i --nproc-per-node K --master-addr A "
      "--master-port P -- <command...>\n"
      "Local rank l gets RANK = i·K + l, WORLD_SIZE = N·K, LOCAL_RANK = l, LOCAL_WORLD_SIZE = K, "
      "GROUP_RANK = i, MASTER_ADDR (127.0.0.1 on one host), MASTER_PORT and TALLY_LAUNCH_SCRATCH "
      "(a directory the launcher removes once its ranks have exited); its output is prefixed "
      "\"[rank RANK] \". If a rank fails the others on this host are stopped (SIGTERM, then "
      "SIGKILL) and launch exits 1 naming it; on --timeout it exits 124. With --nnodes > 1 the "
      "launchers also meet in a store of their own that node 0's launcher serves on "
      "--master-port + 1 (every host must reach both ports): a rank failing on any host stops "
      "the ranks on every host, and every launcher exits 1 naming the rank, its node and host; a "
      "host not arrived within --join-timeout makes the others exit 1 naming the missing node "
      "ranks.");
  cmd->add_option("--nproc", flags->nproc, "ranks to start on this one host, 1..256");
  cmd->add_option("--nproc-per-node", flags->nproc_per_node,
                  "ranks on each host (--nproc's name with --nnodes), 1..256");
  cmd->add_option("--nnodes", opts.nnodes, "hosts, each running this launch with its --node-rank")
      ->capture_default_str();
  cmd->add_option("--node-rank", opts.node_rank, "this host's index, 0..nnodes-1 (node 0 serves "
                  "the rendezvous)")
      ->capture_default_str();
  cmd->add_option("--master-addr", flags->master_addr,
                  "node 0's address as every host reaches it (required with --nnodes > 1; "
                  "default 127.0.0.1 on one host)");
  cmd->add_option("--timeout", opts.timeout_s,
                  "seconds before every rank is stopped and launch exits 124 (0 = no limit)")
      ->check(finite_number(">= 0 s; 0 = no limit"))  // the range: engine::LaunchOptions
      ->capture_default_str();
  cmd->add_option("--master-port", opts.master_port,
                  "MASTER_PORT for the ranks' TCPStore rendezvous (0 = a free port; one host only)")
      ->capture_default_str();
  cmd->add_option("--join-timeout", opts.join_timeout_s,
                  "with --nnodes > 1: seconds for every host's launcher to arrive (and, once this "
                  "host's ranks succeeded, for the other hosts' ranks to end)")
      ->check(finite_number("in (0, 86400] s"))  // the range: engine::LaunchOptions
      ->capture_default_str();
  cmd->add_option("command", opts.command, "the program and its arguments, after --")
      ->required();
  cmd->callback([flags] {
    const engine::LaunchResult result = engine::launch(flags->resolve());
    if (!result.message.empty()) std::cerr << result.message << "\n";
    if (result.exit_code != 0) exit_now(result.exit_code);
  });
}

void register_gloo_smoke(CLI::App& run) {
  auto opts = std::make_shared<engine::GlooSmokeOptions>();
  CLI::App* cmd = run.add_subcommand(
      "gloo-smoke",
      "each rank all-reduces rank+1 over Gloo and checks the sum is k(k+1)/2; start it with "
      "`tally launch --nproc N -- tally run gloo-smoke` or torchrun");
  cmd->add_option("--timeout", opts->timeout_s, "seconds for the rendezvous and the all-reduce")
      ->check(finite_in(0, 86400, Ends::open_lo))
      ->capture_default_str();
  cmd->callback([opts] {
    if (!(opts->timeout_s > 0)) {
      std::ostringstream os;
      os << "--timeout = " << opts->timeout_s << ": must be > 0 s";
      throw InvalidInput(os.str());
    }
    const engine::GlooSmokeResult result =
        engine::run_gloo_smoke(engine::DistEnv::from_environment(), *opts);
    std::cout << gloo_smoke_report(result) << std::endl;
    if (!result.ok()) throw std::runtime_error(gloo_smoke_report(result));
  });
}

}  // namespace

CLI::App& command_group(CLI::App& app, const std::string& name, const std::string& description) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    if (sub->get_name() == name) return *sub;
  CLI::App* group = app.add_subcommand(name, description);
  group->require_subcommand(1);
  return *group;
}

void register_engine_commands(CLI::App& app) {
  register_launch(app);
  CLI::App& run =
      command_group(app, "run", "run an experiment on this rank (start ranks with `tally launch`)");
  register_gloo_smoke(run);
  for (RunRegistrar r : run_registry()) r(run);
  for (CommandRegistrar r : command_registry()) r(app);
}

std::vector<RunRegistrar>& run_registry() {
  static std::vector<RunRegistrar> registry;
  return registry;
}

std::vector<CommandRegistrar>& command_registry() {
  static std::vector<CommandRegistrar> registry;
  return registry;
}

}  // namespace tally::cli
