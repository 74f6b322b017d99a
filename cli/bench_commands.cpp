// `tally bench allreduce`: the nccl-tests-style all-reduce benchmark (engine/bench/allreduce.cpp)
// on every rank of a job started with `tally launch --nproc N -- tally bench allreduce ...` or
// torchrun. The runner lives in the engine; this file parses flags and holds the two reporters
// (text table, JSON), which print on rank 0 only. Exit codes: 0 ok, 1 #wrong > 0 or the ring's
// counted bytes differ from the core's, 2 bad input. The seed ④ checks are reported as PASS/FAIL
// lines but do not change the exit code (they measure the machine, not tally).
// `tally bench ddp` (further down) times tally's data-parallel training step for comparison with
// PyTorch's DDP (bench/ddp_peer.py).
#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common.hpp"
#include "host_prediction.hpp"
#include "html_engine.hpp"
#include "html_report.hpp"
#include "run_registry.hpp"
#include "tally/core/comm.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/bench/allreduce.hpp"
#include "tally/engine/bench/ddp.hpp"
#include "tally/engine/dist_env.hpp"
#include "tally/io/calibration.hpp"
#include "tally/io/files.hpp"

namespace tally::cli::bench_commands {

namespace {

struct BenchAllReduceFlags {
  std::vector<double> sizes_mb;
  std::optional<double> min_mb, max_mb;  // a geometric sweep when both are given
  double factor = 4;
  int warmup = 5, iters = 20;
  std::string algo = "both";
  double timeout_s = 60;
  double busy_ms = 0;
  bool overlap_probe = false;
  bool sharded = false;
  bool json = false;
  std::string calibration_out;
  std::optional<std::string> html;  // --html FILE, written by rank 0
};

engine::BenchAllReduceOptions to_options(const BenchAllReduceFlags& f) {
  engine::BenchAllReduceOptions o;
  if (f.min_mb || f.max_mb) {
    if (!f.min_mb || !f.max_mb)
      throw InvalidInput("--min-mb and --max-mb go together (with --factor, default 4)");
    o.sizes_bytes = engine::geometric_sizes(*f.min_mb * kMB, *f.max_mb * kMB, f.factor);
  } else if (!f.sizes_mb.empty()) {
    o.sizes_bytes.clear();
    for (double mb : f.sizes_mb) o.sizes_bytes.push_back(mb * kMB);
  }
  o.warmup_iters = f.warmup;
  o.iters = f.iters;
  if (f.algo == "gloo") o.algorithms = {engine::AllReduceAlgorithm::gloo};
  if (f.algo == "ring") o.algorithms = {engine::AllReduceAlgorithm::ring};
  o.timeout_s = f.timeout_s;
  o.busy_s = f.busy_ms * 1e-3;
  o.overlap_probe = f.overlap_probe;
  o.sharded = f.sharded;
  try {
    o.validate();
  } catch (const InvalidInput& e) {
    throw InvalidInput(std::string("bench allreduce: ") + e.what());
  }
  return o;
}

// The ranks share one host when the rendezvous is on loopback or torchrun says so.
bool single_host(const engine::DistEnv& env) {
  if (engine::is_loopback_address(env.master_addr)) return true;
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  return local != nullptr && std::string(local) == std::to_string(env.world_size);
}

engine::AllReduceAlgorithm fit_source(const engine::BenchAllReduceResult& r) {
  for (auto a : r.algorithms)
    if (a == engine::AllReduceAlgorithm::gloo) return a;
  return engine::AllReduceAlgorithm::ring;
}

// io's atomic write (temporary name, fsync, rename): a reader never sees half a file.
void write_file(const std::string& path, const std::string& text) {
  try {
    io::write_text_atomically(path, text);
  } catch (const std::system_error& e) {
    throw std::runtime_error(std::string("--calibration-out: ") + e.what());
  }
}

double us(double s) { return s * 1e6; }
double gbs(double bps) { return bps / kGB; }

std::string_view check_name(engine::BenchCheckKind kind) {
  return kind == engine::BenchCheckKind::linearity ? "linearity" : "small_vs_large";
}

// Seed ④'s check in words, with the values it compared (engine::BenchCheck).
std::string check_line(const engine::BenchCheck& c) {
  const std::string_view algo = engine::to_string(c.algorithm);
  const auto bw = [](double bps) { return sig_str(bps / kGB, 3) + " GB/s"; };
  const auto size = [](double bytes) { return sig_str(bytes / kMB, 4) + " MB"; };
  const bool measured = c.state != engine::CheckState::not_applicable;
  switch (c.kind) {
    case engine::BenchCheckKind::small_vs_large:
      if (!measured)
        return fmt::format("{}: small vs large busbw needs k >= 2 and >= 2 sizes", algo);
      return fmt::format("{}: small-message busbw {} at {} vs {} at {} (need small < large: "
                         "latency-dominated)",
                         algo, bw(c.busbw_a_bps), size(c.size_a_bytes), bw(c.busbw_b_bps),
                         size(c.size_b_bytes));
    case engine::BenchCheckKind::linearity:
      if (!measured)
        return fmt::format("{}: linearity needs k >= 2 and >= 3 sizes (pairs past the smallest)",
                           algo);
      return fmt::format("{}: busbw ratio min/max of {} and {} = {} (need >= {}: time about "
                         "linear in S)",
                         algo, size(c.size_a_bytes), size(c.size_b_bytes), sig_str(c.ratio, 3),
                         sig_str(c.threshold, 3));
  }
  return "";
}

// One line per table (Note [run-queue wait] in tally/engine/comm.hpp): the calling thread's
// run-queue wait inside each call, its range over the table's sizes for each implementation; no
// line where it was not read.
template <class Row, class Name>
void print_runqueue_line(const char* table, const std::vector<Row>& rows, Name name) {
  std::vector<std::pair<std::string, std::pair<double, double>>> by_name;  // min, max
  for (const Row& row : rows) {
    if (!row.runqueue_wait_s) return;
    const std::string n = name(row);
    auto it = std::find_if(by_name.begin(), by_name.end(),
                           [&](const auto& e) { return e.first == n; });
    if (it == by_name.end()) {
      by_name.push_back({n, {*row.runqueue_wait_s, *row.runqueue_wait_s}});
      continue;
    }
    it->second.first = std::min(it->second.first, *row.runqueue_wait_s);
    it->second.second = std::max(it->second.second, *row.runqueue_wait_s);
  }
  if (by_name.empty()) return;
  std::string parts;
  for (const auto& [n, range] : by_name)
    parts += fmt::format("{}{} {:.1f}-{:.1f} us", parts.empty() ? "" : ", ", n,
                         range.first * 1e6, range.second * 1e6);
  fmt::print("# {} calls: the main thread's run-queue wait per call (time runnable with no core; "
             "mean over calls and ranks), over the sizes: {}\n",
             table, parts);
}

void print_text(const engine::BenchAllReduceResult& r, const BenchAllReduceFlags& f, bool one_host) {
  const int k = r.world_size;
  fmt::print("# tally bench allreduce: k = {} ranks ({}), c10d Gloo, float32, sum; {} warm-up + {} "
             "timed iterations per size\n",
             k, one_host ? "1 host" : "multi-host", r.warmup_iters, r.iters);
  fmt::print("# time_us: per iteration, the slowest rank's own time after a barrier; median, mean, "
             "min, max over iterations\n");
  if (r.busy_s > 0)
    fmt::print("# each call after {} ms of busy CPU on every rank, then the barrier (--busy-ms; "
               "Note [busy before a call])\n", sig_str(r.busy_s * 1e3, 4));
  fmt::print("# algbw = S/time_med; busbw = bus_bandwidth(all-reduce, algbw, k) = algbw*2(k-1)/k "
             "(core/comm.hpp, nccl-tests); GB = 1e9 B\n");
  fmt::print("# gloo = Comm::all_reduce (Gloo's algorithm); ring = Comm::ring_all_reduce (tally's "
             "ring over send/recv)\n#\n");
  fmt::print("# {:>11} {:>11} {:>5} {:>11} {:>11} {:>11} {:>11} {:>10} {:>10} {:>7}\n", "size_B",
             "count_el", "algo", "med_us", "mean_us", "min_us", "max_us", "algbw_GB/s",
             "busbw_GB/s", "#wrong");
  for (const auto& row : r.rows)
    fmt::print("  {:>11.0f} {:>11} {:>5} {:>11.1f} {:>11.1f} {:>11.1f} {:>11.1f} {:>10.3f} "
               "{:>10.3f} {:>7}\n",
               row.size_bytes, row.count, engine::to_string(row.algorithm), us(row.time.median_s),
               us(row.time.mean_s), us(row.time.min_s), us(row.time.max_s), gbs(row.algbw_bps),
               gbs(row.busbw_bps), row.wrong);
  fmt::print("# #wrong total: {}\n", r.total_wrong());
  print_runqueue_line("all-reduce", r.rows, [](const engine::BenchRow& row) {
    return std::string(engine::to_string(row.algorithm));
  });
  const auto ring = r.rows_of(engine::AllReduceAlgorithm::ring);
  if (!ring.empty()) {
    fmt::print("# ring bytes sent per rank per call == core collective_bytes_per_rank = 2S(k-1)/k "
               "exactly, every rank, every call: {}\n",
               r.ring_bytes_exact() ? "PASS" : "FAIL");
    for (const auto& row : ring)
      fmt::print("#   S = {:.0f} B: counted {:.0f} B vs core {:.0f} B{}\n", row.size_bytes,
                 row.bytes_per_rank_counted, row.bytes_per_rank_core,
                 row.bytes_exact ? "" : "  MISMATCH (on some rank / call)");
  }
  for (auto a : r.algorithms) {
    const AlphaBetaFit fit = r.fit(a);
    if (fit.ok)
      fmt::print("# fit {}: alpha = {:.2f} us/step, beta = {:.3f} GB/s  (t = alpha*2(k-1) + "
                 "2S(k-1)/k/beta, on mean times, relative least squares; max residual "
                 "{:.0f}%{}{})\n",
                 engine::to_string(a), us(fit.alpha_s), gbs(fit.beta_bps), 100 * fit.max_rel_error,
                 fit.note.empty() ? "" : "; ", fit.note);
    else
      fmt::print("# fit {}: none ({})\n", engine::to_string(a), fit.note);
  }
  if (auto ratio = r.ring_over_gloo_busbw())
    fmt::print("# ring/gloo busbw at {:.0f} B: {:.3f}\n", r.rows.back().size_bytes, *ratio);
  if (r.sharded_oversubscribed)
    fmt::print("# sharded collectives: not timed, {} ranks on {} cores (Note [sharded "
               "collectives]: with more ranks than cores their per-call cost is not a step's)\n",
               k, std::max(1u, std::thread::hardware_concurrency()));
  if (!r.sharded.empty()) {
    fmt::print("# sharded collectives (Note [sharded collectives]), timed as the rows above: "
               "reduce-scatter = Comm::reduce_scatter_in_place (tally's ring), all-gather = "
               "Comm::all_gather (Gloo's); busbw = algbw*(k-1)/k\n");
    fmt::print("# {:>11} {:>14} {:>5} {:>11} {:>11} {:>11} {:>11} {:>10} {:>7}\n", "size_B",
               "collective", "impl", "med_us", "mean_us", "min_us", "max_us", "busbw_GB/s",
               "#wrong");
    for (const auto& row : r.sharded)
      fmt::print("  {:>11.0f} {:>14} {:>5} {:>11.1f} {:>11.1f} {:>11.1f} {:>11.1f} {:>10.3f} "
                 "{:>7}\n",
                 row.size_bytes, to_string(row.collective),
                 engine::sharded_implementation(row.collective), us(row.time.median_s),
                 us(row.time.mean_s), us(row.time.min_s), us(row.time.max_s), gbs(row.busbw_bps),
                 row.wrong);
    print_runqueue_line("sharded", r.sharded, [](const engine::ShardedRow& row) {
      return std::string(to_string(row.collective));
    });
    for (Collective c : {Collective::reduce_scatter, Collective::all_gather}) {
      const AlphaBetaFit fit = r.fit_sharded(c);
      if (fit.ok)
        fmt::print("# fit {}: alpha = {:.2f} us/step, beta = {:.3f} GB/s  (t = alpha*(k-1) + "
                   "S(k-1)/k/beta, mean times; max residual {:.0f}%)\n",
                   to_string(c), us(fit.alpha_s), gbs(fit.beta_bps), 100 * fit.max_rel_error);
      else
        fmt::print("# fit {}: none ({})\n", to_string(c), fit.note);
    }
  }
  if (r.overlap_oversubscribed)
    fmt::print("# overlap probe: not run, {} ranks on {} cores (Note [host overlap]: with more "
               "ranks than cores its figure is not a step's; the GPU sigma stays)\n",
               k, std::max(1u, std::thread::hardware_concurrency()));
  if (!r.overlap.empty()) {
    fmt::print("# overlap probe (Note [host overlap]): fixed CPU work about twice the call, alone; "
               "Gloo's all-reduce alone; both started together; medians, mean over ranks\n");
    fmt::print("# {:>11} {:>10} {:>10} {:>12} {:>9}\n", "size_B", "work_us", "comm_us",
               "together_us", "exposed");
    for (const auto& o : r.overlap)
      fmt::print("  {:>11.0f} {:>10.1f} {:>10.1f} {:>12.1f} {:>9.2f}\n", o.size_bytes,
                 us(o.work_s), us(o.comm_s), us(o.together_s), o.exposed_fraction());
  }
  for (const auto& c : r.checks())
    fmt::print("# seed 4: {} {}\n", engine::to_string(c.state), check_line(c));
  if (!f.calibration_out.empty() && r.ok())
    fmt::print("# calibration written to {} ({}, fitted to {})\n", f.calibration_out,
               one_host ? "intra_node" : "inter_node", engine::to_string(fit_source(r)));
  fmt::print("# {}\n", r.ok() ? "ok" : "FAILED: wrong results or ring bytes differ from the core");
}

nlohmann::json fit_json(const AlphaBetaFit& fit) {
  return {{"ok", fit.ok},
          {"alpha_s", fit.alpha_s},
          {"beta_bytes_per_s", fit.beta_bps},
          {"max_rel_error", fit.max_rel_error},
          {"note", fit.note}};
}

// A row's time fields: per iteration, the slowest rank's (harness.hpp).
nlohmann::json time_fields(const engine::TimeStats& t) {
  return {{"time_s_median", t.median_s},
          {"time_s_min", t.min_s},
          {"time_s_max", t.max_s},
          {"time_s_mean", t.mean_s}};
}

// The --json object; the --html page is drawn from it too (cli/html_engine.hpp).
nlohmann::json report_json(const engine::BenchAllReduceResult& r, const BenchAllReduceFlags& f,
                           bool one_host) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : r.rows) {
    nlohmann::json j = {{"algorithm", std::string(engine::to_string(row.algorithm))},
                        {"size_bytes", row.size_bytes},
                        {"count", row.count},
                        {"algbw_bytes_per_s", row.algbw_bps},
                        {"busbw_bytes_per_s", row.busbw_bps},
                        {"wrong", row.wrong},
                        {"bytes_per_rank_core", row.bytes_per_rank_core},
                        {"bytes_per_rank_counted", row.bytes_per_rank_counted},
                        {"bytes_exact", row.bytes_exact}};
    j.update(time_fields(row.time));
    if (row.runqueue_wait_s) j["runqueue_wait_s_mean"] = *row.runqueue_wait_s;
    rows.push_back(std::move(j));
  }
  nlohmann::json fits = nlohmann::json::object();
  for (auto a : r.algorithms) fits[std::string(engine::to_string(a))] = fit_json(r.fit(a));
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& c : r.checks())
    checks.push_back({{"check", std::string(check_name(c.kind))},
                      {"algorithm", std::string(engine::to_string(c.algorithm))},
                      {"state", std::string(engine::to_string(c.state))},
                      {"line", check_line(c)}});
  const auto ratio = r.ring_over_gloo_busbw();
  nlohmann::json overlap = nlohmann::json::array();
  for (const auto& o : r.overlap)
    overlap.push_back({{"size_bytes", o.size_bytes},
                       {"work_s", o.work_s},
                       {"comm_s", o.comm_s},
                       {"together_s", o.together_s},
                       {"exposed_fraction", o.exposed_fraction()}});
  nlohmann::json sharded = nlohmann::json::array();
  for (const auto& row : r.sharded) {
    nlohmann::json j = {{"collective", std::string(to_string(row.collective))},
                        {"implementation",
                         std::string(engine::sharded_implementation(row.collective))},
                        {"size_bytes", row.size_bytes},
                        {"count", row.count},
                        {"busbw_bytes_per_s", row.busbw_bps},
                        {"bytes_per_rank_core", row.bytes_per_rank_core},
                        {"wrong", row.wrong}};
    j.update(time_fields(row.time));
    if (row.runqueue_wait_s) j["runqueue_wait_s_mean"] = *row.runqueue_wait_s;
    sharded.push_back(std::move(j));
  }
  nlohmann::json sharded_fits = nlohmann::json::object();
  if (!r.sharded.empty())
    for (Collective c : {Collective::reduce_scatter, Collective::all_gather})
      sharded_fits[std::string(to_string(c))] = fit_json(r.fit_sharded(c));
  return {{"command", "bench allreduce"},
              {"ranks", r.world_size},
              {"single_host", one_host},
              {"dtype", "float32"},
              {"op", "sum"},
              {"warmup_iters", r.warmup_iters},
              {"iters", r.iters},
              {"busy_before_s", r.busy_s},
              {"time_convention",
               "per iteration the slowest rank's own time after a barrier; median/mean/min/max "
               "over iterations" +
                   (r.busy_s > 0 ? "; each call after " + sig_str(r.busy_s * 1e3, 4) +
                                       " ms of busy CPU on every rank (--busy-ms)"
                                 : std::string())},
              {"busbw_convention", "bus_bandwidth(all-reduce, algbw, k) = algbw*2(k-1)/k"},
              {"rows", rows},
              {"total_wrong", r.total_wrong()},
              {"ring_bytes_exact", r.ring_bytes_exact()},
              {"fits", fits},
              {"checks", checks},
              {"ring_over_gloo_busbw", ratio ? nlohmann::json(*ratio) : nlohmann::json(nullptr)},
              {"overlap", overlap},
              {"overlap_skipped_oversubscribed", r.overlap_oversubscribed},
              {"sharded", sharded},
              {"sharded_fits", sharded_fits},
              {"sharded_skipped_oversubscribed", r.sharded_oversubscribed},
              {"calibration_out",
               f.calibration_out.empty() ? nlohmann::json(nullptr) : nlohmann::json(f.calibration_out)},
              {"ok", r.ok()}};
}

