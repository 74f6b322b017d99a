#include "html_pages.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>

#include "format.hpp"
#include "html_report.hpp"

namespace tally::cli {

namespace {

using html::escape;
using html::number;

struct Units {
  SizeUnit u;
  double per(double bytes) const { return to_unit(bytes, u); }
  std::string label() const {
    return u == SizeUnit::GB ? "GB = 1e9 B" : "GiB = 2^30 B";
  }
  std::string name() const { return std::string(to_string(u)); }
};

// The memory items of one layout, per GPU (Note [does it fit]), in the ledger's order.
struct MemoryItem {
  const char* name;
  double bytes;
};
std::vector<MemoryItem> memory_items(const PlanEval& e) {
  std::vector<MemoryItem> v = {{"params", e.states.params}, {"grads", e.states.grads},
                               {"m", e.states.m},           {"v", e.states.v},
                               {"master", e.states.master}};
  if (e.states.low_precision > 0) v.push_back({"low-precision copies", e.states.low_precision});
  v.push_back({"activations", e.activation_bytes});
  v.push_back({"buffers", e.buffer_bytes});
  v.push_back({"allocator", e.allocator_bytes});
  v.push_back({"CUDA runtime", e.runtime_bytes});
  return v;
}

// The step's parts on the critical path (Note [planner time model]).
std::vector<MemoryItem> time_items(const PlanEval& e, bool moe) {
  std::vector<MemoryItem> v = {{"compute", e.compute_s}, {"TP exposed", e.tp_s},
                               {"CP exposed", e.cp_s}};
  if (moe) v.push_back({"EP all-to-all exposed", e.ep_s});
  v.push_back({"PP exposed", e.pp_s});
  v.push_back({"DP/ZeRO exposed", e.dp_exposed_s});
  v.push_back({"bubble", e.bubble_s});
  return v;
}

std::string short_layout(const Layout& l) {
  std::string s = fmt::format("DP{}·TP{}{}·PP{}", l.dp, l.tp, l.sp ? "+SP" : "", l.pp);
  if (l.interleave > 1) s += fmt::format("(v{})", l.interleave);
  s += fmt::format("·CP{}", l.cp);
  if (l.ep > 1) s += fmt::format("·EP{}", l.ep);
  if (l.expert_tp() != l.tp) s += fmt::format("·ETP{}", l.expert_tp());
  s += fmt::format(" Z{} b{}", l.zero, l.micro_batch);
  if (l.recompute != Recompute::none) s += " " + std::string(to_string(l.recompute));
  return s;
}

// One bar per layout: the chosen plan and its alternatives, or compare's options.
struct BarRow {
  std::string name;
  const PlanEval* eval;
};

std::string memory_chart(const std::string& title, const std::string& convention,
                         const std::vector<BarRow>& bars, double usable_bytes,
                         double capacity_bytes, const Units& U) {
  html::BarChart c{.id = "memory", .title = title, .convention = convention + " | " + U.label(),
                   .unit = "memory per GPU (" + U.label() + ")"};
  for (const auto& it : memory_items(*bars.front().eval)) c.segments.push_back(it.name);
  for (const BarRow& b : bars) {
    c.rows.push_back(b.name);
    std::vector<double> row;
    for (const auto& it : memory_items(*b.eval)) row.push_back(U.per(it.bytes));
    c.values.push_back(row);
  }
  c.guides = {{.label = "usable", .value = U.per(usable_bytes)},
              {.label = "capacity", .value = U.per(capacity_bytes)}};
  return html::bar_chart(c);
}

std::string time_chart(const std::string& title, const std::string& convention,
                       const std::vector<BarRow>& bars, bool moe) {
  html::BarChart c{.id = "step", .title = title, .convention = convention,
                   .unit = "time per optimizer step (s)"};
  for (const auto& it : time_items(*bars.front().eval, moe)) c.segments.push_back(it.name);
  for (const BarRow& b : bars) {
    c.rows.push_back(b.name);
    std::vector<double> row;
    for (const auto& it : time_items(*b.eval, moe)) row.push_back(it.bytes);
    c.values.push_back(row);
  }
  c.guides = {{.label = "step time, " + bars.front().name, .value = bars.front().eval->step_s}};
  return html::bar_chart(c);
}

std::vector<BarRow> plan_rows(const PlanResult& r) {
  std::vector<BarRow> rows;
  for (std::size_t i = 0; i < std::min<std::size_t>(r.best.size(), 4); ++i)
    rows.push_back({i == 0 ? "chosen plan" : fmt::format("alternative {}", i + 1), &r.best[i]});
  return rows;
}

std::string memory_section(const PlanResult& r, const Units& U) {
  const PlanEval& b = r.best.front();
  std::vector<std::vector<std::string>> rows;
  for (const auto& it : memory_items(b)) rows.push_back({it.name, number(U.per(it.bytes))});
  rows.push_back({"total held", number(U.per(b.total_bytes))});
  rows.push_back({"usable", number(U.per(b.usable_bytes))});
  rows.push_back({"capacity", number(U.per(r.request.cluster.gpu.memory_bytes))});
  return "<h2>Memory per GPU</h2>\n" +
         memory_chart("Memory per GPU: " + b.layout.describe(), r.convention, plan_rows(r),
                      b.usable_bytes, r.request.cluster.gpu.memory_bytes, U) +
         html::table("Memory per GPU of the chosen plan (" + U.label() + ")",
                     {"item", U.name()}, rows);
}

std::string time_section(const PlanResult& r) {
  const PlanEval& b = r.best.front();
  const bool moe = r.request.model.is_moe();
  std::vector<std::vector<std::string>> rows;
  for (const auto& it : time_items(b, moe))
    rows.push_back({it.name, number(it.bytes), pct_str(it.bytes / b.step_s)});
  rows.push_back({"step time", number(b.step_s), "100.0 %"});
  rows.push_back(
      {"of compute: optimizer step", number(b.optimizer_s), pct_str(b.optimizer_s / b.step_s)});
  return "<h2>Step time</h2>\n" +
         time_chart("Step time: where the seconds go", r.convention, plan_rows(r), moe) +
         html::table("Step time of the chosen plan (s; the parts on the critical path)",
                     {"part", "seconds", "share of step"}, rows);
}

std::string point_tip(const PlanPoint& p, const Units& U) {
  return fmt::format("{} — step {} s, {} {} per GPU{}", p.layout.describe(), number(p.step_s),
                     number(U.per(p.total_bytes)), U.name(), p.fits ? "" : " (does not fit)");
}

std::string scatter_section(const PlanResult& r, const Units& U) {
  html::XYSeries misfit{.label = "does not fit", .marker_px = 2.2},
      fit{.label = "fits", .marker_px = 2.2},
      front{.label = "feasible frontier", .line = true, .marker_px = 3.2},
      chosen{.label = "chosen plan", .marker_px = 6};
  std::vector<const PlanPoint*> frontier;
  for (const PlanPoint& p : r.points) {
    const html::XYPoint xy{.x = U.per(p.total_bytes), .y = p.step_s, .tip = point_tip(p, U)};
    if (p.frontier) frontier.push_back(&p);
    else (p.fits ? fit : misfit).points.push_back(xy);
  }
  std::sort(frontier.begin(), frontier.end(),
            [](const PlanPoint* a, const PlanPoint* b) { return a->total_bytes < b->total_bytes; });
  for (const PlanPoint* p : frontier)
    front.points.push_back({.x = U.per(p->total_bytes), .y = p->step_s, .tip = point_tip(*p, U)});
  const PlanEval& b = r.best.front();
  chosen.points.push_back({.x = U.per(b.total_bytes), .y = b.step_s,
                           .tip = "chosen: " + b.layout.describe()});
  html::XYChart c{.id = "layouts", .title = "Every costed layout: step time against memory",
                  .convention = r.convention + " | " + U.label(),
                  .x = {.label = "memory held per GPU (" + U.label() + ")",
                        .lo = U.per(b.total_bytes), .hi = U.per(b.total_bytes)},
                  .y = {.label = "step time (s)", .lo = 0, .hi = b.step_s},
                  .series = {misfit, fit, front, chosen},
                  .guides = {{.label = "usable", .value = U.per(b.usable_bytes)}}};
  std::vector<std::vector<std::string>> rows;
  for (const PlanPoint* p : frontier)
    rows.push_back({p->layout.describe(), number(p->step_s), number(U.per(p->total_bytes))});
  std::vector<std::vector<std::string>> all;
  for (const PlanPoint& p : r.points)
    all.push_back({short_layout(p.layout), number(p.step_s), number(U.per(p.total_bytes)),
                   p.fits ? "yes" : "no", p.frontier ? "yes" : ""});
  const std::string note = fmt::format(
      "<p>{} layouts costed in full, {} skipped by exact bounds (never costed, so not drawn); "
      "{} drawn{}. Hover a point for its layout.</p>\n",
      r.evaluated, r.pruned, r.points.size(),
      !r.points_sampled ? ""
      : r.frontier_thinned
          ? " — a uniform sample of the costed layouts plus an even share of the feasible frontier "
            "(thinned: it outgrew the page's budget)"
          : " — a uniform sample of the costed layouts plus the whole feasible frontier");
  return "<h2>Layouts</h2>\n" + note + html::xy_chart(c) +
         html::table("The feasible frontier: no other fitting layout is both faster and smaller",
                     {"layout", "step (s)", "per GPU (" + U.name() + ")"}, rows) +
         "<details><summary>Every drawn layout (" + std::to_string(r.points.size()) +
         ")</summary>" +
         html::table("Drawn layouts in search order", {"layout", "step (s)", U.name(), "fits",
                                                       "frontier"},
                     all) +
         "</details>\n";
}

// What a reason's variant changed, in a few words: "TP 1→2", "ZeRO 3→2", "micro-batch 4→8".
std::string change_label(const Layout& a, const Layout& b) {
  std::vector<std::string> parts;
  auto diff = [&](const char* name, auto x, auto y) {
    if (x != y) parts.push_back(fmt::format("{} {}→{}", name, x, y));
  };
  diff("TP", a.tp, b.tp);
  diff("PP", a.pp, b.pp);
  diff("CP", a.cp, b.cp);
  diff("EP", a.ep, b.ep);
  diff("ETP", a.expert_tp(), b.expert_tp());
  if (a.sp != b.sp) parts.push_back(b.sp ? "SP on" : "SP off");
  diff("ZeRO", a.zero, b.zero);
  if (a.recompute != b.recompute)
    parts.push_back(fmt::format("recompute {}→{}", to_string(a.recompute), to_string(b.recompute)));
  diff("micro-batch", a.micro_batch, b.micro_batch);
  if (parts.empty()) diff("DP", a.dp, b.dp);
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "" : ", ") + p;
  return s;
}

std::string reasons_section(const PlanResult& r, const std::vector<Reason>& reasons,
                            const Units& U) {
  const PlanEval& b = r.best.front();
  html::BarChart dt{.id = "reasons-time", .title = "Reasons: step time when one dimension flips",
                    .convention = r.convention, .unit = "change in step time (%)",
                    .segments = {"Δ step time"}};
  html::BarChart dm{.id = "reasons-memory", .title = "Reasons: memory when one dimension flips",
                    .convention = r.convention + " | " + U.label(),
                    .unit = "change in memory held per GPU (" + U.label() + ")",
                    .segments = {"Δ memory"},
                    .guides = {{.label = "spare", .value = U.per(b.usable_bytes - b.total_bytes)}}};
  std::vector<std::vector<std::string>> rows;
  for (const Reason& x : reasons) {
    if (!x.eval) {
      rows.push_back({x.dimension, x.used ? "used" : "not used", "not possible: " + x.invalid_reason,
                      "", "", ""});
      continue;
    }
    const PlanEval& v = *x.eval;
    const std::string row = change_label(b.layout, v.layout) + (v.fits ? "" : " (no fit)");
    dt.rows.push_back(row);
    dt.values.push_back({100 * (v.step_s / b.step_s - 1)});
    dm.rows.push_back(row);
    dm.values.push_back({U.per(v.total_bytes - b.total_bytes)});
    rows.push_back({x.dimension, x.used ? "used" : "not used", x.variant,
                    fmt::format("{:+.1f} %", 100 * (v.step_s / b.step_s - 1)),
                    fmt::format("{:+.2f}", U.per(v.total_bytes - b.total_bytes)),
                    v.fits ? "yes" : "no"});
  }
  std::string s = "<h2>Reasons</h2>\n<p>Each dimension of the chosen plan flipped once and costed "
                  "with the same ledgers.</p>\n";
  if (!dt.rows.empty()) s += html::bar_chart(dt) + html::bar_chart(dm);
  return s + html::table("Reasons (each dimension flipped once)",
                         {"dimension", "in the plan", "instead", "Δ step", "Δ " + U.name(), "fits"},
                         rows);
}

// The lost fraction C/T + (T/2 + R)/M (core overhead_fraction) from Daly/8 to 4 × Daly.
std::string reliability_section(const ReliabilityReport& r) {
  std::string s = "<h2>Reliability</h2>\n";
  if (no_failures_expected(r))  // Note [zero failure rate]
    return s + "<p>" + escape(std::string(kNoFailuresExpected)) + " (" + escape(r.convention()) +
           ").</p>\n";
  const double C = r.save_seconds / 3600, R = r.setup.restart_hours, M = r.mtbf_hours;
  const double lo = r.daly_interval_hours / 8, hi = 4 * std::max(r.daly_interval_hours,
                                                                  r.young_interval_hours);
  html::XYSeries curve{.label = "lost fraction C/T + (T/2 + R)/MTBF", .line = true,
                       .markers = false};
  std::vector<std::vector<std::string>> rows;
  constexpr int kSamples = 64;
  for (int i = 0; i <= kSamples; ++i) {
    const double t = lo + (hi - lo) * i / kSamples;
    const double f = overhead_fraction(t, C, R, M);
    curve.points.push_back({.x = t, .y = 100 * f});
    if (i % 8 == 0) rows.push_back({number(t), fmt::format("{:.2f}", 100 * f)});
  }
  const double fy = overhead_fraction(r.young_interval_hours, C, R, M);
  const double fd = overhead_fraction(r.daly_interval_hours, C, R, M);
  html::XYSeries optima{.label = "optima", .marker_px = 5};
  optima.points = {{.x = r.young_interval_hours, .y = 100 * fy, .tip = "Young"},
                   {.x = r.daly_interval_hours, .y = 100 * fd, .tip = "Daly"}};
  rows.push_back({"Young " + number(r.young_interval_hours), fmt::format("{:.2f}", 100 * fy)});
  rows.push_back({"Daly " + number(r.daly_interval_hours), fmt::format("{:.2f}", 100 * fd)});
  html::XYChart c{.id = "reliability", .title = "Checkpoint interval: lost fraction of wall-clock",
                  .convention = r.convention(),
                  .x = {.label = "checkpoint interval T (hours)", .lo = 0, .hi = hi},
                  .y = {.label = "lost fraction of wall-clock (%)", .lo = 0, .hi = 0},
                  .series = {curve, optima},
                  .guides = {{.label = "Young √(2·C·MTBF)", .value = r.young_interval_hours},
                             {.label = "Daly", .value = r.daly_interval_hours}}};
  return s + fmt::format("<p>MTBF {} h; sharded checkpoint save C = {} s; restart R = {} min.</p>\n",
                         number(M), number(r.save_seconds), number(60 * R)) +
         html::xy_chart(c) +
         html::table("Lost fraction of wall-clock against the interval",
                     {"interval T (h)", "lost (%)"}, rows);
}

}  // namespace

