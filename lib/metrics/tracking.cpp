#include "metrics/tracking.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <variant>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/run_files.h"
#include "core/secrets.h"
#include "metrics/mlflow_sink.h"
#include "metrics/restarts.h"
#include "metrics/tensorboard.h"

namespace dstrain::metrics {
namespace stdfs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string first_set(const std::string& a, const std::string& b) {
  return a.empty() ? b : a;
}

// Config values go to TensorBoard and MLflow as they are, except secret values (core/secrets.h).
tb::HParamValue redacted(const tb::HParamValue& value) {
  if (const auto* text = std::get_if<std::string>(&value)) return secrets::redact(*text);
  return value;
}

bool is_http_url(const std::string& uri) {
  return uri.rfind("http://", 0) == 0 || uri.rfind("https://", 0) == 0;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

void add_tensorboard(MetricsLogger& logger, const TrackingSetup& s) {
  TensorBoardOptions o;
  o.dir = run_files::tensorboard_dir(s.out_dir, s.tensorboard_dir);
  o.start_step = s.start_step;
  // The Text tab renders Markdown: a fenced block keeps the YAML's indentation.
  o.config_markdown = "```yaml\n" + secrets::redact(s.config_yaml) + "```\n";
  for (const auto& setting : s.settings)
    o.hparams.push_back({setting.key, redacted(setting.value)});
  o.hparams.push_back({"world_size", static_cast<double>(s.world_size)});
  logger.add_sink(std::make_unique<TensorBoardSink>(o));
}

// The tracking URI, or "" when MLflow is off.
std::string tracking_uri(const TrackingSetup& s) {
  if (!s.mlflow_tracking_uri.empty()) {
    if (!is_http_url(s.mlflow_tracking_uri)) {
      fail(ErrorKind::kConfig,
           "logging.mlflow.tracking_uri: expected the http:// or https:// URL of an MLflow "
           "tracking server, got '{}'",
           s.mlflow_tracking_uri);
    }
    return s.mlflow_tracking_uri;
  }
  const std::string uri = env("MLFLOW_TRACKING_URI");
  if (!uri.empty() && !is_http_url(uri)) {
    log::warn(
        "MLflow: MLFLOW_TRACKING_URI={} is not an http(s) tracking server; dstrain talks "
        "to MLflow through its REST API only, so MLflow tracking is off",
        uri);
    return "";
  }
  return uri;
}

void add_mlflow(MetricsLogger& logger, const TrackingSetup& s, const std::string& uri) {
  MlflowOptions o;
  o.connection.tracking_uri = uri;
  o.connection.token = env("MLFLOW_TRACKING_TOKEN");
  o.connection.username = env("MLFLOW_TRACKING_USERNAME");
  o.connection.password = env("MLFLOW_TRACKING_PASSWORD");
  o.experiment_name = first_set(s.mlflow_experiment, env("MLFLOW_EXPERIMENT_NAME"));
  if (o.experiment_name.empty()) o.experiment_id = env("MLFLOW_EXPERIMENT_ID");
  o.run_id_file = run_files::mlflow_run_id_file(s.out_dir);
  o.run_id = env("MLFLOW_RUN_ID");
  if (o.run_id.empty() && s.resumed && stdfs::exists(o.run_id_file)) {
    const std::string text = fs::read_file(o.run_id_file);
    o.run_id = text.substr(0, text.find_first_of(" \n\r\t"));
  }
  o.parent_run_id = first_set(s.mlflow_parent_run_id, env("MLFLOW_PARENT_RUN_ID"));
  o.run_name = stdfs::path(s.out_dir).filename().string();
  for (const auto& setting : s.settings)
    o.params.emplace_back(setting.key, secrets::redact(setting.text));
  o.tags = run_tags(s.world_size, s.zero_stage);
  // A run the launcher restarted stays one MLflow run (the run id file above); the tag says how
  // often it was restarted (summary.json and restarts.json say why).
  const auto restarts = read_restarts(restarts_file(s.out_dir));
  if (!restarts.empty()) o.tags.emplace_back("dstrain.restarts", std::to_string(restarts.size()));
  for (auto& tag : o.tags) tag.second = secrets::redact(tag.second);
  o.start_artifacts.push_back({"config.yaml", secrets::redact(s.config_yaml), ""});
  const std::string summary = run_files::summary_file(s.out_dir);
  o.end_artifacts.push_back({stdfs::path(summary).filename().string(), "", summary});
  logger.add_sink(std::make_unique<MlflowSink>(std::move(o)));
}

}  // namespace

std::vector<std::pair<std::string, std::string>> run_tags(int world_size, int zero_stage) {
  std::vector<std::pair<std::string, std::string>> tags = {
      {"dstrain.version", DSTRAIN_VERSION},
      {"dstrain.world_size", std::to_string(world_size)},
      {"dstrain.zero_stage", std::to_string(zero_stage)},
      {"dstrain.host", host_name()},
      {"mlflow.source.name", "dstrain"},
  };
  const std::string user = env("USER");
  if (!user.empty()) tags.emplace_back("mlflow.user", user);
  return tags;
}

void add_tracking_sinks(MetricsLogger& logger, const TrackingSetup& setup) {
  if (setup.tensorboard) add_tensorboard(logger, setup);
  const std::string uri = tracking_uri(setup);
  if (!uri.empty()) add_mlflow(logger, setup, uri);
}

}  // namespace dstrain::metrics