void run_bench_allreduce_command(const BenchAllReduceFlags& f) {
  const engine::BenchAllReduceOptions options = to_options(f);
  const engine::DistEnv env = engine::DistEnv::from_environment();
  if (!f.calibration_out.empty()) {
    if (env.world_size < 2)
      throw InvalidInput("--calibration-out needs WORLD_SIZE >= 2 (k = 1 moves no bytes to fit)");
    const auto parent = std::filesystem::absolute(f.calibration_out).parent_path();
    if (!std::filesystem::is_directory(parent))
      throw InvalidInput("--calibration-out = '" + f.calibration_out + "': directory " +
                         parent.string() + " does not exist");
  }
  if (f.html && env.rank == 0) html::check_writable("--html", *f.html);  // before the run
  const engine::BenchAllReduceResult r = engine::run_bench_allreduce(env, options);
  const bool one_host = single_host(env);
  if (env.rank == 0 && !f.calibration_out.empty() && r.ok()) {
    // An existing file's kernels section (`tally bench gemm|memory`) is kept: one file per host.
    const io::Calibration c = io::merged_with_file(
        engine::to_calibration(r, one_host, fit_source(r)), f.calibration_out);
    write_file(f.calibration_out, io::calibration_to_json(c));
  }
  if (env.rank == 0) {
    const nlohmann::json j = report_json(r, f, one_host);
    if (f.html) html::write_file("--html", *f.html, html::page(allreduce_page(j)));
    if (f.json)
      print_json(j);
    else
      print_text(r, f, one_host);
    std::cout.flush();
  }
  if (!r.ok())
    throw std::runtime_error("bench allreduce: " + std::to_string(r.total_wrong()) +
                             " wrong elements; ring bytes " +
                             (r.ring_bytes_exact() ? "exact" : "differ from the core's"));
}

