#pragma once
// The run report: one self-contained HTML file about a run (`dstrain report RUN_DIR`, and written
// by rank 0 at the end of every run as <out_dir>/report.html). Inline CSS and inline SVG charts
// (svg_chart.h), no script and nothing fetched, so it opens anywhere, offline.
//
// It shows the run's config (config.yaml, flattened to key = value), its world (ranks, ZeRO stage,
// batch), its final numbers (summary.json and the last value of each metric) and charts over steps
// of train and eval loss, learning rate, tokens/s and memory, drawn from metrics.jsonl. Secret
// values (core/secrets.h) are redacted from every text it shows.

#include <string>

#include "core/run_files.h"

namespace dstrain::metrics {

// What a report is made from. Only `metrics` is required: a run that was stopped before its end
// has no summary.json, and one from an older dstrain no config.yaml; the page says what is missing.
struct ReportSources {
  std::string metrics;   // metrics.jsonl (sinks.h)
  std::string summary;   // summary.json, or "" when there is none
  std::string config;    // the resolved config.yaml, or "" when there is none
  std::string restarts;  // restarts.json (restarts.h), or "" when the run was never restarted
};

// The metrics (`metrics_path` when the run set logging.metrics_path, else <run_dir>/metrics.jsonl),
// summary.json, config.yaml and restarts.json of a run (core/run_files.h). Error(kInput) naming
// what is missing when run_dir is not a directory or there are no metrics; the others are "" when
// absent.
ReportSources report_sources(const std::string& run_dir, const std::string& metrics_path = "");

// <out_dir>/report.html: where a run leaves its report.
using run_files::report_file;

// The page. A metrics.jsonl line that is not a JSON object with a numeric "step" is
// Error(kInput) naming the file and line; so is a summary.json or config.yaml that does not parse.
std::string render_report(const ReportSources& sources);

// render_report written atomically to `output` (parent directories created).
void write_report(const ReportSources& sources, const std::string& output);

}  // namespace dstrain::metrics
