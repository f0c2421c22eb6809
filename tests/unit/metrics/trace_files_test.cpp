#include "metrics/trace_files.h"

#include <fstream>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "tests/common/temp_dir.h"

namespace dstrain::metrics {
namespace {

using nlohmann::json;

// A rank's trace as core/trace.h writes it: metadata, then complete events at absolute times.
json rank_trace(int rank, std::initializer_list<std::pair<const char*, int64_t>> spans) {
  json events = json::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", rank},
                    {"tid", 0},
                    {"args", {{"name", "rank " + std::to_string(rank)}}}});
  for (const auto& [name, ts] : spans) {
    events.push_back({{"name", name},
                      {"cat", name},
                      {"ph", "X"},
                      {"ts", ts},
                      {"dur", 10},
                      {"pid", rank},
                      {"tid", 1}});
  }
  return {{"traceEvents", events}, {"otherData", {{"rank", rank}, {"dropped_events", rank}}}};
}

void write(const std::string& path, const std::string& text) {
  fs::create_dirs(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

TEST(TraceFiles, Names_AreUnderTheRunsTraceDirectory) {
  EXPECT_EQ(rank_trace_file("runs/a", 3), "runs/a/trace/rank-3.json");
  EXPECT_EQ(merged_trace_file("runs/a"), "runs/a/trace/trace.json");
}

TEST(TraceFiles, Merge_PutsEveryRankOnOneTimeLineFromTheEarliestEvent) {
  testing::TempDir dir;
  const std::string run = dir.path().string();
  write(rank_trace_file(run, 0), rank_trace(0, {{"forward", 1'700'000'000'000'500}}).dump());
  write(rank_trace_file(run, 1),
        rank_trace(1, {{"forward", 1'700'000'000'000'200}, {"backward", 1'700'000'000'000'900}})
            .dump());
  const MergeResult r = merge_traces(find_rank_traces(run), merged_trace_file(run));
  EXPECT_EQ(r.ranks, 2);
  EXPECT_EQ(r.events, 3u);
  EXPECT_EQ(r.dropped, 1u);  // rank 1's file said it dropped one
  const json merged = json::parse(fs::read_file(merged_trace_file(run)));
  EXPECT_EQ(merged["otherData"]["epoch_unix_us"], 1'700'000'000'000'200);
  std::map<std::pair<int, std::string>, int64_t> ts;
  std::set<std::string> process_names;
  for (const json& e : merged["traceEvents"]) {
    if (e["ph"] == "X") ts[{e["pid"].get<int>(), e["name"].get<std::string>()}] = e["ts"];
    if (e["ph"] == "M") process_names.insert(e["args"]["name"].get<std::string>());
  }
  EXPECT_EQ((ts[{1, "forward"}]), 0);
  EXPECT_EQ((ts[{0, "forward"}]), 300);
  EXPECT_EQ((ts[{1, "backward"}]), 700);
  EXPECT_EQ(process_names, (std::set<std::string>{"rank 0", "rank 1"}));
}

TEST(TraceFiles, Find_OrdersRanksNumericallyAndIgnoresOtherFiles) {
  testing::TempDir dir;
  const std::string run = dir.path().string();
  for (int r : {10, 2, 0}) write(rank_trace_file(run, r), rank_trace(r, {}).dump());
  write(merged_trace_file(run), "{}");
  write(trace_dir(run) + "/rank-x.json", "{}");
  const auto files = find_rank_traces(run);
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0], rank_trace_file(run, 0));
  EXPECT_EQ(files[1], rank_trace_file(run, 2));
  EXPECT_EQ(files[2], rank_trace_file(run, 10));
}

TEST(TraceFiles, Find_WithoutRankFilesIsAnInputErrorNamingTheDirectory) {
  testing::TempDir dir;
  try {
    find_rank_traces(dir.path().string());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find(trace_dir(dir.path().string())), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("logging.trace"), std::string::npos);
  }
}

TEST(TraceFiles, Merge_OfABadFileNamesItAndWritesNothing) {
  testing::TempDir dir;
  const std::string run = dir.path().string();
  write(rank_trace_file(run, 0), rank_trace(0, {{"forward", 5}}).dump());
  write(rank_trace_file(run, 1), "{\"traceEvents\": [");  // cut short
  const std::string out = merged_trace_file(run);
  try {
    merge_traces({rank_trace_file(run, 0), rank_trace_file(run, 1)}, out);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find(rank_trace_file(run, 1)), std::string::npos);
  }
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_THROW(merge_traces({rank_trace_file(run, 7)}, out), Error);  // missing
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace
}  // namespace dstrain::metrics
