#include "metrics/run_report.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/secrets.h"
#include "metrics/restarts.h"
#include "metrics/svg_chart.h"

namespace dstrain::metrics {
namespace stdfs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

// Text as the page shows it: secret values (core/secrets.h) redacted, then escaped.
std::string shown(const std::string& text) {
  return html_escape(secrets::redact(text));
}

constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                    "#9467bd", "#8c564b", "#e377c2", "#17becf"};

// Every metric of metrics.jsonl as (step, value) in file order, and the order keys first appeared.
struct MetricLog {
  std::vector<std::string> keys;
  std::map<std::string, ChartSeries> series;  // x = step, y = value
  size_t records = 0;
};

bool exists_file(const stdfs::path& p) {
  std::error_code ec;
  return stdfs::is_regular_file(p, ec);
}

void add_point(MetricLog& log, const std::string& key, double step, double value) {
  auto it = log.series.find(key);
  if (it == log.series.end()) {
    log.keys.push_back(key);
    it = log.series.emplace(key, ChartSeries{key, "", false, {}, {}}).first;
  }
  it->second.x.push_back(step);
  it->second.y.push_back(value);
}

MetricLog read_metrics(const std::string& path) {
  std::istringstream in(fs::read_file(path));
  MetricLog log;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const ojson j = ojson::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number()) {
      fail(ErrorKind::kInput,
           "{}:{}: not a metrics record (expected a JSON object with a numeric \"step\")", path, n);
    }
    const double step = j["step"].get<double>();
    for (const auto& [key, value] : j.items()) {
      if (key == "step" || key == "time" || !value.is_number()) continue;  // null: not finite
      add_point(log, key, step, value.get<double>());
    }
    ++log.records;
  }
  return log;
}

ojson read_summary(const std::string& path) {
  if (path.empty()) return ojson::object();
  const ojson j = ojson::parse(fs::read_file(path), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    fail(ErrorKind::kInput, "{}: not a run summary (expected a JSON object)", path);
  }
  return j;
}

void flatten_yaml(const YAML::Node& node, const std::string& prefix,
                  std::vector<std::pair<std::string, std::string>>& out) {
  if (node.IsMap()) {
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      flatten_yaml(kv.second, prefix.empty() ? key : prefix + "." + key, out);
    }
  } else if (node.IsSequence()) {
    std::string text;
    for (const auto& item : node) {
      text += text.empty() ? "" : ", ";
      text += item.IsScalar() ? item.Scalar() : YAML::Dump(item);
    }
    out.emplace_back(prefix, "[" + text + "]");
  } else {
    out.emplace_back(prefix, node.IsScalar() ? node.Scalar() : "");
  }
}

std::vector<std::pair<std::string, std::string>> read_config(const std::string& path) {
  std::vector<std::pair<std::string, std::string>> settings;
  if (path.empty()) return settings;
  try {
    flatten_yaml(YAML::Load(fs::read_file(path)), "", settings);
  } catch (const YAML::Exception& e) {
    fail(ErrorKind::kInput, "{}:{}: not a YAML config: {}", path, e.mark.line + 1, e.msg);
  }
  return settings;
}

std::string number(double v) {
  if (std::abs(v) < 1e15 && v == std::floor(v)) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{:.6g}", v);
}

std::string json_text(const ojson& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number()) return number(v.get<double>());
  return v.dump();
}

std::string table(const std::vector<std::pair<std::string, std::string>>& rows,
                  const std::string& cls) {
  std::string out = fmt::format("<table class=\"{}\">\n", cls);
  for (const auto& [k, v] : rows) {
    out += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", shown(k), shown(v));
  }
  return out + "</table>\n";
}

std::string lookup(const std::vector<std::pair<std::string, std::string>>& settings,
                   const std::string& key) {
  for (const auto& [k, v] : settings) {
    if (k == key) return v;
  }
  return "";
}

