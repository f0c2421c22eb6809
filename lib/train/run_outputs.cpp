#include "train/run_outputs.h"

#include <filesystem>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/secrets.h"
#include "core/trace.h"
#include "metrics/restarts.h"
#include "metrics/run_report.h"
#include "metrics/trace_files.h"

namespace dstrain::train {
namespace stdfs = std::filesystem;

namespace {

// Runs `what`, turning any error into a warning that starts with `doing`.
template <typename F>
void warn_on_error(const char* doing, F&& what) {
  try {
    what();
  } catch (const std::exception& e) {
    log::warn("{} failed (the run itself is unaffected): {}", doing, e.what());
  }
}

void merge_rank_traces(const config::Config& cfg, int world_size) {
  std::vector<std::string> files;
  for (int r = 0; r < world_size; ++r) {
    files.push_back(metrics::rank_trace_file(cfg.logging.out_dir, r));
  }
  const metrics::MergeResult m =
      metrics::merge_traces(files, metrics::merged_trace_file(cfg.logging.out_dir));
  log::info("trace: {} ({} ranks, {} spans{}); open it in https://ui.perfetto.dev", m.path, m.ranks,
            m.events,
            m.dropped > 0 ? fmt::format(", {} dropped: buffers full", m.dropped) : std::string());
}

metrics::ReportSources report_sources(const config::Config& cfg) {
  const stdfs::path dir(cfg.logging.out_dir);
  metrics::ReportSources s;
  s.metrics = cfg.logging.metrics_path.empty() ? (dir / "metrics.jsonl").string()
                                               : cfg.logging.metrics_path;
  std::error_code ec;
  if (stdfs::is_regular_file(dir / "summary.json", ec)) s.summary = (dir / "summary.json").string();
  const std::string config = metrics::run_config_file(cfg.logging.out_dir);
  if (stdfs::is_regular_file(config, ec)) s.config = config;
  const std::string restarts = metrics::restarts_file(cfg.logging.out_dir);
  if (stdfs::is_regular_file(restarts, ec)) s.restarts = restarts;
  return s;
}

}  // namespace

void write_run_config(const config::Config& cfg) {
  const std::string path = metrics::run_config_file(cfg.logging.out_dir);
  warn_on_error("writing the resolved config", [&] {
    fs::create_dirs(cfg.logging.out_dir);
    fs::write_file_atomic(path, secrets::redact(config::to_yaml(cfg)));
  });
}

void save_rank_trace(const config::Config& cfg, int rank) {
  if (!cfg.logging.trace) return;
  trace::stop();
  warn_on_error("writing the trace", [&] {
    trace::write_rank_trace(metrics::rank_trace_file(cfg.logging.out_dir, rank), rank);
  });
}

void write_run_outputs(const config::Config& cfg, int world_size) {
  if (cfg.logging.trace)
    warn_on_error("merging the trace", [&] { merge_rank_traces(cfg, world_size); });
  warn_on_error("writing the run report", [&] {
    const std::string out = metrics::report_file(cfg.logging.out_dir);
    metrics::write_report(report_sources(cfg), out);
    log::info("report: {}", out);
  });
}

}  // namespace dstrain::train
