// `--html FILE` on the engine's runs (issue 13, cli/html_engine.hpp): `tally bench allreduce`,
// `tally run zero`, `run tp`, `run 3d` and `run memory-profile` at tiny sizes through the real binary (ranks
// started by `tally launch`), each page checked against the same run's --json object — charts
// present, axes with units, every table figure equal to the JSON's (the α–β line recomputed here
// from the fitted α and β) — and a bad path refused before the run (exit 2, one line). Skipped,
// saying why, when tally-engine was not built (TALLY_ENGINE=OFF).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "../support/subprocess.hpp"
#include "html_report.hpp"
#include "tally_run.hpp"

namespace test_html_engine {
namespace {

namespace fs = std::filesystem;
namespace html = tally::cli::html;
using nlohmann::json;
using tally::clitest::slurp;
using tally::subprocess::rank_lines;
using tally::subprocess::run_command;

bool engine_built() { return fs::exists(fs::path(TALLY_BIN).parent_path() / "tally-engine"); }

fs::path temp_dir(const std::string& tag) {
  const fs::path d =
      fs::temp_directory_path() / ("tally_html_engine_" + tag + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<std::string> launch(int k, const std::vector<std::string>& command) {
  std::vector<std::string> a = {TALLY_BIN, "launch", "--nproc", std::to_string(k), "--timeout",
                                "100", "--", TALLY_BIN};
  a.insert(a.end(), command.begin(), command.end());
  return a;
}

// Rank 0's JSON (one line from run zero, indented from bench) from a `tally launch` run that must
// have succeeded; the other rank prints nothing.
json rank0_json(const tally::subprocess::Ran& r) {
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(rank_lines(r.out, 1).empty()) << r.out;
  std::string text;
  for (const auto& l : rank_lines(r.out, 0)) text += l + "\n";
  return text.empty() ? json::object() : json::parse(text);
}

std::string fmt_g(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string whole(double v) { return fmt_g("%.0f", v); }
std::string sig4(double v) { return fmt_g("%.4g", v); }

// The cells of the first table row that starts with `start` ("<tr><td>…"), or {}.
std::vector<std::string> row_at(const std::string& page, const std::string& start) {
  const auto at = page.find(start);
  if (at == std::string::npos) return {};
  const std::string tr = page.substr(at, page.find("</tr>", at) - at);
  std::vector<std::string> cells;
  const std::regex cell(R"(<td[^>]*>([^<]*)</td>)");
  for (auto it = std::sregex_iterator(tr.begin(), tr.end(), cell); it != std::sregex_iterator(); ++it)
    cells.push_back((*it)[1].str());
  return cells;
}
// The first row whose leading cells are the words `first` (left-aligned cells).
std::vector<std::string> row_after(const std::string& page, const std::vector<std::string>& first) {
  std::string start = "<tr>";
  for (const auto& c : first) start += "<td>" + c + "</td>";
  return row_at(page, start);
}

bool has_chart(const std::string& page, const std::string& id) {
  return page.find("<svg class=\"chart\" id=\"" + id + "\"") != std::string::npos;
}

// 2 ranks, ZeRO-0 (DP) and ZeRO-3 on the 977-parameter MLP: every per-rank state and traffic
// figure of the page's tables equals the JSON's, the loss table holds each step's mean loss.
TEST(HtmlEngine, ZeroPageHoldsTheRunsFigures) {
  if (!engine_built()) GTEST_SKIP() << "tally-engine not built (TALLY_ENGINE=OFF)";
  const fs::path d = temp_dir("zero");
  const std::string file = (d / "zero.html").string();
  const json j = rank0_json(run_command(
      launch(2, {"run", "zero", "--stage", "0", "--stage", "3", "--widths", "6,33,19,5", "--batch",
                 "8", "--steps", "3", "--timeout", "60", "--json", "--html", file}),
      110));
  ASSERT_EQ(j.value("experiment", ""), "zero");
  const std::string p = slurp(file);
  for (const char* id : {"states", "memory-phases", "traffic", "phases", "loss"})
    EXPECT_TRUE(has_chart(p, id)) << id;
  // 977 parameters × 16 B = 15.6 kB at most per rank: the kB axis.
  for (const char* label : {">bytes per rank (kB = 1e3 B)<", ">bytes sent per rank per step (",
                            ">time per optimizer step (ms)<", ">optimizer step<",
                            ">loss (cross-entropy, nats)<", ">params<", ">master<",
                            ">reduce-scatter<", ">all-gather<", ">forward_backward<",
                            ">DP (ZeRO-0)<", ">ZeRO-3<", ">allocated bytes per rank (",
                            ">DP: peak fwd+bwd<", ">ZeRO-3: after setup<", ">ZeRO-3: core states<"})
    EXPECT_NE(p.find(label), std::string::npos) << label;
  for (const char* conv : {"memory_convention", "memory_phases_convention", "traffic_convention"})
    EXPECT_NE(p.find("convention: " + html::escape(j[conv].get<std::string>())), std::string::npos)
        << conv;
  ASSERT_EQ(j["stages"].size(), 2u);
  for (const json& st : j["stages"]) {
    const std::string name = st["name"];
    const json& core = st["predicted_state_bytes"];
    const auto c = row_after(p, {name, "core model_states"});
    ASSERT_EQ(c.size(), 10u) << name;
    EXPECT_EQ(c[2], whole(core["params"])) << name;
    EXPECT_EQ(c[6], whole(core["master"])) << name;
    EXPECT_EQ(c[7], whole(core["total"])) << name;
    for (const json& q : st["ranks"]) {
      const std::string who = "rank " + std::to_string(q["rank"].get<int>());
      const auto held = row_after(p, {name, who + " held"});
      ASSERT_EQ(held.size(), 10u) << name << who;
      const char* items[] = {"params", "grads", "m", "v", "master", "total"};
      for (std::size_t i = 0; i < 6; ++i)
        EXPECT_EQ(held[2 + i], whole(q["held_bytes"][items[i]])) << name << who << items[i];
      EXPECT_EQ(held[8], whole(q["allocator_bytes"])) << name << who;
      const auto sent = row_after(p, {name, who + " measured"});
      ASSERT_EQ(sent.size(), 10u) << name << who;
      EXPECT_EQ(sent[2], std::to_string(q["ring_all_reduce"]["calls"].get<int>()));
      EXPECT_EQ(sent[5], whole(q["reduce_scatter"]["bytes"])) << name << who;
      EXPECT_EQ(sent[7], whole(q["all_gather"]["bytes"])) << name << who;
      EXPECT_EQ(sent[8], whole(q["bytes_per_step"])) << name << who;
      EXPECT_EQ(sent[9], whole(q["wire_bytes_per_step"])) << name << who;
      // Memory by phase (Note [zero memory phases]): the four readings, core's states, and the
      // two ratios recomputed here.
      const auto mem = row_after(p, {name, who});
      ASSERT_EQ(mem.size(), 9u) << name << who;
      EXPECT_EQ(mem[2], whole(q["setup_allocator_bytes"])) << name << who;
      EXPECT_EQ(mem[3], whole(q["peak_forward_backward_bytes"])) << name << who;
      EXPECT_EQ(mem[4], whole(q["peak_update_bytes"])) << name << who;
      EXPECT_EQ(mem[5], whole(q["allocator_bytes"])) << name << who;
      EXPECT_EQ(mem[6], whole(core["total"])) << name << who;
      EXPECT_EQ(mem[7], fmt_g("%.4f", q["setup_allocator_bytes"].get<double>() /
                                          core["total"].get<double>()));
      EXPECT_EQ(mem[8], fmt_g("%.4f", q["allocator_bytes"].get<double>() /
                                          core["total"].get<double>()));
      // The peaks: the larger is the run's peak; the step's first phase holds at least the states.
      EXPECT_EQ(std::max(q["peak_forward_backward_bytes"].get<double>(),
                         q["peak_update_bytes"].get<double>()),
                q["peak_bytes"].get<double>()) << name << who;
      EXPECT_GE(q["peak_forward_backward_bytes"].get<double>(),
                q["setup_allocator_bytes"].get<double>()) << name << who;
    }
    const auto pred = row_after(p, {name, "core step_traffic"});
    ASSERT_EQ(pred.size(), 10u) << name;
    EXPECT_EQ(pred[8], whole(st["predicted_bytes_per_step"])) << name;
    const auto ph = row_at(p, "<tr><td>" + name + "</td><td class=\"n\">");  // the step table
    ASSERT_GE(ph.size(), 5u) << name;
    EXPECT_EQ(ph[1], sig4(st["step_seconds_median"].get<double>() * 1e3)) << name;
  }
  // The loss table: step i's row holds DP's then ZeRO-3's mean loss.
  for (std::size_t i = 0; i < 3; ++i) {
    const std::regex re("<tr><td class=\"n\">" + std::to_string(i + 1) +
                        "</td><td class=\"n\">([^<]*)</td><td class=\"n\">([^<]*)</td></tr>");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(p, m, re)) << i;
    EXPECT_EQ(m[1].str(), fmt_g("%.6g", j["stages"][0]["mean_losses"][i])) << i;
    EXPECT_EQ(m[2].str(), fmt_g("%.6g", j["stages"][1]["mean_losses"][i])) << i;
  }
  fs::remove_all(d);
}

// 2 ranks, three sizes: each row's busbw equals the JSON's, and the α–β column equals core's
// cost recomputed here from the fitted α and β: t = α·2(k−1) + 2S(k−1)/k / β, busbw = S/t ·
// 2(k−1)/k (core/comm.hpp's table, nccl-tests' busbw).
TEST(HtmlEngine, AllreducePageHoldsTheRunsFigures) {
  if (!engine_built()) GTEST_SKIP() << "tally-engine not built (TALLY_ENGINE=OFF)";
  const fs::path d = temp_dir("allreduce");
  const std::string file = (d / "allreduce.html").string();
  const json j = rank0_json(run_command(
      launch(2, {"bench", "allreduce", "--sizes-mb", "0.004,0.04,0.4", "--warmup", "1", "--iters",
                 "3", "--timeout", "30", "--json", "--html", file}),
      110));
  ASSERT_EQ(j.value("command", ""), "bench allreduce");
  const std::string p = slurp(file);
  EXPECT_TRUE(has_chart(p, "busbw"));
  EXPECT_TRUE(has_chart(p, "time"));
  for (const char* label : {">message size S (B, log scale)<", ">bus bandwidth busbw (GB/s)<",
                            ">time per all-reduce, median (µs, log scale)<", ">gloo measured<",
                            ">ring measured<", ">10³<", ">10⁵<", ">10⁶<"})
    EXPECT_NE(p.find(label), std::string::npos) << label;
  const int k = 2;
  ASSERT_EQ(j["rows"].size(), 6u);
  for (const json& row : j["rows"]) {
    const std::string algo = row["algorithm"];
    const double s = row["size_bytes"];
    const auto at = p.find("<tr><td>" + algo + "</td><td class=\"n\">" + whole(s) + "</td>");
    ASSERT_NE(at, std::string::npos) << algo << " " << s;
    const auto r = row_at(p.substr(at), "<tr>");
    ASSERT_EQ(r.size(), 10u) << algo << s;
    EXPECT_EQ(r[3], sig4(row["time_s_median"].get<double>() * 1e6));
    EXPECT_EQ(r[7], sig4(row["busbw_bytes_per_s"].get<double>() / 1e9)) << algo << s;
    EXPECT_EQ(r[9], std::to_string(row["wrong"].get<int>()));
    const json& fit = j["fits"][algo];
    if (fit["ok"].get<bool>()) {
      const double alpha = fit["alpha_s"], beta = fit["beta_bytes_per_s"];
      const double t = alpha * 2 * (k - 1) + 2 * s * (k - 1) / k / beta;
      EXPECT_EQ(r[8], sig4(s / t * 2 * (k - 1) / k / 1e9)) << algo << s;
      EXPECT_NE(p.find(">" + algo + ": core α–β with the fitted α, β<"), std::string::npos);
    } else {
      EXPECT_EQ(r[8], "") << algo << s;
    }
  }
  fs::remove_all(d);
}

// One process, bf16, a 2-layer GPT of h 64: allocated bytes after each phase as in the JSON.
TEST(HtmlEngine, MemoryProfilePageHoldsTheRunsFigures) {
  if (!engine_built()) GTEST_SKIP() << "tally-engine not built (TALLY_ENGINE=OFF)";
  const fs::path d = temp_dir("memory");
  const std::string file = (d / "memory.html").string();
  const auto r = run_command({TALLY_BIN, "run", "memory-profile", "--precision", "bf16",
                              "--hidden", "64", "--layers", "2", "--heads", "4", "--vocab", "256",
                              "--seq", "32", "--json", "--html", file},
                             110);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  const std::string p = slurp(file);
  EXPECT_TRUE(has_chart(p, "memory-bf16"));
  for (const char* label : {">measured allocated<", ">core prediction<", ">peak allocated<"})
    EXPECT_NE(p.find(label), std::string::npos) << label;
  EXPECT_TRUE(std::regex_search(p, std::regex(R"(>allocated bytes \((B|kB = 1e3 B|MB = 1e6 B)\)<)")));
  ASSERT_EQ(j["runs"].size(), 1u);
  for (const json& ph : j["runs"][0]["phases"]) {
    const auto cells = row_after(p, {ph["phase"].get<std::string>()});
    ASSERT_EQ(cells.size(), 9u) << ph.dump();
    EXPECT_EQ(cells[1], whole(ph["allocated_bytes"]));
    EXPECT_EQ(cells[2], whole(ph["predicted_allocated_bytes"]));
    EXPECT_EQ(cells[4], whole(ph["increment_bytes"]));
    EXPECT_EQ(cells[7], whole(ph["peak_allocated_bytes"]));
  }
  fs::remove_all(d);
}

// The part of the page from its heading `h2` on ("<h2>Activations</h2>"), so a table's rows are
// found in their own section.
std::string section(const std::string& page, const std::string& h2) {
  const auto at = page.find("<h2>" + h2 + "</h2>");
  EXPECT_NE(at, std::string::npos) << h2;
  return at == std::string::npos ? std::string() : page.substr(at);
}
// The chart `id`'s SVG alone.
std::string chart(const std::string& page, const std::string& id) {
  const auto at = page.find("<svg class=\"chart\" id=\"" + id + "\"");
  return at == std::string::npos ? std::string() : page.substr(at, page.find("</svg>", at) - at);
}

// 2 ranks, TP without and with SP at h 16 (run tp's JSON test's model): each layout's bytes per
// layer, every layer's collectives, the activations and the losses equal the JSON's; the bytes
// outside core's ledger are the SP traffic summed here.
TEST(HtmlEngine, TpPageHoldsTheRunsFigures) {
  if (!engine_built()) GTEST_SKIP() << "tally-engine not built (TALLY_ENGINE=OFF)";
  const fs::path d = temp_dir("tp");
  const std::string file = (d / "tp.html").string();
  const json j = rank0_json(run_command(
      launch(2, {"run", "tp", "--compare-sp", "--hidden", "16", "--heads", "4", "--vocab", "32",
                 "--seq", "8", "--steps", "3", "--timeout", "60", "--json", "--html", file}),
      110));
  ASSERT_EQ(j.value("experiment", ""), "tp");
  const std::string p = slurp(file);
  for (const char* id : {"tp-bytes", "tp-activations", "tp-loss"}) EXPECT_TRUE(has_chart(p, id)) << id;
  for (const char* label : {">bytes sent per layer per step (", ">bytes per layer (",
                            ">training step<", ">loss (cross-entropy, nats)<", ">all-reduce<",
                            ">all-gather<", ">reduce-scatter<", ">core step_traffic TP item<",
                            ">TP+SP: measured<", ">TP: core<", ">core activations<"})
    EXPECT_NE(p.find(label), std::string::npos) << label;
  EXPECT_NE(p.find("<p>checks: " + std::to_string(j["checks"].get<int>()) + " of " +
                   std::to_string(j["checks"].get<int>()) + " ok.</p>"),
            std::string::npos);
  ASSERT_EQ(j["variants"].size(), 2u);
  const std::string acts = section(p, "Activations"), loss = section(p, "Loss");
  for (const json& v : j["variants"]) {
    const std::string name = v["sequence_parallel"].get<bool>() ? "TP + SP" : "TP";
    const auto t = row_after(p, {name});
    ASSERT_EQ(t.size(), 10u) << name;
    EXPECT_EQ(t[1], whole(v["bytes_per_layer"]["measured"])) << name;
    EXPECT_EQ(t[2], whole(v["bytes_per_layer"]["predicted"])) << name;
    EXPECT_EQ(t[4], whole(v["calls_per_layer"]["measured"])) << name;
    EXPECT_EQ(t[7], whole(v["tp_comm_bytes_per_step"])) << name;
    EXPECT_EQ(t[8], whole(v["predicted_tp"]["bytes_per_step"])) << name;
    double outside = 0;
    for (const char* key : {"sp_edges", "sp_grad_reduce", "sp_regather"})
      for (const json& m : v[key]) outside += m["bytes_sent"].get<double>();
    EXPECT_EQ(t[9], whole(outside)) << name;
    EXPECT_EQ(outside > 0, name == "TP + SP");
    for (std::size_t l = 0; l < v["layers"].size(); ++l)
      for (const json& m : v["layers"][l]) {
        const std::string coll = m["collective"];
        const auto c = row_at(p, "<tr><td>" + html::escape(name) + "</td><td class=\"n\">" +
                                     std::to_string(l) + "</td><td>" + coll + "</td>");
        ASSERT_EQ(c.size(), 8u) << name << l << coll;
        EXPECT_EQ(c[3], std::to_string(m["calls"].get<int>())) << name << l << coll;
        EXPECT_EQ(c[4], whole(m["bytes_sent"])) << name << l << coll;
        EXPECT_EQ(c[6], whole(v["predicted_tp"]["bytes_per_call"])) << name << l << coll;
      }
    const auto a = row_at(acts, "<tr><td>" + html::escape(name) + "</td>");
    ASSERT_EQ(a.size(), 6u) << name;
    EXPECT_EQ(a[1], whole(v["allocated_bytes_per_layer"])) << name;
    EXPECT_EQ(a[2], whole(v["layer_norm_stat_bytes_per_layer"])) << name;
    EXPECT_EQ(a[3], whole(v["activation_bytes_per_layer"]["measured"])) << name;
    EXPECT_EQ(a[4], whole(v["activation_bytes_per_layer"]["predicted"])) << name;
    const auto f = row_at(loss, "<tr><td>" + html::escape(name) + "</td>");
    ASSERT_EQ(f.size(), 6u) << name;
    EXPECT_EQ(f[1], fmt_g("%.12g", v["loss_f64"]["measured"])) << name;
    EXPECT_EQ(f[2], fmt_g("%.12g", v["loss_f64"]["predicted"])) << name;
  }
  // The fp32 loss table: step i's row holds each layout's loss, then the single process's.
  for (std::size_t i = 0; i < 3; ++i) {
    const auto r = row_at(loss, "<tr><td class=\"n\">" + std::to_string(i + 1) + "</td>");
    ASSERT_EQ(r.size(), 5u) << i;
    for (std::size_t v = 0; v < 2; ++v) {
      EXPECT_EQ(r[1 + 2 * v], fmt_g("%.6g", j["variants"][v]["losses_fp32"][i])) << i << v;
      EXPECT_EQ(r[2 + 2 * v], fmt_g("%.6g", j["variants"][v]["reference_losses_fp32"][i])) << i;
    }
  }
  fs::remove_all(d);
}

// 2 ranks, PP 2 (1F1B, M = 4) at h 16: every rank's states, activations, bytes by group, step
// parts and activations per recompute policy equal the JSON's; without --calibration the step
// chart has no core rows.
TEST(HtmlEngine, ThreeDPageHoldsTheRunsFigures) {
  if (!engine_built()) GTEST_SKIP() << "tally-engine not built (TALLY_ENGINE=OFF)";
  const fs::path d = temp_dir("3d");
  const std::string file = (d / "3d.html").string();
  const json j = rank0_json(run_command(
      launch(2, {"run", "3d", "--pp", "2", "--hidden", "16", "--heads", "4", "--vocab", "32",
                 "--seq", "8", "--layers", "2", "--steps", "2", "--timeout", "60", "--json",
                 "--html", file}),
      110));
  ASSERT_EQ(j.value("experiment", ""), "3d");
  const std::string p = slurp(file);
  for (const char* id : {"3d-memory", "3d-traffic", "3d-time", "3d-policies", "3d-loss"})
    EXPECT_TRUE(has_chart(p, id)) << id;
  for (const char* label : {">bytes per rank (", ">bytes sent per rank per step (",
                            ">time per step, mean over the fp32 steps (ms)<", ">bytes per layer (",
                            ">model states<", ">peak activations<", ">PP wait<", ">PP<",
                            ">rank 1: core<", ">op-sac: core<", ">training step<"})
    EXPECT_NE(p.find(label), std::string::npos) << label;
  EXPECT_EQ(chart(p, "3d-time").find(": core<"), std::string::npos) << "no --calibration";
  EXPECT_NE(chart(p, "3d-time").find(">rank 1: measured<"), std::string::npos);
  const std::string bytes = section(p, "Bytes per step"), time = section(p, "Step time"),
                    policies = section(p, "Activations by recompute policy");
  ASSERT_EQ(j["ranks"].size(), 2u);
  for (const json& x : j["ranks"]) {
    const std::string who = "rank " + std::to_string(x["rank"].get<int>());
    const auto m = row_after(p, {who, "0,0," + std::to_string(x["pp_index"].get<int>())});
    ASSERT_EQ(m.size(), 12u) << who;
    EXPECT_EQ(m[2], std::to_string(x["stage_layers"].get<int>())) << who;
    EXPECT_EQ(m[4], whole(x["state_bytes"]["measured"])) << who;
    EXPECT_EQ(m[5], whole(x["state_bytes"]["predicted"])) << who;
    EXPECT_EQ(m[8], whole(x["peak_activation_bytes"]["measured"])) << who;
    EXPECT_EQ(m[9], whole(x["peak_activation_bytes"]["predicted"])) << who;
    const auto b = row_after(bytes, {who});
    ASSERT_EQ(b.size(), 16u) << who;  // rank, TP, PP, DP × 3, then 6
    EXPECT_EQ(b[4], whole(x["pp_bytes"]["measured"])) << who;
    EXPECT_EQ(b[5], whole(x["pp_bytes"]["predicted"])) << who;
    EXPECT_EQ(b[7], whole(x["dp_bytes"]["measured"])) << who;
    EXPECT_EQ(b[11], whole(x["pp_embedding_bytes"])) << who;
    // Note [tied embedding under PP]: core's item on both end stages of this 2-stage run
    EXPECT_EQ(b[12], whole(x["pp_embedding_predicted_bytes"])) << who;
    EXPECT_EQ(b[11], b[12]) << who;
    EXPECT_EQ(b[13], whole(x["pp_sends"]["measured"])) << who;
    const auto t = row_after(time, {who});
    ASSERT_EQ(t.size(), 15u) << who;  // rank, 7 × (measured, core): the step, then its parts
    EXPECT_EQ(t[1], sig4(x["step_s"].get<double>() * 1e3)) << who;
    EXPECT_EQ(t[2], "") << who << ": the step's prediction needs --calibration";
    EXPECT_EQ(t[3], sig4(x["compute_s"]["measured"].get<double>() * 1e3)) << who;
    EXPECT_EQ(t[4], "") << who << ": compute needs --calibration";
    EXPECT_EQ(t[9], sig4(x["pp_wait_s"]["measured"].get<double>() * 1e3)) << who;
    EXPECT_EQ(t[10], sig4(x["pp_wait_s"]["predicted"].get<double>() * 1e3)) << who;
    EXPECT_EQ(t[13], sig4(x["optimizer_s"].get<double>() * 1e3)) << who;
    EXPECT_EQ(t[14], "") << who << ": the optimizer's prediction needs --calibration";
    const auto a = row_after(policies, {who});
    ASSERT_EQ(a.size(), 17u) << who;  // rank, 5 policies × 3, LayerNorm stats
    const char* order[] = {"none", "selective", "full", "save-matmuls", "op-sac"};
    for (std::size_t i = 0; i < 5; ++i) {
      const json& v = x["activation_bytes_per_layer"][order[i]];
      EXPECT_EQ(a[1 + 3 * i], whole(v["measured"])) << who << order[i];
      EXPECT_EQ(a[2 + 3 * i], whole(v["predicted"])) << who << order[i];
    }
  }
  for (std::size_t i = 0; i < j["losses_fp32"].size(); ++i)
    EXPECT_NE(p.find("<tr><td class=\"n\">" + std::to_string(i + 1) + "</td><td class=\"n\">" +
                     fmt_g("%.6g", j["losses_fp32"][i]) + "</td></tr>"),
              std::string::npos)
        << i;
  fs::remove_all(d);
}

// A path that cannot be written is refused before the run: exit 2 and the chart writer's one
// line, as rank 0 without its peers (no rendezvous is attempted) and as a one-process run; under
// `tally launch` the launcher reports the rank's failure (exit 1) with the same line.
TEST(HtmlEngine, UnwritablePathIsRefusedBeforeTheRun) {
  if (!engine_built()) GTEST_SKIP() << "tally-engine not built (TALLY_ENGINE=OFF)";
  const std::string bad = "/nonexistent-dir/e.html";
  const std::string line =
      "tally: error: --html: cannot write '" + bad + "': No such file or directory\n";
  std::vector<std::vector<std::string>> cases = {
      tally::subprocess::as_rank0_of(TALLY_BIN, "zero", 2, {"--html", bad}),
      tally::subprocess::as_rank0_of(TALLY_BIN, "tp", 2, {"--html", bad}),
      tally::subprocess::as_rank0_of(TALLY_BIN, "3d", 2, {"--html", bad}),
      {TALLY_BIN, "run", "memory-profile", "--html", bad}};
  auto bench = tally::subprocess::as_rank0_of(TALLY_BIN, "allreduce", 2, {"--html", bad});
  bench[bench.size() - 4] = "bench";  // `bench allreduce`, not `run allreduce`
  cases.push_back(bench);
  for (const auto& c : cases) {
    const auto r = run_command(c, 50);
    EXPECT_EQ(r.exit_code, 2) << c.back() << r.err;
    EXPECT_EQ(r.err, line);
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  const auto l = run_command(launch(2, {"run", "zero", "--html", bad}), 50);
  EXPECT_EQ(l.exit_code, 1) << l.err;
  EXPECT_NE(l.err.find("--html: cannot write '" + bad + "'"), std::string::npos) << l.err;
}

}  // namespace
}  // namespace test_html_engine
