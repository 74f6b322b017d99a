// `tally launch` and `tally run gloo-smoke`. Bad input throws tally::InvalidInput (main prints one
// line and exits 2); a failed run exits with the launcher's code (1 a rank failed, 124 timeout).
#include "engine_commands.hpp"

#include "flags.hpp"
#include "run_registry.hpp"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
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

void register_launch(CLI::App& app) {
  auto opts = std::make_shared<engine::LaunchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "launch", "start N local ranks of a program under torchrun's environment and supervise them");
  cmd->footer(
      "tally launch --nproc N [--timeout S] [--master-port P] -- <command...>\n"
      "Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and "
      "MASTER_PORT; its output is prefixed \"[rank r] \". If a rank fails the others are stopped "
      "(SIGTERM, then SIGKILL) and launch exits 1 naming it; on --timeout it exits 124.");
  cmd->add_option("--nproc", opts->nproc, "ranks to start, 1..256")->required();
  cmd->add_option("--timeout", opts->timeout_s,
                  "seconds before every rank is stopped and launch exits 124 (0 = no limit)")
      ->check(finite_number(">= 0 s; 0 = no limit"))  // the range: engine::LaunchOptions
      ->capture_default_str();
  cmd->add_option("--master-port", opts->master_port,
                  "MASTER_PORT for the ranks' TCPStore rendezvous (0 = a free port)")
      ->capture_default_str();
  cmd->add_option("command", opts->command, "the program and its arguments, after --")
      ->required();
  cmd->callback([opts] {
    const engine::LaunchResult result = engine::launch(*opts);
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
