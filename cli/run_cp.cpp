// `tally run cp`: the text and JSON reporters of engine::run_cp (tally/engine/experiments/cp.hpp).
// Every rank runs and checks its own figures (exit 1 naming the first failed check); rank 0 prints
// the report (its own figures, and every rank's block pairs and computation time gathered), so
// under `tally launch` only "[rank 0] " lines carry it. Bad flags exit 2. One progress line per
// timed fp32 layer on stderr (rank 0).
#include <fmt/core.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common.hpp"
#include "experiment_report.hpp"
#include "host_prediction.hpp"
#include "run_registry.hpp"
#include "tally/core/comm.hpp"
#include "tally/engine/experiments/cp.hpp"

namespace tally::cli::run_cp {

namespace {

struct Flags {
  engine::CpOptions run;
  bool json = false;
  std::string calibration;
};

std::vector<double> in_ms(const std::vector<double>& seconds) {
  std::vector<double> ms;
  for (double s : seconds) ms.push_back(s * 1e3);
  return ms;
}



nlohmann::json to_json(const engine::CpResult& r, const std::vector<engine::CpCheck>& checks) {
  const engine::CpOptions& o = r.options;
  nlohmann::json j = {{"experiment", "cp"},
                      {"rank", r.rank},
                      {"world_size", r.world_size},
                      {"cp", o.cp},
                      {"attention",
                       {{"micro_batch", o.batch}, {"heads", o.heads}, {"kv_heads", o.kv_heads},
                        {"head_dim", o.head_dim}, {"seq", o.seq}, {"causal", true}}},
                      {"repeats", o.repeats}};
  for (const engine::CpVariant& v : r.variants) {
    const TrafficItem& c64 = v.predicted_f64.cp;
    j["variants"].push_back(
        {{"balance", std::string(to_string(v.balance))},
         {"max_rel_diff_f64",
          {{"out", v.out_rel_diff}, {"dq", v.dq_rel_diff}, {"dk", v.dk_rel_diff},
           {"dv", v.dv_rel_diff}}},
         {"bytes_per_layer_f64", measured_json(v.bytes_f64, c64.bytes_per_rank)},
         {"sends_per_layer_f64", measured_json(double(v.sends_f64), c64.calls)},
         {"bytes_per_send_f64",
          measured_json(v.sends_f64 > 0 ? v.bytes_f64 / double(v.sends_f64) : 0, c64.bytes_per_call)},
         {"bytes_per_layer_fp32", measured_json(v.bytes_f32, v.predicted_f32.cp.bytes_per_rank)},
         {"layer_seconds_fp32", v.layer_seconds},
         {"median_layer_seconds_fp32", v.median_layer_seconds()},
         {"compute_seconds_per_layer_fp32", v.compute_s},
         {"shift_seconds_per_layer_fp32", v.shift_s},
         {"block_pairs_by_rank", v.block_pairs},
         {"predicted_block_pairs_by_rank", v.predicted_block_pairs},
         {"block_pair_imbalance",
          measured_json(v.block_pair_imbalance(), v.predicted_block_pair_imbalance())},
         {"compute_seconds_by_rank_fp32", v.compute_s_by_rank},
         {"compute_imbalance_fp32", v.compute_imbalance()},
         // null without --calibration (Note [engine ring attention], core/gpt_step.hpp)
         {"predicted_compute_seconds_by_rank_fp32",
          v.predicted_compute_s_by_rank.empty() ? nlohmann::json(nullptr)
                                                : nlohmann::json(v.predicted_compute_s_by_rank)},
         {"predicted_cp", {{"calls_per_layer", c64.calls},
                           {"bytes_per_call", c64.bytes_per_call},
                           {"bytes_per_layer", c64.bytes_per_rank},
                           {"formula", c64.formula}}},
         {"convention", v.predicted_f64.convention()}});
  }
  add_checks_json(j, checks);
  return j;
}

std::string joined(const std::vector<double>& x, int decimals) {
  std::string s;
  for (double v : x) s += (s.empty() ? "" : " ") + fmt::format("{:.{}f}", v, decimals);
  return s;
}

void print_text(const engine::CpResult& r, const std::vector<engine::CpCheck>& checks) {
  const engine::CpOptions& o = r.options;
  fmt::print("cp: c = {} ranks (Gloo, CPU), ring attention, causal; B {} a {} g {} d {} s {} "
             "({} tokens per rank); rank 0's figures\n",
             r.world_size, o.batch, o.heads, o.kv_heads, o.head_dim, o.seq, o.seq / r.world_size);
  for (const engine::CpVariant& v : r.variants) {
    const TrafficItem& c64 = v.predicted_f64.cp;
    fmt::print("{} split{}:\n", to_string(v.balance),
               v.balance == CpBalance::zigzag ? " (rank r holds chunks r and 2c-1-r; core's)"
                                              : " (rank r holds chunks 2r and 2r+1)");
    fmt::print("  float64 vs single-process: max relative difference out {:.1e}, dQ {:.1e}, "
               "dK {:.1e}, dV {:.1e}\n",
               v.out_rel_diff, v.dq_rel_diff, v.dk_rel_diff, v.dv_rel_diff);
    fmt::print("  {:<40} {:>12} {:>12} {:>8}\n", "one layer, forward + backward", "measured",
               "predicted", "ratio");
    auto row = [](const std::string& what, double m, double p) {
      fmt::print("  {:<40} {:>12.6g} {:>12.6g} {:>8.4f}\n", what, m, p, ratio(m, p));
    };
    row("sends (float64)", double(v.sends_f64), c64.calls);
    row("bytes sent (float64)", v.bytes_f64, c64.bytes_per_rank);
    row("bytes sent (fp32)", v.bytes_f32, v.predicted_f32.cp.bytes_per_rank);
    row("block-pair imbalance max/min (ranks)", v.block_pair_imbalance(),
        v.predicted_block_pair_imbalance());
    fmt::print("  block pairs by rank: {} (core: {})\n", joined(v.block_pairs, 0),
               joined(v.predicted_block_pairs, 0));
    fmt::print("  fp32 time per layer (median of {}): {:.3f} ms; compute {:.3f} ms, ring shifts "
               "{:.3f} ms (mean); compute by rank {} ms, max/min {:.2f}\n",
               v.layer_seconds.size(), v.median_layer_seconds() * 1e3, v.compute_s * 1e3,
               v.shift_s * 1e3, joined(in_ms(v.compute_s_by_rank), 3), v.compute_imbalance());
    if (!v.predicted_compute_s_by_rank.empty()) {
      std::vector<double> ratios;
      for (std::size_t i = 0; i < v.compute_s_by_rank.size(); ++i)
        ratios.push_back(ratio(v.compute_s_by_rank[i], v.predicted_compute_s_by_rank[i]));
      fmt::print("  compute by rank, operator model on the calibration (Note [engine ring "
                 "attention]): {} ms; measured/predicted {}\n",
                 joined(in_ms(v.predicted_compute_s_by_rank), 3), joined(ratios, 2));
    }
    fmt::print("  core: {}\n", c64.formula.empty() ? "no CP traffic at c = 1" : c64.formula);
  }
  int failed = 0;
  for (const auto& c : checks) failed += c.ok ? 0 : 1;
  fmt::print("checks: {} of {} passed\n", int(checks.size()) - failed, int(checks.size()));
}

void run(Flags& f) {
  if (!f.calibration.empty()) {  // kernels only: no link is priced here
    f.run.host = load_host_model("--calibration", f.calibration, 1).host;
    f.run.host_cores = host_cores();
  }
  const engine::CpResult r = engine::run_cp(engine::DistEnv::from_environment(), f.run);
  report_and_check("cp", r, engine::cp_checks(r), f.json, to_json, print_text);
}

const RegisterRun reg{[](CLI::App& run_cmd) {
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = run_cmd.add_subcommand(
      "cp",
      "context parallelism: causal ring attention over every rank (K,V blocks passed round the "
      "ring with online-softmax rescaling; explicit backward returning dK,dV round the ring), with "
      "Transformer Engine's zigzag split and contiguous chunks: float64 output and dQ, dK, dV vs "
      "single-process attention, bytes per layer vs core's CP ledger, per-rank work balance; start "
      "it with `tally launch --nproc C -- tally run cp --cp C`");
  cmd->footer("Exit 1 when a check fails: float64 ≤ 1e-10 relative, bytes and block pairs exact. "
              "Rank 0 prints.");
  cmd->add_option("--cp", f->run.cp, "CP ranks; must equal the world size (0 = the world size)")
      ->capture_default_str();
  cmd->add_option("--micro-batch", f->run.batch, "B")->capture_default_str();
  cmd->add_option("--heads", f->run.heads, "a, query heads")->capture_default_str();
  cmd->add_option("--kv-heads", f->run.kv_heads, "g, key/value heads (GQA), dividing a")
      ->capture_default_str();
  cmd->add_option("--head-dim", f->run.head_dim, "d")->capture_default_str();
  cmd->add_option("--seq", f->run.seq, "s, tokens; split into 2c chunks")->capture_default_str();
  cmd->add_option("--repeats", f->run.repeats, "timed fp32 layers per split")->capture_default_str();
  cmd->add_option("--seed", f->run.seed, "seed of Q, K, V and the output gradient")
      ->capture_default_str();
  add_rank_run_flags(cmd, f->run.timeout_s, f->run.threads, f->json, "send / recv");
  cmd->add_option("--calibration", f->calibration,
                  "predict each rank's ring computation from this host calibration (`tally bench "
                  "gemm|memory --calibration-out`; reported, not checked)");
  cmd->callback([f] { run(*f); });
}};

}  // namespace

}  // namespace tally::cli::run_cp
