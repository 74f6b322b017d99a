#include "html_report.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tally/core/types.hpp"

namespace tally::cli::html {

namespace {

// Geometry of every chart, pixels (Legend: W × H plot area inside the margins).
constexpr double kWidth = 760, kLeft = 78, kRight = 24, kTop = 40, kBottom = 56;
constexpr double kPlotW = kWidth - kLeft - kRight;
constexpr double kXYHeight = 380, kBarRowPx = 34;
constexpr double kCharPx = 6.6;  // average glyph width at the legend's 12 px, for layout only

// Palette: Okabe & Ito 2008's eight (distinguishable under the common colour-vision
// deficiencies) and two of Tol's muted (grey, wine) for the memory bar's ten items; dash patterns
// and marker shapes keep series apart in greyscale too, and every chart has its table.
constexpr const char* kColours[] = {"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9",
                                    "#D55E00", "#F0E442", "#000000", "#999999", "#882255"};
constexpr const char* kDashes[] = {"", "6 3", "2 2", "8 3 2 3"};
const char* colour(std::size_t i) { return kColours[i % std::size(kColours)]; }

std::string num(double v) { return fmt::format("{:.1f}", v); }

// Heckbert's nicenum: a 1, 2 or 5 × 10^k near x, rounded or the next above.
double nicenum(double x, bool round) {
  const double e = std::floor(std::log10(x));
  const double f = x / std::pow(10.0, e);
  double nf;
  if (round) nf = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
  else nf = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
  return nf * std::pow(10.0, e);
}

struct Scale {
  double lo, hi, px0, px1;  // value range → pixel range (px1 may be < px0: the y axis)
  bool log = false;         // place log10(v) between log10(lo) and log10(hi)
  double at(double v) const {
    if (log) return px0 + std::log10(v / lo) / std::log10(hi / lo) * (px1 - px0);
    return px0 + (v - lo) / (hi - lo) * (px1 - px0);
  }
};

double step_of(const std::vector<double>& t) { return t.size() > 1 ? t[1] - t[0] : 1.0; }

// A marker of shape i at (x, y), radius r: circle, square, triangle, diamond.
std::string marker(std::size_t i, double x, double y, double r, const std::string& fill,
                   const std::string& extra) {
  switch (i % 4) {
    case 0:
      return fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"{}\" fill=\"{}\"{}", num(x), num(y),
                         num(r), fill, extra);
    case 1:
      return fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"{}",
                         num(x - r), num(y - r), num(2 * r), num(2 * r), fill, extra);
    case 2:
      return fmt::format("<polygon points=\"{},{} {},{} {},{}\" fill=\"{}\"{}", num(x),
                         num(y - 1.2 * r), num(x - 1.1 * r), num(y + 0.8 * r), num(x + 1.1 * r),
                         num(y + 0.8 * r), fill, extra);
    default:
      return fmt::format("<polygon points=\"{},{} {},{} {},{} {},{}\" fill=\"{}\"{}", num(x),
                         num(y - 1.3 * r), num(x + 1.3 * r), num(y), num(x), num(y + 1.3 * r),
                         num(x - 1.3 * r), num(y), fill, extra);
  }
}

// One legend row across the top of the SVG, wrapping to a second row when needed.
struct LegendEntry {
  std::string label;
  std::string swatch;  // "bar", "line", "marker", "guide"
  std::size_t style = 0;
};
std::string legend(const std::vector<LegendEntry>& entries) {
  std::string s = "<g class=\"legend\">";
  double x = kLeft, y = 14;
  for (const auto& e : entries) {
    const double w = 22 + kCharPx * double(e.label.size()) + 14;
    if (x + w > kWidth - kRight && x > kLeft) {
      x = kLeft;
      y += 16;
    }
    const std::string c = e.swatch == "guide" ? "#444" : colour(e.style);
    if (e.swatch == "bar")
      s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"10\" fill=\"{}\"/>", num(x),
                       num(y - 9), c);
    else if (e.swatch == "marker")
      s += marker(e.style, x + 7, y - 4, 4, c, "/>");
    else
      s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" "
                       "stroke-width=\"2\" stroke-dasharray=\"{}\"/>",
                       num(x), num(y - 4), num(x + 16), num(y - 4), c,
                       e.swatch == "guide" ? "4 3" : kDashes[e.style % std::size(kDashes)]);
    s += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>", num(x + 20), num(y), escape(e.label));
    x += w;
  }
  return s + "</g>";
}