void register_bench_allreduce(CLI::App& bench) {
  auto f = std::make_shared<BenchAllReduceFlags>();
  CLI::App* cmd = bench.add_subcommand(
      "allreduce",
      "time all-reduce (Gloo's and tally's ring) over sizes on every rank, check results, fit "
      "alpha/beta");
  cmd->footer(
      "Start on every rank: tally launch --nproc N -- tally bench allreduce [flags]\n"
      "Sizes in MB = 1e6 B of float32 (the seed's MB*250000 elements), each rounded down to a "
      "multiple of k elements so the ring's bytes are exact. Output (rank 0): size_B, count_el, "
      "time_us median/min/max, algbw and busbw in GB/s, #wrong; --calibration-out FILE writes the "
      "fitted alpha/beta for `tally comm|plan --calibration FILE` (keeping the kernels section of "
      "an existing FILE).");
  auto* sizes = cmd->add_option("--sizes-mb", f->sizes_mb,
                                "sizes S in MB (1e6 B), ascending, comma-separated (default "
                                "1,4,16,64)")
                    ->delimiter(',')
                    ->check(finite_in(1e-6, 4e3));
  auto* min = cmd->add_option("--min-mb", f->min_mb, "sweep start, MB (nccl-tests -b)")
                  ->check(finite_in(1e-6, 4e3));
  auto* max = cmd->add_option("--max-mb", f->max_mb, "sweep end, MB (nccl-tests -e)")
                  ->check(finite_in(1e-6, 4e3));
  cmd->add_option("--factor", f->factor, "sweep factor (nccl-tests -f)")
      ->check(finite_in(1.000001, 1e6))
      ->capture_default_str();
  sizes->excludes(min)->excludes(max);
  cmd->add_option("--warmup", f->warmup, "warm-up iterations per size and algorithm")
      ->check(CLI::Range(0, 10000))
      ->capture_default_str();
  cmd->add_option("--iters", f->iters, "timed iterations per size and algorithm")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--algo", f->algo, "gloo | ring | both")
      ->check(one_of({"gloo", "ring", "both"}))
      ->capture_default_str();
  cmd->add_option("--timeout", f->timeout_s, "seconds for the rendezvous and each collective")
      ->check(finite_in(1e-3, 86400))
      ->capture_default_str();
  cmd->add_option("--busy-ms", f->busy_ms,
                  "keep every rank's CPU busy this long before the barrier that starts each call, "
                  "as a training step's compute does (0 = calls back to back)")
      ->check(finite_in(0, 1000))
      ->capture_default_str();
  cmd->add_flag("--overlap-probe", f->overlap_probe,
                "then, per size, time fixed CPU work alone, Gloo's all-reduce alone and both "
                "started together: how much of a collective this host hides behind compute (its "
                "sigma, written to --calibration-out; bench ddp's prediction uses it)");
  cmd->add_flag("--sharded", f->sharded,
                "also time each size as ZeRO's halves, as run zero calls them (tally's ring "
                "reduce-scatter, Gloo's all-gather), after --busy-ms like the all-reduces; written "
                "to --calibration-out, where run zero's prediction prices them (not run where the "
                "ranks outnumber this host's cores)");
  cmd->add_flag("--json", f->json, "print one JSON object (rank 0) instead of the table");
  cmd->add_option("--calibration-out", f->calibration_out,
                  "write the fitted alpha/beta and the measured points as a calibration JSON");
  cmd->add_option("--html", f->html,
                  "also write bus bandwidth and time against message size (measured and the "
                  "fitted alpha/beta) as a self-contained HTML page to FILE (rank 0)");
  cmd->callback([f] { run_bench_allreduce_command(*f); });
}

