#include "metrics/mlflow_sink.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "metrics/mlflow_artifacts.h"

namespace dstrain::metrics {
namespace {

constexpr size_t kMetricsPerRequest = 1000;
constexpr double kMinRequestSeconds = 0.5;  // below this, a request is not worth starting

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string truncated(const std::string& value, size_t limit) {
  return value.size() <= limit ? value : value.substr(0, limit);
}

}  // namespace

MlflowSink::MlflowSink(MlflowOptions options)
    : options_(std::move(options)), client_(options_.connection) {
  client_.set_cancel([this] {
    const int64_t cutoff = cutoff_ns_.load();
    return cutoff != 0 && Clock::now().time_since_epoch().count() > cutoff;
  });
  worker_ = std::thread([this] { run(); });
}

MlflowSink::~MlflowSink() {
  bool finished = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished = finishing_;
  }
  if (!finished) finish(RunStatus::kFailed, 5);
  worker_.join();
}

void MlflowSink::write(const Record& record) {
  const int64_t t = now_ms();
  size_t dropped_now = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finishing_) return;
    for (const auto& [key, value] : record.values) {
      if (!std::isfinite(value)) continue;  // MLflow's JSON has no NaN/Inf (metrics.jsonl: null)
      queue_.push_back({key, value, t, record.step});
    }
    while (queue_.size() > options_.max_queued_metrics) {
      queue_.pop_front();
      ++dropped_now;
    }
    if (dropped_ == 0 && dropped_now > 0) {
      log::warn(
          "MLflow: more than {} metric values wait for the tracking server; dropping the "
          "oldest",
          options_.max_queued_metrics);
    }
    dropped_ += dropped_now;
  }
  wake_.notify_one();
}

void MlflowSink::finish(RunStatus status, double timeout_s) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (finishing_) return;
  finishing_ = true;
  status_ = status;
  deadline_ = Clock::now() +
              std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  status_reserve_s_ = std::min(timeout_s, std::max(timeout_s / 3, kMinRequestSeconds));
  cutoff_ns_.store((deadline_ - std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(status_reserve_s_)))
                       .time_since_epoch()
                       .count());
  wake_.notify_all();
  // The worker watches the deadline itself; the extra second covers its last request's return.
  const bool done =
      done_cv_.wait_until(lock, deadline_ + std::chrono::seconds(1), [this] { return done_; });
  if (!done) {
    log::warn("MLflow: the run's end could not be recorded within {:.0f}s; giving up", timeout_s);
  }
}

double MlflowSink::seconds_left() const {
  return std::chrono::duration<double>(deadline_ - Clock::now()).count();
}

void MlflowSink::report_failure(const std::string& what) {
  last_error_ = what;
  size_t queued = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finishing_) return;  // finish_up() names what did not make it, with this error
    queued = queue_.size();
  }
  if (outage_) return;  // one warning per outage
  outage_ = true;
  log::warn(
      "MLflow: {}; training goes on, metrics are kept ({} queued) and sent when the "
      "tracking server answers",
      what, queued);
}

void MlflowSink::report_recovery() {
  if (!outage_) return;
  outage_ = false;
  log::info("MLflow: the tracking server at {} answers again", client_.tracking_uri());
}

void MlflowSink::run() {
  double pause = 1;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!finishing_) {
    lock.unlock();
    const bool ok = set_up() && send_queued(false);
    lock.lock();
    if (!ok) {
      wake_.wait_for(lock, std::chrono::duration<double>(pause), [this] { return finishing_; });
      pause = std::min(pause * 2, options_.retry_max_s);
      continue;
    }
    pause = 1;
    wake_.wait(lock, [this] { return finishing_ || !queue_.empty(); });
  }
  lock.unlock();
  finish_up();
  lock.lock();
  done_ = true;
  done_cv_.notify_all();
}

bool MlflowSink::set_up() {
  try {
    if (setup_stage_ == 0) {
      KeyValues tags = options_.tags;
      if (!options_.parent_run_id.empty()) {
        tags.emplace_back("mlflow.parentRunId", options_.parent_run_id);
      }
      if (!options_.run_id.empty()) {
        run_ = client_.get_run(options_.run_id);
        if (run_.status != "RUNNING") client_.update_run(run_.run_id, "RUNNING", 0);
        for (const auto& batch : split_log_batch({{}, {}, tags})) {
          client_.log_batch(run_.run_id, batch);
        }
      } else {
        std::string experiment = options_.experiment_id;
        if (experiment.empty()) {
          experiment = options_.experiment_name.empty()
                           ? "0"
                           : client_.experiment_id(options_.experiment_name);
        }
        run_ = client_.create_run(experiment, options_.run_name, now_ms(), tags);
      }
      setup_stage_ = 1;
      log::info("MLflow: run {} (experiment {}) at {}/#/experiments/{}/runs/{}", run_.run_id,
                run_.experiment_id, client_.tracking_uri(), run_.experiment_id, run_.run_id);
      if (!options_.run_id_file.empty()) {
        fs::write_file_atomic(options_.run_id_file, run_.run_id + "\n");
      }
    }
    if (setup_stage_ == 1) {
      log_params();
      setup_stage_ = 2;
    }
    if (setup_stage_ == 2) {
      upload(options_.start_artifacts);
      setup_stage_ = 3;
    }
    report_recovery();
    return true;
  } catch (const Error& e) {
    report_failure(e.what());
    return false;
  }
}

