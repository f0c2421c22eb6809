#pragma once
// Every file a run keeps under its logging.out_dir, named in one place (as leveldb's filename.h
// names a database's files): the trainer, the launcher, the trackers, `dstrain report` and
// `dstrain trace` all ask here.
//
//   <out_dir>/metrics.jsonl          the metrics (metrics/sinks.h), unless logging.metrics_path
//   <out_dir>/summary.json           how the run ended (rank 0)
//   <out_dir>/config.yaml            the config as resolved, secret values redacted
//   <out_dir>/restarts.json          the launcher's restarts of the run (metrics/restarts.h)
//   <out_dir>/report.html            the run report (metrics/run_report.h)
//   <out_dir>/trace/rank-<K>.json    rank K's trace (logging.trace; metrics/trace_files.h)
//   <out_dir>/trace/trace.json       the ranks' traces merged
//   <out_dir>/profile/rank-<K>.json  rank K's profiled steps (logging.profile_steps)
//   <out_dir>/tb/                    TensorBoard's events, unless logging.tensorboard_dir
//   <out_dir>/mlflow_run_id          the MLflow run that a resumed run continues
//   <out_dir>/lora_adapter/          the trained LoRA adapter (PEFT's layout)
//   <out_dir>/data_cache/            tokenized datasets the ranks share

#include <string>

namespace dstrain::run_files {

// `metrics_path` when set, else <out_dir>/metrics.jsonl.
std::string metrics_file(const std::string& out_dir, const std::string& metrics_path);
std::string summary_file(const std::string& out_dir);
std::string config_file(const std::string& out_dir);
std::string restarts_file(const std::string& out_dir);
std::string report_file(const std::string& out_dir);
std::string trace_dir(const std::string& out_dir);
std::string rank_trace_file(const std::string& out_dir, int rank);
std::string merged_trace_file(const std::string& out_dir);
// K for a file name "rank-<K>.json" (at most 6 digits), else -1.
int rank_of_file(const std::string& file_name);
std::string profile_file(const std::string& out_dir, int rank);
// `tensorboard_dir` when set, else <out_dir>/tb.
std::string tensorboard_dir(const std::string& out_dir, const std::string& tensorboard_dir);
std::string mlflow_run_id_file(const std::string& out_dir);
std::string lora_adapter_dir(const std::string& out_dir);
std::string data_cache_dir(const std::string& out_dir);

}  // namespace dstrain::run_files
