#include "metrics/run_report.h"

#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/fs.h"
#include "metrics/svg_chart.h"
#include "tests/common/temp_dir.h"

namespace dstrain::metrics {
namespace {

void write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string attribute(const std::string& element, const std::string& name) {
  std::smatch m;
  const std::regex re(name + "=\"([^\"]*)\"");
  return std::regex_search(element, m, re) ? m[1].str() : "";
}

std::pair<double, double> pair_of(const std::string& text) {
  std::istringstream in(text);
  double a = 0, b = 0;
  in >> a >> b;
  return {a, b};
}

// The (x, y) data values of the polyline drawn for `key`, read back through the plot's scale.
std::vector<std::pair<double, double>> points_of(const std::string& svg, const std::string& key) {
  std::smatch plot;
  EXPECT_TRUE(std::regex_search(svg, plot, std::regex("<g class=\"plot\"[^>]*>")));
  const auto [x0, x1] = pair_of(attribute(plot[0], "data-x-domain"));
  const auto [px0, px1] = pair_of(attribute(plot[0], "data-x-range"));
  const auto [y0, y1] = pair_of(attribute(plot[0], "data-y-domain"));
  const auto [py0, py1] = pair_of(attribute(plot[0], "data-y-range"));
  std::smatch line;
  const std::regex re("<polyline class=\"series\" data-key=\"" + key + "\"[^>]*>");
  EXPECT_TRUE(std::regex_search(svg, line, re)) << key;
  std::vector<std::pair<double, double>> out;
  std::istringstream in(attribute(line[0], "points"));
  std::string point;
  while (in >> point) {
    const auto [px, py] = pair_of(point.replace(point.find(','), 1, " "));
    out.emplace_back(x0 + (px - px0) / (px1 - px0) * (x1 - x0),
                     y0 + (py - py0) / (py1 - py0) * (y1 - y0));
  }
  return out;
}

TEST(SvgChart, NiceAxis_CoversTheDataWithRoundTicks) {
  const NiceAxis a = nice_axis(0.613, 5.58, 6);
  EXPECT_LE(a.lo, 0.613);
  EXPECT_GE(a.hi, 5.58);
  EXPECT_DOUBLE_EQ(a.step, 1.0);
  const auto ticks = a.ticks();
  EXPECT_EQ(ticks.front(), 0.0);
  EXPECT_EQ(ticks.back(), 6.0);
  const NiceAxis flat = nice_axis(3e-4, 3e-4, 6);  // a constant learning rate
  EXPECT_LT(flat.lo, 3e-4);
  EXPECT_GT(flat.hi, 3e-4);
  for (double t : nice_axis(0.1, 0.7, 6).ticks()) {
    EXPECT_LE(fmt::format("{:g}", t).size(), 3u) << t;  // "0.4", not "0.40000000000000002"
  }
}

TEST(SvgChart, Chart_PointsMapBackToTheDataThroughTheStatedScale) {
  Chart c{"chart-loss", "Loss", "step", "loss", {}};
  c.series.push_back({"train/loss", "#1f77b4", false, {1, 10, 20, 30}, {5.6, 3.1, 1.25, 0.61}});
  c.series.push_back({"eval/loss", "#ff7f0e", true, {15, 30}, {2.0, 0.7}});
  const std::string svg = render_chart(c);
  const auto train = points_of(svg, "train/loss");
  ASSERT_EQ(train.size(), 4u);
  for (size_t i = 0; i < train.size(); ++i) {
    EXPECT_NEAR(train[i].first, c.series[0].x[i], 0.1);
    EXPECT_NEAR(train[i].second, c.series[0].y[i], 0.01);
  }
  const auto eval = points_of(svg, "eval/loss");
  ASSERT_EQ(eval.size(), 2u);
  EXPECT_NEAR(eval[1].second, 0.7, 0.01);
  EXPECT_NE(svg.find("<circle"), std::string::npos);  // eval points are marked
}

TEST(SvgChart, Chart_WithoutPointsSaysSo) {
  const std::string svg = render_chart({"chart-lr", "Learning rate", "step", "lr", {}});
  EXPECT_NE(svg.find("no data"), std::string::npos);
  EXPECT_EQ(svg.find("polyline"), std::string::npos);
}

class RunReport : public ::testing::Test {
 protected:
  void SetUp() override {
    write(dir / "metrics.jsonl",
          "{\"step\":1,\"time\":1.5,\"train/loss\":5.5,\"lr\":0.001,\"tokens_per_s\":1000,"
          "\"memory/rss_mb\":300}\n"
          "{\"step\":2,\"time\":2.5,\"train/loss\":4.0,\"lr\":0.002,\"tokens_per_s\":1200,"
          "\"memory/rss_mb\":310,\"grad_norm\":null}\n"
          "{\"step\":2,\"time\":2.6,\"eval/loss\":4.2,\"eval/ppl\":66.7}\n");
    write(dir / "summary.json", "{\"status\":\"completed\",\"steps\":2,\"world_size\":2}\n");
    write(dir / "config.yaml",
          "model:\n  name_or_path: builtin:tiny\nzero:\n  stage: 2\n"
          "lora:\n  target_modules: [q_proj, v_proj]\n");
  }
  testing::TempDir dir;
};

TEST_F(RunReport, Page_HasTheRunsNumbersChartsAndConfigAndNoScriptOrLink) {
  const std::string html = render_report(report_sources(dir.path().string()));
  for (const char* id : {"chart-loss", "chart-lr", "chart-throughput", "chart-memory"}) {
    EXPECT_NE(html.find(std::string("id=\"") + id + "\""), std::string::npos) << id;
  }
  const auto loss = points_of(html.substr(html.find("id=\"chart-loss\"")), "train/loss");
  ASSERT_EQ(loss.size(), 2u);
  EXPECT_NEAR(loss[1].second, 4.0, 0.01);
  EXPECT_NE(html.find("<th>zero.stage</th><td>2</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>lora.target_modules</th><td>[q_proj, v_proj]</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>ranks</th><td>2</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>status</th><td>completed</td>"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
}

TEST_F(RunReport, Sources_SummaryAndConfigAreOptionalAndTheirAbsenceIsShown) {
  std::filesystem::remove(dir / "summary.json");
  std::filesystem::remove(dir / "config.yaml");
  const ReportSources s = report_sources(dir.path().string());
  EXPECT_TRUE(s.summary.empty());
  EXPECT_TRUE(s.config.empty());
  const std::string html = render_report(s);
  EXPECT_NE(html.find("No summary.json"), std::string::npos);
  EXPECT_NE(html.find("No config.yaml"), std::string::npos);
}

TEST_F(RunReport, Sources_WithoutMetricsIsAnInputErrorNamingTheFile) {
  std::filesystem::remove(dir / "metrics.jsonl");
  try {
    report_sources(dir.path().string());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find((dir / "metrics.jsonl").string()), std::string::npos);
  }
  EXPECT_THROW(report_sources((dir / "nope").string()), Error);
}

TEST_F(RunReport, Render_ABadMetricsLineIsAnInputErrorNamingFileAndLine) {
  write(dir / "metrics.jsonl", "{\"step\":1,\"train/loss\":2}\n{\"train/loss\":2}\n");
  try {
    render_report(report_sources(dir.path().string()));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl:2:"), std::string::npos) << e.what();
  }
}

TEST_F(RunReport, Write_LeavesNoFileWhenTheInputIsBad) {
  write(dir / "summary.json", "{not json");
  const auto out = dir / "report.html";
  EXPECT_THROW(write_report(report_sources(dir.path().string()), out.string()), Error);
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace
}  // namespace dstrain::metrics
