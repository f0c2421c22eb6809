#pragma once
// MlflowSink: rank 0's MLflow run, kept through the REST API on a background thread so that a
// tracking server that is down or slow never stops or slows training.
//
// write() only appends the record's finite values to a bounded queue (oldest dropped, with one
// warning, past `max_queued_metrics`). The worker thread:
//  1. sets the run up: continues `run_id` (status back to RUNNING), or creates a run in the
//     experiment (by id, else by name, created when missing, else MLflow's default one) with the
//     tags, `mlflow.parentRunId` for a nested run; logs the params (a continued run's equal ones
//     are skipped, changed ones named in a warning: MLflow params cannot change); stores the start
//     artifacts where the run's artifact URI says (mlflow_artifacts.h: through the server's
//     artifact proxy, or straight into an artifact directory on a shared file system; a location
//     this machine cannot write is one warning, and the run goes on); writes the run id to
//     `run_id_file`.
//  2. sends queued metrics in runs/log-batch requests within the server's limits.
//  Every request has a bounded time. When one fails, a warning names the server and the error,
//  metrics keep queueing, and the worker retries with a growing pause (1 s .. retry_max_s); a line
//  says when the server answers again.
// finish(status, timeout_s) gives the worker until the deadline to send what is queued, store the
// end artifacts (files read then; missing ones skipped) and set the status and end time; what did
// not make it is named in a warning. It never throws. The status matters most (a run left RUNNING
// looks alive forever), so the last third of the time is the status request's alone: a request
// still running when that part begins (a slow server's answer to a batch sent before finish())
// is aborted, and the queued metrics and the end artifacts get only the time before it.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "metrics/mlflow_client.h"
#include "metrics/sinks.h"

namespace dstrain::metrics {

struct MlflowArtifact {
  std::string path;        // inside the run's artifact root ("config.yaml")
  std::string content;     // uploaded as is, unless local_file is set
  std::string local_file;  // read when uploaded
};

struct MlflowOptions {
  MlflowConnection connection;
  std::string experiment_name;  // used when experiment_id is "" ("" too: MLflow's default, id 0)
  std::string experiment_id;
  std::string run_id;         // continue this run instead of creating one
  std::string parent_run_id;  // make the run a child of this one
  std::string run_name;
  KeyValues params;
  KeyValues tags;
  std::vector<MlflowArtifact> start_artifacts;
  std::vector<MlflowArtifact> end_artifacts;
  std::string run_id_file;  // "" = none
  size_t max_queued_metrics = 100000;
  double retry_max_s = 30;
};

class MlflowSink : public Sink {
 public:
  explicit MlflowSink(MlflowOptions options);
  // Finishes as FAILED (5 s) when finish() was never called, then joins the worker.
  ~MlflowSink() override;
  MlflowSink(const MlflowSink&) = delete;
  MlflowSink& operator=(const MlflowSink&) = delete;

  void write(const Record& record) override;
  void finish(RunStatus status, double timeout_s) override;

 private:
  using Clock = std::chrono::steady_clock;

  void run();
  // Each returns false after a failed request (already reported).
  bool set_up();
  // Until the queue is empty; when finishing, also until only `keep_s` are left before the
  // deadline.
  bool send_queued(bool finishing, double keep_s = 0);
  void finish_up();
  void log_params();
  void upload(const std::vector<MlflowArtifact>& artifacts);
  void report_failure(const std::string& what);
  void report_recovery();
  double seconds_left() const;  // until the finish deadline (worker thread, once finishing)

  MlflowOptions options_;
  MlflowClient client_;  // worker thread only, as everything below down to `mutex_`
  MlflowRun run_;
  int setup_stage_ = 0;  // 0: no run; 1: run; 2: params logged; 3: start artifacts done
  bool outage_ = false;
  std::string last_error_;
  size_t sent_metrics_ = 0;

  std::mutex mutex_;
  std::condition_variable wake_;  // the worker: new metrics or finishing
  std::condition_variable done_cv_;
  std::deque<MlflowMetric> queue_;
  size_t dropped_ = 0;
  bool finishing_ = false;
  bool done_ = false;
  RunStatus status_ = RunStatus::kFinished;
  Clock::time_point deadline_;
  double status_reserve_s_ = 0;  // the end of the time before deadline_ kept for the status
  // When a running request is aborted, readable without the mutex (0 = not finishing): the start
  // of the status's reserve, then, for the status request itself, deadline_.
  std::atomic<int64_t> cutoff_ns_{0};
  std::thread worker_;
};

}  // namespace dstrain::metrics
