// `tally run fault-drill --elastic`: the reporters (elastic_report.hpp). The flags are
// run_fault_drill.cpp's (one subcommand).
#include <fmt/core.h>

#include <string>

#include "elastic_report.hpp"

namespace tally::cli {

namespace {

using nlohmann::json;

const char* mark(bool ok) { return ok ? "ok" : "FAILED"; }

json launches_json(const std::vector<engine::DrillLaunch>& ls) {
  json a = json::array();
  for (const auto& l : ls) a.push_back(drill_launch_json(l));
  return a;
}

std::string hosts_text(const std::vector<int>& hosts, int nnodes) {
  if (int(hosts.size()) == nnodes) return "every host, on this machine";
  std::string s = "host";
  for (int h : hosts) s += " " + std::to_string(h);
  return s + " of " + std::to_string(nnodes);
}

}  // namespace

json drill_launch_json(const engine::DrillLaunch& l) {
  return {{"what", l.what}, {"command", l.command}, {"exit_code", l.exit_code},
          {"message", l.message}, {"elapsed_s", l.end_unix_s - l.start_unix_s}};
}

json elastic_json(const engine::ElasticDrillResult& r) {
  const auto& o = r.options;
  json steps = json::array();
  for (const auto& s : r.steps)
    steps.push_back({{"step", s.step},
                     {"consumed_samples", s.consumed_samples},
                     {"reference_consumed_samples", s.reference_consumed_samples},
                     {"loss", s.loss},
                     {"reference_loss", s.reference_loss},
                     {"loss_rel_diff", s.loss_rel_diff()},
                     {"grad_norm", s.grad_norm},
                     {"reference_grad_norm", s.reference_grad_norm},
                     {"grad_norm_rel_diff", s.grad_norm_rel_diff()}});
  return {{"command", "run fault-drill --elastic"},
          {"nnodes", o.nnodes},
          {"nproc_per_node", o.nproc_per_node},
          {"node_rank", o.node_rank},
          {"hosts_here", r.hosts_here},
          {"master_addr", o.master_addr},
          {"steps", o.steps},
          {"save_every", o.save_every},
          {"kill_at_step", o.kill_at_step},
          {"consistency_every", o.consistency_every},
          {"tolerance", o.tolerance},
          {"collective_timeout_s", o.collective_timeout_s},
          {"global_batch", r.global_batch},
          {"world_size_before", o.world_before()},
          {"world_size_after", o.world_after()},
          {"grad_accum_before", o.accum_before()},
          {"grad_accum_after", o.accum_after()},
          {"micro_batch", r.global_batch / (o.world_before() * o.accum_before())},
          {"work_dir", r.work_dir.string()},
          {"work_dir_removed", r.work_dir_removed},
          {"reference", launches_json(r.reference)},
          {"loss", launches_json(r.loss)},
          {"resume", drill_launch_json(r.resume)},
          {"lost_ranks", r.lost_ranks},
          {"loss_named", r.loss_named},
          {"loss_to_exit_s", r.loss_to_exit_s},
          {"checkpoint_verifies", r.checkpoint_verifies},
          {"checkpoint_step", r.checkpoint_step},
          {"checkpoint_world_size", r.checkpoint_world_size},
          {"restart_s", r.restart_s},
          {"loaded_world_size", r.loaded_world_size},
          {"resumed_world_size", r.resumed_world_size},
          {"resume_step", r.resume_step},
          {"reference_step", r.reference_step},
          {"resume_consumed_samples", r.resume_consumed},
          {"reference_consumed_samples", r.reference_consumed},
          {"resumed_steps", steps},
          {"max_loss_rel_diff", r.max_loss_rel_diff()},
          {"max_grad_norm_rel_diff", r.max_grad_norm_rel_diff()},
          {"final_step", r.final_step},
          {"reference_consistency_checks", r.reference_checks},
          {"resume_consistency_checks", r.resume_checks},
          {"consistency_checks_agree", r.checks_agree},
          {"leftover_pids", r.leftover_pids},
          {"ok", r.ok()}};
}

void print_elastic_text(const engine::ElasticDrillResult& r) {
  const auto& o = r.options;
  const std::int64_t micro = r.global_batch / (o.world_before() * o.accum_before());
  fmt::print("fault-drill --elastic: {} hosts × {} ranks ({}), {} steps, checkpoint every {}, "
             "global batch {}; collective timeout {:g} s; work dir {}\n",
             o.nnodes, o.nproc_per_node, hosts_text(r.hosts_here, o.nnodes), o.steps,
             o.save_every, r.global_batch, o.collective_timeout_s, r.work_dir.string());
  for (std::size_t i = 0; i < r.reference.size(); ++i)
    fmt::print("  reference (host {}): uninterrupted at world size {} (grad-accum {} × micro-batch "
               "{}), exit {}\n",
               r.hosts_here[i], o.world_before(), o.accum_before(), micro,
               r.reference[i].exit_code);
  const std::string lost =
      r.lost_ranks.size() == 1
          ? fmt::format("rank {}", r.lost_ranks.front())
          : fmt::format("ranks {}–{}", r.lost_ranks.front(), r.lost_ranks.back());
  for (std::size_t i = 0; i < r.loss.size(); ++i)
    fmt::print("  loss (host {}): every rank of host {} ({}) SIGKILLs itself mid-step {}; tally "
               "launch exit {}: {}\n",
               r.hosts_here[i], o.nnodes - 1, lost, o.kill_at_step, r.loss[i].exit_code,
               r.loss[i].message);
  if (!r.host0_here()) {
    fmt::print("  this host's part is done{}; host 0's report has the verdict\n",
               r.resume.command.empty() ? " (it was the lost host)"
                                        : fmt::format(" (resume exit {})", r.resume.exit_code));
    fmt::print("fault-drill --elastic: {}\n", mark(r.ok()));
    return;
  }
  fmt::print("    host 0 named the lost host: {}{}\n", r.loss_named ? "yes" : "NO",
             r.loss_to_exit_s >= 0
                 ? fmt::format("; its launcher returned {:.3f} s after the kill", r.loss_to_exit_s)
                 : std::string());
  fmt::print("    on disk: checkpoint at step {} saved at world size {} {}\n", r.checkpoint_step,
             r.checkpoint_world_size, r.checkpoint_verifies ? "verifies" : "DOES NOT VERIFY");
  fmt::print("  resume on {} host(s): world size {} → {}, grad-accum {} → {} (micro-batch {}, "
             "global batch {} kept), exit {}, restart {:.3f} s (start → checkpoint resharded "
             "and loaded)\n",
             o.nnodes - 1, r.loaded_world_size, r.resumed_world_size, o.accum_before(),
             o.accum_after(), micro, r.global_batch, r.resume.exit_code, r.restart_s);
  fmt::print("  resume point vs uninterrupted: step {} = {}, consumed_samples {} = {}\n",
             r.resume_step, r.reference_step, r.resume_consumed, r.reference_consumed);
  fmt::print("    step  consumed  (uninterrupted)  loss                 (uninterrupted)       "
             "rel.diff  grad-norm            (uninterrupted)       rel.diff\n");
  for (const auto& s : r.steps)
    fmt::print("    {:>4}  {:>8}  {:>15}  {:<19.17g}  {:<19.17g}  {:8.1e}  {:<19.17g}  "
               "{:<19.17g}  {:8.1e}\n",
               s.step, s.consumed_samples, s.reference_consumed_samples, s.loss, s.reference_loss,
               s.loss_rel_diff(), s.grad_norm, s.reference_grad_norm, s.grad_norm_rel_diff());
  bool consumed_equal = !r.steps.empty();
  for (const auto& s : r.steps)
    consumed_equal = consumed_equal && s.consumed_samples == s.reference_consumed_samples;
  fmt::print("    consumed_samples {} at every step; loss and grad-norm within {:g} relative: max "
             "{:.1e} and {:.1e} (the same batches, their gradients summed in another order)\n",
             consumed_equal ? "equal" : "NOT EQUAL", o.tolerance, r.max_loss_rel_diff(),
             r.max_grad_norm_rel_diff());
  fmt::print("  consistency checks every {} steps (reference batch, bit for bit across ranks): "
             "{} in the reference, {} after the resume: {}\n",
             o.consistency_every, r.reference_checks, r.resume_checks,
             r.checks_agree ? "all agree" : "NOT ALL AGREE (or none ran)");
  fmt::print("  final step {}; leftover processes: {}; work dir {}\n", r.final_step,
             r.leftover_pids.size(), r.work_dir_removed ? "removed" : "kept");
  fmt::print("fault-drill --elastic: {}\n", mark(r.ok()));
}

}  // namespace tally::cli
