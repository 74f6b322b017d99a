// `tally run health-check` (engine/experiments/include/tally/engine/experiments/health_check.hpp):
// every rank measures, rank 0 prints the group's report (a table, or one JSON object with --json)
// and exits 1 naming every straggler rank, straggler link and wrong-result rank; the other ranks
// print nothing and exit 0. Bad flags exit 2 with one line.
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common.hpp"
#include "flags.hpp"
#include "format.hpp"
#include "run_registry.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/experiments/health_check.hpp"
#include "tally/io/calibration.hpp"
#include "tally/io/files.hpp"

namespace tally::cli::run_health_check {

namespace {

struct Flags {
  engine::HealthCheckOptions options;
  double memory_mib = 16, link_mb = 4;
  std::string calibration;
  bool json = false;
};

std::string list(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

std::string link_name(const engine::LinkHealth& l) {
  return std::to_string(l.src) + "→" + std::to_string(l.dst);
}

// "" when nothing is flagged, else "straggler rank(s) 2; straggler link(s) 2→3; wrong result
// rank(s) 1" — the error line and the report's verdict.
std::string flagged(const engine::HealthCheckResult& r) {
  std::vector<std::string> parts;
  if (const auto s = r.straggler_ranks(); !s.empty()) parts.push_back("straggler rank " + list(s));
  if (const auto s = r.straggler_links(); !s.empty()) {
    std::string links;
    for (int src : s) links += (links.empty() ? "" : ", ") + link_name(r.links[std::size_t(src)]);
    parts.push_back("straggler link " + links);
  }
  if (const auto s = r.wrong_result_ranks(); !s.empty())
    parts.push_back("wrong result rank " + list(s));
  if (const auto s = r.below_calibration_ranks(); !s.empty())
    parts.push_back("below its own calibration rank " + list(s));
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

std::string rank_verdict(const engine::RankHealth& h) {
  std::vector<std::string> v;
  if (h.gemm_straggler) v.push_back("STRAGGLER (gemm)");
  if (h.memory_straggler) v.push_back("STRAGGLER (memory)");
  if (h.wrong_result) v.push_back("WRONG RESULT");
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s.empty() ? "ok" : s;
}

// The verdict against the rank's own calibration (Note [health-check against a calibration]).
std::string calibration_verdict(const engine::RankHealth& h) {
  if (h.gemm_below_calibration && h.memory_below_calibration) return "BELOW (gemm, memory)";
  if (h.gemm_below_calibration) return "BELOW (gemm)";
  if (h.memory_below_calibration) return "BELOW (memory)";
  return "ok";
}

void print_calibration(const engine::HealthCheckResult& r, double limit) {
  const auto& c = *r.options.calibration;
  fmt::print("  against each rank's own calibration ({}; rank 0's expects gemm from {}, "
             "memory from {}); below = figure < {} × expected:\n",
             c.source,
             c.gemm_measured ? "its own " + std::to_string(r.options.gemm_n) + "³ sample"
                             : "the operator model fitted to its GEMMs",
             c.memory_measured ? "its curve at the same working set"
                               : "its DRAM streaming rate",
             sig_str(limit, 3));
  fmt::print("  {:>4} {:>13} {:>8} {:>13} {:>8}  {:<22}  {}\n", "rank", "exp_GFLOP/s", "×calib",
             "exp_GB/s", "×calib", "vs own calibration", "vs group median");
  for (const engine::RankHealth& h : r.ranks)
    fmt::print("  {:>4} {:>13.2f} {:>8.2f} {:>13.2f} {:>8.2f}  {:<22}  {}\n", h.rank,
               h.gemm_expected_flops_per_s / 1e9, h.gemm_vs_calibration,
               h.memory_expected_bytes_per_s / kGB, h.memory_vs_calibration,
               calibration_verdict(h), rank_verdict(h));
}

void print_text(const engine::HealthCheckResult& r) {
  const auto& o = r.options;
  const double limit = 1 / (1 + o.straggler_threshold);
  const double calibration_limit = 1 / (1 + o.calibration_threshold);
  fmt::print("health-check: {} rank{} (Gloo, CPU, 1 torch thread each, kernels on the CPU clock); "
             "straggler = figure < {} × the group median (a link: < {} ×); {} rounds, each rank or "
             "link timed alone\n",
             r.world_size, r.world_size == 1 ? "" : "s", sig_str(limit, 3),
             sig_str(1 / (1 + o.link_straggler_threshold), 3), o.rounds);
  fmt::print("  {:>4} {:>13} {:>8} {:>13} {:>8} {:>9}  {}\n", "rank", "gemm_GFLOP/s", "×median",
             "memory_GB/s", "×median", "checksum", "verdict");
  for (const engine::RankHealth& h : r.ranks)
    fmt::print("  {:>4} {:>13.2f} {:>8.2f} {:>13.2f} {:>8.2f} {:>9}  {}\n", h.rank,
               h.gemm_flops_per_s / 1e9, h.gemm_vs_median, h.memory_bytes_per_s / kGB,
               h.memory_vs_median, io::crc32c_hex(h.checksum), rank_verdict(h));
  fmt::print("  median {:>11.2f} {:>8} {:>13.2f} {:>8} {:>9}  (gemm {}³ float32; memory add over "
             "{} MiB; checksum CRC-32C of a fixed-seed gemm, majority {})\n",
             r.gemm_median_flops_per_s / 1e9, "", r.memory_median_bytes_per_s / kGB, "",
             "", o.gemm_n, sig_str(o.memory_bytes / kMiB, 4),
             r.majority_checksum ? io::crc32c_hex(*r.majority_checksum) : "none");
  if (o.calibration) print_calibration(r, calibration_limit);
  if (!r.links.empty()) {
    fmt::print("  {:>6} {:>13} {:>8} {:>10}  {}   (send/recv of {} MB to the ring neighbour; "
               "its fastest message)\n",
               "link", "GB/s", "×median", "min_us", "verdict",
               sig_str(r.link_message_bytes / kMB, 4));
    for (const engine::LinkHealth& l : r.links)
      fmt::print("  {:>6} {:>13.3f} {:>8.2f} {:>10.1f}  {}\n", link_name(l), l.bytes_per_s / kGB,
                 l.vs_median, l.time.min_s * 1e6, l.straggler ? "STRAGGLER" : "ok");
    fmt::print("  all-reduce of {} MB over the group: busbw {} GB/s (median {:.0f} us; "
               "2S(k−1)/k per rank)\n",
               sig_str(r.link_message_bytes / kMB, 4), sig_str(r.all_reduce_busbw_bps / kGB, 3),
               r.all_reduce_time.median_s * 1e6);
  }
  const std::string bad = flagged(r);
  fmt::print("  verdict: {}\n", bad.empty() ? "healthy: nothing flagged" : bad);
}

nlohmann::json to_json(const engine::HealthCheckResult& r) {
  const auto& o = r.options;
  nlohmann::json ranks = nlohmann::json::array(), links = nlohmann::json::array();
  for (const engine::RankHealth& h : r.ranks)
    ranks.push_back({{"rank", h.rank},
                     {"gemm_flops_per_s", h.gemm_flops_per_s},
                     {"gemm_vs_median", h.gemm_vs_median},
                     {"memory_bytes_per_s", h.memory_bytes_per_s},
                     {"memory_vs_median", h.memory_vs_median},
                     {"checksum_crc32c", io::crc32c_hex(h.checksum)},
                     {"gemm_straggler", h.gemm_straggler},
                     {"memory_straggler", h.memory_straggler},
                     {"straggler", h.straggler()},
                     {"wrong_result", h.wrong_result}});
  if (o.calibration)
    for (std::size_t i = 0; i < r.ranks.size(); ++i) {
      const engine::RankHealth& h = r.ranks[i];
      ranks[i]["gemm_expected_flops_per_s"] = h.gemm_expected_flops_per_s;
      ranks[i]["gemm_vs_calibration"] = h.gemm_vs_calibration;
      ranks[i]["memory_expected_bytes_per_s"] = h.memory_expected_bytes_per_s;
      ranks[i]["memory_vs_calibration"] = h.memory_vs_calibration;
      ranks[i]["gemm_below_calibration"] = h.gemm_below_calibration;
      ranks[i]["memory_below_calibration"] = h.memory_below_calibration;
      ranks[i]["below_calibration"] = h.below_calibration();
    }
  for (const engine::LinkHealth& l : r.links)
    links.push_back({{"src", l.src},
                     {"dst", l.dst},
                     {"bytes_per_s", l.bytes_per_s},
                     {"vs_median", l.vs_median},
                     {"median_s", l.time.median_s},
                     {"min_s", l.time.min_s},
                     {"straggler", l.straggler}});
  nlohmann::json j = {
      {"experiment", "health-check"},
      {"world_size", r.world_size},
      {"straggler_threshold", o.straggler_threshold},
      {"link_straggler_threshold", o.link_straggler_threshold},
      {"calibration_threshold", o.calibration_threshold},
      {"rounds", o.rounds},
      {"gemm_n", o.gemm_n},
      {"memory_working_set_bytes", o.memory_bytes},
      {"link_message_bytes", r.link_message_bytes},
      {"ranks", ranks},
      {"links", links},
      {"median", {{"gemm_flops_per_s", r.gemm_median_flops_per_s},
                  {"memory_bytes_per_s", r.memory_median_bytes_per_s},
                  {"link_bytes_per_s", r.link_median_bytes_per_s}}},
      {"majority_checksum_crc32c",
       r.majority_checksum ? nlohmann::json(io::crc32c_hex(*r.majority_checksum)) : nullptr},
      {"straggler_ranks", r.straggler_ranks()},
      {"straggler_links", r.straggler_links()},
      {"wrong_result_ranks", r.wrong_result_ranks()},
      {"below_calibration_ranks", r.below_calibration_ranks()},
      {"calibration", nullptr},
      {"ok", r.ok()},
  };
  if (o.calibration)
    j["calibration"] = {{"file", o.calibration->source},
                        {"gemm_basis", o.calibration->gemm_measured ? "measured" : "fitted"},
                        {"memory_basis", o.calibration->memory_measured ? "measured" : "dram"}};
  if (r.world_size > 1)
    j["all_reduce"] = {{"bytes", r.link_message_bytes},
                       {"median_s", r.all_reduce_time.median_s},
                       {"busbw_bps", r.all_reduce_busbw_bps}};
  return j;
}

void run(const Flags& f) {
  engine::HealthCheckOptions o = f.options;
  o.memory_bytes = f.memory_mib * kMiB;
  o.link_bytes = f.link_mb * kMB;
  if (!f.calibration.empty())
    o.calibration = engine::expect_from_calibration(io::load_calibration(f.calibration),
                                                    "--calibration", f.calibration, o.gemm_n,
                                                    o.memory_bytes);
  const engine::DistEnv env = engine::DistEnv::from_environment();
  const engine::HealthCheckResult r = engine::run_health_check(env, o);
  if (env.rank != 0) return;
  if (f.json)
    std::cout << to_json(r).dump() << std::endl;
  else {
    print_text(r);
    std::cout.flush();
  }
  if (!r.ok()) throw std::runtime_error("health-check: " + flagged(r));
}

const RegisterRun reg{[](CLI::App& run_cmd) {
  auto f = std::make_shared<Flags>();
  auto& o = f->options;
  CLI::App* cmd = run_cmd.add_subcommand(
      "health-check",
      "find the bad rank: each rank's GEMM FLOP/s, memory bandwidth and a deterministic GEMM's "
      "checksum, every ring link's send/recv bandwidth and the group's all-reduce; flags "
      "stragglers and wrong results. Start it with `tally launch --nproc N -- tally run "
      "health-check`");
  cmd->footer(
      "Rank 0 prints the report; exit 1 when a rank or link is a straggler (slower than the "
      "median by more than --straggler-threshold) or a rank's checksum differs from the "
      "majority's, or (with --calibration) a rank is slower than its own calibration by as "
      "much. --inject-slow-rank/--inject-slow-factor/--inject-corrupt-rank inject those "
      "faults (tests and drills).");
  cmd->add_option("--straggler-threshold", o.straggler_threshold,
                  "flag a rank or link whose time exceeds (1 + this) × the group median's")
      ->check(finite_in(0.01, 10))
      ->capture_default_str();
  cmd->add_option("--link-threshold", o.link_straggler_threshold,
                  "the same for a ring link (its fastest message; looser: loopback links on a "
                  "shared host jitter more than kernels)")
      ->check(finite_in(0.01, 10))
      ->capture_default_str();
  cmd->add_option("--rounds", o.rounds, "interleaved repetitions; each figure is their median")
      ->capture_default_str();
  cmd->add_option("--gemm-n", o.gemm_n, "n of the n×n×n float32 GEMM (timing and checksum)")
      ->capture_default_str();
  cmd->add_option("--memory-mib", f->memory_mib, "working set of the memory test, MiB")
      ->check(finite_in(0.00390625, 4096))
      ->capture_default_str();
  cmd->add_option("--link-mb", f->link_mb, "bytes of each send/recv and the all-reduce, MB (1e6)")
      ->check(finite_in(4e-6, 1000))
      ->capture_default_str();
  cmd->add_option("--timeout", o.timeout_s, "seconds for the rendezvous and each collective")
      ->check(finite_in(0, 86400, Ends::open_lo))
      ->capture_default_str();
  cmd->add_option("--inject-slow-rank", o.fault.slow_rank,
                  "fault: this rank does each timed call's work --inject-slow-factor times (-1 = "
                  "none)")
      ->capture_default_str();
  cmd->add_option("--inject-slow-factor", o.fault.slow_factor, "fault: how many times, 2..100")
      ->capture_default_str();
  cmd->add_option("--inject-corrupt-rank", o.fault.corrupt_rank,
                  "fault: this rank flips one bit of its checksum GEMM's result (-1 = none)")
      ->capture_default_str();
  cmd->add_option("--calibration", f->calibration,
                  "also judge each rank against its own host's calibration (`tally bench "
                  "gemm|memory --threads 1 --clock cpu --calibration-out FILE`, gemm with "
                  "--cache warm, read on each host): flag a figure below expected / (1 + "
                  "--calibration-threshold)");
  cmd->add_option("--calibration-threshold", o.calibration_threshold,
                  "with --calibration: flag a rank whose time exceeds (1 + this) × its "
                  "calibration's (looser than the median's: the calibration was measured at "
                  "another time)")
      ->check(finite_in(0.01, 10))
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "rank 0 prints one JSON object on one line");
  cmd->callback([f] { run(*f); });
}};

}  // namespace

}  // namespace tally::cli::run_health_check
