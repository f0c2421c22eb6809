#include "metrics/mlflow_client.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dstrain::metrics {
namespace {

using json = nlohmann::json;

constexpr const char* kApi = "/api/2.0/mlflow/";
constexpr const char* kArtifactsApi = "/api/2.0/mlflow-artifacts/artifacts/";
constexpr const char* kArtifactScheme = "mlflow-artifacts:";

// Bytes one entry adds to a log-batch request body, roughly (JSON punctuation included).
size_t entry_bytes(const std::string& key, size_t value_bytes) {
  return key.size() + value_bytes + 64;
}

MlflowRun parse_run(const json& j) {
  const json& info = j.at("run").at("info");
  MlflowRun run;
  run.run_id = info.value("run_id", info.value("run_uuid", ""));
  run.experiment_id = info.value("experiment_id", "");
  run.artifact_uri = info.value("artifact_uri", "");
  run.status = info.value("status", "");
  const json& data = j.at("run").value("data", json::object());
  for (const auto& p : data.value("params", json::array())) {
    run.params[p.value("key", "")] = p.value("value", "");
  }
  return run;
}

json key_values(const KeyValues& kv) {
  json a = json::array();
  for (const auto& [k, v] : kv) a.push_back({{"key", k}, {"value", v}});
  return a;
}

}  // namespace

std::vector<LogBatch> split_log_batch(const LogBatch& batch, const BatchLimits& limits) {
  std::vector<LogBatch> out;
  LogBatch cur;
  size_t bytes = 0;
  auto room = [&](size_t add_bytes) {
    const size_t n = cur.metrics.size() + cur.params.size() + cur.tags.size();
    return n < limits.entities && bytes + add_bytes <= limits.request_bytes;
  };
  auto flush = [&] {
    out.push_back(std::move(cur));
    cur = LogBatch();
    bytes = 0;
  };
  for (const auto& m : batch.metrics) {
    const size_t b = entry_bytes(m.key, 64);
    if (cur.metrics.size() >= limits.metrics || !room(b)) flush();
    cur.metrics.push_back(m);
    bytes += b;
  }
  for (const auto& p : batch.params) {
    const size_t b = entry_bytes(p.first, p.second.size());
    if (cur.params.size() >= limits.params || !room(b)) flush();
    cur.params.push_back(p);
    bytes += b;
  }
  for (const auto& t : batch.tags) {
    const size_t b = entry_bytes(t.first, t.second.size());
    if (cur.tags.size() >= limits.tags || !room(b)) flush();
    cur.tags.push_back(t);
    bytes += b;
  }
  if (!cur.metrics.empty() || !cur.params.empty() || !cur.tags.empty()) flush();
  return out;
}

MlflowClient::MlflowClient(MlflowConnection connection) : connection_(std::move(connection)) {
  while (!connection_.tracking_uri.empty() && connection_.tracking_uri.back() == '/') {
    connection_.tracking_uri.pop_back();
  }
}

HttpResponse MlflowClient::send(const std::string& method, const std::string& url,
                                const std::string& body, const std::string& content_type) {
  HttpRequest r;
  r.method = method;
  r.url = url;
  r.body = body;
  r.timeout_s = connection_.timeout_s;
  r.connect_timeout_s = std::min(5.0, connection_.timeout_s);
  r.cancelled = cancelled_;
  if (!content_type.empty()) r.headers.push_back("Content-Type: " + content_type);
  if (!connection_.token.empty()) r.headers.push_back("Authorization: Bearer " + connection_.token);
  if (!connection_.username.empty()) r.userpwd = connection_.username + ":" + connection_.password;
  return http_.send(r);
}

std::string MlflowClient::call(const std::string& method, const std::string& path,
                               const std::string& body, std::string* error_code) {
  const std::string url = connection_.tracking_uri + kApi + path;
  const HttpResponse r = send(method, url, body, method == "GET" ? "" : "application/json");
  if (!r.error.empty()) fail(ErrorKind::kComm, "{} {}: {}", method, url, r.error);
  if (r.ok()) return r.body;
  const json e = json::parse(r.body, nullptr, false);
  const std::string code = e.is_object() ? e.value("error_code", "") : "";
  if (error_code != nullptr && !code.empty()) {
    *error_code = code;
    return "";
  }
  const std::string message = e.is_object()
                                  ? e.value("message", r.body)
                                  : r.body.substr(0, std::min<size_t>(300, r.body.size()));
  fail(ErrorKind::kComm, "{} {}: HTTP {}{}: {}", method, url, r.status,
       code.empty() ? "" : " " + code, message);
}

