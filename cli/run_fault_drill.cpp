// `tally run fault-drill`: the text and JSON reporters of engine::run_fault_drill
// (tally/engine/experiments/fault_drill.hpp). Run it directly (not under `tally launch`): it launches its own
// sub-runs. Bad flags exit 2; a failed criterion exits 1.
#include <fmt/core.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common.hpp"
#include "elastic_report.hpp"
#include "run_registry.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/experiments/fault_drill.hpp"

namespace tally::cli::run_fault_drill {

namespace {

using nlohmann::json;

struct Flags {
  engine::FaultDrillOptions drill;
  engine::ElasticDrillOptions elastic;
  bool is_elastic = false;
  std::string work_dir;
  bool json = false;
};

// Flags of one form only: naming one with the other form is bad input.
const std::vector<std::string> kPlainOnly = {"--nproc", "--kill-rank", "--kill-at-save"};
const std::vector<std::string> kElasticOnly = {"--consistency-every", "--tolerance"};
// The plain form across hosts takes these (with --nnodes >= 2).
const std::vector<std::string> kHostFlags = {"--nproc-per-node", "--node-rank", "--master-addr",
                                             "--master-port", "--join-timeout"};

void run_elastic(const Flags& f, const CLI::App& cmd) {
  for (const std::string& flag : kPlainOnly)
    if (cmd.count(flag) > 0)
      throw InvalidInput(flag + " = " + cmd.get_option(flag)->results().front() +
                         ": not with --elastic, which loses a whole host (--nnodes, "
                         "--nproc-per-node, --kill-at-step)");
  engine::ElasticDrillOptions o = f.elastic;
  // The flags both forms share, when given (the forms' defaults differ).
  if (cmd.count("--steps") > 0) o.steps = f.drill.steps;
  if (cmd.count("--save-every") > 0) o.save_every = f.drill.save_every;
  if (cmd.count("--kill-at-step") > 0) o.kill_at_step = f.drill.kill_at_step;
  if (cmd.count("--timeout") > 0) o.collective_timeout_s = f.drill.collective_timeout_s;
  if (cmd.count("--launch-timeout") > 0) o.launch_timeout_s = f.drill.launch_timeout_s;
  o.keep_work_dir = f.drill.keep_work_dir;
  o.tally_binary = f.drill.tally_binary;
  o.work_dir = f.work_dir;
  const engine::ElasticDrillResult r = engine::run_elastic_drill(o);
  if (f.json)
    print_json(elastic_json(r));
  else
    print_elastic_text(r);
  std::fflush(stdout);
  if (!r.ok()) throw std::runtime_error("fault-drill --elastic: a criterion failed (see the report)");
}

const char* mark(bool ok) { return ok ? "ok" : "FAILED"; }

// The plain drill's host flags (shared with --elastic): --nnodes N >= 2 and --nproc-per-node K
// make N·K ranks instead of --nproc.
void across_hosts(const Flags& f, const CLI::App& cmd, engine::FaultDrillOptions& o) {
  const bool nnodes = cmd.count("--nnodes") > 0;
  if (!nnodes || f.elastic.nnodes == 1) {
    for (const std::string& flag : kHostFlags)
      if (cmd.count(flag) > 0)
        throw InvalidInput(flag + " = " + cmd.get_option(flag)->results().front() +
                           ": only with --nnodes >= 2 (or --elastic)");
    if (nnodes) o.nnodes = 1;
    return;
  }
  if (cmd.count("--nproc") > 0)
    throw InvalidInput("--nproc = " + cmd.get_option("--nproc")->results().front() +
                       ": not with --nnodes; give --nproc-per-node (ranks per host)");
  const engine::ElasticDrillOptions& e = f.elastic;
  o.nnodes = e.nnodes;
  o.world_size = e.nnodes * e.nproc_per_node;
  o.node_rank = e.node_rank;
  o.master_addr = e.master_addr;
  o.master_port = e.master_port;
  o.join_timeout_s = e.join_timeout_s;
}

json scenario_json(const engine::KillScenario& s, const engine::FaultDrillOptions& o) {
  json survivors = json::array();
  for (const auto& v : s.survivors)
    survivors.push_back({{"rank", v.rank}, {"outcome", engine::to_string(v.outcome)},
                         {"lost_ranks", v.lost_ranks}, {"detection_s", v.detection_s},
                         {"exit", v.exit}, {"error_line", v.error_line}});
  return {{"name", s.name},
          {"kill_rank", o.kill_rank},
          {"kill_node", o.node_of(o.kill_rank)},
          {"kill_step", s.kill_step},
          {"failed", drill_launch_json(s.failed)},
          {"relaunch", drill_launch_json(s.relaunch)},
          {"survivors", survivors},
          {"detection_s", s.detection_s},
          {"all_exited_s", s.all_exited_s},
          {"kill_grace_s", s.kill_grace_s},
          {"launch_names_lost_rank", s.launch_names_lost_rank},
          {"checkpoint_verifies", s.checkpoint_verifies},
          {"checkpoint_step", s.checkpoint_step},
          {"staging_left", s.staging_left},
          {"staging_removed_on_relaunch", s.staging_removed_on_relaunch},
          {"restart_s", s.restart_s},
          {"recovery_s", s.recovery_s},
          {"steps_redone", s.steps_redone},
          {"resume_step", s.resume_step},
          {"reference_step", s.reference_step},
          {"resume_consumed_samples", s.resume_consumed},
          {"reference_consumed_samples", s.reference_consumed},
          {"resume_grad_norm", s.resume_grad_norm},
          {"reference_grad_norm", s.reference_grad_norm},
          {"losses_equal", s.losses_equal},
          {"final_params_equal", s.final_params_equal},
          {"detection_ok", s.detection_ok(o.kill_rank, o.collective_timeout_s)},
          {"recovery_ok", s.recovery_ok()}};
}

json to_json(const engine::FaultDrillResult& r) {
  const auto& o = r.options;
  json damage = json::array();
  for (const auto& c : r.corruptions)
    damage.push_back({{"damage", c.damage}, {"file", c.file},
                      {"expected_check", c.expected_check},
                      {"launch", drill_launch_json(c.launch)},
                      {"error_line", c.error_line}, {"loaded_anything", c.loaded_anything},
                      {"io_verify_alone_rejects", c.io_verify_alone_rejects}, {"ok", c.ok()}});
  return {{"command", "run fault-drill"},
          {"world_size", o.world_size},
          {"nnodes", o.nnodes},
          {"nproc_per_node", o.nproc_per_node()},
          {"node_rank", o.node_rank},
          {"hosts_here", r.hosts_here},
          {"master_addr", o.master_addr},
          {"gathered", r.gathered},
          {"steps", o.steps},
          {"save_every", o.save_every},
          {"collective_timeout_s", o.collective_timeout_s},
          {"work_dir", r.work_dir.string()},
          {"work_dir_removed", r.work_dir_removed},
          {"reference", drill_launch_json(r.reference)},
          {"reference_params_crc32c", r.reference_params_crc32c},
          {"mid_step", scenario_json(r.mid_step, o)},
          {"during_save", o.nnodes == 1 ? scenario_json(r.during_save, o) : json(nullptr)},
          {"corruptions", damage},
          {"leftover_pids", r.leftover_pids},
          {"ok", r.ok()}};
}

void print_scenario(const char* label, const engine::KillScenario& s,
                    const engine::FaultDrillOptions& o) {
  fmt::print("{} kill rank {}{} {} at step {}:\n", label, o.kill_rank,
             o.nnodes > 1 ? fmt::format(" (host {})", o.node_of(o.kill_rank)) : "", s.name,
             s.kill_step);
  fmt::print("    tally launch exit {}: {}\n", s.failed.exit_code, s.failed.message);
  for (const auto& v : s.survivors) {
    switch (v.outcome) {
      case engine::SurvivorOutcome::noticed:
        fmt::print("    rank {}: CommError {:.3f} s after the kill (timeout {:g} s): {}\n", v.rank,
                   v.detection_s, o.collective_timeout_s, v.error_line);
        break;
      case engine::SurvivorOutcome::stopped_by_launcher:
        fmt::print("    rank {}: stopped by the launcher before it noticed ({}){}{}\n", v.rank,
                   v.exit, v.error_line.empty() ? "" : ": ", v.error_line);
        break;
      case engine::SurvivorOutcome::exited_unreported:
        fmt::print("    rank {}: EXITED WITHOUT REPORTING THE FAILURE ({}){}{}\n", v.rank, v.exit,
                   v.error_line.empty() ? "" : ": ", v.error_line);
        break;
    }
  }
  const std::string detection =
      s.detection_s >= 0 ? fmt::format("detection {:.3f} s (slowest survivor that noticed)",
                                       s.detection_s)
                         : std::string("no survivor noticed before the launcher stopped it");
  fmt::print("    {}; every rank gone {:.3f} s after the kill (limit {:g} s: timeout + kill "
             "grace): {}\n",
             detection, s.all_exited_s, o.collective_timeout_s + s.kill_grace_s,
             mark(s.detection_ok(o.kill_rank, o.collective_timeout_s)));
  fmt::print("    on disk: checkpoint at step {} {}{}\n", s.checkpoint_step,
             s.checkpoint_verifies ? "verifies" : "DOES NOT VERIFY",
             s.staging_left ? fmt::format("; the interrupted save's staging directory left aside "
                                          "({} on relaunch)",
                                          s.staging_removed_on_relaunch ? "removed" : "NOT removed")
                            : "");
  fmt::print("    relaunch (exit {}): restart {:.3f} s (start → checkpoint loaded), recovery "
             "{:.3f} s (kill → step {} done again), {} step(s) redone\n",
             s.relaunch.exit_code, s.restart_s, s.recovery_s, s.kill_step, s.steps_redone);
  fmt::print("    resume point vs uninterrupted: step {} = {}, consumed_samples {} = {}, "
             "grad-norm of step {} {:.17g} = {:.17g}; later losses {}; final params and Adam "
             "state {}: {}\n",
             s.resume_step, s.reference_step, s.resume_consumed, s.reference_consumed,
             s.resume_step + 1, s.resume_grad_norm, s.reference_grad_norm,
             s.losses_equal ? "identical" : "DIFFER",
             s.final_params_equal ? "bit-identical" : "DIFFER", mark(s.recovery_ok()));
}

void print_text(const engine::FaultDrillResult& r) {
  const auto& o = r.options;
  std::string where = "over loopback";
  if (o.nnodes > 1) {
    where = fmt::format("on {} hosts × {} (", o.nnodes, o.nproc_per_node());
    if (int(r.hosts_here.size()) == o.nnodes)
      where += "every host, on this machine)";
    else
      where += fmt::format("this is host {}; master {}; every host's ranks read back from the "
                           "work dir)",
                           o.node_rank, o.master_addr);
  }
  fmt::print("fault-drill: {} ranks {}, {} steps, checkpoint every {}, collective "
             "timeout {:g} s; work dir {}\n",
             o.world_size, where, o.steps, o.save_every, o.collective_timeout_s,
             r.work_dir.string());
  fmt::print("  reference: uninterrupted run, exit {}, final params crc32c {}\n",
             r.reference.exit_code, r.reference_params_crc32c);
  print_scenario("  (1)", r.mid_step, o);
  if (!r.gathered)
    fmt::print("  ANOTHER HOST'S PART OF A SUB-RUN NEVER ARRIVED in the work dir (within "
               "--join-timeout {:g} s)\n",
               o.join_timeout_s);
  if (o.nnodes > 1) {
    fmt::print("  (2), (3): on one host only (what they test lands in the checkpoint files, "
               "wherever the ranks run)\n");
    fmt::print("  leftover processes: {}; work dir {}\n", r.leftover_pids.size(),
               r.work_dir_removed ? "removed" : "kept");
    fmt::print("fault-drill: {}\n", mark(r.ok()));
    return;
  }
  print_scenario("  (2)", r.during_save, o);
  fmt::print("  (3) damaged copies of the step-{} checkpoint, resumed:\n", o.steps);
  for (const auto& c : r.corruptions)
    fmt::print("    {}: exit {}, nothing loaded: {}; {}\n      {}{}\n", c.damage,
               c.launch.exit_code, c.loaded_anything ? "NO" : "yes", mark(c.ok()), c.error_line,
               c.io_verify_alone_rejects ? ""
                                         : "\n      (io::verify_checkpoint alone accepts this "
                                           "edit: index.json carries no checksum in io's format; "
                                           "the engine's index.json.crc32c catches it)");
  fmt::print("  leftover processes: {}; work dir {}\n", r.leftover_pids.size(),
             r.work_dir_removed ? "removed" : "kept");
  fmt::print("fault-drill: {}\n", mark(r.ok()));
}

const RegisterRun reg{[](CLI::App& run_cmd) {
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = run_cmd.add_subcommand(
      "fault-drill",
      "the seed's fault-tolerance drill: kill a rank mid-step and during a save, damage "
      "checkpoint files; measure detection and recovery, check the resume is exact");
  cmd->footer(
      "Runs by itself (not under `tally launch`): it starts every sub-run of `tally run "
      "checkpoint` with the launcher, on 127.0.0.1, in a temporary directory it removes. Takes "
      "≈15–30 s at 2 ranks. Exit 1 if a criterion fails. With --nnodes N (>= 2) and "
      "--nproc-per-node K: (1) across N hosts (the victim may be on any), each host a launcher "
      "of its own — threads of this process, or with --node-rank this host's only, every host "
      "running the same drill. With --elastic: three sub-runs, each "
      "host a launcher of its own (threads of this process, or with --node-rank this host's "
      "only, every host running the same drill).");
  auto& o = f->drill;
  cmd->add_option("--nproc", o.world_size, "ranks per sub-run")->capture_default_str();
  cmd->add_option("--steps", o.steps, "steps of every run")->capture_default_str();
  cmd->add_option("--save-every", o.save_every, "checkpoint interval, steps")->capture_default_str();
  cmd->add_option("--kill-rank", o.kill_rank, "the rank that dies")->capture_default_str();
  cmd->add_option("--kill-at-step", o.kill_at_step, "(1) it dies after this step's forward pass")
      ->capture_default_str();
  cmd->add_option("--kill-at-save", o.kill_at_save,
                  "(2) it dies after writing its shard of this step's save")
      ->capture_default_str();
  cmd->add_option("--timeout", o.collective_timeout_s, "each rank's collective timeout, s")
      ->check(finite_in(0, 86400, Ends::open_lo))
      ->capture_default_str();
  cmd->add_option("--launch-timeout", o.launch_timeout_s, "each sub-run's deadline, s")
      ->check(finite_in(0, 86400, Ends::open_lo))
      ->capture_default_str();
  cmd->add_option("--work-dir", f->work_dir, "use (and keep) this directory instead of a temporary one");
  cmd->add_flag("--keep", o.keep_work_dir, "keep the temporary work directory");
  cmd->add_option("--tally-binary", o.tally_binary, "the tally executable the ranks run (default: this one)");
  cmd->add_flag("--json", f->json, "one JSON object");
  // --elastic: lose a whole host, resume on the rest at the smaller world size.
  auto& e = f->elastic;
  cmd->add_flag("--elastic", f->is_elastic,
                "the elastic drill: the last host's ranks all die mid-step; the remaining hosts "
                "resume from the last checkpoint at the smaller world size with the gradient "
                "accumulation that keeps the global batch, compared with an uninterrupted run "
                "(defaults then: --steps 8, --save-every 4, --kill-at-step 6)");
  cmd->add_option("--nnodes", e.nnodes,
                  "hosts (--elastic: before the loss; without it the default is 1)")
      ->capture_default_str();
  cmd->add_option("--nproc-per-node", e.nproc_per_node, "with --nnodes: ranks per host")
      ->capture_default_str();
  cmd->add_option("--node-rank", e.node_rank,
                  "with --nnodes: play only this host (run the drill on every host, each with "
                  "its own; needs --master-addr, --master-port, a shared --work-dir); -1 = every "
                  "host on this machine")
      ->capture_default_str();
  cmd->add_option("--master-addr", e.master_addr, "with --nnodes: host 0, as every host reaches it")
      ->capture_default_str();
  cmd->add_option("--master-port", e.master_port,
                  "with --nnodes: sub-run j uses port + 2j and + 2j + 1 (0 = free ports)")
      ->capture_default_str();
  cmd->add_option("--consistency-every", e.consistency_every,
                  "--elastic: the runs compare their replicas every N steps (0 = never)")
      ->capture_default_str();
  cmd->add_option("--tolerance", e.tolerance,
                  "--elastic: relative difference allowed in loss and grad-norm after the resume")
      ->check(finite_in(0, 1, Ends::open_hi))
      ->capture_default_str();
  cmd->add_option("--join-timeout", e.join_timeout_s,
                  "with --nnodes: the hosts' launchers meet (and their parts arrive) within, s")
      ->check(finite_in(0, 86400, Ends::open_lo))
      ->capture_default_str();
  cmd->callback([f, cmd] {
    if (f->is_elastic) return run_elastic(*f, *cmd);
    for (const std::string& flag : kElasticOnly)
      if (cmd->count(flag) > 0)
        throw InvalidInput(flag + " = " + cmd->get_option(flag)->results().front() +
                           ": only with --elastic");
    engine::FaultDrillOptions o = f->drill;
    o.work_dir = f->work_dir;
    across_hosts(*f, *cmd, o);
    const engine::FaultDrillResult r = engine::run_fault_drill(o);
    if (f->json)
      print_json(to_json(r));
    else
      print_text(r);
    std::fflush(stdout);
    if (!r.ok()) throw std::runtime_error("fault-drill: a criterion failed (see the report)");
  });
}};

}  // namespace

}  // namespace tally::cli::run_fault_drill
