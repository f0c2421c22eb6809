#pragma once
// The rank-0 progress display. On a terminal it redraws one line in place
// ("step 120/500 | loss 2.314 | lr 2.9e-03 | 5,812 tok/s | ETA 1m05s"); when stdout is a pipe or a
// file (logs, the launcher's prefixed stream) it prints one plain line per logged step instead,
// since carriage returns make logs unreadable.

#include <cstdint>
#include <string>

#include "metrics/sinks.h"

namespace dstrain::metrics {

class ProgressSink : public Sink {
 public:
  // total_steps <= 0: unknown (no ETA). `interactive` forces the terminal mode (tests).
  ProgressSink(int64_t total_steps, bool interactive);
  ~ProgressSink() override;
  void write(const Record& record) override;

  // One line for a record, without newline or carriage return (pure; unit tested).
  static std::string format_line(const Record& record, int64_t total_steps);

 private:
  int64_t total_steps_;
  bool interactive_;
  bool line_open_ = false;
};

// Human-friendly duration: "42s", "3m05s", "1h02m".
std::string format_duration(double seconds);

// True when stdout is a terminal.
bool stdout_is_terminal();

}  // namespace dstrain::metrics
