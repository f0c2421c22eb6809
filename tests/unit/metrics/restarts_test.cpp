#include "metrics/restarts.h"

#include <fstream>
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "metrics/run_report.h"
#include "tests/common/temp_dir.h"

namespace dstrain::metrics {
namespace {

RestartRecord record(int attempt, long step, bool counted) {
  RestartRecord r;
  r.attempt = attempt;
  r.time = "2026-11-26T13:00:00Z";
  r.rank = 1;
  r.host = "node-b";
  r.cause = "signal SIGKILL (9)";
  r.exit_code = 137;
  r.step = step;
  r.resumed_from = "step_00000020";
  r.counted = counted;
  return r;
}

TEST(Restarts, WrittenRecordsReadBackFieldForField) {
  testing::TempDir dir;
  write_restarts(dir.path(), {record(0, 21, false), record(1, 35, true)});
  const auto back = read_restarts(restarts_file(dir.path()));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].attempt, 1);
  EXPECT_EQ(back[1].time, "2026-11-26T13:00:00Z");
  EXPECT_EQ(back[1].rank, 1);
  EXPECT_EQ(back[1].host, "node-b");
  EXPECT_EQ(back[1].cause, "signal SIGKILL (9)");
  EXPECT_EQ(back[1].exit_code, 137);
  EXPECT_EQ(back[1].step, 35);
  EXPECT_EQ(back[1].resumed_from, "step_00000020");
  EXPECT_TRUE(back[1].counted);
  EXPECT_FALSE(back[0].counted);
}

TEST(Restarts, AnEmptyListRemovesTheFileAndNoFileIsNoRestarts) {
  testing::TempDir dir;
  write_restarts(dir.path(), {record(0, 3, true)});
  write_restarts(dir.path(), {});
  EXPECT_FALSE(std::ifstream(restarts_file(dir.path())).good());
  EXPECT_TRUE(read_restarts(restarts_file(dir.path())).empty());
}

TEST(Restarts, AFileOfSomethingElseIsAnInputErrorNamingIt) {
  testing::TempDir dir;
  std::ofstream(restarts_file(dir.path())) << R"({"restarts": [{"attempt": "x"}]})";
  try {
    read_restarts(restarts_file(dir.path()));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find(restarts_file(dir.path())), std::string::npos);
  }
}

TEST(Restarts, LastLoggedStepIsTheStepOfTheLastCompleteLine) {
  testing::TempDir dir;
  const std::string file = (dir.path() / "metrics.jsonl").string();
  EXPECT_EQ(last_logged_step(file), -1);
  std::ofstream(file) << "{\"step\": 1, \"train/loss\": 5.0}\n{\"step\": 2, \"train/loss\": 4.0}\n"
                      << "{\"step\": 3, \"train/lo";  // a line cut by the crash
  EXPECT_EQ(last_logged_step(file), 2);
}

TEST(Restarts, TheReportListsThemAndMarksTheirStepsOnEveryChart) {
  testing::TempDir dir;
  std::ofstream((dir.path() / "metrics.jsonl").string())
      << "{\"step\": 10, \"train/loss\": 5.0, \"lr\": 0.1}\n"
      << "{\"step\": 20, \"train/loss\": 4.0, \"lr\": 0.1}\n"
      << "{\"step\": 30, \"train/loss\": 3.0, \"lr\": 0.1}\n";
  write_restarts(dir.path(), {record(0, 21, false)});
  const ReportSources sources = report_sources(dir.path());
  ASSERT_EQ(sources.restarts, restarts_file(dir.path()));
  const std::string html = render_report(sources);
  EXPECT_NE(html.find("<h2>Restarts</h2>"), std::string::npos);
  EXPECT_NE(html.find("signal SIGKILL (9)"), std::string::npos);
  const std::regex mark("<line class=\"mark\" data-x=\"21\"");
  const auto marks =
      std::distance(std::sregex_iterator(html.begin(), html.end(), mark), std::sregex_iterator());
  EXPECT_EQ(marks, 2);  // the loss and learning-rate charts (the others have no data)
}

}  // namespace
}  // namespace dstrain::metrics
