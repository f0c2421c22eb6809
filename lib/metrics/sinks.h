#pragma once
// Metric sinks. The trainer builds one MetricsLogger on rank 0 only (other ranks log nothing) and
// hands it one Record per logged step; the logger fans it out to every configured sink.
//
// metrics.jsonl: one JSON object per line, {"step": N, "time": <unix seconds>, "<name>": value,
// ...} in the order the values were added. Names use a "train/", "eval/" prefix ("train/loss",
// "eval/ppl") or none for step-level figures ("lr", "grad_norm", "tokens_per_s", ...).
// Lines are flushed as they are written, so a crashed run keeps every line logged before the crash.
//
// Other sinks: ProgressSink (progress.h), TensorBoardSink (tensorboard.h), MlflowSink
// (mlflow_sink.h). A run ends with MetricsLogger::finish(status), once, from whichever comes
// first: the end of training, an error, or a termination signal (termination.h).

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace dstrain::metrics {

struct Record {
  int64_t step = 0;
  std::vector<std::pair<std::string, double>> values;

  void add(std::string name, double value) { values.emplace_back(std::move(name), value); }
  // The value of `name`, or `fallback` when absent.
  double get(const std::string& name, double fallback = 0.0) const;
  bool has(const std::string& name) const;
};

// How a run ended, in MLflow's words: FINISHED (all steps done), FAILED (an error), KILLED (a
// signal, or a preemption stop that saved a checkpoint to resume from).
enum class RunStatus { kFinished, kFailed, kKilled };

// "FINISHED", "FAILED", "KILLED".
const char* to_string(RunStatus status) noexcept;

class Sink {
 public:
  virtual ~Sink() = default;
  virtual void write(const Record& record) = 0;
  // The run is over. Called at most once, possibly from another thread than write() (the
  // termination watcher), and possibly while a write() is still in progress: a sink that does work
  // here must guard its state. Returns within about `timeout_s`.
  virtual void finish(RunStatus status, double timeout_s) {}
};

// Writes JSON lines to `path` (created with its parent directories; Error(kIo) naming it if not).
// A new run (`resumed_at` < 0) starts the file afresh. A run resumed at step S continues it: the
// lines of steps after S (written before the interruption, written again now) and lines that are
// not a JSON object with a step (a line cut short by a crash) are removed first, so that the file
// holds each step once.
class JsonlSink : public Sink {
 public:
  explicit JsonlSink(const std::string& path, int64_t resumed_at = -1);
  ~JsonlSink() override;
  JsonlSink(const JsonlSink&) = delete;
  JsonlSink& operator=(const JsonlSink&) = delete;
  void write(const Record& record) override;

 private:
  std::FILE* file_ = nullptr;
};

// Fans records out to its sinks. add_sink() is for set-up, before any other thread can call
// finish(); write() is for the training thread; finish() may come from any thread.
class MetricsLogger {
 public:
  void add_sink(std::unique_ptr<Sink> sink) { sinks_.push_back(std::move(sink)); }
  void write(const Record& record);
  // Ends the run in every sink. The first call wins and returns true; a later one returns false
  // once the first is done (so a signal during shutdown waits for the status being sent), and an
  // error during shutdown does not turn a FINISHED or KILLED run into FAILED.
  bool finish(RunStatus status, double timeout_s);

 private:
  std::vector<std::unique_ptr<Sink>> sinks_;
  std::once_flag finished_;
};

}  // namespace dstrain::metrics