// ---- tally bench ddp -------------------------------------------------------------------------
// Data-parallel step time of tally's DDP (engine/bench/ddp.cpp), reported on rank 0 as a table or
// one JSON line whose keys bench/ddp_peer.py (PyTorch's DDP, same settings) prints too. Exit codes:
// 0 ok, 1 the replicas' parameters differ after training, 2 bad input.

struct BenchDdpFlags {
  std::vector<std::int64_t> widths = engine::BenchDdpOptions{}.widths;
  std::int64_t batch = 32;
  double bucket_mb = 25;  // MiB, as PyTorch's bucket_cap_mb
  double first_bucket_mb = 1;  // MiB, as PyTorch's dist._DEFAULT_FIRST_BUCKET_BYTES
  int threads = 1;
  std::int64_t seed = 1234;
  std::string optimizer = "sgd";
  double lr = 0.01;
  int warmup = 3, steps = 20, data_batches = 4;
  double timeout_s = 60;
  bool json = false;
  std::string calibration;
};

engine::BenchDdpOptions to_options(const BenchDdpFlags& f) {
  engine::BenchDdpOptions o{
      .widths = f.widths,
      .batch_per_rank = f.batch,
      .bucket_cap_bytes = f.bucket_mb * engine::kMiB,
      .first_bucket_cap_bytes = f.first_bucket_mb * engine::kMiB,
      .threads = f.threads,
      .seed = f.seed,
      .optimizer = f.optimizer == "adam" ? engine::BenchOptimizer::adam : engine::BenchOptimizer::sgd,
      .lr = f.lr,
      .warmup_steps = f.warmup,
      .steps = f.steps,
      .data_batches = f.data_batches,
      .timeout_s = f.timeout_s};
  try {
    o.validate();
  } catch (const InvalidInput& e) {
    throw InvalidInput(std::string("bench ddp: ") + e.what());
  }
  return o;
}

