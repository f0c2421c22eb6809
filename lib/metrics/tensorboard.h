#pragma once
// TensorBoardSink: rank 0's TensorBoard event file (logging.tensorboard_dir, default
// <out_dir>/tb). Every value of every Record becomes a scalar under its metrics.jsonl name at the
// record's step; the resolved config is a text summary ("config", at the start step) and the
// flattened config the run's hyper-parameters for the HParams tab (session start, and a session
// end with the run's status at finish()).
//
// Each process writes its own file, events.out.tfevents.<unix seconds>.<host>.<pid>.<n>, so a
// resumed run adds a file beside the old ones. The file opens with a SessionLog START at the first
// step this process will log (start_step + 1; step 0 for a fresh run): TensorBoard then drops the
// steps the previous process logged after the checkpoint it resumed from, and a fresh run reusing a
// directory hides the old run's data, as metrics.jsonl is rewritten.
//
// Records are flushed as they are written (TensorBoard reads a file while it grows; a crashed run
// keeps everything logged before the crash). Thread-safe: finish() may come from the termination
// watcher while write() runs.

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "metrics/sinks.h"
#include "metrics/tb_events.h"

namespace dstrain::metrics {

struct TensorBoardOptions {
  std::string dir;              // created with its parents
  int64_t start_step = 0;       // the step the run starts from (the checkpoint's when resuming)
  std::string config_markdown;  // shown in the Text tab under "config" ("" = none)
  std::vector<tb::HParam> hparams;
};

class TensorBoardSink : public Sink {
 public:
  // Error(kIo) naming the file when it cannot be created.
  explicit TensorBoardSink(const TensorBoardOptions& options);
  ~TensorBoardSink() override;
  TensorBoardSink(const TensorBoardSink&) = delete;
  TensorBoardSink& operator=(const TensorBoardSink&) = delete;

  void write(const Record& record) override;
  void finish(RunStatus status, double timeout_s) override;

  const std::string& path() const { return path_; }

 private:
  void append(const std::string& event);  // holds mutex_

  std::mutex mutex_;
  std::string path_;
  std::FILE* file_ = nullptr;
  int64_t last_step_ = 0;
  bool write_failed_ = false;
};

// events.out.tfevents.<seconds, 10 digits>.<host>.<pid>.<n>: TensorBoard's naming (its reader
// takes every file whose name contains "tfevents", in name order).
std::string event_file_name(double wall_time);

}  // namespace dstrain::metrics