std::vector<std::pair<std::string, std::string>> world_rows(
    const ojson& summary, const std::vector<std::pair<std::string, std::string>>& config) {
  std::vector<std::pair<std::string, std::string>> rows;
  if (summary.contains("world_size")) rows.emplace_back("ranks", json_text(summary["world_size"]));
  const std::pair<const char*, const char*> from_config[] = {
      {"ZeRO stage", "zero.stage"},
      {"micro-batch per rank", "training.per_device_train_batch_size"},
      {"gradient accumulation steps", "training.gradient_accumulation_steps"},
      {"sequence length", "data.max_length"},
      {"bf16", "training.bf16"},
      {"model", "model.name_or_path"}};
  for (const auto& [label, key] : from_config) {
    const std::string v = lookup(config, key);
    if (!v.empty()) rows.emplace_back(label, v);
  }
  return rows;
}

std::vector<std::pair<std::string, std::string>> summary_rows(const ojson& summary) {
  std::vector<std::pair<std::string, std::string>> rows;
  for (const auto& [key, value] : summary.items()) rows.emplace_back(key, json_text(value));
  return rows;
}

// The last value of every metric, with the step it was logged at.
std::vector<std::pair<std::string, std::string>> last_rows(const MetricLog& log) {
  std::vector<std::pair<std::string, std::string>> rows;
  for (const std::string& key : log.keys) {
    const ChartSeries& s = log.series.at(key);
    rows.emplace_back(key, fmt::format("{} (step {})", number(s.y.back()), number(s.x.back())));
  }
  return rows;
}

// The chart of the metrics named in `keys` (those present in the log), one colour each.
Chart chart_of(const MetricLog& log, std::string id, std::string title, std::string y_label,
               const std::vector<std::string>& keys) {
  Chart chart{std::move(id), std::move(title), "step", std::move(y_label), {}};
  for (const std::string& key : keys) {
    const auto it = log.series.find(key);
    if (it == log.series.end()) continue;
    ChartSeries s = it->second;
    s.color = kPalette[chart.series.size() % std::size(kPalette)];
    s.markers = key.rfind("eval/", 0) == 0;  // a few points: dots show where evals ran
    chart.series.push_back(std::move(s));
  }
  return chart;
}

// Every chart marks the steps where the run failed and was restarted.
std::vector<Chart> charts(const MetricLog& log, const std::vector<RestartRecord>& restarts) {
  std::vector<std::string> memory;
  for (const std::string& key : log.keys) {
    if (key.rfind("memory/", 0) == 0) memory.push_back(key);
  }
  std::vector<Chart> out = {
      chart_of(log, "chart-loss", "Loss", "loss", {"train/loss", "eval/loss"}),
      chart_of(log, "chart-lr", "Learning rate", "lr", {"lr"}),
      chart_of(log, "chart-throughput", "Throughput", "tokens/s", {"tokens_per_s"}),
      chart_of(log, "chart-memory", "Memory", "MB", memory)};
  for (Chart& c : out) {
    for (const RestartRecord& r : restarts)
      if (r.step >= 0) c.marks.push_back(static_cast<double>(r.step));
  }
  return out;
}

std::string restarts_table(const std::vector<RestartRecord>& restarts) {
  std::string out =
      "<table class=\"restarts\">\n<tr><th>attempt</th><th>time</th><th>rank</th><th>host</th>"
      "<th>cause</th><th>step</th><th>resumed from</th><th>counted</th></tr>\n";
  for (const RestartRecord& r : restarts) {
    out += fmt::format(
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td></tr>\n",
        r.attempt, html_escape(r.time), r.rank >= 0 ? std::to_string(r.rank) : "-",
        html_escape(r.host), html_escape(r.cause), r.step >= 0 ? std::to_string(r.step) : "-",
        r.resumed_from.empty() ? "the start" : html_escape(r.resumed_from),
        r.counted ? "yes" : "no");
  }
  return out + "</table>\n";
}

