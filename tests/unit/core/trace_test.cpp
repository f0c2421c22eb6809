#include "core/trace.h"

#include <chrono>
#include <map>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace dstrain::trace {
namespace {

int64_t unix_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void busy_for(std::chrono::microseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
  }
}

const Event* find(const Snapshot& s, const std::string& name) {
  for (const Event& e : s.events) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

class TraceTest : public ::testing::Test {
 protected:
  void TearDown() override { stop(); }
};

TEST_F(TraceTest, Trace_NothingIsRecordedUntilStarted) {
  stop();
  start();
  stop();
  { const Span span("forward", "forward"); }
  record("data", "data", now_us());
  EXPECT_FALSE(enabled());
  EXPECT_TRUE(snapshot().events.empty());
}

TEST_F(TraceTest, Trace_SpansNestOnTheirThreadWithWallClockTimes) {
  const int64_t before = unix_us();
  start();
  {
    const Span outer("step", "step", {"step", 7});
    busy_for(std::chrono::microseconds(200));
    {
      const Span inner("forward", "forward");
      busy_for(std::chrono::microseconds(200));
    }
    Span ended("backward", "backward");
    busy_for(std::chrono::microseconds(100));
    ended.end();
    busy_for(std::chrono::microseconds(300));
  }
  const int64_t after = unix_us();
  const Snapshot s = snapshot();
  ASSERT_EQ(s.events.size(), 3u);
  const Event* step = find(s, "step");
  const Event* forward = find(s, "forward");
  const Event* backward = find(s, "backward");
  ASSERT_TRUE(step && forward && backward);
  EXPECT_EQ(step->tid, forward->tid);
  EXPECT_GE(step->ts_us, before - 1000);  // the trace clock is the wall clock (to a millisecond)
  EXPECT_LE(step->ts_us + step->dur_us, after + 1000);
  EXPECT_GE(forward->ts_us, step->ts_us);
  EXPECT_LE(forward->ts_us + forward->dur_us, step->ts_us + step->dur_us);
  EXPECT_GE(forward->dur_us, 200);
  EXPECT_GE(step->dur_us, 800);
  // end() closed the span early: at ~100 µs, not at the end of the scope (~400 µs later).
  EXPECT_LT(backward->ts_us + backward->dur_us, step->ts_us + step->dur_us - 200);
  EXPECT_STREQ(step->args[0].key, "step");
  EXPECT_EQ(step->args[0].value, 7);
}

TEST_F(TraceTest, Trace_EachThreadIsANamedTrack) {
  start();
  { const Span span("step", "on main"); }
  std::thread worker([] {
    name_thread("comm");
    const Span span("comm", "on comm");
  });
  worker.join();
  const Snapshot s = snapshot();
  const Event* on_main = find(s, "on main");
  const Event* on_comm = find(s, "on comm");
  ASSERT_TRUE(on_main && on_comm);
  EXPECT_NE(on_main->tid, on_comm->tid);
  std::map<int, std::string> names(s.threads.begin(), s.threads.end());
  EXPECT_EQ(names[on_main->tid], "main");
  EXPECT_EQ(names[on_comm->tid], "comm");
}

TEST_F(TraceTest, Trace_LabelIsSeenByTheCodeThatHandsWorkOver) {
  EXPECT_EQ(current_label().key, nullptr);
  {
    const ScopedLabel outer("bucket", 3);
    {
      const ScopedLabel inner("unit", 5);
      EXPECT_STREQ(current_label().key, "unit");
      EXPECT_EQ(current_label().value, 5);
    }
    EXPECT_STREQ(current_label().key, "bucket");
    EXPECT_EQ(current_label().value, 3);
    Arg on_other_thread{"x", -1};
    std::thread([&] { on_other_thread = current_label(); }).join();
    EXPECT_EQ(on_other_thread.key, nullptr);  // a label belongs to the thread that set it
  }
  EXPECT_EQ(current_label().key, nullptr);
}

TEST_F(TraceTest, Trace_FullBufferCountsDroppedEvents) {
  start(/*max_events=*/3);
  for (int i = 0; i < 5; ++i) record("data", "data", now_us());
  const Snapshot s = snapshot();
  EXPECT_EQ(s.events.size(), 3u);
  EXPECT_EQ(s.dropped, 2u);
  const auto j = nlohmann::json::parse(to_json(s, 0));
  EXPECT_EQ(j["otherData"]["dropped_events"], 2);
}

TEST_F(TraceTest, Trace_JsonIsTraceEventFormatWithRankAsPid) {
  start();
  {
    const ScopedLabel label("bucket", 2);
    const Span span("comm", "reduce_scatter", current_label(), {"bytes_sent", 4096});
  }
  const auto j = nlohmann::json::parse(to_json(snapshot(), 3));
  ASSERT_TRUE(j["traceEvents"].is_array());
  bool process_named = false, complete_seen = false;
  for (const auto& e : j["traceEvents"]) {
    EXPECT_EQ(e["pid"], 3);
    if (e["ph"] == "M" && e["name"] == "process_name") {
      process_named = e["args"]["name"] == "rank 3";
    }
    if (e["ph"] == "X") {
      complete_seen = true;
      EXPECT_EQ(e["name"], "reduce_scatter");
      EXPECT_EQ(e["cat"], "comm");
      EXPECT_TRUE(e["ts"].is_number_integer());
      EXPECT_TRUE(e["dur"].is_number_integer());
      EXPECT_EQ(e["args"]["bucket"], 2);
      EXPECT_EQ(e["args"]["bytes_sent"], 4096);
    }
  }
  EXPECT_TRUE(process_named);
  EXPECT_TRUE(complete_seen);
}

TEST_F(TraceTest, Trace_StartDiscardsAnEarlierRecording) {
  start();
  { const Span span("step", "old"); }
  start();
  { const Span span("step", "new"); }
  const Snapshot s = snapshot();
  ASSERT_EQ(s.events.size(), 1u);
  EXPECT_STREQ(s.events[0].name, "new");
}

}  // namespace
}  // namespace dstrain::trace
