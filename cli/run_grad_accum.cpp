// `tally run grad-accum`: one rank of the seed's gradient-accumulation check on tally's DDP
// (engine/experiments/include/tally/engine/experiments/grad_accum.hpp). Text or --json (one line per rank); exits 1
// naming the first failed criterion.
#include <cmath>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "common.hpp"
#include "run_registry.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/experiments/grad_accum.hpp"

namespace tally::cli::run_grad_accum {

namespace {

struct Flags {
  engine::GradAccumOptions options;
  double bucket_mib = 25;
  bool json = false;
};

nlohmann::json to_json(const engine::GradAccumResult& r) {
  const auto& d = r.ddp;
  return {
      {"experiment", "grad-accum"},
      {"rank", r.rank},
      {"world_size", r.world_size},
      {"dtype", "float64"},
      {"micro_batches", r.micro_batches},
      {"micro_batch_samples", r.micro_batch_samples},
      {"max_accum_vs_big_batch", r.max_accum_vs_big_batch},
      {"max_accum_vs_full_batch", r.max_accum_vs_full_batch},
      {"accum_tolerance", r.accum_tolerance},
      {"unnormalized_relative_error", r.unnormalized_relative_error},
      {"unnormalized_tolerance", r.unnormalized_tolerance},
      {"counted_steps", r.counted_steps},
      {"optimizer_steps_counted", r.optimizer_steps_counted},
      {"backward_calls_counted", r.backward_calls_counted},
      {"ddp_backward_passes_counted", r.ddp_backward_passes_counted},
      {"step_losses", r.step_losses},
      {"first5_mean_loss", r.first5_mean_loss},
      {"last5_mean_loss", r.last5_mean_loss},
      {"optimizer_steps", r.optimizer_steps},
      {"backward_calls", r.backward_calls},
      {"sync_events", d.sync_events},
      {"bucket_all_reduces", d.bucket_all_reduces},
      {"comm_all_reduce_calls", r.comm_all_reduce_calls},
      {"buckets", r.buckets},
      {"no_sync_backward_passes", d.no_sync_backward_passes},
      {"gradient_bytes_sent", d.gradient_bytes_sent},
      {"gradient_bytes_per_optimizer_step", r.gradient_bytes_per_optimizer_step},
      {"wire_dtype", d.wire_dtype},
      {"criteria",
       {{"1_accum_equals_big_batch", r.accum_ok()},
        {"2_unnormalized_is_K_times", r.unnormalized_ok()},
        {"3_counters", r.counters_ok()},
        {"4_loss_decreases", r.loss_ok()},
        {"5_one_sync_per_step", r.sync_ok()}}},
      {"ok", r.ok()},
  };
}

std::string to_text(const engine::GradAccumResult& r) {
  std::ostringstream os;
  auto mark = [](bool ok) { return ok ? "ok" : "FAILED"; };
  const auto& d = r.ddp;
  os << "grad-accum: rank " << r.rank << " of world " << r.world_size << " (float64, K = "
     << r.micro_batches << " micro-batches of " << r.micro_batch_samples << " samples per rank)\n";
  os << "  ① max|g_acc − g_big| = " << r.max_accum_vs_big_batch << ", vs one process on all 64: "
     << r.max_accum_vs_full_batch << " < " << r.accum_tolerance << ": " << mark(r.accum_ok())
     << "\n";
  os << "  ② unnormalized vs K·g_big: relative " << r.unnormalized_relative_error << " < "
     << r.unnormalized_tolerance << ": " << mark(r.unnormalized_ok()) << "\n";
  os << "  ③ after " << r.counted_steps << " effective steps: " << r.optimizer_steps_counted
     << " optimizer steps, " << r.backward_calls_counted << " backward calls (DDP hooks saw "
     << r.ddp_backward_passes_counted << "): " << mark(r.counters_ok()) << "\n";
  os << "  ④ " << r.optimizer_steps << " SGD steps: loss " << r.step_losses.front() << " → "
     << r.step_losses.back() << "; mean of last 5 " << r.last5_mean_loss << " < first 5 "
     << r.first5_mean_loss << ": " << mark(r.loss_ok()) << "\n";
  os << "  ⑤ sync events " << d.sync_events << " = optimizer steps " << r.optimizer_steps << "; "
     << d.bucket_all_reduces << " bucket all-reduces (" << r.buckets << " bucket"
     << (r.buckets == 1 ? "" : "s") << "), Comm counted " << r.comm_all_reduce_calls << "; "
     << d.no_sync_backward_passes << " backward passes under no_sync sent nothing: "
     << mark(r.sync_ok()) << "\n";
  os << "  comm: " << r.gradient_bytes_per_optimizer_step << " bytes per optimizer step ("
     << d.wire_dtype << ", 2S(k−1)/k), the same for any K: "
     << r.gradient_bytes_per_optimizer_step / r.micro_batches << " per micro-batch at K = "
     << r.micro_batches;
  return os.str();
}

std::string first_failure(const engine::GradAccumResult& r) {
  std::ostringstream os;
  if (!r.accum_ok())
    os << "① accumulated vs big-batch gradient: " << r.max_accum_vs_big_batch << " / "
       << r.max_accum_vs_full_batch << " vs tolerance " << r.accum_tolerance;
  else if (!r.unnormalized_ok())
    os << "② unnormalized relative error " << r.unnormalized_relative_error << " vs tolerance "
       << r.unnormalized_tolerance;
  else if (!r.counters_ok())
    os << "③ " << r.optimizer_steps_counted << " optimizer steps and " << r.backward_calls_counted
       << " backward calls vs expected " << r.counted_steps << " and "
       << r.counted_steps * r.micro_batches;
  else if (!r.loss_ok())
    os << "④ mean loss of the last 5 steps " << r.last5_mean_loss << " vs first 5 "
       << r.first5_mean_loss << ": did not decrease";
  else if (!r.sync_ok())
    os << "⑤ sync events " << r.ddp.sync_events << " vs optimizer steps " << r.optimizer_steps
       << " (all-reduce calls " << r.comm_all_reduce_calls << ", buckets " << r.buckets << ")";
  return os.str();
}

void register_grad_accum(CLI::App& run) {
  auto f = std::make_shared<Flags>();
  engine::GradAccumOptions& o = f->options;
  CLI::App* cmd = run.add_subcommand(
      "grad-accum",
      "the seed's gradient accumulation on DDP: K micro-batches equal one big batch, one gradient "
      "all-reduce per optimizer step; start it with `tally launch --nproc N -- tally run "
      "grad-accum`");
  cmd->add_option("--timeout", o.timeout_s, "seconds for the rendezvous and each collective")
      ->check(finite_in(0, 86400, Ends::open_lo))
      ->capture_default_str();
  cmd->add_option("--micro-batches", o.micro_batches, "K, micro-batches per optimizer step")
      ->capture_default_str();
  cmd->add_option("--steps", o.steps, "optimizer steps of SGD training (>= 10)")
      ->capture_default_str();
  cmd->add_option("--counted-steps", o.counted_steps, "criterion ③ reads the counters after these")
      ->capture_default_str();
  cmd->add_option("--lr", o.lr, "SGD learning rate")
      ->check(finite_in(0, 1e6, Ends::open_lo))
      ->capture_default_str();
  cmd->add_option("--bucket-mib", f->bucket_mib, "DDP bucket size in MiB (bucket_cap_mb)")
      ->check(finite_in(0, 1e6, Ends::open_lo))
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "one JSON object per rank, on one line");
  cmd->callback([f] {
    if (!(f->bucket_mib > 0) || !std::isfinite(f->bucket_mib)) {
      std::ostringstream os;
      os << "--bucket-mib = " << f->bucket_mib << ": must be a finite number > 0 MiB";
      throw InvalidInput(os.str());
    }
    f->options.bucket_cap_bytes = f->bucket_mib * engine::kMiB;
    const engine::GradAccumResult r =
        engine::run_grad_accum(engine::DistEnv::from_environment(), f->options);
    if (f->json)
      std::cout << to_json(r).dump() << std::endl;
    else
      std::cout << to_text(r) << std::endl;
    if (!r.ok())
      throw std::runtime_error("grad-accum: rank " + std::to_string(r.rank) + ": criterion " +
                               first_failure(r));
  });
}

const RegisterRun reg{register_grad_accum};

}  // namespace

}  // namespace tally::cli::run_grad_accum
