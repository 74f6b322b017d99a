// `tally run ddp-check`: one rank of the seed's ddp_check.py (engine/runtime/include/tally/engine/
// ddp_check.hpp). Text or --json (one JSON object on one line per rank, so `tally launch`'s
// "[rank r] " prefixes keep ranks apart); exits 1 naming the first failed criterion.
#include <cmath>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "common.hpp"
#include "run_registry.hpp"
#include "tally/core/types.hpp"
#include "tally/core/comm.hpp"
#include "tally/engine/experiments/ddp_check.hpp"

namespace tally::cli::run_ddp_check {

namespace {

struct Flags {
  double timeout_s = 60;
  double bucket_mib = 25;
  bool json = false;
  bool grads = false;
};

nlohmann::json ddp_stats_json(const engine::DdpStats& s) {
  return {{"backward_passes", s.backward_passes},
          {"no_sync_backward_passes", s.no_sync_backward_passes},
          {"sync_events", s.sync_events},
          {"bucket_all_reduces", s.bucket_all_reduces},
          {"gradient_bytes_sent", s.gradient_bytes_sent},
          {"buckets_done_during_backward", s.buckets_done_during_backward},
          {"wire_bytes_per_sync", s.wire_bytes_per_sync},
          {"grad_dtype", s.grad_dtype},
          {"wire_dtype", s.wire_dtype}};
}

nlohmann::json to_json(const engine::DdpCheckResult& r) {
  const auto& c = r.comm;
  nlohmann::json j = {
      {"experiment", "ddp-check"},
      {"rank", r.rank},
      {"world_size", r.world_size},
      {"samples", r.samples},
      {"local_loss", r.local_loss},
      {"full_batch_loss", r.full_batch_loss},
      {"local_grad_norm", r.local_grad_norm},
      {"ddp_grad_norm", r.ddp_grad_norm},
      {"max_grad_error", r.max_grad_error},
      {"grad_tolerance", r.grad_tolerance},
      {"max_param_diff_vs_rank0", r.max_param_diff_vs_rank0},
      {"manual_param", r.manual_param},
      {"manual_all_reduce_error", r.manual_all_reduce_error},
      {"manual_tolerance", r.manual_tolerance},
      {"criteria",
       {{"1_grad_matches_full_batch", r.grads_ok()},
        {"2_params_equal_rank0", r.params_ok()},
        {"4_manual_all_reduce_matches", r.manual_ok()}}},
      {"ok", r.ok()},
      {"buckets", r.buckets},
      {"ddp", ddp_stats_json(r.ddp)},
      {"comm",
       {{"all_reduce_calls", c[Collective::all_reduce].calls},
        {"all_reduce_bytes_sent", c[Collective::all_reduce].bytes_sent},
        {"broadcast_calls", c[Collective::broadcast].calls},
        {"broadcast_bytes_sent", c[Collective::broadcast].bytes_sent}}},
      {"parameter_names", r.parameter_names},
  };
  if (!r.averaged_gradients.empty()) {
    j["initial_parameters"] = r.initial_parameters;
    j["averaged_gradients"] = r.averaged_gradients;
  }
  return j;
}

std::string to_text(const engine::DdpCheckResult& r) {
  std::ostringstream os;
  auto mark = [](bool ok) { return ok ? "ok" : "FAILED"; };
  os << "ddp-check: rank " << r.rank << " of world " << r.world_size << " (Gloo, CPU, "
     << r.ddp.grad_dtype << "; " << r.samples << " of 64 samples; " << r.buckets << " bucket"
     << (r.buckets == 1 ? "" : "s") << ")\n";
  os << "  ③ loss " << r.local_loss << " on this rank's samples (full batch " << r.full_batch_loss
     << "); grad norm " << r.local_grad_norm << " local → " << r.ddp_grad_norm
     << " after DDP's average\n";
  os << "  ① max|g_ddp − g_full| = " << r.max_grad_error << " < " << r.grad_tolerance << ": "
     << mark(r.grads_ok()) << "\n";
  os << "  ② max|θ_rank − θ_rank0| after SGD(lr 0.1) = " << r.max_param_diff_vs_rank0
     << " (atol 0): " << mark(r.params_ok()) << "\n";
  os << "  ④ all_reduce(g)/world by hand on " << r.manual_param << " vs DDP: max diff "
     << r.manual_all_reduce_error << " < " << r.manual_tolerance << ": " << mark(r.manual_ok())
     << "\n";
  os << "  comm: " << r.ddp.sync_events << " gradient sync, " << r.ddp.bucket_all_reduces
     << " bucket all-reduce(s), " << r.ddp.gradient_bytes_sent << " bytes sent (S = "
     << r.ddp.wire_bytes_per_sync << " bytes " << r.ddp.wire_dtype << ", 2S(k−1)/k)";
  return os.str();
}

void register_ddp_check(CLI::App& run) {
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = run.add_subcommand(
      "ddp-check",
      "the seed's ddp_check.py: DDP gradients equal the full-batch gradient, replicas stay equal; "
      "start it with `tally launch --nproc N -- tally run ddp-check`");
  cmd->add_option("--timeout", f->timeout_s, "seconds for the rendezvous and each collective")
      ->check(finite_in(0, 86400, Ends::open_lo))
      ->capture_default_str();
  cmd->add_option("--bucket-mib", f->bucket_mib,
                  "DDP bucket size in MiB (PyTorch's bucket_cap_mb); tiny = one parameter each")
      ->check(finite_in(0, 1e6, Ends::open_lo))
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "one JSON object per rank, on one line");
  cmd->add_flag("--grads", f->grads, "with --json: include the initial parameters and averaged gradients (flat)");
  cmd->callback([f] {
    if (!(f->bucket_mib > 0) || !std::isfinite(f->bucket_mib)) {
      std::ostringstream os;
      os << "--bucket-mib = " << f->bucket_mib << ": must be a finite number > 0 MiB";
      throw InvalidInput(os.str());
    }
    const engine::DdpCheckOptions options{.timeout_s = f->timeout_s,
                                          .bucket_cap_bytes = f->bucket_mib * engine::kMiB,
                                          .include_gradients = f->grads};
    const engine::DdpCheckResult r =
        engine::run_ddp_check(engine::DistEnv::from_environment(), options);
    if (f->json)
      std::cout << to_json(r).dump() << std::endl;
    else
      std::cout << to_text(r) << std::endl;
    std::ostringstream why;
    if (!r.grads_ok())
      why << "① max|g_ddp − g_full| = " << r.max_grad_error << " vs tolerance " << r.grad_tolerance;
    else if (!r.params_ok())
      why << "② parameters differ from rank 0's by " << r.max_param_diff_vs_rank0 << " vs atol 0";
    else if (!r.manual_ok())
      why << "④ hand-written all-reduce differs by " << r.manual_all_reduce_error
          << " vs tolerance " << r.manual_tolerance;
    if (!r.ok())
      throw std::runtime_error("ddp-check: rank " + std::to_string(r.rank) + ": criterion " +
                               why.str());
  });
}

const RegisterRun reg{register_ddp_check};

}  // namespace

}  // namespace tally::cli::run_ddp_check