html::Page plan_page(const PlanResult& r, const std::vector<Reason>& reasons,
                      const std::vector<Suggestion>& suggestions, double search_s, SizeUnit u) {
  const Units U{u};
  const auto& q = r.request;
  const std::string title = fmt::format("tally plan — {} on {} × {}, global batch {} × {} tokens",
                                        q.model.name, q.gpus, q.cluster.gpu.name,
                                        q.global_batch, q.seq);
  std::string body = "<h1>" + escape(title) + "</h1>\n<p class=\"convention\">convention: " +
                     escape(r.convention) + "</p>\n";
  if (!r.feasible()) {
    body += "<p class=\"plan\"><strong>No layout fits.</strong></p>\n";
    std::vector<std::vector<std::string>> rows;
    for (const auto& e : r.near_misses)
      rows.push_back({e.layout.describe(), number(U.per(e.total_bytes)),
                      number(U.per(e.usable_bytes))});
    body += html::table("Closest layouts (" + U.label() + ")",
                        {"layout", "needs", "usable"}, rows);
    std::vector<std::vector<std::string>> sug;
    for (const auto& s : suggestions)
      sug.push_back({s.change, s.fits ? "fits" : "does not fit", number(U.per(s.per_gpu_bytes)),
                     s.cost});
    if (!sug.empty())
      body += html::table("Smallest changes", {"change", "", "per GPU (" + U.name() + ")", "cost"},
                          sug);
    return {title, body + reliability_section(r.reliability)};
  }
  const PlanEval& b = r.best.front();
  body += "<p class=\"plan\"><strong>Plan:</strong> " + escape(b.layout.describe()) + "</p>\n";
  body += html::table(
      "Summary of the chosen plan", {"figure", "value"},
      {{"step time (s)", number(b.step_s)},
       {"tokens/s", number(b.tokens_per_s)},
       {"MFU", pct_str(b.mfu)},
       {"scaling efficiency E", number(b.efficiency, 3)},
       {"memory held per GPU (" + U.name() + ")", number(U.per(b.total_bytes))},
       {"usable per GPU (" + U.name() + ")", number(U.per(b.usable_bytes))},
       {"tightest wall", std::string(to_string(b.wall))},
       {"search", fmt::format("{} costed, {} pruned, {:.1f} ms", r.evaluated, r.pruned,
                              1e3 * search_s)}});
  body += memory_section(r, U) + time_section(r) + scatter_section(r, U) +
          reasons_section(r, reasons, U) + reliability_section(r.reliability);
  return {title, body};
}

