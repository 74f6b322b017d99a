// `tally reliability`: MTBF, checkpoint save time, optimal interval and overhead.
#include <fmt/core.h>

#include <cmath>
#include <memory>
#include <optional>

#include "commands.hpp"
#include "common.hpp"
#include "html_pages.hpp"
#include "html_report.hpp"
#include "tally/core/hardware.hpp"
#include "tally/core/reliability.hpp"

namespace tally::cli {

namespace {

struct ReliabilityOptions {
  OutputOptions out;
  // Defaults from production fleets (core/hardware.hpp ClusterSpec); the seed's scenarios give
  // λ = 3e-6 and 2 GB/s explicitly.
  double gpus = 0, failure_rate = kFleetFailureRatePerGpuHour, restart_minutes = 8;
  std::optional<double> state_bytes;  // required: --state-size or --state-gb
  std::optional<double> write_bps;    // unset: 1 GB/s per node of 8 GPUs
  double full_copies = 1;
  std::optional<double> interval_hours, days;  // unset: not evaluated
  std::optional<std::string> html;             // --html FILE
};

nlohmann::json reliability_json(const ReliabilityOptions& o, const ReliabilityReport& r) {
  nlohmann::json j = {{"command", "reliability"},
                      {"convention", r.convention()},
                      {"gpus", o.gpus},
                      {"failure_rate_per_gpu_hour", o.failure_rate},
                      {"no_failures_expected", no_failures_expected(r)},
                      {"mtbf_hours", unless_no_failures(r, r.mtbf_hours)},
                      {"save_seconds", r.save_seconds},
                      {"full_save_seconds", r.full_save_seconds},
                      {"young_interval_hours", unless_no_failures(r, r.young_interval_hours)},
                      {"daly_interval_hours", unless_no_failures(r, r.daly_interval_hours)},
                      {"recommended_interval_hours",
                       unless_no_failures(r, r.recommended_interval_hours)},
                      {"overhead_fraction", r.overhead_at_recommended}};
  if (r.overhead_at_given) {
    j["interval_hours"] = *o.interval_hours;
    j["overhead_fraction_at_interval"] = *r.overhead_at_given;
  }
  if (r.expected_failures) j["expected_failures"] = *r.expected_failures;
  return j;
}

void print_reliability_text(const ReliabilityOptions& o, const ReliabilityReport& r) {
  fmt::print("tally reliability  [{}]\n", r.convention());
  if (no_failures_expected(r))
    fmt::print("  MTBF                 not applicable: no failures expected (G = {:g}, λ = {:g} "
               "per GPU-hour)\n",
               o.gpus, o.failure_rate);
  else
    fmt::print("  MTBF                 {:>10.4g} h   (1 / (G·λ), G = {:g}, λ = {:g} per "
               "GPU-hour)\n",
               r.mtbf_hours, o.gpus, o.failure_rate);
  fmt::print("  sharded save         {:>10.1f} s   ({:g} GB at {:g} GB/s)\n", r.save_seconds,
             *o.state_bytes / kGB, *o.write_bps / kGB);
  if (o.full_copies > 1)
    fmt::print("  full save            {:>10.1f} s   ({:g} copies)\n", r.full_save_seconds,
               o.full_copies);
  if (no_failures_expected(r)) {
    fmt::print("  interval             {}\n", kNoFailuresExpected);
    fmt::print("  overhead             {:>10.2f} %   no rework and no checkpoint needed\n",
               100 * r.overhead_at_recommended);
  } else {
    fmt::print("  Young interval       {:>10.3f} h   √(2·C·MTBF)\n", r.young_interval_hours);
    fmt::print("  Daly interval        {:>10.3f} h   (recommended)\n", r.daly_interval_hours);
    fmt::print("  overhead             {:>10.2f} %   C/T + (T/2 + R)/MTBF at the Daly interval, "
               "R = {:g} min\n",
               100 * r.overhead_at_recommended, o.restart_minutes);
  }
  if (r.overhead_at_given)
    fmt::print("  overhead at {:g} h     {:>10.2f} %\n", *o.interval_hours,
               100 * *r.overhead_at_given);
  if (r.expected_failures)
    fmt::print("  expected failures    {:>10.1f}     over {:g} days\n", *r.expected_failures,
               *o.days);
}

void run_reliability(ReliabilityOptions o) {
  if (!o.write_bps) o.write_bps = ClusterSpec{}.checkpoint_write_bps_for(int(std::ceil(o.gpus)));
  if (!o.state_bytes)
    throw InvalidInput("--state-size is required (or --state-gb): the checkpointed state, e.g. 112GB");
  ReliabilitySetup s{.gpus = o.gpus, .failure_rate_per_hour = o.failure_rate,
                     .state_bytes = *o.state_bytes, .write_bps = *o.write_bps,
                     .restart_hours = o.restart_minutes / 60, .full_copies = o.full_copies};
  if (o.interval_hours) s.interval_hours = *o.interval_hours;
  if (o.days) s.run_hours = *o.days * 24;
  const ReliabilityReport r = reliability(s);
  const nlohmann::json j = reliability_json(o, r);
  require_finite(j);  // Note [no inf or nan in output], for the text report too
  if (o.html) html::write_file("--html", *o.html, html::page(reliability_page(r)));
  if (o.out.json) {
    print_json(j);
    return;
  }
  print_reliability_text(o, r);
}

}  // namespace

void register_reliability(CLI::App& app) {
  auto o = std::make_shared<ReliabilityOptions>();
  auto* cmd = app.add_subcommand("reliability",
                                 "failures, checkpoint cost and the optimal checkpoint interval");
  add_output_flags(cmd, o->out);
  cmd->add_option("--gpus", o->gpus, "GPUs G")->required()->check(finite_in(1, 1e8));
  cmd->add_option("--failure-rate", o->failure_rate,
                  "failures per GPU-hour λ (0: no failures expected, no interval needed)")
      ->check(finite_in(kFailureRateBounds.lo, kFailureRateBounds.hi))
      ->default_str("1.97e-5, Llama 3's fleet");
  add_size_flag(cmd, "--state-size", "--state-gb", o->state_bytes,
                "checkpointed state (required)", 1, 1e21);
  add_bandwidth_flag(cmd, "--write-bandwidth", "--write-gbps", o->write_bps,
                     "aggregate checkpoint write bandwidth (default 1GB/s per node of 8 GPUs, from "
                     "published saves at scale; the seed's scenarios use 2GB/s)",
                     kBandwidthBpsBounds.lo, kBandwidthBpsBounds.hi);
  cmd->add_option("--restart-minutes", o->restart_minutes,
                  "R: detect + restart + reload per failure, minutes")
      ->check(finite_in(0, 1e6))
      ->capture_default_str();
  cmd->add_option("--interval-hours", o->interval_hours, "evaluate this checkpoint interval too")
      ->check(finite_in(1e-6, 1e6));
  cmd->add_option("--days", o->days, "run length, for expected failures")
      ->check(finite_in(1e-6, 1e5));
  cmd->add_option("--full-copies", o->full_copies,
                  "copies written by a full (unsharded) strategy, for comparison (seed: 128)")
      ->check(finite_in(1, 1e7));
  cmd->add_option("--html", o->html,
                  "also write the lost fraction against the checkpoint interval as a "
                  "self-contained HTML page to FILE");
  cmd->callback([o] { run_reliability(*o); });
}

}  // namespace tally::cli