// Ticks, grid lines and the axis label of one axis.
std::string axis(const Scale& sc, const std::vector<double>& ticks, bool horizontal,
                 const std::string& label, double plot_top, double plot_bottom) {
  std::string s = "<g class=\"axis\">";
  const double step = step_of(ticks);
  for (double t : ticks) {
    const double p = sc.at(t);
    const std::string text = sc.log ? power_of_ten_label(int(std::lround(std::log10(t))))
                                    : tick_label(t, step);
    if (horizontal)
      s += fmt::format("<line class=\"grid\" x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>"
                       "<text x=\"{0}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>",
                       num(p), num(plot_top), num(plot_bottom + 5), num(plot_bottom + 18),
                       escape(text));
    else
      s += fmt::format("<line class=\"grid\" x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\"/>"
                       "<text x=\"{3}\" y=\"{4}\" text-anchor=\"end\">{5}</text>",
                       num(kLeft - 5), num(p), num(kWidth - kRight), num(kLeft - 8), num(p + 4),
                       escape(text));
  }
  if (horizontal)
    s += fmt::format("<text class=\"axis-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                     num(kLeft + kPlotW / 2), num(plot_bottom + 40), escape(label));
  else
    s += fmt::format("<text class=\"axis-label\" transform=\"translate(16,{}) rotate(-90)\" "
                     "text-anchor=\"middle\">{}</text>",
                     num((plot_top + plot_bottom) / 2), escape(label));
  return s + "</g>";
}

std::string guide_line(const Guide& g, const Scale& sc, double top, double bottom, std::size_t n) {
  const double p = sc.at(g.value);
  const std::string tip = "<title>" + escape(g.label + ": " + number(g.value)) + "</title>";
  if (g.vertical)
    return fmt::format("<g class=\"guide\"><line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>"
                       "<text x=\"{3}\" y=\"{4}\">{5}</text>{6}</g>",
                       num(p), num(top), num(bottom), num(p + 3), num(top + 12 + 13 * double(n)),
                       escape(g.label), tip);
  return fmt::format("<g class=\"guide\"><line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\"/>"
                     "<text x=\"{3}\" y=\"{4}\" text-anchor=\"end\">{5}</text>{6}</g>",
                     num(kLeft), num(p), num(kWidth - kRight), num(kWidth - kRight - 4),
                     num(p - 4), escape(g.label), tip);
}

std::string svg_open(const std::string& id, const std::string& title, double height) {
  return fmt::format("<svg class=\"chart\" id=\"{0}\" role=\"img\" aria-labelledby=\"{0}-t\" "
                     "viewBox=\"0 0 {1} {2}\" width=\"{1}\" height=\"{2}\"><title id=\"{0}-t\">{3}</title>",
                     escape(id), num(kWidth), num(height), escape(title));
}

std::string figure(const std::string& id, const std::string& title, const std::string& convention,
                   const std::string& svg) {
  return fmt::format("<figure id=\"{}-fig\"><figcaption><strong>{}</strong><br><span "
                     "class=\"convention\">convention: {}</span></figcaption>{}</figure>\n",
                     escape(id), escape(title), escape(convention), svg);
}

std::vector<double> ticks_with(double lo, double hi, const std::vector<Guide>& guides, bool vertical,
                               int n, bool log = false) {
  for (const Guide& g : guides)
    if (g.vertical == vertical && std::isfinite(g.value)) {
      lo = std::min(lo, g.value);
      hi = std::max(hi, g.value);
    }
  return log ? log_ticks(lo, hi) : nice_ticks(lo, hi, n);
}

// An axis' data range: its own lo and hi (on a log axis only when > 0) and every point's value.
struct Range {
  double lo = INFINITY, hi = -INFINITY;
  void add(double v, const Axis& a) {
    if (a.log && !(v > 0))
      throw InvalidInput("chart axis '" + a.label + "': log scale needs values > 0, got " +
                         format_number(v));
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
};
Range start_range(const Axis& a) {
  Range r;
  for (double v : {a.lo, a.hi})
    if (!a.log || v > 0) r.add(v, a);
  return r;
}

// "12.5", "-3", "+9.9 %", "4.7e+04": a figure, right-aligned in tables.
bool looks_numeric(const std::string& s) {
  if (s.empty()) return false;
  std::size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  return i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])) &&
         s.find_first_not_of("0123456789.e+- %", i) == std::string::npos;
}

}  // namespace

