// A tiny SVG chart writer for the `--html FILE` reports (issue 13): axes with ticks and units,
// stacked horizontal bars, scatter and line charts, each a <figure> with its title, convention
// label, legend and the numbers as a table under it — readable without colour and by a screen
// reader. The page is one self-contained file: inline SVG and CSS, no external scripts or fonts
// (Note [self-contained page]). Every string placed in the page goes through escape().
//
// Legend: a chart's plot area is W × H pixels inside the SVG's margins; a value v on an axis
// [lo, hi] sits at (v − lo) / (hi − lo) of the way along it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tally::cli::html {

// HTML/XML text and attribute escaping: & < > " ' (so one function serves both).
std::string escape(std::string_view s);

// Heckbert's "nice numbers" (Graphics Gems, 1990): ticks at a step of 1, 2 or 5 × 10^k covering
// [lo, hi] with about `max_ticks` of them; the first tick <= lo and the last >= hi. lo == hi is
// widened to a unit interval around it.
std::vector<double> nice_ticks(double lo, double hi, int max_ticks = 6);
// A tick's text with as many decimals as the step needs: 0.25 step → "0.25", 20 → "20".
std::string tick_label(double v, double step);

// A number for a table cell or label: `digits` significant digits (as %g).
std::string number(double v, int digits = 4);

// The powers of ten covering [lo, hi] (both > 0), at least two: [3e3, 2e5] → 1e3, 1e4, 1e5, 1e6.
std::vector<double> log_ticks(double lo, double hi);
// 10^e with a superscript exponent: 3 → "10³", -2 → "10⁻²".
std::string power_of_ten_label(int e);

struct Axis {
  std::string label;  // with its unit: "memory held per GPU (GB = 1e9 B)"
  double lo = 0, hi = 1;  // data range; the drawn range is the nice ticks around it
  // Logarithmic (base 10): ticks at the powers of ten around the data, labelled 10ⁿ; every value
  // on it must be > 0 (InvalidInput otherwise), and lo / hi <= 0 are ignored.
  bool log = false;
};

// A reference line across the plot: the usable-memory line, Young's optimum, the bubble target.
struct Guide {
  std::string label;
  double value = 0;
  bool vertical = true;  // vertical: at x = value; horizontal: at y = value
};

// Stacked horizontal bars, one row per category; each segment one legend entry. Positive values
// stack rightwards from 0, negative ones leftwards.
struct BarChart {
  std::string id, title, convention;
  std::string unit;                        // the value axis' label, with unit
  std::vector<std::string> segments;       // legend: one name per segment
  std::vector<std::string> rows;           // category names
  std::vector<std::vector<double>> values; // values[row][segment]
  std::vector<Guide> guides;               // vertical lines (value axis)
};
std::string bar_chart(const BarChart& c);

struct XYPoint {
  double x = 0, y = 0;
  std::string tip;  // hover text (an SVG <title>); empty: none
};
struct XYSeries {
  std::string label;
  std::vector<XYPoint> points;
  bool line = false;     // join the points (in the given order)
  bool markers = true;   // draw each point
  double marker_px = 3;  // marker radius
};
struct XYChart {
  std::string id, title, convention;
  Axis x, y;
  std::vector<XYSeries> series;
  std::vector<Guide> guides;
};
// The chart's <figure> without a table (pages add the table they need with table()).
std::string xy_chart(const XYChart& c);

// A <table> with a caption and a header row; every cell escaped.
std::string table(const std::string& caption, const std::vector<std::string>& header,
                  const std::vector<std::vector<std::string>>& rows);

// Note [self-contained page]
// The page holds everything it shows: CSS in a <style>, charts as inline <svg>, no URL to fetch.
// Two inline scripts only observe: one in <head> records any script error in the root element's
// data-tally-error attribute (the browser test's "no console errors"), one at the end counts the
// rendered charts into data-tally-charts (proof the browser parsed them). The page reads the same
// without them.
std::string page(const std::string& title, const std::string& body);

// A report's title and body, before page() wraps them: `tally serve` places the body into its own
// page (Note [one code path] in commands.hpp).
struct Page {
  std::string title, body;
};
inline std::string page(const Page& p) { return page(p.title, p.body); }

// What page() puts in <head>: the character set, the title, the error recorder and the
// stylesheet, with `extra_css` at its end (`tally serve`'s page adds its form's rules).
std::string head(const std::string& title, std::string_view extra_css = {});
// The script that counts the rendered charts into data-tally-charts.
inline constexpr const char* kCountChartsScript =
    "document.documentElement.setAttribute('data-tally-charts',String(document.querySelectorAll("
    "'svg.chart').length));";

// Writes `content` to `path`; a path that cannot be written throws InvalidInput naming the flag:
//   --html: cannot write 'dir/x.html': No such file or directory
void write_file(const std::string& flag, const std::string& path, const std::string& content);
// The same refusal before a long run (`tally run … --html`): opens `path` for appending, throwing
// what write_file would when it cannot, and removes the empty file it created.
void check_writable(const std::string& flag, const std::string& path);

}  // namespace tally::cli::html