void MlflowSink::log_params() {
  LogBatch batch;
  std::vector<std::string> changed;
  for (const auto& [key, value] : options_.params) {
    const std::string v = truncated(value, kMaxParamValueLength);
    const auto it = run_.params.find(key);
    if (it == run_.params.end()) {
      batch.params.emplace_back(key, v);
    } else if (it->second != v) {
      changed.push_back(key);
    }
  }
  if (!changed.empty()) {
    std::string names;
    for (const auto& k : changed) names += (names.empty() ? "" : ", ") + k;
    log::warn(
        "MLflow: run {} already has other values for {} (MLflow params cannot change); "
        "keeping the old ones",
        run_.run_id, names);
  }
  for (const auto& b : split_log_batch(batch)) client_.log_batch(run_.run_id, b);
  for (const auto& [key, value] : batch.params) run_.params[key] = value;
}

void MlflowSink::upload(const std::vector<MlflowArtifact>& artifacts) {
  std::vector<std::string> skipped;
  std::string reason;
  for (const auto& a : artifacts) {
    std::string content = a.content;
    if (!a.local_file.empty()) {
      if (!std::filesystem::exists(a.local_file)) continue;
      content = fs::read_file(a.local_file);
    }
    if (is_proxied_artifact_uri(run_.artifact_uri)) {
      client_.upload_artifact(run_.artifact_uri, a.path, content);  // a server error: retried
      continue;
    }
    // Not the server's business: a location this machine cannot write stays so, so it is said
    // once and the run goes on (retrying would hold the metrics back).
    try {
      write_local_artifact(run_.artifact_uri, a.path, content);
    } catch (const Error& e) {
      skipped.push_back(a.path);
      reason = e.what();
    }
  }
  if (!skipped.empty()) {
    std::string names;
    for (const auto& name : skipped) names += (names.empty() ? "" : ", ") + name;
    log::warn("MLflow: run {}: {}; artifacts not stored: {}", run_.run_id, reason, names);
  }
}

bool MlflowSink::send_queued(bool finishing, double keep_s) {
  while (true) {
    LogBatch batch;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const size_t n = std::min(queue_.size(), kMetricsPerRequest);
      if (n == 0) return true;
      batch.metrics.assign(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
    }
    try {
      client_.log_batch(run_.run_id, batch);
    } catch (const Error& e) {
      report_failure(e.what());
      return false;
    }
    report_recovery();
    sent_metrics_ += batch.metrics.size();
    {
      // Only the worker pops, and write() drops from the front only past the bound: when it did,
      // the sent values may be gone already, so pop at most what is left.
      std::lock_guard<std::mutex> lock(mutex_);
      const size_t n = std::min(queue_.size(), batch.metrics.size());
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
      if (!finishing && finishing_) return true;
    }
    if (finishing && seconds_left() - keep_s < kMinRequestSeconds) return false;
  }
}

// The end of the run, within the deadline: queued metrics, the end artifacts (the last third of
// the time before the status's reserve), then the status. Every request gets at most its part of
// the time that is left.
void MlflowSink::finish_up() {
  const std::string status = to_string(status_);
  const double reserve = status_reserve_s_;
  const double artifacts_from = reserve + std::max(seconds_left() - reserve, 0.0) / 3;
  auto limit_request = [&](double keep) {
    const double left = seconds_left() - keep;
    client_.set_timeout(std::min(options_.connection.timeout_s, std::max(left, 0.1)));
    return left >= kMinRequestSeconds;
  };
  if (setup_stage_ < 3 && limit_request(reserve)) set_up();
  if (setup_stage_ == 0) {
    log::warn("MLflow: the run could not be recorded at {} ({}); its status {} is not set",
              client_.tracking_uri(), last_error_, status);
    return;
  }
  if (limit_request(artifacts_from)) send_queued(true, artifacts_from);
  std::vector<std::string> missing;
  size_t unsent = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    unsent = queue_.size();
  }
  if (unsent > 0) {
    missing.push_back(std::to_string(unsent) + " metric values (" +
                      (last_error_.empty() ? "out of time" : last_error_) + ")");
  }
  try {
    if (!limit_request(reserve)) fail(ErrorKind::kTimeout, "no time left");
    upload(options_.end_artifacts);
  } catch (const Error& e) {
    missing.push_back(std::string("the end artifacts (") + e.what() + ")");
  }
  cutoff_ns_.store(deadline_.time_since_epoch().count());
  try {
    if (!limit_request(0)) fail(ErrorKind::kTimeout, "no time left");
    client_.update_run(run_.run_id, status, now_ms());
  } catch (const Error& e) {
    missing.push_back("the status " + status + " (" + e.what() + ")");
  }
  if (!missing.empty()) {
    std::string what;
    for (const auto& m : missing) what += (what.empty() ? "" : "; ") + m;
    log::warn("MLflow: run {} at {}: not recorded: {}", run_.run_id, client_.tracking_uri(), what);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (dropped_ > 0) {
    log::warn("MLflow: {} metric values were dropped while the server did not answer", dropped_);
  }
}

}  // namespace dstrain::metrics