std::string escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  return out;
}

std::vector<double> nice_ticks(double lo, double hi, int max_ticks) {
  if (!std::isfinite(lo) || !std::isfinite(hi))
    throw InvalidInput("chart axis: range [" + format_number(lo) + ", " + format_number(hi) +
                       "] is not finite");
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) {
    const double half = lo == 0 ? 0.5 : std::abs(lo) * 0.5;
    lo -= half;
    hi += half;
  }
  max_ticks = std::max(max_ticks, 2);
  const double range = nicenum(hi - lo, false);
  const double step = nicenum(range / (max_ticks - 1), true);
  const double first = std::floor(lo / step) * step, last = std::ceil(hi / step) * step;
  std::vector<double> out;
  for (double k = 0;; ++k) {
    double v = first + k * step;
    if (std::abs(v) < step * 1e-9) v = 0;  // no "-0"
    out.push_back(v);
    if (v >= last - step * 1e-9) break;
  }
  return out;
}

std::string tick_label(double v, double step) {
  const int decimals = std::max(0, int(-std::floor(std::log10(step) + 1e-9)));
  return fmt::format("{:.{}f}", v, decimals);
}

std::string number(double v, int digits) { return fmt::format("{:.{}g}", v, digits); }

std::vector<double> log_ticks(double lo, double hi) {
  if (!(lo > 0) || !(hi > 0) || !std::isfinite(lo) || !std::isfinite(hi))
    throw InvalidInput("chart axis: log range [" + format_number(lo) + ", " + format_number(hi) +
                       "] needs finite values > 0");
  if (hi < lo) std::swap(lo, hi);
  const int first = int(std::floor(std::log10(lo) + 1e-9));
  const int last = std::max(first + 1, int(std::ceil(std::log10(hi) - 1e-9)));
  std::vector<double> out;
  for (int e = first; e <= last; ++e) out.push_back(std::pow(10.0, e));
  return out;
}

std::string power_of_ten_label(int e) {
  static constexpr const char* kSuperscript[] = {"⁰", "¹", "²", "³", "⁴", "⁵", "⁶", "⁷", "⁸", "⁹"};
  std::string s = "10";
  if (e < 0) s += "⁻";
  for (char d : std::to_string(std::abs(e))) s += kSuperscript[d - '0'];
  return s;
}