html::Page bubble_page(const BubblePageInput& in) {
  const int P = in.stages, v = std::max(2, in.interleave);
  const int m1 = min_micro_batches_for_bubble(P, in.max_bubble, 1);
  const int mv = min_micro_batches_for_bubble(P, in.max_bubble, v);
  const int hi = std::max({2 * m1, in.given_micro_batches, 4 * P, 8});
  html::XYSeries one{.label = "1F1B (P−1)/(M+P−1)", .line = true, .marker_px = 2.5};
  html::XYSeries inter{.label = fmt::format("interleaved v={} (P−1)/(v·M+P−1)", v), .line = true,
                       .marker_px = 2.5};
  const int stride = std::max(1, hi / 96);  // ≤ ~100 points per series
  std::vector<std::vector<std::string>> rows;
  for (int M = 1; M <= hi; M += (M < 16 ? 1 : stride)) {
    const double f1 = bubble(PipelineSetup{.stages = P, .micro_batches = M}).bubble_fraction;
    one.points.push_back({.x = double(M), .y = 100 * f1, .tip = fmt::format("M={}: {:.2f} %", M, 100 * f1)});
    std::string fv;
    if (P > 1 && M % P == 0) {
      const double f = bubble(PipelineSetup{.stages = P, .micro_batches = M, .interleave = v})
                           .bubble_fraction;
      inter.points.push_back({.x = double(M), .y = 100 * f, .tip = fmt::format("M={}: {:.2f} %", M, 100 * f)});
      fv = fmt::format("{:.2f}", 100 * f);
    }
    rows.push_back({std::to_string(M), fmt::format("{:.2f}", 100 * f1), fv});
  }
  std::vector<html::XYSeries> series = {one};
  if (P > 1) series.push_back(inter);
  const std::string conv = bubble(PipelineSetup{.stages = P, .micro_batches = in.given_micro_batches})
                               .convention();
  html::XYChart c{.id = "bubble", .title = fmt::format("Pipeline bubble at P = {}", P),
                  .convention = conv, .x = {.label = "micro-batches per step M", .lo = 0, .hi = double(hi)},
                  .y = {.label = "bubble fraction (% of wall-clock)", .lo = 0, .hi = 0},
                  .series = series,
                  .guides = {{.label = fmt::format("target {:.1f} %", 100 * in.max_bubble),
                              .value = 100 * in.max_bubble, .vertical = false},
                             {.label = fmt::format("1F1B M ≥ {}", m1), .value = double(m1)}}};
  if (P > 1) c.guides.push_back({.label = fmt::format("v={} M ≥ {}", v, mv), .value = double(mv)});
  const std::string title = fmt::format("tally bubble — P = {}", P);
  std::string body = "<h1>" + escape(title) + "</h1>\n" +
                     fmt::format("<p>Smallest M with bubble ≤ {:.1f} %: {} (1F1B){}.</p>\n",
                                 100 * in.max_bubble, m1,
                                 P > 1 ? fmt::format(", {} (interleaved, v = {})", mv, v) : "");
  body += html::xy_chart(c) +
          html::table("Bubble fraction against micro-batches (% of wall-clock)",
                      {"M", "1F1B (%)", fmt::format("interleaved v={} (%)", v)}, rows);
  return {title, body};
}