std::string widths_str(const std::vector<std::int64_t>& w) {
  std::string s;
  for (std::size_t i = 0; i < w.size(); ++i) s += (i ? "," : "") + std::to_string(w[i]);
  return s;
}

double ms(double s) { return s * 1e3; }

StepPhases bench_ddp_phases(const engine::BenchDdpResult& r) {
  return {.median_s = {{"forward_backward", r.phases.forward_backward_s},
                       {"sync_wait", r.phases.sync_wait_s},
                       {"optimizer", r.phases.optimizer_s}},
          .convention = "rank 0's own phases of each timed step, medians; forward_backward "
                        "includes packing gradients into buckets"};
}

// The keys shared with bench/ddp_peer.py (impl "pytorch" there).
nlohmann::json bench_ddp_json(const engine::BenchDdpResult& r) {
  const engine::BenchDdpOptions& o = r.options;
  return {{"command", "bench ddp"},
          {"impl", "tally"},
          {"world_size", r.world_size},
          {"model", "mlp"},
          {"widths", o.widths},
          {"parameters", r.parameters},
          {"batch_per_rank", o.batch_per_rank},
          {"bucket_cap_mb", o.bucket_cap_bytes / engine::kMiB},
          {"first_bucket_mb", o.first_bucket_cap_bytes / engine::kMiB},
          {"buckets", r.buckets},
          {"threads", o.threads},
          {"optimizer", std::string(engine::to_string(o.optimizer))},
          {"lr", o.lr},
          {"seed", o.seed},
          {"warmup_steps", o.warmup_steps},
          {"steps", o.steps},
          {"data_batches", o.data_batches},
          {"time_convention",
           "per step the slowest rank's forward+backward+gradient sync+optimizer step+zero_grad "
           "after a barrier; quantiles over timed steps"},
          {"step_time_s",
           {{"median", r.step.median_s},
            {"p10", r.step.p10_s},
            {"p90", r.step.p90_s},
            {"min", r.step.min_s},
            {"max", r.step.max_s}}},
          {"step_times_s", r.step_times_s},
          {"phase_seconds_median", phases_json(bench_ddp_phases(r))},
          {"samples_per_s", r.samples_per_s},
          {"final_loss", r.final_loss},
          {"param_sum", r.param_sum},
          {"param_abs_sum", r.param_abs_sum},
          {"max_param_diff_vs_rank0", r.max_param_diff_vs_rank0},
          {"ddp",
           {{"sync_events", r.ddp.sync_events},
            {"bucket_all_reduces", r.ddp.bucket_all_reduces},
            {"buckets_done_during_backward", r.ddp.buckets_done_during_backward},
            {"gradient_bytes_sent", r.ddp.gradient_bytes_sent},
            {"bucket_buffer_reallocations", r.ddp.bucket_buffer_reallocations}}},
          {"ok", r.replicas_equal()}};
}

