#pragma once
// What a run leaves in logging.out_dir besides its metrics and checkpoints: the resolved config
// (config.yaml, at the start), the trace files (logging.trace, metrics/trace_files.h) and the HTML
// report (metrics/run_report.h) at the end. None of them may fail a run that trained: each
// function logs a warning naming the file and the reason instead of throwing.

#include <string>
#include <vector>

#include "config/config.h"

namespace dstrain::train {

// Rank 0, at the start: <out_dir>/config.yaml, the config as resolved (config::to_yaml), secret
// values redacted (core/secrets.h), headed by `comments` (one "# " line each: what the run plan
// chose, run_plan.h); resume reads the checkpoint's own copy, never this one.
void write_run_config(const config::Config& cfg, const std::vector<std::string>& comments = {});

// Every rank, at the end (also after a failure): this process's trace to
// <out_dir>/trace/rank-<K>.json.
void save_rank_trace(const config::Config& cfg, int rank);

// Rank 0, after every rank has saved its trace: the merged trace (when logging.trace) and
// <out_dir>/report.html.
void write_run_outputs(const config::Config& cfg, int world_size);

}  // namespace dstrain::train