std::string bar_chart(const BarChart& c) {
  double lo = 0, hi = 0;
  for (const auto& row : c.values) {
    double pos = 0, neg = 0;
    for (double v : row) (v >= 0 ? pos : neg) += v;
    lo = std::min(lo, neg);
    hi = std::max(hi, pos);
  }
  const std::vector<double> ticks = ticks_with(lo, hi, c.guides, true, 7);
  const double label_w = 150;  // row names on the left of the bars
  const double plot_l = kLeft + label_w - 60;
  const double top = kTop + 8 * double(c.guides.size());
  const double bottom = top + kBarRowPx * double(c.rows.size()) + 8;
  const double height = bottom + kBottom;
  const Scale sx{ticks.front(), ticks.back(), plot_l, kWidth - kRight};
  std::string s = svg_open(c.id, c.title, height);
  std::vector<LegendEntry> le;
  for (std::size_t i = 0; i < c.segments.size(); ++i) le.push_back({c.segments[i], "bar", i});
  for (const auto& g : c.guides) le.push_back({g.label, "guide", 0});
  s += legend(le);
  // the value axis
  s += "<g class=\"axis\">";
  const double step = step_of(ticks);
  for (double t : ticks)
    s += fmt::format("<line class=\"grid\" x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>"
                     "<text x=\"{0}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>",
                     num(sx.at(t)), num(top), num(bottom + 5), num(bottom + 18),
                     escape(tick_label(t, step)));
  s += fmt::format("<text class=\"axis-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                   num((plot_l + kWidth - kRight) / 2), num(bottom + 40), escape(c.unit));
  s += "</g>";
  for (std::size_t r = 0; r < c.rows.size(); ++r) {
    const double y = top + 6 + kBarRowPx * double(r);
    s += fmt::format("<text class=\"row-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
                     num(plot_l - 6), num(y + 15), escape(c.rows[r]));
    double pos = 0, neg = 0;
    for (std::size_t i = 0; i < c.values[r].size(); ++i) {
      const double v = c.values[r][i];
      if (v == 0) continue;
      const double a = v >= 0 ? pos : neg + v, b = v >= 0 ? pos + v : neg;
      (v >= 0 ? pos : neg) += v;
      s += fmt::format("<rect class=\"seg\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"22\" "
                       "fill=\"{}\"><title>{}</title></rect>",
                       num(sx.at(a)), num(y), num(std::max(sx.at(b) - sx.at(a), 0.5)), colour(i),
                       escape(c.rows[r] + " — " + c.segments[i] + ": " + number(v)));
    }
  }
  s += fmt::format("<line class=\"zero\" x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>",
                   num(sx.at(0)), num(top), num(bottom));
  for (std::size_t i = 0; i < c.guides.size(); ++i)  // labels stacked: guides may coincide
    s += guide_line(c.guides[i], sx, top - 8 * double(c.guides.size()), bottom, i);
  s += "</svg>";
  return figure(c.id, c.title, c.convention, s);
}

std::string xy_chart(const XYChart& c) {
  Range xr = start_range(c.x), yr = start_range(c.y);
  for (const auto& se : c.series)
    for (const auto& p : se.points) {
      xr.add(p.x, c.x);
      yr.add(p.y, c.y);
    }
  if (xr.lo > xr.hi) xr = {c.x.log ? 1.0 : 0.0, c.x.log ? 10.0 : 1.0};  // nothing to draw
  if (yr.lo > yr.hi) yr = {c.y.log ? 1.0 : 0.0, c.y.log ? 10.0 : 1.0};
  const std::vector<double> xt = ticks_with(xr.lo, xr.hi, c.guides, true, 8, c.x.log);
  const std::vector<double> yt = ticks_with(yr.lo, yr.hi, c.guides, false, 6, c.y.log);
  const double top = kTop, bottom = kXYHeight - kBottom;
  const Scale sx{xt.front(), xt.back(), kLeft, kWidth - kRight, c.x.log};
  const Scale sy{yt.front(), yt.back(), bottom, top, c.y.log};
  std::string s = svg_open(c.id, c.title, kXYHeight);
  std::vector<LegendEntry> le;
  for (std::size_t i = 0; i < c.series.size(); ++i)
    le.push_back({c.series[i].label, c.series[i].markers ? "marker" : "line", i});
  for (const auto& g : c.guides) le.push_back({g.label, "guide", 0});
  s += legend(le);
  s += axis(sx, xt, true, c.x.label, top, bottom);
  s += axis(sy, yt, false, c.y.label, top, bottom);
  s += fmt::format("<rect class=\"frame\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>",
                   num(kLeft), num(top), num(kPlotW), num(bottom - top));
  std::size_t nv = 0;
  for (const auto& g : c.guides) s += guide_line(g, g.vertical ? sx : sy, top, bottom, g.vertical ? nv++ : 0);
  for (std::size_t i = 0; i < c.series.size(); ++i) {
    const XYSeries& se = c.series[i];
    s += fmt::format("<g class=\"series\" data-series=\"{}\">", escape(se.label));
    if (se.line && se.points.size() > 1) {
      s += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" "
                       "stroke-dasharray=\"{}\" points=\"",
                       colour(i), kDashes[i % std::size(kDashes)]);
      for (const auto& p : se.points) s += num(sx.at(p.x)) + "," + num(sy.at(p.y)) + " ";
      s += "\"/>";
    }
    if (se.markers)
      for (const auto& p : se.points)
        s += marker(i, sx.at(p.x), sy.at(p.y), se.marker_px, colour(i),
                    p.tip.empty() ? "/>" : "><title>" + escape(p.tip) + "</title></" +
                                               (i % 4 == 0 ? "circle>" : i % 4 == 1 ? "rect>"
                                                                                   : "polygon>"));
    s += "</g>";
  }
  s += "</svg>";
  return figure(c.id, c.title, c.convention, s);
}