void print_bench_ddp_text(const engine::BenchDdpResult& r) {
  const engine::BenchDdpOptions& o = r.options;
  fmt::print("# tally bench ddp: k = {} ranks, c10d Gloo, float32 MLP widths {} (N = {} "
             "parameters), B = {} samples/rank, {} (lr {}), bucket {} MiB (first {} MiB; {} buckets), "
             "{} thread(s)/rank\n",
             r.world_size, widths_str(o.widths), r.parameters, o.batch_per_rank,
             engine::to_string(o.optimizer), o.lr, o.bucket_cap_bytes / engine::kMiB,
             o.first_bucket_cap_bytes / engine::kMiB, r.buckets, o.threads);
  fmt::print("# step = forward + backward + gradient sync + optimizer step + zero_grad, after a "
             "barrier; per step the slowest rank; {} warm-up + {} timed steps\n",
             o.warmup_steps, o.steps);
  fmt::print("# {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}\n", "median_ms", "p10_ms", "p90_ms",
             "min_ms", "max_ms", "samples/s");
  fmt::print("  {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>12.1f}\n", ms(r.step.median_s),
             ms(r.step.p10_s), ms(r.step.p90_s), ms(r.step.min_s), ms(r.step.max_s),
             r.samples_per_s);
  fmt::print("# phases (rank 0, medians): {}\n", phases_line(bench_ddp_phases(r)));
  fmt::print("# final_loss {:.9g}  param_sum {:.17g}  param_abs_sum {:.17g}\n", r.final_loss,
             r.param_sum, r.param_abs_sum);
  fmt::print("# replicas equal after training (max|p - p_rank0| = {:g}): {}\n",
             r.max_param_diff_vs_rank0, r.replicas_equal() ? "PASS" : "FAIL");
}

