#pragma once
// Metric sinks. The trainer builds one MetricsLogger on rank 0 only (other ranks log nothing) and
// hands it one Record per logged step; the logger fans it out to every configured sink.
//
// metrics.jsonl: one JSON object per line, {"step": N, "time": <unix seconds>, "<name>": value,
// ...} in the order the values were added. Names use a "train/", "eval/" prefix ("train/loss",
// "eval/ppl") or none for step-level figures ("lr", "grad_norm", "tokens_per_s", ...).
// Lines are flushed as they are written, so a crashed run keeps every line logged before the crash.

#include <cstdint>
#include <cstdio>
#include <memory>
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

class Sink {
 public:
  virtual ~Sink() = default;
  virtual void write(const Record& record) = 0;
};

// Appends JSON lines to `path` (created with its parent directories; Error(kIo) naming it if not).
class JsonlSink : public Sink {
 public:
  explicit JsonlSink(const std::string& path, bool append = false);
  ~JsonlSink() override;
  JsonlSink(const JsonlSink&) = delete;
  JsonlSink& operator=(const JsonlSink&) = delete;
  void write(const Record& record) override;

 private:
  std::FILE* file_ = nullptr;
};

class MetricsLogger {
 public:
  void add_sink(std::unique_ptr<Sink> sink) { sinks_.push_back(std::move(sink)); }
  void write(const Record& record);

 private:
  std::vector<std::unique_ptr<Sink>> sinks_;
};

}  // namespace dstrain::metrics
