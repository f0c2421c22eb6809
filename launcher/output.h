#pragma once
// Rank output routing. Each rank's stdout and stderr arrive through pipes as arbitrary chunks; the
// launcher re-emits them line by line with a "[rank K] " (or "[host:K] ") prefix on its own
// stdout/stderr (one write per line, so lines of different ranks never interleave mid-line), copies
// the raw bytes to an optional per-rank log file, and keeps the last lines of each rank for the
// failure summary. Known secret values (core/secrets.h) are redacted from all three.

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/secrets.h"

namespace dstrain::launcher {

// Splits a byte stream into lines (without the '\n'). A line longer than `max_line` bytes is
// emitted in pieces of `max_line`, so a rank that never prints a newline cannot grow the launcher's
// memory.
class LineSplitter {
 public:
  using LineFn = std::function<void(std::string_view line)>;

  explicit LineSplitter(size_t max_line = 64 * 1024) : max_line_(max_line) {}
  void feed(std::string_view bytes, const LineFn& on_line);
  // Emits the unterminated last line, if any.
  void finish(const LineFn& on_line);

 private:
  size_t max_line_;
  std::string pending_;
};

// The last `capacity` lines pushed.
class TailBuffer {
 public:
  explicit TailBuffer(size_t capacity) : capacity_(capacity) {}
  void push(std::string_view line);
  std::vector<std::string> lines() const { return {lines_.begin(), lines_.end()}; }

 private:
  size_t capacity_;
  std::deque<std::string> lines_;
};

enum class Stream { kStdout, kStderr };

struct OutputTargets {
  int stdout_fd = 1;  // prefixed copy of every rank's stdout
  int stderr_fd = 2;  // prefixed copy of every rank's stderr
  std::string host;   // "" → lines are prefixed "[rank K] "; else "[host:K] " (multi-node runs)
};

// One rank's output. Not copyable (owns the log file descriptor).
class RankOutput {
 public:
  // `log_path` empty: no log file. Otherwise the file is created/truncated; Error(kIo) on failure.
  RankOutput(int rank, const std::string& log_path, OutputTargets targets, size_t tail_lines = 10);
  ~RankOutput();
  RankOutput(const RankOutput&) = delete;
  RankOutput& operator=(const RankOutput&) = delete;

  void write(Stream stream, std::string_view bytes);
  // Flushes unterminated last lines of both streams (a newline is added on the console only).
  void finish();
  std::vector<std::string> tail() const { return tail_.lines(); }

 private:
  void emit(Stream stream, std::string_view line);

  std::string prefix_;
  OutputTargets targets_;
  int log_fd_ = -1;
  secrets::StreamRedactor log_redactor_;
  LineSplitter out_;
  LineSplitter err_;
  TailBuffer tail_;
};

// Writes all of `data` to `fd`, retrying on EINTR and short writes. Returns false on error (the
// caller decides whether a lost console line matters; for the launcher it does not stop the job).
bool write_all(int fd, std::string_view data);

}  // namespace dstrain::launcher
