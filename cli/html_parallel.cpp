// The `--html FILE` pages of `tally run tp` and `tally run 3d` (issue 13; Note [engine pages] in
// html_engine.hpp): drawn from the object each prints with --json, measured beside core.
#include <fmt/core.h>

#include <algorithm>
#include <string>
#include <vector>

#include "html_engine.hpp"
#include "html_engine_parts.hpp"
#include "tally/core/types.hpp"

namespace tally::cli {

namespace {

using html::number;
using nlohmann::json;
using namespace engine_html;

using Rows = std::vector<std::vector<std::string>>;

// A {measured, predicted, ratio} object of bytes (or counts) as three cells: whole numbers and
// the ratio; a null prediction leaves predicted and ratio empty.
std::vector<std::string> vs_cells(const json& v) {
  const auto cell = [](const json& x) { return x.is_null() ? std::string() : bytes_cell(num(x)); };
  return {cell(v["measured"]), cell(v["predicted"]),
          v["ratio"].is_null() ? std::string() : ratio_cell(num(v["ratio"]))};
}

std::vector<std::string> failed_checks(const json& j) {
  std::vector<std::string> out;
  for (const json& c : j["failed_checks"]) out.push_back("FAILED " + str(c));
  return out;
}

std::string checks_line(const json& j) {
  const std::size_t n = j["checks"].get<std::size_t>(), failed = j["failed_checks"].size();
  return fmt::format("<p>checks: {} of {} ok.</p>\n", n - failed, n) + list(failed_checks(j));
}

std::string model_words(const json& m) {
  return fmt::format("GPT h {}, L {}, a {}, V {}, T {}, B {} (N = {})",
                     m["hidden"].get<long long>(), m["layers"].get<long long>(),
                     m["heads"].get<long long>(), m["vocab"].get<long long>(),
                     m["seq"].get<long long>(), m["micro_batch"].get<long long>(),
                     m["params"].get<long long>());
}

// A loss chart: one series per entry, step 1 … n, the y axis spanning the losses alone.
struct LossSeries {
  std::string label;
  const json* losses;
};
html::XYChart loss_chart(const std::string& id, const std::string& title,
                         const std::string& convention, const std::vector<LossSeries>& series) {
  const double l0 = series.empty() || series[0].losses->empty() ? 0.0 : num((*series[0].losses)[0]);
  html::XYChart c{.id = id, .title = title, .convention = convention,
                  .x = {.label = "training step", .lo = 1, .hi = 1},
                  .y = {.label = "loss (cross-entropy, nats)", .lo = l0, .hi = l0}};
  for (const LossSeries& s : series) {
    html::XYSeries x{.label = s.label, .line = true, .marker_px = 3.5};
    for (std::size_t i = 0; i < s.losses->size(); ++i)
      x.points.push_back({.x = double(i + 1), .y = num((*s.losses)[i]),
                          .tip = fmt::format("{} step {}: {:.6g}", s.label, i + 1,
                                             num((*s.losses)[i]))});
    c.series.push_back(x);
  }
  return c;
}

// ---- run tp -----------------------------------------------------------------------------------

// "TP + SP, full recompute" for tables; "TP+SP+rc" for the chart's row labels (150 px).
std::string variant_name(const json& v) {
  return std::string(v["sequence_parallel"].get<bool>() ? "TP + SP" : "TP") +
         (v["full_recompute"].get<bool>() ? ", full recompute" : "");
}
std::string variant_row(const json& v) {
  return std::string(v["sequence_parallel"].get<bool>() ? "TP+SP" : "TP") +
         (v["full_recompute"].get<bool>() ? "+rc" : "");
}

// The collectives the run issued in its layers, in order of first appearance.
std::vector<std::string> layer_collectives(const json& variants) {
  std::vector<std::string> out;
  for (const json& v : variants)
    for (const json& layer : v["layers"])
      for (const json& m : layer)
        if (std::find(out.begin(), out.end(), str(m["collective"])) == out.end())
          out.push_back(str(m["collective"]));
  return out;
}

std::string tp_bytes_section(const json& j) {
  const std::vector<std::string> kinds = layer_collectives(j["variants"]);
  html::BarChart c{.id = "tp-bytes", .title = "Bytes sent per layer in one training step",
                   .convention = "bytes this rank sent (Comm counters: core's ring formula on "
                                 "each call's real S), mean over the layers; core: step_traffic's "
                                 "TP item ÷ L | rc = full recompute"};
  c.segments = kinds;
  c.segments.push_back("core step_traffic TP item");
  Rows per_call, totals;
  std::vector<std::string> notes;
  for (const json& v : j["variants"]) {
    const json& pred = v["predicted_tp"];
    const double layers = double(v["layers"].size());
    std::vector<double> measured(c.segments.size(), 0.0);
    for (std::size_t l = 0; l < v["layers"].size(); ++l)
      for (const json& m : v["layers"][l]) {
        const auto at = std::find(kinds.begin(), kinds.end(), str(m["collective"])) - kinds.begin();
        measured[std::size_t(at)] += num(m["bytes_sent"]) / layers;
        const double calls = num(m["calls"]), sent = num(m["bytes_sent"]);
        const double each = calls > 0 ? sent / calls : 0;
        const double core = num(pred["bytes_per_call"]);
        per_call.push_back({variant_name(v), std::to_string(l), str(m["collective"]),
                            fmt::format("{:.0f}", calls), bytes_cell(sent), bytes_cell(each),
                            bytes_cell(core), core > 0 ? ratio_cell(each / core) : ""});
      }
    c.rows.push_back(variant_row(v) + ": measured");
    c.values.push_back(measured);
    std::vector<double> core(c.segments.size(), 0.0);
    core.back() = num(v["bytes_per_layer"]["predicted"]);
    c.rows.push_back(variant_row(v) + ": core");
    c.values.push_back(core);
    double outside = 0;
    for (const char* key : {"sp_edges", "sp_grad_reduce", "sp_regather"})
      for (const json& m : v[key]) outside += num(m["bytes_sent"]);
    std::vector<std::string> row{variant_name(v)};
    for (const std::string& s : vs_cells(v["bytes_per_layer"])) row.push_back(s);
    for (const std::string& s : vs_cells(v["calls_per_layer"])) row.push_back(s);
    row.insert(row.end(), {bytes_cell(num(v["tp_comm_bytes_per_step"])),
                           bytes_cell(num(pred["bytes_per_step"])), bytes_cell(outside)});
    totals.push_back(row);
    notes.push_back(variant_name(v) + ": core " + str(pred["collective"]) + " × " +
                    std::to_string(pred["calls_per_step"].get<long long>()) + " per step: " +
                    str(pred["formula"]) + " | " + str(v["convention"]));
  }
  return "<h2>Bytes per layer</h2>\n" + byte_bars(c, "bytes sent per layer per step") +
         html::table("Bytes and calls per layer, measured beside core's TP item; the step's TP "
                     "bytes, all of them, and those outside core's TP item (SP edges, SP gradient "
                     "all-reduce: core's engine_sp_traffic; SP re-gathers: its tp_regather) (B)",
                     {"layout", "per layer", "core", "ratio", "calls", "core", "ratio",
                      "TP per step", "core", "outside TP item"},
                     totals) +
         html::table("Every layer's collectives in one training step (B)",
                     {"layout", "layer", "collective", "calls", "bytes sent", "per call",
                      "core per call", "ratio"},
                     per_call) +
         list(notes);
}

std::string tp_activations_section(const json& j) {
  html::BarChart c{.id = "tp-activations",
                   .title = "Activation bytes per layer: measured beside core",
                   .convention = "bytes the blocks leave alive after one fp32 forward, per layer "
                                 "(mean over the layers), this rank; core: activations()' "
                                 "Korthikanti terms, which omit LayerNorm's mean and rstd | rc = "
                                 "full recompute",
                   .segments = {"measured, Korthikanti's inventory",
                                "measured, LayerNorm mean and rstd", "core activations"}};
  Rows rows;
  for (const json& v : j["variants"]) {
    const json& a = v["activation_bytes_per_layer"];
    c.rows.push_back(variant_row(v) + ": measured");
    c.values.push_back({num(a["measured"]), num(v["layer_norm_stat_bytes_per_layer"]), 0});
    c.rows.push_back(variant_row(v) + ": core");
    c.values.push_back({0, 0, num(a["predicted"])});
    std::vector<std::string> row{variant_name(v), bytes_cell(num(v["allocated_bytes_per_layer"])),
                                 bytes_cell(num(v["layer_norm_stat_bytes_per_layer"]))};
    for (const std::string& s : vs_cells(a)) row.push_back(s);
    rows.push_back(row);
  }
  return "<h2>Activations</h2>\n" + byte_bars(c, "bytes per layer") +
         html::table("Activation bytes per layer (B)",
                     {"layout", "allocated", "LayerNorm stats", "allocated less stats", "core",
                      "ratio"},
                     rows);
}

std::string tp_loss_section(const json& j) {
  std::vector<LossSeries> series;
  std::vector<std::string> header{"step"};
  for (const json& v : j["variants"]) {
    series.push_back({variant_name(v), &v["losses_fp32"]});
    series.push_back({variant_name(v) + ": single process", &v["reference_losses_fp32"]});
    header.insert(header.end(), {variant_name(v), "single process"});
  }
  Rows steps;
  for (const LossSeries& s : series)
    for (std::size_t i = 0; i < s.losses->size(); ++i) {
      if (steps.size() <= i) steps.push_back({std::to_string(i + 1)});
      steps[i].push_back(fmt::format("{:.6g}", num((*s.losses)[i])));
    }
  Rows f64;
  for (const json& v : j["variants"]) {
    const json& l = v["loss_f64"];
    f64.push_back({variant_name(v), fmt::format("{:.12g}", num(l["measured"])),
                   fmt::format("{:.12g}", num(l["predicted"])),
                   fmt::format("{:.3g}", num(v["max_grad_rel_diff_f64"])), str(v["worst_grad"]),
                   fmt::format("{:.3g}", num(v["max_loss_rel_diff_fp32"]))});
  }
  const html::XYChart c = loss_chart(
      "tp-loss", "Loss per step: tensor parallel against the single-process model",
      "fp32 SGD, the same weights and tokens on every rank and in the single process; the issue's "
      "bound: 1e-5 relative per step",
      series);
  return "<h2>Loss</h2>\n" + html::xy_chart(c) +
         html::table("fp32 loss per step (nats)", header, steps) +
         html::table("float64 equivalence: loss and gradients against the single-process model",
                     {"layout", "loss f64", "single process", "max gradient difference (rel.)",
                      "worst tensor", "max fp32 loss difference (rel.)"},
                     f64);
}

// ---- run 3d -----------------------------------------------------------------------------------

std::string rank_name(const json& x) { return fmt::format("rank {}", x["rank"].get<int>()); }

// "dp,tp,pp" (and cp when the run has it): the rank's place in the layout.
std::string coords(const json& j, const json& x) {
  if (j["cp"].get<int>() > 1)
    return fmt::format("{},{},{},{}", x["dp_index"].get<int>(), x["cp_index"].get<int>(),
                       x["tp_index"].get<int>(), x["pp_index"].get<int>());
  return fmt::format("{},{},{}", x["dp_index"].get<int>(), x["tp_index"].get<int>(),
                     x["pp_index"].get<int>());
}

std::string memory_3d_section(const json& j) {
  html::BarChart c{.id = "3d-memory",
                   .title = "Model states and peak activations per rank: measured beside core",
                   .convention = "fp32 Adam states allocated by the tracking allocator beside "
                                 "core model_states(n) of the rank's own parameters; peak "
                                 "activations beside core's per-layer bytes × layers / v × the "
                                 "schedule's in-flight micro-batches",
                   .segments = {"model states", "peak activations"}};
  Rows rows;
  for (const json& x : j["ranks"]) {
    c.rows.push_back(rank_name(x) + ": measured");
    c.values.push_back({num(x["state_bytes"]["measured"]),
                        num(x["peak_activation_bytes"]["measured"])});
    c.rows.push_back(rank_name(x) + ": core");
    c.values.push_back({num(x["state_bytes"]["predicted"]),
                        num(x["peak_activation_bytes"]["predicted"])});
    std::vector<std::string> row{rank_name(x), coords(j, x),
                                 std::to_string(x["stage_layers"].get<int>()),
                                 bytes_cell(num(x["own_params"]))};
    for (const std::string& s : vs_cells(x["state_bytes"])) row.push_back(s);
    row.push_back(bytes_cell(num(x["state_bytes_layout"]["predicted"])));
    for (const std::string& s : vs_cells(x["peak_activation_bytes"])) row.push_back(s);
    row.push_back(number(num(x["in_flight_predicted"])));
    rows.push_back(row);
  }
  return "<h2>Memory per rank</h2>\n" + byte_bars(c, "bytes per rank") +
         html::table("Model states and peak activations per rank (B)",
                     {"rank", j["cp"].get<int>() > 1 ? "dp,cp,tp,pp" : "dp,tp,pp", "layers",
                      "own params", "states", "core", "ratio", "core at N/(t·p)",
                      "peak activations", "core", "ratio", "in flight"},
                     rows);
}

// The communication groups: the JSON's key, the chart's name.
struct Group {
  const char* key;
  const char* name;
};
std::vector<Group> groups_3d(const json& j) {
  std::vector<Group> g = {{"tp_bytes", "TP"}, {"pp_bytes", "PP"}, {"dp_bytes", "DP"}};
  if (j["cp"].get<int>() > 1) g.push_back({"cp_bytes", "CP"});
  return g;
}

std::string traffic_3d_section(const json& j) {
  const std::vector<Group> groups = groups_3d(j);
  html::BarChart c{.id = "3d-traffic", .title = "Bytes sent per step by group: measured beside core",
                   .convention = "bytes each rank sent in the first fp32 step; core step_traffic "
                                 "on the rank's own stage and parameters (TP: its layers' "
                                 "collectives, PP: the schedule's sends, DP: gradient reduction "
                                 "+ ZeRO gather); outside those items: SP edges and gradients "
                                 "(TP; core's engine_sp_traffic in the core bar), the tied "
                                 "embedding's exchange (PP; core's pp_embedding in the core "
                                 "bar)"};
  for (const Group& g : groups) c.segments.push_back(g.name);
  c.segments.push_back("outside the layout's items");
  std::vector<std::string> header{"rank"};
  for (const Group& g : groups)
    header.insert(header.end(), {std::string(g.name), "core", "ratio"});
  header.insert(header.end(), {"TP SP edges+grads", "PP embedding", "core embedding",
                               "PP sends", "core sends", "DP calls"});
  Rows rows;
  for (const json& x : j["ranks"]) {
    std::vector<double> measured, core;
    std::vector<std::string> row{rank_name(x)};
    for (const Group& g : groups) {
      measured.push_back(num(x[g.key]["measured"]));
      core.push_back(num(x[g.key]["predicted"]));
      for (const std::string& s : vs_cells(x[g.key])) row.push_back(s);
    }
    measured.push_back(num(x["tp_other_bytes"]) + num(x["pp_embedding_bytes"]));
    // Note [engine SP edges], Note [tied embedding under PP]
    core.push_back(x.value("tp_other_predicted_bytes", 0.0) +
                   x.value("pp_embedding_predicted_bytes", 0.0));
    c.rows.push_back(rank_name(x) + ": measured");
    c.values.push_back(measured);
    c.rows.push_back(rank_name(x) + ": core");
    c.values.push_back(core);
    row.insert(row.end(), {bytes_cell(num(x["tp_other_bytes"])),
                           bytes_cell(num(x["pp_embedding_bytes"])),
                           bytes_cell(x.value("pp_embedding_predicted_bytes", 0.0)),
                           fmt::format("{:.0f}", num(x["pp_sends"]["measured"])),
                           fmt::format("{:.0f}", num(x["pp_sends"]["predicted"])),
                           fmt::format("{:.0f}", num(x["dp_calls"]))});
    rows.push_back(row);
  }
  return "<h2>Bytes per step</h2>\n" + byte_bars(c, "bytes sent per rank per step") +
         html::table("Bytes sent per step by group (B)", header, rows);
}

// The step's parts: the JSON's key (a {measured, predicted, ratio} object), the name.
constexpr Group kTimeParts[] = {{"compute_s", "compute"}, {"tp_comm_s", "TP comm"},
                                {"cp_comm_s", "CP comm"}, {"pp_wait_s", "PP wait"},
                                {"dp_comm_s", "DP comm"}, {"optimizer_time_s", "optimizer"}};

double measured_s(const json& v) { return v.is_object() ? num(v["measured"]) : num(v); }

std::string time_3d_section(const json& j) {
  const bool calibrated = !j["ranks"].empty() && !j["ranks"][0]["compute_s"]["predicted"].is_null();
  html::BarChart c{.id = "3d-time", .title = "Step time per rank by part",
                   .convention = std::string("measured: the parts of each rank's step, the rest "
                                             "is the step less the parts (ZeRO gathers, "
                                             "bookkeeping); core: ") +
                                 (calibrated ? "the operator model (Note [host GPT step]) "
                                               "and the α–β items on the host "
                                               "calibration, the PP wait as the bubble "
                                               "(P−1)(t_f+t_b)/v on the measured t_f, t_b"
                                             : "drawn with --calibration only; without it core "
                                               "predicts the PP wait alone (the table)"),
                   .unit = "time per step, mean over the fp32 steps (ms)"};
  for (const Group& g : kTimeParts) c.segments.push_back(g.name);
  c.segments.push_back("rest of the step");
  std::vector<std::string> header{"rank", "step (ms)", "core (ms)"};
  for (const Group& g : kTimeParts) {
    header.push_back(std::string(g.name) + " (ms)");
    header.push_back("core (ms)");
  }
  Rows rows;
  for (const json& x : j["ranks"]) {
    const double step = num(x["step_s"]) * 1e3;
    std::vector<double> measured, core;
    // The step Note [predicted 3-D step] adds up (the slowest rank's, on every rank).
    const json& predicted_step = x["step_time_s"]["predicted"];
    std::vector<std::string> row{rank_name(x), number(step),
                                 predicted_step.is_null() ? "" : number(num(predicted_step) * 1e3)};
    double parts = 0;
    for (const Group& g : kTimeParts) {
      const json& v = x[g.key];
      const double m = measured_s(v) * 1e3;
      parts += m;
      measured.push_back(m);
      row.push_back(number(m));
      if (!v.is_object()) {
        core.push_back(0);
        continue;
      }
      const bool have = !v["predicted"].is_null();
      core.push_back(have ? num(v["predicted"]) * 1e3 : 0);
      row.push_back(have ? number(num(v["predicted"]) * 1e3) : "");
    }
    measured.push_back(step - parts);
    core.push_back(0);
    c.rows.push_back(rank_name(x) + ": measured");
    c.values.push_back(measured);
    if (calibrated) {
      c.rows.push_back(rank_name(x) + ": core");
      c.values.push_back(core);
    }
    rows.push_back(row);
  }
  return "<h2>Step time</h2>\n" + html::bar_chart(c) +
         html::table("Step time by part, mean over the fp32 steps (ms); core empty where it needs "
                     "--calibration",
                     header, rows);
}

std::string policies_3d_section(const json& j) {
  const json& rank0 = j["ranks"].at(0);
  html::BarChart c{.id = "3d-policies",
                   .title = "Activation bytes per layer by recompute policy (rank 0)",
                   .convention = "bytes one forward of the rank's layers leaves alive per layer, "
                                 "less LayerNorm's statistics, for every policy whatever the "
                                 "run's; core: activations().per_layer_bytes for that policy",
                   .segments = {"measured", "core"}};
  std::vector<std::string> header{"rank"};
  for (int i = 0; i < kRecomputePolicies; ++i) {
    const std::string p(to_string(Recompute(i)));
    const json& v = rank0["activation_bytes_per_layer"][p];
    c.rows.push_back(p + ": measured");
    c.values.push_back({num(v["measured"]), 0});
    c.rows.push_back(p + ": core");
    c.values.push_back({0, num(v["predicted"])});
    header.insert(header.end(), {p, "core", "ratio"});
  }
  header.push_back("LayerNorm stats");
  Rows rows;
  for (const json& x : j["ranks"]) {
    std::vector<std::string> row{rank_name(x)};
    for (int i = 0; i < kRecomputePolicies; ++i)
      for (const std::string& s :
           vs_cells(x["activation_bytes_per_layer"][std::string(to_string(Recompute(i)))]))
        row.push_back(s);
    row.push_back(bytes_cell(num(x["layer_norm_stat_bytes_per_layer"])));
    rows.push_back(row);
  }
  return "<h2>Activations by recompute policy</h2>\n" + byte_bars(c, "bytes per layer") +
         html::table("Activation bytes per layer by recompute policy, every rank (B)", header,
                     rows);
}

std::string loss_3d_section(const json& j) {
  const html::XYChart c = loss_chart(
      "3d-loss", "Loss per fp32 step",
      "fp32 Adam, the training loss of each step averaged over the DP ranks",
      {{"3-D run", &j["losses_fp32"]}});
  Rows steps;
  for (std::size_t i = 0; i < j["losses_fp32"].size(); ++i)
    steps.push_back({std::to_string(i + 1), fmt::format("{:.6g}", num(j["losses_fp32"][i]))});
  Rows eq;
  for (const json& x : j["ranks"])
    eq.push_back({rank_name(x), fmt::format("{:.3g}", num(x["max_grad_rel_diff_f64"])),
                  fmt::format("{:.3g}", num(x["max_param_rel_diff_f64"]))});
  const json& l = j["loss_f64"];
  return "<h2>Loss</h2>\n" +
         fmt::format("<p>float64 mean loss over every micro-batch: {:.12g}; the single-process "
                     "model's: {:.12g} (ratio {:.12g}).</p>\n",
                     num(l["measured"]), num(l["predicted"]), num(l["ratio"])) +
         html::xy_chart(c) + html::table("fp32 loss per step (nats)", {"step", "loss"}, steps) +
         html::table("float64 equivalence per rank (relative to the single-process model)",
                     {"rank", "max gradient difference", "max parameter difference"}, eq);
}

}  // namespace

html::Page tp_page(const json& j) {
  const std::string title = fmt::format("tally run tp — t = {} ranks, {}, {} fp32 steps",
                                        j["tp"].get<int>(), model_words(j["model"]),
                                        j["steps"].get<int>());
  std::string body = heading(title, "rank 0's figures (the TP ranks are symmetric); fp32 bytes, "
                                    "B = bytes, no unit prefixes in tables");
  body += checks_line(j) + tp_bytes_section(j) + tp_activations_section(j) + tp_loss_section(j);
  return {title, body};
}

html::Page three_d_page(const json& j) {
  std::string layout = fmt::format("DP {} × TP {}{} × PP {}", j["dp"].get<int>(),
                                   j["tp"].get<int>(), j["sp"].get<bool>() ? " + SP" : "",
                                   j["pp"].get<int>());
  if (j["cp"].get<int>() > 1) layout += fmt::format(" × CP {}", j["cp"].get<int>());
  std::string split;
  for (const json& l : j["stage_layers"])
    split += (split.empty() ? "" : "+") + std::to_string(l.get<int>());
  const std::string title = fmt::format("tally run 3d — {} = {} ranks, ZeRO-{}", layout,
                                        j["world_size"].get<int>(), j["zero"].get<int>());
  std::string body = heading(
      title, fmt::format("{}; {} schedule{}, M = {}, layers {}; recompute {}; every rank's "
                         "figures, bytes per step of the first fp32 step, times the mean over "
                         "the {} fp32 steps",
                         model_words(j["model"]), str(j["schedule"]),
                         j["interleave"].get<int>() > 1
                             ? fmt::format(" v = {}", j["interleave"].get<int>())
                             : "",
                         j["micro_batches"].get<int>(), split, str(j["recompute"]),
                         j["steps"].get<int>()));
  body += checks_line(j) + memory_3d_section(j) + traffic_3d_section(j) + time_3d_section(j) +
          policies_3d_section(j) + loss_3d_section(j);
  return {title, body};
}

}  // namespace tally::cli