// The step core/mlp_step.hpp predicts for this run: the MLP, B rows, DP with the reducer's
// buckets (the engine's own plan for the same caps).
MlpStepTime predict_bench_ddp(const HostModel& m, const engine::BenchDdpOptions& o, int k) {
  std::vector<double> param_bytes;  // float32, registration order: the reducer's input
  for (std::int64_t n : mlp_tensor_sizes(o.widths)) param_bytes.push_back(4.0 * double(n));
  MlpStepSetup s{.widths = o.widths, .rows = o.batch_per_rank, .ranks = k, .zero_stage = 0,
                 .optimizer = o.optimizer == engine::BenchOptimizer::adam ? Optimizer::adam
                                                                          : Optimizer::sgd,
                 .threads_per_rank = o.threads,
                 .reduce_link = m.gloo_link,  // the reducer calls Gloo's all-reduce
                 // ... from the autograd hooks, while the backward continues (engine/runtime/
                 // ddp.cpp launch_ready_buckets); it waits after the backward.
                 .overlap_gradients = true,
                 // on this host's own σ where the calibration probed it (Note [host overlap])
                 .overlap_slowdown = io::overlap_slowdown(m.calibration, k)};
  for (const auto& bucket : engine::compute_bucket_assignment_by_size(
           param_bytes, o.bucket_cap_bytes, o.first_bucket_cap_bytes)) {
    double bytes = 0;
    for (std::size_t i : bucket) bytes += param_bytes[i];
    s.bucket_bytes.push_back(bytes);
  }
  return predict_step(m, s);
}

