#pragma once
// MLflow's REST API (mlflow/protos/service.proto, mlflow/server/handlers.py), the calls dstrain
// needs, each one blocking request with a bounded time. Errors are thrown as Error(kComm) whose
// message names the endpoint and gives the server's own error (or curl's, when no answer came).
// Not thread-safe: the MLflow sink's worker thread owns its client.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "metrics/http.h"

namespace dstrain::metrics {

struct MlflowConnection {
  std::string tracking_uri;  // http(s)://host[:port][/prefix]
  std::string token;         // MLFLOW_TRACKING_TOKEN: "Authorization: Bearer"
  std::string username;      // MLFLOW_TRACKING_USERNAME / _PASSWORD: basic authentication
  std::string password;
  double timeout_s = 10;  // every request
};

struct MlflowMetric {
  std::string key;
  double value = 0;
  int64_t timestamp_ms = 0;
  int64_t step = 0;
};

using KeyValues = std::vector<std::pair<std::string, std::string>>;

struct MlflowRun {
  std::string run_id;
  std::string experiment_id;
  std::string artifact_uri;  // "mlflow-artifacts:/<exp>/<run>/artifacts" on a proxying server
  std::string status;
  std::map<std::string, std::string> params;
};

// The server's limits for runs/log-batch (mlflow/utils/validation.py).
struct BatchLimits {
  size_t metrics = 1000;
  size_t params = 100;
  size_t tags = 100;
  size_t entities = 1000;         // metrics + params + tags
  size_t request_bytes = 900000;  // the server refuses 1 MB; keep a margin for the JSON framing
};
constexpr size_t kMaxParamValueLength = 6000;
constexpr size_t kMaxTagValueLength = 8000;

struct LogBatch {
  std::vector<MlflowMetric> metrics;
  KeyValues params;
  KeyValues tags;
};

// `batch` cut into requests that each respect `limits`, in order (pure; unit tested).
std::vector<LogBatch> split_log_batch(const LogBatch& batch, const BatchLimits& limits = {});

class MlflowClient {
 public:
  explicit MlflowClient(MlflowConnection connection);

  // The experiment's id; creates it when it does not exist (and copes with a concurrent creator).
  std::string experiment_id(const std::string& name);
  MlflowRun create_run(const std::string& experiment_id, const std::string& run_name,
                       int64_t start_time_ms, const KeyValues& tags);
  MlflowRun get_run(const std::string& run_id);
  // One request: the caller respects the limits (split_log_batch).
  void log_batch(const std::string& run_id, const LogBatch& batch);
  // status: RUNNING | FINISHED | FAILED | KILLED; end_time_ms 0 = leave unset.
  void update_run(const std::string& run_id, const std::string& status, int64_t end_time_ms);
  // PUT through the server's artifact proxy (mlflow-artifacts API), for an `artifact_uri` that
  // is_proxied_artifact_uri() (mlflow_artifacts.h says where other artifact URIs go).
  void upload_artifact(const std::string& artifact_uri, const std::string& path,
                       const std::string& content);

  void set_timeout(double seconds) { connection_.timeout_s = seconds; }
  // Polled during every request; true aborts it (the request then fails).
  void set_cancel(std::function<bool()> cancelled) { cancelled_ = std::move(cancelled); }
  const std::string& tracking_uri() const { return connection_.tracking_uri; }

 private:
  // `path` below /api/2.0/mlflow/; JSON in, JSON text out. Throws on transport errors and non-2xx.
  std::string call(const std::string& method, const std::string& path, const std::string& body,
                   std::string* error_code = nullptr);
  HttpResponse send(const std::string& method, const std::string& url, const std::string& body,
                    const std::string& content_type);

  MlflowConnection connection_;
  std::function<bool()> cancelled_;
  HttpClient http_;
};

}  // namespace dstrain::metrics
