#include "core/trace.h"

#include <chrono>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "core/fs.h"
#include "core/secrets.h"

namespace dstrain::trace {

std::atomic<bool> detail::recording{false};

namespace {

// Everything recorded, behind one lock: a span's cost when on is dominated by reading the clock
// twice, and a step records tens of spans, so contention is not worth per-thread buffers.
struct Recorder {
  std::mutex mutex;
  std::vector<Event> events;
  size_t max_events = kDefaultMaxEvents;
  uint64_t dropped = 0;
  std::map<int, std::string> thread_names;
};

Recorder& recorder() {
  static Recorder* r = new Recorder();  // never destroyed: threads may record during exit
  return *r;
}

std::atomic<int64_t> base_wall_us{0};
std::atomic<int64_t> base_steady_us{0};
std::atomic<int> next_tid{1};
thread_local int this_tid = 0;
thread_local const char* this_name = nullptr;
thread_local Arg this_label{};

int64_t steady_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int tid() {
  if (this_tid == 0) this_tid = next_tid.fetch_add(1);
  return this_tid;
}

// Every string of a trace goes through here, so a secret value never reaches a trace file.
void append_escaped(std::string& out, const char* text) {
  const std::string redacted = secrets::redact(text);
  for (const char* s = redacted.c_str(); *s; ++s) {
    const auto c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += fmt::format("\\u{:04x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
}

std::string quoted(const char* s) {
  std::string out = "\"";
  append_escaped(out, s);
  out += '"';
  return out;
}

std::string args_json(const Event& e) {
  std::string out;
  for (const Arg& a : e.args) {
    if (a.key == nullptr) continue;
    out += out.empty() ? "{" : ",";
    out += fmt::format("{}:{}", quoted(a.key), a.value);
  }
  return out.empty() ? out : out + "}";
}

std::string event_json(const Event& e, int rank) {
  std::string out =
      fmt::format(R"({{"name":{},"cat":{},"ph":"X","ts":{},"dur":{},"pid":{},"tid":{})",
                  quoted(e.name), quoted(e.category), e.ts_us, e.dur_us, rank, e.tid);
  const std::string args = args_json(e);
  if (!args.empty()) out += ",\"args\":" + args;
  return out + "}";
}

std::string metadata_json(const char* what, int rank, int tid, const std::string& arg) {
  return fmt::format(R"({{"name":"{}","ph":"M","pid":{},"tid":{},"args":{{{}}}}})", what, rank, tid,
                     arg);
}

}  // namespace

void start(size_t max_events) {
  Recorder& r = recorder();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    r.events.clear();
    r.dropped = 0;
    r.max_events = max_events;
  }
  base_steady_us.store(steady_us());
  base_wall_us.store(std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count());
  name_thread("main");
  detail::recording.store(true, std::memory_order_release);
}

void stop() {
  detail::recording.store(false, std::memory_order_release);
}

void name_thread(const char* name) {
  if (this_name == name) return;
  this_name = name;
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.thread_names[tid()] = name;
}

int64_t now_us() {
  return base_wall_us.load(std::memory_order_relaxed) + steady_us() -
         base_steady_us.load(std::memory_order_relaxed);
}

void Span::end() noexcept {
  if (start_us_ < 0) return;
  record(category_, name_, start_us_, a_, b_);
  start_us_ = -1;
}

void record(const char* category, const char* name, int64_t start_us, Arg a, Arg b) noexcept {
  if (!enabled()) return;
  const int64_t end_us = now_us();
  Event e{name, category, start_us, end_us - start_us, tid(), {a, b}};
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.events.size() >= r.max_events) {
    ++r.dropped;
    return;
  }
  try {
    r.events.push_back(e);
  } catch (...) {
    ++r.dropped;  // out of memory: lose the event, not the run
  }
}

ScopedLabel::ScopedLabel(const char* key, int64_t value) noexcept : previous_(this_label) {
  this_label = {key, value};
}

ScopedLabel::~ScopedLabel() {
  this_label = previous_;
}

Arg current_label() noexcept {
  return this_label;
}

Snapshot snapshot() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  Snapshot s;
  s.events = r.events;
  s.threads.assign(r.thread_names.begin(), r.thread_names.end());
  s.dropped = r.dropped;
  return s;
}

std::string to_json(const Snapshot& s, int rank) {
  std::vector<std::string> items;
  items.push_back(
      metadata_json("process_name", rank, 0, fmt::format("\"name\":\"rank {}\"", rank)));
  items.push_back(
      metadata_json("process_sort_index", rank, 0, fmt::format("\"sort_index\":{}", rank)));
  for (const auto& [tid, name] : s.threads) {
    items.push_back(metadata_json("thread_name", rank, tid, "\"name\":" + quoted(name.c_str())));
    items.push_back(
        metadata_json("thread_sort_index", rank, tid, fmt::format("\"sort_index\":{}", tid)));
  }
  for (const Event& e : s.events) items.push_back(event_json(e, rank));
  std::string out = "{\"traceEvents\":[\n";
  for (size_t i = 0; i < items.size(); ++i) {
    out += items[i];
    out += i + 1 < items.size() ? ",\n" : "\n";
  }
  out += fmt::format(
      "],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{{\"rank\":{},\"clock\":\"unix_us\","
      "\"dropped_events\":{}}}}}\n",
      rank, s.dropped);
  return out;
}

void write_rank_trace(const std::string& path, int rank) {
  const fs::stdfs::path p(path);
  if (p.has_parent_path()) fs::create_dirs(p.parent_path());
  fs::write_file_atomic(p, to_json(snapshot(), rank));
}

}  // namespace dstrain::trace
