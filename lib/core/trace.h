#pragma once
// Spans of where a rank's time goes, for a Chrome/Perfetto trace (the Trace Event Format's
// complete events, "ph":"X"). Any module may record: this sits in core so that the engine and the
// communicator, below metrics, can mark their own work.
//
// Contract:
//  - Off until start(): a Span then costs one relaxed atomic load and records nothing.
//  - Thread-safe: every thread may record. Each thread is a track with a small id (tid), given the
//    first time it records or is named; name_thread() names it ("main", "comm", "data prefetch").
//  - Events are kept in memory, at most `max_events` of them; later ones are counted as dropped
//    (the trace file says how many) instead of growing without bound.
//  - Names, categories and argument keys are string literals (only the pointer is kept).
//
// Clock: timestamps are wall-clock microseconds since the Unix epoch. The system clock is read
// once, at start(), and advanced by the monotonic clock from there, so spans never jump with a
// clock adjustment; ranks on one host then share their time base exactly and ranks on different
// hosts agree as well as their clocks are synchronised (NTP/PTP), which is what lets the ranks'
// files be merged (metrics/trace_files.h) without exchanging clocks.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dstrain::trace {

// One integer argument of an event, shown by trace viewers ("bucket": 3, "bytes": 4096).
struct Arg {
  const char* key = nullptr;  // nullptr: no argument
  int64_t value = 0;
};

struct Event {
  const char* name = "";
  const char* category = "";
  int64_t ts_us = 0;   // start, microseconds since the Unix epoch (see the clock above)
  int64_t dur_us = 0;  // duration, microseconds
  int tid = 0;
  Arg args[2];
};

inline constexpr size_t kDefaultMaxEvents = 1'000'000;  // ~64 MB at most

namespace detail {
extern std::atomic<bool> recording;
}

inline bool enabled() noexcept {
  return detail::recording.load(std::memory_order_relaxed);
}

// Starts recording in this process (discarding earlier events) and names the calling thread
// "main".
void start(size_t max_events = kDefaultMaxEvents);
// Stops recording; the events recorded so far are kept for snapshot().
void stop();

// Names the calling thread's track; cheap to call again with the same name.
void name_thread(const char* name);

// Microseconds on the trace clock.
int64_t now_us();

// Records one complete event from construction to destruction (or end()), on the calling thread's
// track.
class Span {
 public:
  Span(const char* category, const char* name, Arg a = {}, Arg b = {}) noexcept
      : category_(category), name_(name), a_(a), b_(b), start_us_(enabled() ? now_us() : -1) {}
  ~Span() { end(); }
  // Records the event now instead of at destruction (for a phase that ends mid-scope).
  void end() noexcept;
  // Sets the second argument, for a value known only as the span ends (a phase's memory peak).
  void set_arg(Arg b) noexcept { b_ = b; }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* category_;
  const char* name_;
  Arg a_, b_;
  int64_t start_us_;  // -1: recording was off at construction
};

// Records an event that ran on the calling thread from `start_us` to now.
void record(const char* category, const char* name, int64_t start_us, Arg a = {},
            Arg b = {}) noexcept;

// A label for work this thread hands to another one (a collective run by the communicator's
// thread on behalf of gradient bucket 3): set for the scope, read by the code that hands the work
// over (current_label()), which records it as an argument of the other thread's span.
class ScopedLabel {
 public:
  ScopedLabel(const char* key, int64_t value) noexcept;
  ~ScopedLabel();
  ScopedLabel(const ScopedLabel&) = delete;
  ScopedLabel& operator=(const ScopedLabel&) = delete;

 private:
  Arg previous_;
};
Arg current_label() noexcept;

struct Snapshot {
  std::vector<Event> events;                         // in recording order
  std::vector<std::pair<int, std::string>> threads;  // tid → track name (named tracks only)
  uint64_t dropped = 0;                              // events past max_events
};
Snapshot snapshot();

// The Trace Event Format JSON of one rank: {"traceEvents": [...], "otherData": {...}} with
// pid = rank, metadata events naming the process "rank K" and each named thread.
std::string to_json(const Snapshot& snapshot, int rank);

// Writes to_json(snapshot(), rank) to `path` atomically (parent directories created);
// Error(kIo) naming the path on failure.
void write_rank_trace(const std::string& path, int rank);

}  // namespace dstrain::trace