void run_bench_ddp_command(const BenchDdpFlags& f) {
  const engine::BenchDdpOptions options = to_options(f);
  const engine::DistEnv env = engine::DistEnv::from_environment();
  std::optional<HostModel> model;
  if (!f.calibration.empty())
    model = load_host_model("--calibration", f.calibration, env.world_size);
  const engine::BenchDdpResult r = engine::run_bench_ddp(env, options);
  if (env.rank == 0) {
    std::optional<MlpStepTime> predicted;
    if (model) predicted = predict_bench_ddp(*model, options, r.world_size);
    if (f.json) {
      nlohmann::json j = bench_ddp_json(r);
      if (predicted) add_prediction_json(j, *model, *predicted, r.step.median_s);
      std::cout << j.dump() << "\n";  // one line, as the peer's
    } else {
      print_bench_ddp_text(r);
      if (predicted) fmt::print("{}\n", prediction_line(*model, *predicted, r.step.median_s));
    }
    std::cout.flush();
  }
  if (!r.replicas_equal())
    throw std::runtime_error("bench ddp: replicas differ after training: max|p - p_rank0| = " +
                             std::to_string(r.max_param_diff_vs_rank0));
}

void register_bench_ddp(CLI::App& bench) {
  auto f = std::make_shared<BenchDdpFlags>();
  CLI::App* cmd = bench.add_subcommand(
      "ddp", "time data-parallel training steps with tally's DDP (compare: bench/ddp_peer.py)");
  cmd->footer(
      "Start on every rank: tally launch --nproc N -- tally bench ddp [flags]\n"
      "The same flags to bench/ddp_peer.py run PyTorch's DistributedDataParallel on the same "
      "model, data and optimizer; final_loss and param_sum must agree. Output (rank 0): step "
      "time median/p10/p90/min/max in ms (slowest rank per step), samples/s = k*B/median.");
  cmd->add_option("--widths", f->widths, "MLP widths d_0,...,d_L (L Linear layers, ReLU between)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--batch", f->batch, "samples per rank per step")->capture_default_str();
  cmd->add_option("--bucket-mb", f->bucket_mb, "DDP bucket size, MiB (PyTorch's bucket_cap_mb)")
      ->check(finite_in(0, 1e6, Ends::open_lo))
      ->capture_default_str();
  cmd->add_option("--first-bucket-mb", f->first_bucket_mb,
                  "first bucket (last layers' gradients) closes here, MiB (PyTorch's "
                  "dist._DEFAULT_FIRST_BUCKET_BYTES)")
      ->check(finite_in(0, 1e6, Ends::open_lo))
      ->capture_default_str();
  cmd->add_option("--threads", f->threads, "torch intra-op threads per rank")->capture_default_str();
  cmd->add_option("--seed", f->seed, "model init seed (data: seed + 1)")->capture_default_str();
  cmd->add_option("--optimizer", f->optimizer, "sgd | adam")
      ->check(one_of({"sgd", "adam"}))
      ->capture_default_str();
  cmd->add_option("--lr", f->lr, "learning rate")
      ->check(finite_in(0, 1e6, Ends::open_lo))
      ->capture_default_str();
  cmd->add_option("--warmup", f->warmup, "untimed steps first")->capture_default_str();
  cmd->add_option("--steps", f->steps, "timed steps")->capture_default_str();
  cmd->add_option("--data-batches", f->data_batches, "distinct global batches, cycled")
      ->capture_default_str();
  cmd->add_option("--timeout", f->timeout_s, "seconds for the rendezvous and each collective")
      ->check(finite_in(0, 86400, Ends::open_lo))
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "print one JSON object (rank 0) instead of the table");
  cmd->add_option("--calibration", f->calibration,
                  "predict the step time from this host calibration (`tally bench gemm|memory|"
                  "allreduce --calibration-out`) and print measured/predicted");
  cmd->callback([f] { run_bench_ddp_command(*f); });
}

void register_bench(CLI::App& app) {
  CLI::App& bench = command_group(app, "bench", kBenchDescription);
  register_bench_allreduce(bench);
  register_bench_ddp(bench);
}

const RegisterCommand kRegisterBench{register_bench};

}  // namespace

}  // namespace tally::cli::bench_commands
