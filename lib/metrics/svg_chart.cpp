#include "metrics/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace dstrain::metrics {
namespace {

// The drawing: a 640×320 canvas with the plot inside these margins (room for tick labels).
constexpr double kWidth = 640, kHeight = 320;
constexpr double kLeft = 72, kRight = 16, kTop = 12, kBottom = 48;
constexpr int kMaxXTicks = 8, kMaxYTicks = 6;

struct Scale {
  NiceAxis axis;
  double px0, px1;  // where axis.lo and axis.hi are drawn
  double operator()(double v) const {
    return px0 + (v - axis.lo) / (axis.hi - axis.lo) * (px1 - px0);
  }
};

// Shortest text that reads back as the tick's value ("0.3", "2500", "1e-05").
std::string tick_label(double v) {
  return fmt::format("{:g}", v);
}

std::string exact(double v) {
  return fmt::format("{:.17g}", v);
}

bool has_points(const Chart& chart) {
  for (const ChartSeries& s : chart.series) {
    if (!s.x.empty()) return true;
  }
  return false;
}

// [min, max] of the finite values of every series along one coordinate.
std::pair<double, double> extent(const Chart& chart, bool y) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const ChartSeries& s : chart.series) {
    for (double v : y ? s.y : s.x) {
      if (!std::isfinite(v)) continue;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  return {lo, hi};
}

std::string ticks_svg(const Scale& x, const Scale& y) {
  std::string out;
  for (double v : x.axis.ticks()) {
    const double px = x(v);
    out += fmt::format(
        R"(<g class="tick" data-axis="x"><line x1="{0:.2f}" y1="{1:.2f}" x2="{0:.2f}" y2="{2:.2f}"/>)"
        R"(<text x="{0:.2f}" y="{3:.2f}" text-anchor="middle">{4}</text></g>)",
        px, y.px0, y.px1, y.px0 + 16, tick_label(v));
    out += "\n";
  }
  for (double v : y.axis.ticks()) {
    const double py = y(v);
    out += fmt::format(
        R"(<g class="tick" data-axis="y"><line x1="{0:.2f}" y1="{1:.2f}" x2="{2:.2f}" y2="{1:.2f}"/>)"
        R"(<text x="{3:.2f}" y="{4:.2f}" text-anchor="end">{5}</text></g>)",
        x.px0, py, x.px1, x.px0 - 6, py + 4, tick_label(v));
    out += "\n";
  }
  return out;
}

std::string series_svg(const ChartSeries& s, const Scale& x, const Scale& y) {
  std::string points, dots;
  for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
    if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
    const double px = x(s.x[i]), py = y(s.y[i]);
    points += fmt::format("{}{:.2f},{:.2f}", points.empty() ? "" : " ", px, py);
    if (s.markers) {
      dots += fmt::format(R"(<circle cx="{:.2f}" cy="{:.2f}" r="3" fill="{}"/>)", px, py,
                          html_escape(s.color));
    }
  }
  return fmt::format(
      R"(<polyline class="series" data-key="{}" fill="none" stroke="{}" stroke-width="2" )"
      R"(stroke-linejoin="round" points="{}"/>{}{})",
      html_escape(s.key), html_escape(s.color), points, dots, "\n");
}

std::string legend_html(const Chart& chart) {
  std::string out = R"(<span class="legend">)";
  for (const ChartSeries& s : chart.series) {
    out += fmt::format(
        R"(<span class="key"><span class="swatch" style="background:{}"></span>{}</span>)",
        html_escape(s.color), html_escape(s.key));
  }
  return out + "</span>";
}

std::string plot_svg(const Chart& chart) {
  const auto [xlo, xhi] = extent(chart, false);
  const auto [ylo, yhi] = extent(chart, true);
  const Scale x{nice_axis(xlo, xhi, kMaxXTicks), kLeft, kWidth - kRight};
  const Scale y{nice_axis(ylo, yhi, kMaxYTicks), kHeight - kBottom, kTop};
  std::string out = fmt::format(
      R"(<g class="plot" data-x-domain="{} {}" data-x-range="{} {}" data-y-domain="{} {}" )"
      R"(data-y-range="{} {}">)"
      "\n",
      exact(x.axis.lo), exact(x.axis.hi), exact(x.px0), exact(x.px1), exact(y.axis.lo),
      exact(y.axis.hi), exact(y.px0), exact(y.px1));
  out += fmt::format(R"(<rect class="frame" x="{}" y="{}" width="{}" height="{}"/>)"
                     "\n",
                     kLeft, kTop, kWidth - kLeft - kRight, kHeight - kTop - kBottom);
  out += ticks_svg(x, y);
  for (const ChartSeries& s : chart.series) out += series_svg(s, x, y);
  for (double m : chart.marks) {
    if (!std::isfinite(m) || m < x.axis.lo || m > x.axis.hi) continue;
    out += fmt::format(R"(<line class="mark" data-x="{}" x1="{:.2f}" x2="{:.2f}" y1="{}" y2="{}" )"
                       R"(stroke="#d62728" stroke-dasharray="4 3"><title>{} at {}</title></line>)"
                       "\n",
                       exact(m), x(m), x(m), exact(y.px1), exact(y.px0),
                       html_escape(chart.mark_title), exact(m));
  }
  out += "</g>\n";
  out += fmt::format(R"(<text class="axis-label" x="{}" y="{}" text-anchor="middle">{}</text>)"
                     "\n",
                     (kLeft + kWidth - kRight) / 2, kHeight - 10, html_escape(chart.x_label));
  out += fmt::format(R"(<text class="axis-label" x="14" y="{0}" text-anchor="middle" )"
                     R"svg(transform="rotate(-90 14 {0})">{1}</text>)svg"
                     "\n",
                     (kTop + kHeight - kBottom) / 2, html_escape(chart.y_label));
  return out;
}

}  // namespace

std::vector<double> NiceAxis::ticks() const {
  std::vector<double> out;
  const auto n = static_cast<int64_t>(std::llround((hi - lo) / step));
  for (int64_t i = 0; i <= n; ++i) {
    // Snap to the step's grid so that labels read "0.3", not "0.30000000000000004".
    const double v = std::round((lo + static_cast<double>(i) * step) / step) * step;
    out.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  }
  return out;
}

NiceAxis nice_axis(double lo, double hi, int max_ticks) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {};
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) {
    const double pad = lo != 0 ? std::abs(lo) * 0.1 : 1.0;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(1, max_ticks - 1);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / magnitude;
  const double step = (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * magnitude;
  return {std::floor(lo / step) * step, std::ceil(hi / step) * step, step};
}

std::string render_chart(const Chart& chart) {
  std::string out =
      fmt::format(R"(<figure class="chart" id="{}"><figcaption>{} {}</figcaption>)"
                  "\n",
                  html_escape(chart.id), html_escape(chart.title), legend_html(chart));
  out += fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {0} {1}" width="{0}" height="{1}" )"
      R"(role="img" aria-label="{2}">)"
      "\n",
      kWidth, kHeight, html_escape(chart.title));
  if (has_points(chart)) {
    out += plot_svg(chart);
  } else {
    out += fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">no data</text>)", kWidth / 2,
                       kHeight / 2);
  }
  return out + "</svg></figure>\n";
}

std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace dstrain::metrics
