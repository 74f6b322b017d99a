// `--html FILE` on the engine's runs (issue 13, cli/html_engine.hpp): `tally bench allreduce`,
// `tally run zero` and `tally run memory-profile` at tiny sizes through the real binary (ranks
// started by `tally launch`), each page checked against the same run's --json object — charts
// present, axes with units, every table figure equal to the JSON's (the α–β line recomputed here
// from the fitted α and β) — and a bad path refused before the run (exit 2, one line). Skipped,
// saying why, when tally-engine was not built (TALLY_ENGINE=OFF).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "../support/subprocess.hpp"
#include "html_report.hpp"
#include "tally_run.hpp"

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
  for (const char* id : {"states", "traffic", "phases", "loss"}) EXPECT_TRUE(has_chart(p, id)) << id;
  // 977 parameters × 16 B = 15.6 kB at most per rank: the kB axis.
  for (const char* label : {">bytes per rank (kB = 1e3 B)<", ">bytes sent per rank per step (",
                            ">time per optimizer step (ms)<", ">optimizer step<",
                            ">loss (cross-entropy, nats)<", ">params<", ">master<",
                            ">reduce-scatter<", ">all-gather<", ">forward_backward<",
                            ">DP (ZeRO-0)<", ">ZeRO-3<"})
    EXPECT_NE(p.find(label), std::string::npos) << label;
  for (const char* conv : {"memory_convention", "traffic_convention"})
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
