#include "train/run_outputs.h"

#include <filesystem>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/run_files.h"
#include "core/secrets.h"
#include "core/trace.h"
#include "metrics/restarts.h"
#include "metrics/run_report.h"
#include "metrics/trace_files.h"

namespace dstrain::train {

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
    files.push_back(run_files::rank_trace_file(cfg.logging.out_dir, r));
  }
  const metrics::MergeResult m =
      metrics::merge_traces(files, run_files::merged_trace_file(cfg.logging.out_dir));
  log::info("trace: {} ({} ranks, {} spans{}); open it in https://ui.perfetto.dev", m.path, m.ranks,
            m.events,
            m.dropped > 0 ? fmt::format(", {} dropped: buffers full", m.dropped) : std::string());
}

}  // namespace

void write_run_config(const config::Config& cfg, const std::vector<std::string>& comments) {
  const std::string path = run_files::config_file(cfg.logging.out_dir);
  std::string head;
  for (const std::string& line : comments) head += "# " + line + "\n";
  warn_on_error("writing the resolved config", [&] {
    fs::create_dirs(cfg.logging.out_dir);
    fs::write_file_atomic(path, secrets::redact(head + config::to_yaml(cfg)));
  });
}

void save_rank_trace(const config::Config& cfg, int rank) {
  if (!cfg.logging.trace) return;
  trace::stop();
  warn_on_error("writing the trace", [&] {
    trace::write_rank_trace(run_files::rank_trace_file(cfg.logging.out_dir, rank), rank);
  });
}

void write_run_outputs(const config::Config& cfg, int world_size) {
  if (cfg.logging.trace)
    warn_on_error("merging the trace", [&] { merge_rank_traces(cfg, world_size); });
  warn_on_error("writing the run report", [&] {
    const std::string out = run_files::report_file(cfg.logging.out_dir);
    metrics::write_report(metrics::report_sources(cfg.logging.out_dir, cfg.logging.metrics_path),
                          out);
    log::info("report: {}", out);
  });
}

}  // namespace dstrain::train
