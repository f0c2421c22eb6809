#pragma once
// Line charts as inline SVG for the run report (run_report.h): no script, no font or file from
// elsewhere, so the page renders the same offline, in a mail attachment or in a CI artifact.
//
// Each chart states its linear scale on its plot group, so that a reader (a test, a script) can map
// any drawn point back to data without trusting a second copy of the numbers:
//   <g class="plot" data-x-domain="X0 X1" data-x-range="PX0 PX1"
//                   data-y-domain="Y0 Y1" data-y-range="PY0 PY1">
// maps X0 → PX0 and X1 → PX1 (Y likewise; PY0 is the bottom edge). Each series is one
// <polyline class="series" data-key="KEY" points="px,py ..."> in data order, coordinates rounded
// to 0.01 px; each tick is a <g class="tick" data-axis="x|y"> holding a grid line at the tick's
// position and its label as drawn.

#include <string>
#include <vector>

namespace dstrain::metrics {

struct ChartSeries {
  std::string key;           // the metric, e.g. "train/loss"
  std::string color;         // CSS colour of the line, e.g. "#1f77b4"
  bool markers = false;      // also draw a dot at each point (for sparse series such as eval loss)
  std::vector<double> x, y;  // same length
};

struct Chart {
  std::string id;     // HTML id of the chart's <figure>
  std::string title;  // e.g. "Loss"
  std::string x_label = "step";
  std::string y_label;
  std::vector<ChartSeries> series;
  // x positions marked by a dashed vertical line across the plot (the steps where the run failed
  // and was restarted): <line class="mark" data-x="X" ...> with a <title>.
  std::vector<double> marks = {};
  std::string mark_title = "restart";
};

// A linear axis whose ends are multiples of `step` (1, 2 or 5 × 10^k) around [lo, hi], with at
// most about `max_ticks` ticks. An empty range [v, v] is widened around v.
struct NiceAxis {
  double lo = 0;
  double hi = 1;
  double step = 0.2;
  std::vector<double> ticks() const;
};
NiceAxis nice_axis(double lo, double hi, int max_ticks);

// The chart as an <svg> element. A chart without any point says "no data" instead of axes.
std::string render_chart(const Chart& chart);

// Text safe inside HTML/SVG element content and attribute values.
std::string html_escape(const std::string& text);

}  // namespace dstrain::metrics
