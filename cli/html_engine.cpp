#include "html_engine.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <string>
#include <vector>

#include "html_engine_parts.hpp"
#include "tally/core/comm.hpp"
#include "tally/core/types.hpp"

namespace tally::cli {

namespace {

using html::escape;
using html::number;
using nlohmann::json;
using namespace engine_html;

// ---- bench allreduce ------------------------------------------------------------------------

// Core's α–β all-reduce with the run's fitted link (the planner's formula, core/comm.hpp).
CollectiveCost fitted_cost(const json& fit, double size_bytes, int ranks) {
  return collective_cost(Collective::all_reduce, size_bytes, ranks,
                         {.bandwidth_bps = num(fit["beta_bytes_per_s"]),
                          .latency_s = num(fit["alpha_s"])});
}

bool fit_usable(const json& fits, const std::string& algo, int ranks) {
  return ranks > 1 && fits.contains(algo) && fits[algo]["ok"].get<bool>() &&
         num(fits[algo]["beta_bytes_per_s"]) > 0;
}

}  // namespace

html::Page allreduce_page(const json& j) {
  const int k = j["ranks"].get<int>();
  std::vector<std::string> algos;
  for (const json& row : j["rows"])
    if (std::find(algos.begin(), algos.end(), str(row["algorithm"])) == algos.end())
      algos.push_back(str(row["algorithm"]));
  const json& fits = j["fits"];
  std::vector<html::XYSeries> bw, times;
  std::vector<std::vector<std::string>> rows;
  for (const std::string& a : algos) {
    html::XYSeries mb{.label = a + " measured", .line = true},
        mt{.label = a + " measured", .line = true};
    html::XYSeries fb{.label = a + ": core α–β with the fitted α, β", .line = true,
                      .markers = false},
        ft = fb;
    const bool fitted = fit_usable(fits, a, k);
    for (const json& row : j["rows"]) {
      if (str(row["algorithm"]) != a) continue;
      const double s = num(row["size_bytes"]), t = num(row["time_s_median"]);
      const double busbw = num(row["busbw_bytes_per_s"]);
      const std::string tip = fmt::format("{} at {} B: {} GB/s, {} µs", a, bytes_cell(s),
                                          number(busbw / kGB), number(t * 1e6));
      mb.points.push_back({.x = s, .y = busbw / kGB, .tip = tip});
      mt.points.push_back({.x = s, .y = t * 1e6, .tip = tip});
      std::string predicted;
      if (fitted) {
        const CollectiveCost c = fitted_cost(fits[a], s, k);
        fb.points.push_back({.x = s, .y = c.busbw_bps() / kGB});
        ft.points.push_back({.x = s, .y = c.seconds * 1e6});
        predicted = number(c.busbw_bps() / kGB);
      }
      rows.push_back({a, bytes_cell(s), std::to_string(row["count"].get<long long>()),
                      number(t * 1e6), number(num(row["time_s_min"]) * 1e6),
                      number(num(row["time_s_max"]) * 1e6),
                      number(num(row["algbw_bytes_per_s"]) / kGB), number(busbw / kGB), predicted,
                      std::to_string(row["wrong"].get<long long>())});
    }
    bw.push_back(mb);
    times.push_back(mt);
    if (fitted) {
      bw.push_back(fb);
      times.push_back(ft);
    }
  }
  const std::string conv = str(j["busbw_convention"]) + "; time: " + str(j["time_convention"]) +
                           " | GB = 1e9 B";
  const double s0 = j["rows"].empty() ? 1.0 : num(j["rows"][0]["size_bytes"]);
  html::XYChart cb{.id = "busbw", .title = "Bus bandwidth against message size",
                   .convention = conv,
                   .x = {.label = "message size S (B, log scale)", .lo = s0, .hi = s0, .log = true},
                   .y = {.label = "bus bandwidth busbw (GB/s)", .lo = 0, .hi = 0},
                   .series = bw};
  html::XYChart ct{.id = "time", .title = "Time per all-reduce against message size",
                   .convention = conv,
                   .x = cb.x,
                   .y = {.label = "time per all-reduce, median (µs, log scale)", .lo = 0, .hi = 0,
                         .log = true},
                   .series = times};
  std::vector<std::vector<std::string>> fit_rows;
  for (const std::string& a : algos) {
    if (!fits.contains(a)) continue;
    const json& f = fits[a];
    fit_rows.push_back({a, f["ok"].get<bool>() ? "yes" : "no", number(num(f["alpha_s"]) * 1e6),
                        number(num(f["beta_bytes_per_s"]) / kGB),
                        fmt::format("{:.1f} %", 100 * num(f["max_rel_error"])), str(f["note"])});
  }
  std::vector<std::string> checks;
  for (const json& c : j["checks"]) checks.push_back(str(c["state"]) + " " + str(c["line"]));
  const std::string title = fmt::format("tally bench allreduce — k = {} ranks, {} {}", k,
                                        str(j["dtype"]), str(j["op"]));
  std::string body = heading(title, conv);
  body += fmt::format("<p>{} warm-up + {} timed iterations per size; #wrong total {}; ring bytes "
                      "per rank = core 2S(k−1)/k exactly: {}; {}.</p>\n",
                      j["warmup_iters"].get<int>(), j["iters"].get<int>(),
                      j["total_wrong"].get<long long>(),
                      j["ring_bytes_exact"].get<bool>() ? "yes" : "no",
                      j["ok"].get<bool>() ? "ok" : "FAILED");
  body += "<h2>Bus bandwidth</h2>\n" + html::xy_chart(cb) + "<h2>Time per call</h2>\n" +
          html::xy_chart(ct) +
          html::table("Every size and algorithm (time in µs, bandwidth in GB/s = 1e9 B/s)",
                      {"algorithm", "S (B)", "elements", "median (µs)", "min (µs)", "max (µs)",
                       "algbw (GB/s)", "busbw (GB/s)", "busbw α–β (GB/s)", "#wrong"},
                      rows) +
          html::table("α–β fit: t = α·2(k−1) + 2S(k−1)/k / β (relative least squares)",
                      {"algorithm", "fitted", "α (µs per step)", "β (GB/s)", "max residual",
                       "note"},
                      fit_rows);
  if (!checks.empty()) body += "<h2>Seed ④'s checks</h2>\n" + list(checks);
  return {title, body};
}

namespace {

// ---- run zero -------------------------------------------------------------------------------

constexpr const char* kStateItems[] = {"params", "grads", "m", "v", "master"};
// The measured counters' keys and core's collective names, in the chart's segment order.
constexpr std::pair<const char*, const char*> kCollectives[] = {
    {"ring_all_reduce", "all-reduce"}, {"reduce_scatter", "reduce-scatter"},
    {"all_gather", "all-gather"}};

std::vector<double> state_items(const json& items) {
  std::vector<double> v;
  for (const char* name : kStateItems) v.push_back(num(items[name]));
  return v;
}

std::string states_section(const json& j) {
  html::BarChart c{.id = "states", .title = "Model-state bytes per rank: measured beside core",
                   .convention = str(j["memory_convention"]) +
                                 " | core: model_states() of each stage (below)"};
  for (const char* name : kStateItems) c.segments.push_back(name);
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> conventions;
  for (const json& st : j["stages"]) {
    const std::string name = str(st["name"]);
    const json& core = st["predicted_state_bytes"];
    c.rows.push_back(name + ": core");
    c.values.push_back(state_items(core));
    std::vector<std::string> row{name, "core model_states"};
    for (double v : state_items(core)) row.push_back(bytes_cell(v));
    rows.push_back(row);
    rows.back().insert(rows.back().end(), {bytes_cell(num(core["total"])), "", ""});
    for (const json& q : st["ranks"]) {
      const std::string who = fmt::format("rank {}", q["rank"].get<int>());
      c.rows.push_back(name + ": " + who);
      c.values.push_back(state_items(q["held_bytes"]));
      row = {name, who + " held"};
      for (double v : state_items(q["held_bytes"])) row.push_back(bytes_cell(v));
      row.insert(row.end(), {bytes_cell(num(q["held_bytes"]["total"])),
                             bytes_cell(num(q["allocator_bytes"])),
                             fmt::format("{:.4f}", num(q["allocator_ratio"]))});
      rows.push_back(row);
    }
    conventions.push_back(name + ": " + str(st["states_convention"]));
  }
  return "<h2>Model-state bytes per rank</h2>\n" + byte_bars(c, "bytes per rank") +
         html::table("Model-state bytes per rank after the last step (B)",
                     {"stage", "who", "params", "grads", "m", "v", "master", "total",
                      "allocator", "allocator ÷ core"},
                     rows) +
         list(conventions);
}

// Note [zero memory phases] (engine/experiments/zero.cpp): the JSON's keys and the rows' words.
constexpr std::pair<const char*, const char*> kMemoryPhases[] = {
    {"setup_allocator_bytes", "after setup"},
    {"peak_forward_backward_bytes", "peak fwd+bwd"},
    {"peak_update_bytes", "peak update"},
    {"allocator_bytes", "after steps"}};

// "DP" for stage 0, else the stage's name: row labels stay within the chart's 150 px.
std::string short_stage(const json& st) {
  return st["stage"].get<int>() == 0 ? "DP" : str(st["name"]);
}

std::string memory_phases_section(const json& j) {
  html::BarChart c{.id = "memory-phases",
                   .title = "Allocated bytes by phase (rank 0) beside core's model states",
                   .convention = str(j["memory_phases_convention"]),
                   .segments = {"measured allocated, rank 0", "core model_states"}};
  std::vector<std::vector<std::string>> rows;
  for (const json& st : j["stages"]) {
    const double core = num(st["predicted_state_bytes"]["total"]);
    const json& rank0 = st["ranks"].at(0);
    for (const auto& [key, words] : kMemoryPhases) {
      c.rows.push_back(short_stage(st) + ": " + words);
      c.values.push_back({num(rank0[key]), 0});
    }
    c.rows.push_back(short_stage(st) + ": core states");
    c.values.push_back({0, core});
    for (const json& q : st["ranks"]) {
      std::vector<std::string> row{str(st["name"]), fmt::format("rank {}", q["rank"].get<int>())};
      for (const auto& [key, words] : kMemoryPhases) row.push_back(bytes_cell(num(q[key])));
      row.insert(row.end(), {bytes_cell(core), ratio_cell(num(q["setup_allocator_bytes"]) / core),
                             ratio_cell(num(q["allocator_bytes"]) / core)});
      rows.push_back(row);
    }
  }
  return "<h2>Memory by phase</h2>\n" + byte_bars(c, "allocated bytes per rank") +
         html::table("Allocated bytes by phase, every rank (B); the peaks are maxima over the "
                     "steps, core predicts the states only",
                     {"stage", "who", "after setup", "peak fwd+bwd", "peak update", "after steps",
                      "core model_states", "setup ÷ core", "after ÷ core"},
                     rows);
}

std::string traffic_section(const json& j) {
  html::BarChart c{.id = "traffic", .title = "Bytes sent per optimizer step, by collective",
                   .convention = str(j["traffic_convention"])};
  for (const auto& [key, name] : kCollectives) c.segments.push_back(name);
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> formulas;
  for (const json& st : j["stages"]) {
    const std::string name = str(st["name"]);
    std::vector<double> core(std::size(kCollectives), 0.0);
    std::vector<std::string> row{name, "core step_traffic"};
    std::vector<long long> calls(std::size(kCollectives), 0);
    for (const json& it : st["predicted_items"]) {
      for (std::size_t i = 0; i < std::size(kCollectives); ++i)
        if (str(it["collective"]) == kCollectives[i].second) {
          core[i] += num(it["bytes_per_rank"]);
          calls[i] += it["calls"].get<long long>();
        }
      if (num(it["bytes_per_rank"]) > 0)
        formulas.push_back(fmt::format("{}: core {} ({}): {} = {} B", name, str(it["kind"]),
                                       str(it["collective"]), str(it["formula"]),
                                       bytes_cell(num(it["bytes_per_rank"]))));
    }
    for (std::size_t i = 0; i < core.size(); ++i)
      row.insert(row.end(), {std::to_string(calls[i]), bytes_cell(core[i])});
    row.insert(row.end(), {bytes_cell(num(st["predicted_bytes_per_step"])), ""});
    c.rows.push_back(name + ": core");
    c.values.push_back(core);
    rows.push_back(row);
    for (const json& q : st["ranks"]) {
      const std::string who = fmt::format("rank {}", q["rank"].get<int>());
      std::vector<double> measured;
      row = {name, who + " measured"};
      for (const auto& [key, n] : kCollectives) {
        measured.push_back(num(q[key]["bytes"]));
        row.insert(row.end(), {std::to_string(q[key]["calls"].get<long long>()),
                               bytes_cell(num(q[key]["bytes"]))});
      }
      row.insert(row.end(), {bytes_cell(num(q["bytes_per_step"])),
                             bytes_cell(num(q["wire_bytes_per_step"]))});
      c.rows.push_back(name + ": " + who);
      c.values.push_back(measured);
      rows.push_back(row);
    }
  }
  return "<h2>Bytes sent per step</h2>\n" + byte_bars(c, "bytes sent per rank per step") +
         html::table("Collective calls and bytes sent per optimizer step (B)",
                     {"stage", "who", "all-reduce calls", "all-reduce B", "reduce-scatter calls",
                      "reduce-scatter B", "all-gather calls", "all-gather B", "total B",
                      "wire B"},
                     rows) +
         list(formulas);
}

// arrival_wait is there when the ranks shared this host (run_zero.cpp's zero_phases); else the
// chart draws 0 and the table says n/a.
constexpr const char* kZeroPhases[] = {"forward_backward", "arrival_wait", "collectives",
                                       "optimizer"};

std::string phases_section(const json& j) {
  html::BarChart c{.id = "phases", .title = "Step time by phase (rank 0, medians)",
                   .unit = "time per optimizer step (ms)"};
  for (const char* p : kZeroPhases) c.segments.push_back(p);
  bool predicted = false;  // only with --calibration
  for (const json& st : j["stages"]) predicted = predicted || st.contains("predicted_step_seconds");
  if (predicted) c.segments.push_back("predicted step (host model, --calibration)");
  std::vector<std::vector<std::string>> rows;
  for (const json& st : j["stages"]) {
    const json& ph = st["phase_seconds_median"];
    c.convention = str(ph["convention"]);
    std::vector<double> v;
    std::vector<std::string> row{str(st["name"]), number(num(st["step_seconds_median"]) * 1e3)};
    for (const char* p : kZeroPhases) {
      const double ms = ph.contains(p) ? num(ph[p]) * 1e3 : 0.0;
      v.push_back(ms);
      row.push_back(ph.contains(p) ? number(ms) : "n/a");  // one rank, or ranks on several hosts
    }
    if (predicted) v.push_back(0);
    c.rows.push_back(str(st["name"]) + ": measured");
    c.values.push_back(v);
    if (st.contains("predicted_step_seconds")) {
      const double p = num(st["predicted_step_seconds"]) * 1e3;
      c.rows.push_back(str(st["name"]) + ": predicted");
      std::vector<double> only(std::size(kZeroPhases), 0.0);
      only.push_back(p);
      c.values.push_back(only);
      row.push_back(number(p));
    } else {
      row.push_back("");
    }
    rows.push_back(row);
  }
  return "<h2>Step time</h2>\n" + html::bar_chart(c) +
         html::table("Rank 0's step and its phases, medians over the steps (ms)",
                     {"stage", "step", "forward_backward", "arrival_wait", "collectives",
                      "optimizer", "predicted step"},
                     rows);
}

std::string loss_section(const json& j) {
  // The y axis spans the losses alone (not from 0): ZeRO's curves lie within 1e-5 of DP's.
  const json& first = j["stages"].at(0)["mean_losses"];
  const double l0 = first.empty() ? 0.0 : num(first[0]);
  html::XYChart c{.id = "loss", .title = "Loss per step: every stage against DP",
                  .convention = "training loss (cross-entropy, nats) of each step, averaged over "
                                "the ranks; fp32 ZeRO-1/2/3 must follow DP within " +
                                std::string("1e-5 relative"),
                  .x = {.label = "optimizer step", .lo = 1, .hi = 1},
                  .y = {.label = "loss (cross-entropy, nats)", .lo = l0, .hi = l0}};
  std::vector<std::string> header{"step"};
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> diffs;
  for (const json& st : j["stages"]) {
    html::XYSeries s{.label = str(st["name"]), .line = true, .marker_px = 3.5};
    header.push_back(str(st["name"]));
    const json& losses = st["mean_losses"];
    for (std::size_t i = 0; i < losses.size(); ++i) {
      s.points.push_back({.x = double(i + 1), .y = num(losses[i]),
                          .tip = fmt::format("{} step {}: {:.6g}", str(st["name"]), i + 1,
                                             num(losses[i]))});
      if (rows.size() <= i) rows.push_back({std::to_string(i + 1)});
      rows[i].push_back(fmt::format("{:.6g}", num(losses[i])));
    }
    c.series.push_back(s);
    if (st.contains("max_rel_loss_diff_vs_dp"))
      diffs.push_back(fmt::format("{}: max relative loss difference vs DP {:.3g}, max |θ − θ_DP| "
                                  "{:.3g}",
                                  str(st["name"]), num(st["max_rel_loss_diff_vs_dp"]),
                                  num(st["max_param_diff_vs_dp"])));
  }
  return "<h2>Loss</h2>\n" + html::xy_chart(c) +
         html::table("Loss per step, mean over ranks (nats)", header, rows) + list(diffs);
}

}  // namespace

html::Page zero_page(const json& j) {
  std::string widths;
  for (const json& w : j["model"]["widths"])
    widths += (widths.empty() ? "" : "-") + std::to_string(w.get<long long>());
  const std::string title =
      fmt::format("tally run zero — MLP {}, N = {}, k = {} ranks, {}, {} steps", widths,
                  j["n_params"].get<long long>(), j["world_size"].get<int>(), str(j["precision"]),
                  j["steps"].get<int>());
  std::size_t failed = 0;
  for (const json& c : j["checks"]) failed += c["ok"].get<bool>() ? 0 : 1;
  std::string body = heading(title, fmt::format("{} params, {} on the wire, Adam lr {}",
                                                str(j["param_dtype"]), str(j["wire_dtype"]),
                                                number(num(j["lr"]))));
  body += fmt::format("<p>checks: {} of {} ok.</p>\n", j["checks"].size() - failed,
                      j["checks"].size());
  if (const std::string c = str(j["conclusion"]); !c.empty())
    body += "<p>conclusion: " + escape(c) + "</p>\n";
  body += states_section(j) + memory_phases_section(j) + traffic_section(j) + phases_section(j) +
          loss_section(j);
  return {title, body};
}

html::Page memory_profile_page(const json& j) {
  const std::string title = "tally run memory-profile";
  std::string body = "<h1>" + escape(title) + "</h1>\n";
  for (const json& run : j["runs"]) {
    const std::string precision = str(run["precision"]);
    const json& m = run["model"];
    html::BarChart c{.id = "memory-" + precision,
                     .title = "Allocated bytes after each phase: measured beside the ledgers (" +
                              precision + ")",
                     .convention = str(run["memory_convention"]),
                     .segments = {"measured allocated", "core prediction"},
                     .guides = {{.label = "peak allocated",
                                 .value = num(run["peak_allocated_bytes"])}}};
    std::vector<std::vector<std::string>> rows;
    for (const json& p : run["phases"]) {
      const std::string phase = str(p["phase"]);
      // "after-optimizer-init: measured" overflows the row labels' 150 px; the table keeps it.
      const std::string row = phase.rfind("after-", 0) == 0 ? phase.substr(6) : phase;
      c.rows.push_back(row + ": measured");
      c.values.push_back({num(p["allocated_bytes"]), 0});
      c.rows.push_back(row + ": core");
      c.values.push_back({0, num(p["predicted_allocated_bytes"])});
      rows.push_back({phase, bytes_cell(num(p["allocated_bytes"])),
                      bytes_cell(num(p["predicted_allocated_bytes"])),
                      fmt::format("{:.4f}", num(p["allocated_ratio"])),
                      bytes_cell(num(p["increment_bytes"])),
                      bytes_cell(num(p["predicted_increment_bytes"])),
                      fmt::format("{:.4f}", num(p["increment_ratio"])),
                      bytes_cell(num(p["peak_allocated_bytes"])),
                      bytes_cell(num(p["reserved_bytes"]))});
    }
    std::vector<std::string> notes = {str(run["states_convention"]),
                                      str(run["activations_convention"])};
    for (const json& ch : run["checks"])
      notes.push_back(fmt::format("{} {}: {} B vs {} B, ratio {:.4f} (±{:.0f} %): {}",
                                  str(ch["id"]), str(ch["what"]),
                                  bytes_cell(num(ch["measured_bytes"])),
                                  bytes_cell(num(ch["predicted_bytes"])), num(ch["ratio"]),
                                  100 * num(ch["tolerance"]), ch["ok"].get<bool>() ? "ok" : "FAILED"));
    notes.push_back(fmt::format("peak {} B in {}", bytes_cell(num(run["peak_allocated_bytes"])),
                                str(run["peak_phase"])));
    body += fmt::format("<h2>{}: h {}, L {}, T {}, B {} — {}</h2>\n", escape(str(m["name"])),
                        m["hidden"].get<long long>(), m["layers"].get<long long>(),
                        m["seq"].get<long long>(), m["micro_batch"].get<long long>(),
                        escape(precision)) +
            byte_bars(c, "allocated bytes") +
            html::table("Allocated bytes after each phase (B)",
                        {"phase", "allocated", "core", "ratio", "increment", "core increment",
                         "Δ ratio", "phase peak", "reserved"},
                        rows) +
            list(notes);
  }
  return {title, body};
}

}  // namespace tally::cli