html::Page compare_page(const std::vector<Comparison>& options, SizeUnit u) {
  const Units U{u};
  const std::string title = "tally compare — one change at a time, global batch held";
  std::vector<BarRow> bars;
  std::vector<std::vector<std::string>> rows;
  for (const Comparison& c : options) {
    if (!c.eval) {
      rows.push_back({c.name, c.change, "not a valid layout: " + c.invalid_reason, "", "", "", "",
                      "", ""});
      continue;
    }
    const PlanEval& e = *c.eval;
    bars.push_back({c.name + (e.fits ? "" : " (no fit)"), &e});
    rows.push_back({c.name, c.change, e.layout.describe(), number(U.per(e.total_bytes)),
                    e.fits ? "yes" : "no", number(e.step_s), pct_str(c.comm_share()),
                    pct_str(c.bubble_share()), std::string(to_string(e.wall))});
  }
  std::string body = "<h1>" + escape(title) + "</h1>\n";
  if (!options.empty()) {
    const PlanRequest& q = options.front().request;
    body += "<p class=\"convention\">convention: " +
            escape(fmt::format("{} | {} | memory held: allocated × {} + {} MiB runtime, usable {} "
                               "% of capacity | time: {} model | {}",
                               to_string(q.precision), to_string(q.optimizer),
                               number(1 + q.allocator_allowance), number(q.runtime_bytes / kMiB),
                               number(100 * (1 - q.headroom)), to_string(q.time_model),
                               U.label())) +
            "</p>\n";
    if (!bars.empty()) {
      const std::string conv = fmt::format("each option costed with the planner's ledgers ({} | {})",
                                           to_string(q.precision), to_string(q.optimizer));
      body += "<h2>Memory per GPU</h2>\n" +
              memory_chart("Memory per GPU of each option", conv, bars, bars.front().eval->usable_bytes,
                           q.cluster.gpu.memory_bytes, U) +
              "<h2>Step time</h2>\n" +
              time_chart("Step time of each option", conv, bars, q.model.is_moe());
    }
  }
  body += html::table("The options side by side (" + U.label() + ")",
                      {"option", "change", "layout", "per GPU (" + U.name() + ")", "fits",
                       "step (s)", "comm share", "bubble share", "tightest wall"},
                      rows);
  return {title, body};
}