std::string table(const std::string& caption, const std::vector<std::string>& header,
                  const std::vector<std::vector<std::string>>& rows) {
  std::string s = "<table><caption>" + escape(caption) + "</caption><thead><tr>";
  for (const auto& h : header) s += "<th scope=\"col\">" + escape(h) + "</th>";
  s += "</tr></thead><tbody>";
  for (const auto& r : rows) {
    s += "<tr>";
    for (const auto& cell : r)  // numbers right-aligned, words left
      s += (looks_numeric(cell) ? "<td class=\"n\">" : "<td>") + escape(cell) + "</td>";
    s += "</tr>";
  }
  return s + "</tbody></table>\n";
}

std::string head(const std::string& title, std::string_view extra_css) {
  return "<meta charset=\"utf-8\"><title>" + escape(title) +
         "</title>\n<script>window.addEventListener('error',function(e){document.documentElement."
         "setAttribute('data-tally-error',String(e.message||'error'));});</script>\n<style>\n"
         "body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:820px;color:#111}\n"
         "h1{font-size:20px}h2{font-size:17px;margin-top:28px}\n"
         "figure{margin:12px 0}figcaption{margin-bottom:4px}.convention{color:#444;font-size:12px}\n"
         "svg.chart{font:12px system-ui,sans-serif;max-width:100%;height:auto}\n"
         "svg .grid{stroke:#ddd}svg .frame{fill:none;stroke:#888}svg .zero{stroke:#333}\n"
         "svg .guide line{stroke:#444;stroke-width:1.5;stroke-dasharray:4 3}\n"
         "svg .axis-label{font-weight:600}\n"
         "table{border-collapse:collapse;font-size:12px;margin:6px 0 16px}\n"
         "caption{text-align:left;font-weight:600;padding:2px 0}\n"
         "th,td{border:1px solid #ccc;padding:2px 6px;text-align:left}th{background:#f3f3f3}\n"
         "td.n{text-align:right;font-variant-numeric:tabular-nums}caption{white-space:nowrap}\n" +
         std::string(extra_css) + "</style>";
}

std::string page(const std::string& title, const std::string& body) {
  return "<!DOCTYPE html>\n<html lang=\"en\"><head>" + head(title) + "</head>\n<body>\n" +
         body + "<script>" + kCountChartsScript + "</script>\n</body></html>\n";
}

void check_writable(const std::string& flag, const std::string& path) {
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  std::ofstream f(path, std::ios::binary | std::ios::app);
  if (!f) throw InvalidInput(flag + ": cannot write '" + path + "': " + std::strerror(errno));
  f.close();
  if (!existed) std::filesystem::remove(path, ec);
}

void write_file(const std::string& flag, const std::string& path, const std::string& content) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (f) f.write(content.data(), std::streamsize(content.size()));
  if (f) f.close();
  if (!f) throw InvalidInput(flag + ": cannot write '" + path + "': " + std::strerror(errno));
}

}  // namespace tally::cli::html