std::string MlflowClient::experiment_id(const std::string& name) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::string code;
    const std::string got =
        call("GET", "experiments/get-by-name?experiment_name=" + url_escape(name), "", &code);
    if (code.empty()) return json::parse(got).at("experiment").at("experiment_id");
    if (code != "RESOURCE_DOES_NOT_EXIST") {
      fail(ErrorKind::kComm, "experiment '{}': {}", name, code);
    }
    const std::string created =
        call("POST", "experiments/create", json{{"name", name}}.dump(), &code);
    if (!created.empty()) return json::parse(created).at("experiment_id");
    // RESOURCE_ALREADY_EXISTS: another process created it meanwhile; look it up again.
    if (code != "RESOURCE_ALREADY_EXISTS") {
      fail(ErrorKind::kComm, "cannot create experiment '{}': {}", name, code);
    }
  }
  fail(ErrorKind::kComm, "experiment '{}' neither found nor created", name);
}

MlflowRun MlflowClient::create_run(const std::string& experiment_id, const std::string& run_name,
                                   int64_t start_time_ms, const KeyValues& tags) {
  json body = {
      {"experiment_id", experiment_id}, {"start_time", start_time_ms}, {"tags", key_values(tags)}};
  if (!run_name.empty()) body["run_name"] = run_name;
  return parse_run(json::parse(call("POST", "runs/create", body.dump())));
}

MlflowRun MlflowClient::get_run(const std::string& run_id) {
  return parse_run(json::parse(call("GET", "runs/get?run_id=" + url_escape(run_id), "")));
}

void MlflowClient::log_batch(const std::string& run_id, const LogBatch& batch) {
  json metrics = json::array();
  for (const auto& m : batch.metrics) {
    metrics.push_back(
        {{"key", m.key}, {"value", m.value}, {"timestamp", m.timestamp_ms}, {"step", m.step}});
  }
  const json body = {{"run_id", run_id},
                     {"metrics", metrics},
                     {"params", key_values(batch.params)},
                     {"tags", key_values(batch.tags)}};
  call("POST", "runs/log-batch", body.dump());
}

void MlflowClient::update_run(const std::string& run_id, const std::string& status,
                              int64_t end_time_ms) {
  json body = {{"run_id", run_id}, {"status", status}};
  if (end_time_ms > 0) body["end_time"] = end_time_ms;
  call("POST", "runs/update", body.dump());
}

void MlflowClient::upload_artifact(const std::string& artifact_uri, const std::string& path,
                                   const std::string& content) {
  // "mlflow-artifacts:/1/<run>/artifacts" or "mlflow-artifacts://host:port/1/<run>/artifacts":
  // the part after the authority is the path below the proxy's artifacts endpoint.
  const std::string scheme = kArtifactScheme;
  if (artifact_uri.compare(0, scheme.size(), scheme) != 0) {
    fail(ErrorKind::kInternal, "upload_artifact: {} is not a mlflow-artifacts: URI", artifact_uri);
  }
  std::string rest = artifact_uri.substr(scheme.size());
  if (rest.rfind("//", 0) == 0) {
    const size_t slash = rest.find('/', 2);
    rest = slash == std::string::npos ? "" : rest.substr(slash);
  }
  while (!rest.empty() && rest.front() == '/') rest.erase(rest.begin());
  const std::string url = connection_.tracking_uri + kArtifactsApi + rest + "/" + path;
  const HttpResponse r = send("PUT", url, content, "application/octet-stream");
  if (!r.error.empty()) fail(ErrorKind::kComm, "PUT {}: {}", url, r.error);
  if (!r.ok()) {
    fail(ErrorKind::kComm, "PUT {}: HTTP {}: {}", url, r.status,
         r.body.substr(0, std::min<size_t>(300, r.body.size())));
  }
}

}  // namespace dstrain::metrics