constexpr const char* kStyle = R"(
body { font: 14px/1.4 "DejaVu Sans", Helvetica, Arial, sans-serif; margin: 24px; color: #222;
       background: #fff; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; font-weight: normal; }
td { font-family: "DejaVu Sans Mono", monospace; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
figure.chart { margin: 0; border: 1px solid #ddd; padding: 8px; }
figcaption { font-weight: bold; margin-bottom: 4px; }
.legend { font-weight: normal; margin-left: 12px; }
.key { margin-right: 12px; white-space: nowrap; }
.swatch { display: inline-block; width: 14px; height: 3px; margin: 0 4px 3px 0; }
svg text { font-size: 11px; fill: #444; }
svg .tick line { stroke: #e6e6e6; }
svg rect.frame { fill: none; stroke: #999; }
.note { color: #a00; }
)";

std::string missing_note(const std::string& what) {
  return fmt::format("<p class=\"note\">{}</p>\n", shown(what));
}

}  // namespace

ReportSources report_sources(const std::string& run_dir, const std::string& metrics_path) {
  std::error_code ec;
  if (!stdfs::is_directory(run_dir, ec)) {
    fail(ErrorKind::kInput, "{}: not a run directory (expected the logging.out_dir of a run)",
         run_dir);
  }
  ReportSources s;
  s.metrics = run_files::metrics_file(run_dir, metrics_path);
  if (!exists_file(s.metrics)) {
    fail(ErrorKind::kInput, "{}: no such file; a run writes it to its logging.out_dir", s.metrics);
  }
  for (auto [path, file] : {std::pair{&s.summary, run_files::summary_file(run_dir)},
                            {&s.config, run_files::config_file(run_dir)},
                            {&s.restarts, run_files::restarts_file(run_dir)}}) {
    if (exists_file(file)) *path = file;
  }
  return s;
}

std::string render_report(const ReportSources& sources) {
  const MetricLog log = read_metrics(sources.metrics);
  const ojson summary = read_summary(sources.summary);
  const auto config = read_config(sources.config);
  const std::string run = stdfs::path(sources.metrics).parent_path().filename().string();
  std::string html = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n";
  html += fmt::format("<title>dstrain run {}</title>\n<style>{}</style></head><body>\n", shown(run),
                      kStyle);
  html += fmt::format("<h1>dstrain run <code>{}</code></h1>\n", shown(run));
  html += fmt::format("<p>{} metric records from <code>{}</code>.</p>\n", log.records,
                      shown(sources.metrics));
  html += "<h2>World</h2>\n";
  html += table(world_rows(summary, config), "world");
  html += "<h2>Final numbers</h2>\n";
  if (sources.summary.empty()) html += missing_note("No summary.json: the run did not finish.");
  html += table(summary_rows(summary), "final");
  const std::vector<RestartRecord> restarts =
      sources.restarts.empty() ? std::vector<RestartRecord>{} : read_restarts(sources.restarts);
  if (!restarts.empty()) {
    html += fmt::format(
        "<h2>Restarts</h2>\n<p>The launcher restarted the run {} time(s) "
        "(dashed lines on the charts).</p>\n",
        restarts.size());
    html += restarts_table(restarts);
  }
  html += "<h2>Charts</h2>\n<div class=\"charts\">\n";
  for (const Chart& c : charts(log, restarts)) html += render_chart(c);
  html += "</div>\n<h2>Last logged values</h2>\n";
  html += table(last_rows(log), "last");
  html += "<h2>Config</h2>\n";
  if (sources.config.empty()) html += missing_note("No config.yaml in the run directory.");
  html += table(config, "config");
  return html + "</body></html>\n";
}

void write_report(const ReportSources& sources, const std::string& output) {
  const std::string html = render_report(sources);
  const stdfs::path out(output);
  if (out.has_parent_path()) fs::create_dirs(out.parent_path());
  fs::write_file_atomic(out, html);
}

}  // namespace dstrain::metrics
