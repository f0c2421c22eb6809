#pragma once
// Progress of a long pass over input data (tokenization), in bytes of input. On a terminal
// (stderr) it redraws one line in place at most ten times a second
//   "tokenizing data/train.parquet [#########...........]  45% 1.2 GB/2.6 GB 35.2 MB/s 41s left"
// once the pass has run half a second, so short passes stay silent; otherwise (a log file, the
// launcher's pipe) it logs that line every 30 s. Thread-safe: workers call advance() directly.

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "core/timer.h"

namespace dstrain::data {

class Progress {
 public:
  Progress(std::string label, int64_t total_bytes);
  ~Progress();  // shows the final state and ends the line, if anything was shown
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(int64_t bytes);
  int64_t done() const { return done_.load(); }

  // The line for `done` of `total` bytes after `seconds` (pure; unit tested).
  static std::string format_line(const std::string& label, int64_t done, int64_t total,
                                 double seconds);

 private:
  void show(bool final);

  std::string label_;
  int64_t total_;
  bool terminal_;
  std::atomic<int64_t> done_{0};
  Stopwatch clock_;
  std::mutex mu_;  // guards the fields below and the output
  double last_shown_ = 0;
  bool shown_ = false;
};

}  // namespace dstrain::data
