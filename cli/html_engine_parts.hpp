// The pieces the engine's pages share (cli/html_engine.cpp: bench allreduce, run zero,
// memory-profile; cli/html_parallel.cpp: run tp, run 3d): byte figures as the JSON holds them,
// a bar chart of bytes scaled to one decimal unit, the page's heading and plain lists. Internal to
// those two files.
#pragma once

#include <fmt/core.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "html_report.hpp"

namespace tally::cli::engine_html {

inline double num(const nlohmann::json& v) { return v.get<double>(); }
inline std::string str(const nlohmann::json& v) { return v.get<std::string>(); }

// Whole bytes, as the JSON holds them: 15632 → "15632".
inline std::string bytes_cell(double b) { return fmt::format("{:.0f}", b); }
// A measured/predicted ratio as the tables print it: 1.0000.
inline std::string ratio_cell(double r) { return fmt::format("{:.4f}", r); }

// A decimal unit for a chart of byte figures up to `max_bytes` (tables stay in whole bytes).
struct ByteUnit {
  double bytes = 1;
  const char* label = "B";  // the unit as the axis names it
  std::string axis(const std::string& what) const { return what + " (" + label + ")"; }
};
inline ByteUnit byte_unit(double max_bytes) {
  if (max_bytes >= 1e9) return {1e9, "GB = 1e9 B"};
  if (max_bytes >= 1e6) return {1e6, "MB = 1e6 B"};
  if (max_bytes >= 1e3) return {1e3, "kB = 1e3 B"};
  return {};
}

// The longest stacked bar: the largest row sum of positive values.
inline double max_row_sum(const std::vector<std::vector<double>>& rows) {
  double m = 0;
  for (const auto& r : rows) {
    double sum = 0;
    for (double v : r) sum += std::max(v, 0.0);
    m = std::max(m, sum);
  }
  return m;
}

// A bar chart of byte figures (values in bytes), scaled to one ByteUnit for drawing; `what` names
// the value axis, which gets the unit.
inline std::string byte_bars(html::BarChart c, const std::string& what) {
  double top = max_row_sum(c.values);
  for (const auto& g : c.guides) top = std::max(top, g.value);
  const ByteUnit u = byte_unit(top);
  for (auto& row : c.values)
    for (double& v : row) v /= u.bytes;
  for (auto& g : c.guides) g.value /= u.bytes;
  c.unit = u.axis(what);
  return html::bar_chart(c);
}

inline std::string heading(const std::string& title, const std::string& convention) {
  return "<h1>" + html::escape(title) + "</h1>\n<p class=\"convention\">convention: " +
         html::escape(convention) + "</p>\n";
}

inline std::string list(const std::vector<std::string>& items) {
  std::string s = "<ul>";
  for (const auto& i : items) s += "<li>" + html::escape(i) + "</li>";
  return s + "</ul>\n";
}

}  // namespace tally::cli::engine_html