html::Page reliability_page(const ReliabilityReport& r) {
  const std::string title = "tally reliability";
  return {title, "<h1>" + escape(title) + "</h1>\n<p class=\"convention\">convention: " +
                     escape(r.convention()) + "</p>\n" + reliability_section(r)};
}

html::Page finetune_page(const FineTunePlan& p, SizeUnit u) {
  const Units U{u};
  const PlanRequest& q = p.request;
  const std::string title =
      fmt::format("tally plan — {} fine-tune of {} on {} × {}", to_string(p.lora.method),
                  q.model.name, q.gpus, q.cluster.gpu.name);
  std::string body = "<h1>" + escape(title) + "</h1>\n<p class=\"convention\">convention: " +
                     escape(p.convention) + "</p>\n";
  body += p.max_seq > 0
              ? fmt::format("<p>Longest sequence that fits at micro-batch 1 with gradient "
                            "checkpointing: <strong>{}</strong> tokens.</p>\n", p.max_seq)
              : std::string("<p>No sequence fits: the static bytes alone overflow.</p>\n");
  const std::vector<FineTuneEval>& evals = p.feasible() ? p.best : p.near_misses;
  if (!p.feasible()) body += "<p><strong>No configuration fits.</strong> The closest:</p>\n";
  if (evals.empty()) return {title, body};
  // Memory per GPU (Note [does it fit]): the items sum to what the GPU holds.
  auto memory = [](const FineTuneEval& e) -> std::vector<std::pair<const char*, double>> {
    const FineTuneLedger& f = e.ledger;
    return {{"quantized weights", f.quantized_weight_bytes},
            {"quant constants", f.quant_constant_bytes},
            {"frozen", f.frozen_bytes},
            {"adapters + grads + optimizer", f.adapter_total_bytes()},
            {"dequantized layer", f.dequant_transient_bytes},
            {"activations", e.activation_bytes},
            {"allocator cache", e.fit.allocator_bytes},
            {"CUDA runtime", e.fit.runtime_bytes}};
  };
  auto time = [](const FineTuneEval& e) -> std::vector<std::pair<const char*, double>> {
    return {{"kernels", e.compute_s - e.dequant_s},
            {"dequantization", e.dequant_s},
            {"adapters' optimizer step", e.optimizer_s},
            {"adapters' all-reduce", e.allreduce_s}};
  };
  html::BarChart mem{.id = "memory", .title = "Memory per GPU", .convention = p.convention +
                     " | " + U.label(), .unit = "memory per GPU (" + U.label() + ")"};
  html::BarChart step{.id = "step", .title = "Step time: where the seconds go",
                      .convention = p.convention, .unit = "time per optimizer step (s)"};
  for (const auto& [name, v] : memory(evals.front())) mem.segments.push_back(name);
  for (const auto& [name, v] : time(evals.front())) step.segments.push_back(name);
  for (std::size_t i = 0; i < std::min<std::size_t>(evals.size(), 4); ++i) {
    const FineTuneEval& e = evals[i];
    const std::string row = (i == 0 ? (p.feasible() ? "chosen: " : "closest: ")
                                    : fmt::format("alternative {}: ", i + 1)) + e.describe();
    mem.rows.push_back(row);
    step.rows.push_back(row);
    std::vector<double> m, t;
    for (const auto& [name, v] : memory(e)) m.push_back(U.per(v));
    for (const auto& [name, v] : time(e)) t.push_back(v);
    mem.values.push_back(m);
    step.values.push_back(t);
  }
  const FineTuneEval& b = evals.front();
  mem.guides = {{.label = "usable", .value = U.per(b.fit.usable_bytes)},
                {.label = "capacity", .value = U.per(q.cluster.gpu.memory_bytes)}};
  step.guides = {{.label = "step time", .value = b.step_s}};
  std::vector<std::vector<std::string>> mrows, trows;
  for (const auto& [name, v] : memory(b)) mrows.push_back({name, number(U.per(v))});
  mrows.push_back({"total held", number(U.per(b.fit.total_bytes))});
  mrows.push_back({"usable", number(U.per(b.fit.usable_bytes))});
  for (const auto& [name, v] : time(b)) trows.push_back({name, number(v), pct_str(v / b.step_s)});
  trows.push_back({"step time", number(b.step_s), "100.0 %"});
  body += "<h2>Memory per GPU</h2>\n" + html::bar_chart(mem) +
          html::table("Memory per GPU of " + b.describe() + " (" + U.label() + ")",
                      {"item", U.name()}, mrows) +
          "<h2>Step time</h2>\n" + html::bar_chart(step) +
          html::table("Step time of " + b.describe() + " (s)", {"part", "seconds", "share of step"},
                      trows);
  return {title, body};
}

}  // namespace tally::cli
