#pragma once
// The experiment trackers of a run, set up in one place from the run's settings and the
// environment: TensorBoard (tensorboard.h) and MLflow (mlflow_sink.h). See docs/training.md,
// "Experiment tracking".
//
// MLflow is on when a tracking URI is given: logging.mlflow.tracking_uri, else MLFLOW_TRACKING_URI.
// The experiment: logging.mlflow_experiment, else MLFLOW_EXPERIMENT_NAME, else
// MLFLOW_EXPERIMENT_ID, else MLflow's default. The run: MLFLOW_RUN_ID continues that run; else a
// resumed run continues the one recorded in <out_dir>/mlflow_run_id; else a new one, nested under
// logging.mlflow.parent_run_id or MLFLOW_PARENT_RUN_ID when set. MLFLOW_TRACKING_TOKEN, or
// MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, authenticate. Secret values
// (core/secrets.h) are redacted from every param, tag, hparam and config text they record.

#include <cstdint>
#include <string>
#include <vector>

#include "metrics/sinks.h"
#include "metrics/tb_events.h"

namespace dstrain::metrics {

struct Setting {
  std::string key;        // "training.lr"
  std::string text;       // MLflow param value
  tb::HParamValue value;  // TensorBoard hparam value
};

struct TrackingSetup {
  std::string out_dir;
  bool tensorboard = true;
  std::string tensorboard_dir;  // "" = <out_dir>/tb
  std::string mlflow_tracking_uri;
  std::string mlflow_experiment;
  std::string mlflow_parent_run_id;
  std::string config_yaml;        // the resolved config
  std::vector<Setting> settings;  // the resolved config, flattened
  int world_size = 1;
  int zero_stage = 0;
  int64_t start_step = 0;  // the checkpoint's step when resuming
  bool resumed = false;
};

// Adds the trackers `setup` asks for to `logger`. Error(kConfig) naming logging.mlflow.tracking_uri
// when it is not an http(s) URL (one from MLFLOW_TRACKING_URI only warns and leaves MLflow off);
// Error(kIo) when the TensorBoard directory cannot be written. Never waits for the MLflow server.
void add_tracking_sinks(MetricsLogger& logger, const TrackingSetup& setup);

// Tags every MLflow run of dstrain gets: dstrain.version, dstrain.world_size, dstrain.zero_stage,
// dstrain.host, mlflow.source.name, mlflow.user.
std::vector<std::pair<std::string, std::string>> run_tags(int world_size, int zero_stage);

}  // namespace dstrain::metrics
