// `--html FILE` (issue 13): the SVG chart writer's structure, escaping and ticks (worked by hand
// below), the pages `tally plan|compare|bubble|reliability --html` write (figures checked against the
// JSON or an independent computation), and the pages rendered in Debian's headless chromium.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "../support/chromium.hpp"
#include "../support/subprocess.hpp"
#include "tally_run.hpp"
#include "html_report.hpp"
#include "tally/core/types.hpp"

namespace test_html {
namespace {

namespace html = tally::cli::html;
namespace fs = std::filesystem;
using tally::clitest::slurp;
using tally::clitest::tally;
using tally::clitest::TallyRun;

std::size_t count(const std::string& s, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

// A fresh directory per test process, removed at the end of each test that makes one.
fs::path temp_dir(const std::string& tag) {
  const fs::path d = fs::temp_directory_path() / ("tally_html_" + tag + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(HtmlWriter, EscapesTextAndAttributes) {
  EXPECT_EQ(html::escape(R"(<a href="x">Tom & 'Jerry'</a>)"),
            "&lt;a href=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/a&gt;");
  EXPECT_EQ(html::escape("DP 8 × TP 1, ≤ 10 %"), "DP 8 × TP 1, ≤ 10 %");  // UTF-8 untouched
}

// Heckbert 1990, by hand: [0, 73] with 6 ticks → range nicenum(73) = 100, step nicenum(20) = 20,
// 0..80; [0, 1] with 5 → step nicenum(0.25, round) = 0.2; [12.3, 18.9] with 6 → range 10, step 2,
// from floor(12.3/2)·2 = 12 to ceil(18.9/2)·2 = 20; [−3.2, 7.1] with 6 → range 20, step
// nicenum(4, round) = 5, −5..10; [5, 5] widens to [2.5, 7.5] → range 5, step 1, 2..8.
TEST(HtmlWriter, NiceTicksByHand) {
  auto near = [](const std::vector<double>& got, const std::vector<double>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;
  };
  near(html::nice_ticks(0, 73, 6), {0, 20, 40, 60, 80});
  near(html::nice_ticks(0, 1, 5), {0, 0.2, 0.4, 0.6, 0.8, 1.0});
  near(html::nice_ticks(12.3, 18.9, 6), {12, 14, 16, 18, 20});
  near(html::nice_ticks(-3.2, 7.1, 6), {-5, 0, 5, 10});
  near(html::nice_ticks(5, 5, 6), {2, 3, 4, 5, 6, 7, 8});
  EXPECT_THROW(html::nice_ticks(0, INFINITY), tally::InvalidInput);
  EXPECT_EQ(html::tick_label(0.2, 0.2), "0.2");
  EXPECT_EQ(html::tick_label(20, 20), "20");
  EXPECT_EQ(html::tick_label(0.25, 0.05), "0.25");
  EXPECT_EQ(html::tick_label(0.001, 0.0005), "0.0010");
}

// Geometry by hand: the bar chart's value axis runs from x = 78 + 150 − 60 = 168 px to
// 760 − 24 = 736 px; values 1 and 3 stack to 4, ticks nice_ticks(0, 4, 7) = 0..4 (range
// nicenum(4) = 5, step nicenum(5/6, round) = 1), so 0 → 168, 1 → 310, 4 → 736. Rows start at
// y = 40 (top margin) + 6 and are 34 px apart.
TEST(HtmlWriter, StackedBarGeometryLegendAndEscaping) {
  const std::string s = html::bar_chart(
      {.id = "b", .title = "T <1>", .convention = "conv & co", .unit = "memory (GB = 1e9 B)",
       .segments = {"params", "grads <g>"}, .rows = {"chosen"}, .values = {{1, 3}}});
  EXPECT_NE(s.find(R"(<rect class="seg" x="168.0" y="46.0" width="142.0" height="22")"),
            std::string::npos) << s;
  EXPECT_NE(s.find(R"(<rect class="seg" x="310.0" y="46.0" width="426.0" height="22")"),
            std::string::npos) << s;
  EXPECT_EQ(count(s, "<rect class=\"seg\""), 2u);
  for (const char* t : {">0<", ">1<", ">2<", ">3<", ">4<"}) EXPECT_NE(s.find(t), std::string::npos) << t;
  EXPECT_NE(s.find(">memory (GB = 1e9 B)</text>"), std::string::npos);     // axis label with unit
  EXPECT_NE(s.find(">grads &lt;g&gt;</text>"), std::string::npos);         // legend, escaped
  EXPECT_NE(s.find("convention: conv &amp; co"), std::string::npos);       // convention label
  EXPECT_NE(s.find("role=\"img\""), std::string::npos);
  EXPECT_EQ(s.find("<1>"), std::string::npos);                             // title escaped
  // A negative value stacks leftwards of zero: [−2, 2] → ticks −2..2, 0 at (168 + 736) / 2 = 452.
  const std::string n = html::bar_chart({.id = "n", .title = "t", .unit = "u", .segments = {"d"},
                                         .rows = {"up", "down"}, .values = {{2}, {-2}}});
  EXPECT_NE(n.find(R"(x="452.0" y="46.0" width="284.0")"), std::string::npos) << n;
  EXPECT_NE(n.find(R"(x="168.0" y="80.0" width="284.0")"), std::string::npos) << n;
}

// The XY chart: x axis 78 → 736 px, y axis 324 (= 380 − 56) → 40 px. Points (0, 0) and (10, 5):
// x ticks nice_ticks(0, 10, 8): range 10, step nicenum(10/7 = 1.43, round) = 1, so 0..10; y ticks
// nice_ticks(0, 5, 6): range 5, step 1, so 0..5. (0, 0) → (78, 324), (10, 5) → (736, 40).
TEST(HtmlWriter, XYChartPlacesPointsAndTips) {
  const std::string s = html::xy_chart(
      {.id = "xy", .title = "t", .convention = "c",
       .x = {.label = "interval (h)", .lo = 0, .hi = 0}, .y = {.label = "lost (%)", .lo = 0, .hi = 0},
       .series = {{.label = "curve", .points = {{0, 0, "a<b"}, {10, 5, ""}}, .line = true}},
       .guides = {{.label = "Young", .value = 4}}});
  EXPECT_NE(s.find(R"(<circle cx="78.0" cy="324.0")"), std::string::npos) << s;
  EXPECT_NE(s.find(R"(<circle cx="736.0" cy="40.0")"), std::string::npos) << s;
  EXPECT_NE(s.find("<title>a&lt;b</title>"), std::string::npos);
  EXPECT_NE(s.find("points=\"78.0,324.0 736.0,40.0 \""), std::string::npos);
  // the guide at x = 4: 78 + 0.4 · 658 = 341.2
  EXPECT_NE(s.find(R"(<line x1="341.2" y1="40.0" x2="341.2" y2="324.0"/>)"), std::string::npos);
  EXPECT_NE(s.find(">interval (h)</text>"), std::string::npos);
  EXPECT_NE(s.find(">lost (%)</text>"), std::string::npos);
  EXPECT_NE(s.find(">Young</text>"), std::string::npos);
}

// A log axis (Axis::log): x from 1e3 to 1e5 gives ticks at 10³, 10⁴, 10⁵ (log_ticks), 78 → 736 px,
// so 10⁴ sits halfway, at 78 + 329 = 407; y stays linear, 0..5 → 324..40 px, 2.5 at 182.
TEST(HtmlWriter, LogAxisByHand) {
  const std::string s = html::xy_chart(
      {.id = "log", .title = "t", .convention = "c",
       .x = {.label = "size (B, log scale)", .lo = 0, .hi = 0, .log = true},
       .y = {.label = "busbw (GB/s)", .lo = 0, .hi = 0},
       .series = {{.label = "m", .points = {{1e3, 0, ""}, {1e4, 2.5, ""}, {1e5, 5, ""}}}}});
  EXPECT_NE(s.find(R"(<circle cx="78.0" cy="324.0")"), std::string::npos) << s;
  EXPECT_NE(s.find(R"(<circle cx="407.0" cy="182.0")"), std::string::npos) << s;
  EXPECT_NE(s.find(R"(<circle cx="736.0" cy="40.0")"), std::string::npos) << s;
  for (const char* t : {">10³<", ">10⁴<", ">10⁵<"}) EXPECT_NE(s.find(t), std::string::npos) << t;
  EXPECT_EQ(html::log_ticks(3e3, 2e5), (std::vector<double>{1e3, 1e4, 1e5, 1e6}));
  EXPECT_EQ(html::log_ticks(5, 5), (std::vector<double>{1, 10}));  // at least two
  EXPECT_EQ(html::power_of_ten_label(-2), "10⁻²");
  EXPECT_EQ(html::power_of_ten_label(12), "10¹²");
  EXPECT_THROW(html::xy_chart({.id = "z", .x = {.label = "x", .log = true},
                               .series = {{.label = "s", .points = {{0, 1, ""}}}}}),
               tally::InvalidInput);  // log10(0) has no place on the axis
}

TEST(HtmlWriter, TableAndPageAreSelfContained) {
  const std::string t = html::table("cap & x", {"a", "b"}, {{"-1.5e+03", "<2>"}, {"+9.9 %", "x1"}});
  EXPECT_NE(t.find("<caption>cap &amp; x</caption>"), std::string::npos);
  EXPECT_NE(t.find("<td>&lt;2&gt;</td>"), std::string::npos);
  EXPECT_NE(t.find("<td class=\"n\">-1.5e+03</td>"), std::string::npos);  // figures right-aligned
  EXPECT_NE(t.find("<td class=\"n\">+9.9 %</td>"), std::string::npos);
  EXPECT_NE(t.find("<td>x1</td>"), std::string::npos);
  const std::string p = html::page("x < y", t);
  EXPECT_EQ(p.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(p.find("<title>x &lt; y</title>"), std::string::npos);
  EXPECT_NE(p.find("<style>"), std::string::npos);
  for (const char* ext : {"http:", "https:", "src=", "<link", "@import", "url(", "//cdn"})
    EXPECT_EQ(p.find(ext), std::string::npos) << ext;
}

TEST(HtmlWriter, UnwritablePathNamesTheFlag) {
  try {
    html::write_file("--html", "/nonexistent-dir/x.html", "x");
    FAIL() << "no throw";
  } catch (const tally::InvalidInput& e) {
    EXPECT_EQ(std::string(e.what()),
              "--html: cannot write '/nonexistent-dir/x.html': No such file or directory");
  }
}

// The engine's pre-run check: the same message as write_file, and no file left behind or changed.
TEST(HtmlWriter, CheckWritableLeavesNoTrace) {
  const fs::path d = temp_dir("probe");
  EXPECT_NO_THROW(html::check_writable("--html", (d / "new.html").string()));
  EXPECT_FALSE(fs::exists(d / "new.html"));
  std::ofstream(d / "old.html") << "abc";
  EXPECT_NO_THROW(html::check_writable("--html", (d / "old.html").string()));
  EXPECT_EQ(slurp(d / "old.html"), "abc");
  try {
    html::check_writable("--html", "/nonexistent-dir/x.html");
    FAIL() << "no throw";
  } catch (const tally::InvalidInput& e) {
    EXPECT_EQ(std::string(e.what()),
              "--html: cannot write '/nonexistent-dir/x.html': No such file or directory");
  }
  fs::remove_all(d);
}

TEST(HtmlCli, UnwritablePathExitsTwoWithOneLine) {
  for (const std::vector<std::string>& cmd :
       {std::vector<std::string>{"plan"}, {"bubble", "--pp", "4", "--micro-batches", "8"},
        {"reliability", "--gpus", "64", "--state-size", "112GB"}}) {
    std::vector<std::string> a = cmd;
    a.insert(a.end(), {"--html", "/nonexistent-dir/p.html"});
    const TallyRun r = tally(a);
    EXPECT_EQ(r.rc, 2) << cmd[0];
    EXPECT_EQ(r.err, "tally: error: --html: cannot write '/nonexistent-dir/p.html': No such file "
                     "or directory\n") << cmd[0];
    EXPECT_TRUE(r.out.empty()) << cmd[0];  // nothing printed before the page failed
  }
}

// A figure as the pages' tables print it: 4 significant digits (html::number).
std::string sig4(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return std::string(buf);
}

std::string cell_after(const std::string& page, const std::string& first_cell) {
  const std::regex re("<td>" + first_cell + "</td><td class=\"n\">([^<]*)</td>");
  std::smatch m;
  return std::regex_search(page, m, re) ? m[1].str() : std::string("(missing)");
}

// The default plan's page: every chart, the numbers beside them equal to the JSON's, bounded size.
TEST(HtmlCli, PlanPageHoldsTheChartsAndTheJsonFigures) {
  const fs::path d = temp_dir("plan");
  const TallyRun r = tally({"plan", "--json", "--html", (d / "plan.html").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const std::string p = slurp(d / "plan.html");
  EXPECT_LT(p.size(), 2'000'000u);
  for (const char* id : {"memory", "step", "layouts", "reasons-time", "reasons-memory", "reliability"})
    EXPECT_NE(p.find(std::string("<svg class=\"chart\" id=\"") + id + "\""), std::string::npos) << id;
  for (const char* label : {">params<", ">grads<", ">m<", ">v<", ">master<", ">activations<",
                            ">buffers<", ">usable<", ">capacity<", ">compute<", ">bubble<",
                            ">TP exposed<", ">DP/ZeRO exposed<", ">feasible frontier<",
                            ">chosen plan<", ">Daly<", "Young √(2·C·MTBF)"})
    EXPECT_NE(p.find(label), std::string::npos) << label;
  const auto& b = j["best"];
  EXPECT_EQ(cell_after(p, "total held"), sig4(b["per_gpu_gb"].get<double>()));
  EXPECT_EQ(cell_after(p, "params"), sig4(b["states_gb"]["params"].get<double>()));
  EXPECT_EQ(cell_after(p, "activations"), sig4(b["activations_gb"].get<double>()));
  EXPECT_EQ(cell_after(p, "step time"), sig4(b["step_seconds"].get<double>()));
  EXPECT_NE(p.find(b["layout"].get<std::string>()), std::string::npos);
  // The scatter: the search's count, and one SVG marker per drawn layout (plus the chosen plan
  // and the four legend swatches). The default search costs more layouts than the page keeps
  // (Note [plan points]), so it says it drew a sample.
  const auto evaluated = j["search"]["evaluated"].get<std::uint64_t>();
  EXPECT_NE(p.find("<p>" + std::to_string(evaluated) + " layouts costed in full"), std::string::npos);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(p, m, std::regex(R"(Every drawn layout \((\d+)\))")));
  const std::size_t drawn = std::stoul(m[1].str());
  EXPECT_LE(drawn, std::min<std::size_t>(evaluated, 3000));
  if (drawn < evaluated) {
    EXPECT_NE(p.find("a uniform sample of the costed layouts"), std::string::npos);
  }
  const auto a = p.find("<svg class=\"chart\" id=\"layouts\"");
  const std::string svg = p.substr(a, p.find("</svg>", a) - a);
  EXPECT_EQ(count(svg, "<circle cx=") + count(svg, "<rect x=") + count(svg, "<polygon points="),
            drawn + 1 + 4);
  EXPECT_EQ(count(p, "<tr><td"), count(p, "<tr>") - count(p, "<thead><tr>"));  // well-formed rows
  fs::remove_all(d);
}

// `tally compare --html`: the base and the seed's three alternatives, figures as in --json.
TEST(HtmlCli, ComparePageSideBySide) {
  const fs::path d = temp_dir("compare");
  const TallyRun r = tally({"compare", "--json", "--html", (d / "compare.html").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const std::string p = slurp(d / "compare.html");
  for (const char* id : {"memory", "step"})
    EXPECT_NE(p.find(std::string("<svg class=\"chart\" id=\"") + id + "\""), std::string::npos) << id;
  ASSERT_GE(j["options"].size(), 4u);
  for (const auto& o : j["options"]) {
    if (o["eval"].is_null()) continue;
    char want[64];
    std::snprintf(want, sizeof want, "%.4g", o["eval"]["per_gpu_gb"].get<double>());
    const std::string row = "<tr><td>" + o["name"].get<std::string>() + "</td>";
    const auto at = p.find(row);
    ASSERT_NE(at, std::string::npos) << row;
    const std::string tr = p.substr(at, p.find("</tr>", at) - at);
    EXPECT_NE(tr.find(std::string("<td class=\"n\">") + want + "</td>"), std::string::npos) << tr;
    EXPECT_NE(tr.find(">" + o["eval"]["wall"].get<std::string>() + "<"), std::string::npos) << tr;
  }
  fs::remove_all(d);
}

// Nothing fits (Llama 2 70B on one 80 GB GPU needs > 16 B × 69e9 of states): the page says so and
// lists the closest layouts; the fine-tuning plan has no page yet and says so, naming the flag.
TEST(HtmlCli, PlanPageWhenNothingFitsAndForFineTunes) {
  const fs::path d = temp_dir("edge");
  const TallyRun r = tally({"plan", "--model", "llama-2-70b", "--gpus", "1", "--html",
                            (d / "none.html").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string p = slurp(d / "none.html");
  EXPECT_NE(p.find("<strong>No layout fits.</strong>"), std::string::npos);
  EXPECT_NE(p.find("<caption>Closest layouts (GB = 1e9 B)</caption>"), std::string::npos);
  EXPECT_EQ(p.find("id=\"memory\""), std::string::npos);  // no chosen plan to draw
  // A fine-tune's page (issue 13): its memory and step bars, the numbers beside them those of
  // --json, the items summing to what the GPU holds; and a fine-tune that nothing fits.
  const TallyRun f = tally({"plan", "--method", "qlora", "--model", "llama-2-7b", "--json",
                            "--html", (d / "qlora.html").string()});
  ASSERT_EQ(f.rc, 0) << f.err;
  const auto j = nlohmann::json::parse(f.out);
  const std::string q = slurp(d / "qlora.html");
  for (const char* id : {"memory", "step"})
    EXPECT_NE(q.find(std::string("<svg class=\"chart\" id=\"") + id + "\""), std::string::npos);
  const auto& b = j["best"];
  EXPECT_EQ(cell_after(q, "total held"), sig4(b["per_gpu_gb"].get<double>()));
  EXPECT_EQ(cell_after(q, "activations"), sig4(b["activations_gb"].get<double>()));
  EXPECT_EQ(cell_after(q, "dequantization"), sig4(b["dequant_seconds"].get<double>()));
  EXPECT_EQ(cell_after(q, "step time"), sig4(b["step_seconds"].get<double>()));
  EXPECT_NE(q.find("<strong>" + std::to_string(j["max_seq"].get<long>()) + "</strong> tokens"),
            std::string::npos);
  const TallyRun none = tally({"plan", "--method", "lora", "--model", "llama-2-70b", "--gpus",
                               "1", "--gpu", "a100-40g", "--html", (d / "lora.html").string()});
  ASSERT_EQ(none.rc, 0) << none.err;
  const std::string l = slurp(d / "lora.html");
  EXPECT_NE(l.find("<strong>No configuration fits.</strong>"), std::string::npos);
  EXPECT_NE(l.find("No sequence fits"), std::string::npos);
  EXPECT_NE(l.find("closest: "), std::string::npos);
  fs::remove_all(d);
}

// Hand values: P = 8, target 10 %: 1F1B 7/(M+7) <= 0.1 → M >= 63 (DESIGN.md, the seed's M >= 63);
// interleaved v = 2: 7/(2M+7) <= 0.1 → M >= 31.5, the next multiple of P is 32.
// Reliability: M = 1/(1024 · 3e-6) h, C = 112 GB / 2 GB/s = 56 s, Young √(2CM).
TEST(HtmlCli, BubbleAndReliabilityPages) {
  const fs::path d = temp_dir("small");
  ASSERT_EQ(tally({"bubble", "--pp", "8", "--micro-batches", "16", "--html",
                   (d / "bubble.html").string()}).rc, 0);
  const std::string b = slurp(d / "bubble.html");
  EXPECT_NE(b.find("Smallest M with bubble ≤ 10.0 %: 63 (1F1B), 32 (interleaved, v = 2)"),
            std::string::npos);
  EXPECT_NE(b.find(">1F1B M ≥ 63<"), std::string::npos);
  EXPECT_NE(b.find(">target 10.0 %<"), std::string::npos);
  EXPECT_NE(b.find(">bubble fraction (% of wall-clock)<"), std::string::npos);
  // M = 16 row: 1F1B 7/23, interleaved 7/39
  EXPECT_NE(b.find("<td class=\"n\">16</td><td class=\"n\">30.43</td><td class=\"n\">17.95</td>"), std::string::npos);

  ASSERT_EQ(tally({"reliability", "--gpus", "1024", "--failure-rate", "3e-6", "--state-size",
                   "112GB", "--write-bandwidth", "2GB/s", "--html", (d / "rel.html").string()}).rc,
            0);
  const std::string r = slurp(d / "rel.html");
  const double mtbf = 1 / (1024 * 3e-6), c = 56.0 / 3600;
  char young[32];
  std::snprintf(young, sizeof young, "Young %.4g", std::sqrt(2 * c * mtbf));
  EXPECT_NE(r.find(young), std::string::npos) << young;
  EXPECT_NE(r.find(">checkpoint interval T (hours)<"), std::string::npos);
  EXPECT_NE(r.find(">lost fraction of wall-clock (%)<"), std::string::npos);
  // λ = 0: no curve, the reason in words
  ASSERT_EQ(tally({"reliability", "--gpus", "8", "--failure-rate", "0", "--state-size", "1GB",
                   "--html", (d / "none.html").string()}).rc,
            0);
  EXPECT_NE(slurp(d / "none.html").find("no failures expected"), std::string::npos);
  fs::remove_all(d);
}

// Loads each page from disk in headless chromium: the browser's DOM holds every chart (counted by
// the page's own script, so the browser parsed the SVG), no script error was recorded and the
// console stayed silent; then a screenshot of the plan page. With tally-engine built, the pages
// of `tally run zero --html` (all stages, 4 steps), `run tp` and `run 3d` from 2-rank runs too,
// and the zero page's screenshot.
TEST(HtmlBrowser, PagesRenderInChromium) {
  if (const std::string why = tally::chromium::why_no_browser(); !why.empty()) GTEST_SKIP() << why;
  const std::string bin = tally::chromium::find_chromium();
  const fs::path d = temp_dir("browser");
  const tally::chromium::Browser br{bin, d / "profile"};
  auto file = [&](const char* name) { return "file://" + (d / name).string(); };
  ASSERT_EQ(tally({"plan", "--html", (d / "plan.html").string()}).rc, 0);
  ASSERT_EQ(tally({"bubble", "--pp", "4", "--micro-batches", "8", "--html",
                   (d / "bubble.html").string()}).rc, 0);
  ASSERT_EQ(tally({"reliability", "--gpus", "1024", "--state-size", "112GB", "--html",
                   (d / "rel.html").string()}).rc, 0);
  ASSERT_EQ(tally({"compare", "--html", (d / "compare.html").string()}).rc, 0);
  struct Page {
    const char* file;
    int charts;
    std::vector<std::string> ids;
  };
  std::vector<Page> pages = {Page{"plan.html", 6, {"memory", "step", "layouts", "reasons-time",
                                                   "reasons-memory", "reliability"}},
                             Page{"bubble.html", 1, {"bubble"}}, Page{"rel.html", 1, {"reliability"}},
                             Page{"compare.html", 2, {"memory", "step"}}};
  // An engine page (cli/html_engine.hpp) from a real 2-rank run, when tally-engine was built.
  const bool engine = fs::exists(fs::path(TALLY_BIN).parent_path() / "tally-engine");
  if (engine) {
    const auto z = tally::subprocess::run_command(
        {TALLY_BIN, "launch", "--nproc", "2", "--timeout", "100", "--", TALLY_BIN, "run", "zero",
         "--widths", "6,33,19,5", "--batch", "8", "--steps", "4", "--timeout", "60", "--html",
         (d / "zero.html").string()},
        110);
    ASSERT_EQ(z.exit_code, 0) << z.out << z.err;
    pages.push_back(
        Page{"zero.html", 5, {"states", "memory-phases", "traffic", "phases", "loss"}});
    // run tp (TP and TP + SP) and run 3d (PP 2) at the tiny width of test_html_engine.cpp.
    const auto t = tally::subprocess::run_command(
        {TALLY_BIN, "launch", "--nproc", "2", "--timeout", "100", "--", TALLY_BIN, "run", "tp",
         "--compare-sp", "--hidden", "16", "--heads", "4", "--vocab", "32", "--seq", "8",
         "--steps", "3", "--timeout", "60", "--html", (d / "tp.html").string()},
        110);
    ASSERT_EQ(t.exit_code, 0) << t.out << t.err;
    pages.push_back(Page{"tp.html", 3, {"tp-bytes", "tp-activations", "tp-loss"}});
    const auto x = tally::subprocess::run_command(
        {TALLY_BIN, "launch", "--nproc", "2", "--timeout", "100", "--", TALLY_BIN, "run", "3d",
         "--pp", "2", "--hidden", "16", "--heads", "4", "--vocab", "32", "--seq", "8", "--layers",
         "2", "--steps", "2", "--timeout", "60", "--html", (d / "3d.html").string()},
        110);
    ASSERT_EQ(x.exit_code, 0) << x.out << x.err;
    pages.push_back(
        Page{"3d.html", 5, {"3d-memory", "3d-traffic", "3d-time", "3d-policies", "3d-loss"}});
  }
  for (const Page& pg : pages) {
    const auto r = br.run({"--dump-dom"}, file(pg.file));
    ASSERT_FALSE(r.killed_at_limit) << pg.file;
    ASSERT_EQ(r.exit_code, 0) << pg.file << ": " << r.err;
    EXPECT_NE(r.out.find("data-tally-charts=\"" + std::to_string(pg.charts) + "\""),
              std::string::npos) << pg.file << ": the page's script did not count its charts";
    EXPECT_EQ(r.out.find("data-tally-error=\""), std::string::npos) << pg.file;
    for (const auto& id : pg.ids)
      EXPECT_NE(r.out.find("<svg class=\"chart\" id=\"" + id + "\""), std::string::npos) << id;
    EXPECT_GT(count(r.out, "<text "), 10u) << pg.file;  // labels, ticks, legend
    EXPECT_EQ(r.err.find(":CONSOLE"), std::string::npos) << pg.file << ": " << r.err;
  }
  // The control: a page whose script fails is caught by both checks.
  std::ofstream(d / "broken.html") << html::page("broken", "<script>no_such_function();</script>");
  const auto bad = br.run({"--dump-dom"}, file("broken.html"));
  EXPECT_NE(bad.out.find("data-tally-error=\""), std::string::npos) << bad.out;
  EXPECT_NE(bad.err.find(":CONSOLE"), std::string::npos);

  const fs::path png = d / "plan.png";
  const auto s = br.run({"--screenshot=" + png.string(), "--window-size=900,2400",
                         "--hide-scrollbars"}, file("plan.html"));
  ASSERT_EQ(s.exit_code, 0) << s.err;
  const std::string img = slurp(png);
  ASSERT_GT(img.size(), 10'000u);  // a blank 900 × 2400 page compresses to a few KB
  EXPECT_EQ(img.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  if (engine) {  // and of the engine page (docs/zero-html.png is one)
    const auto e = br.run({"--screenshot=" + (d / "zero.png").string(), "--window-size=900,2400",
                           "--hide-scrollbars"}, file("zero.html"));
    ASSERT_EQ(e.exit_code, 0) << e.err;
    const std::string zimg = slurp(d / "zero.png");
    EXPECT_GT(zimg.size(), 10'000u);
    EXPECT_EQ(zimg.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  }
  fs::remove_all(d);
}

}  // namespace
}  // namespace test_html
