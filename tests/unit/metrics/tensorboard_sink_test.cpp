#include "metrics/tensorboard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <metrics/proto/tensorboard_events.pb.h>

#include "metrics/tfrecord.h"

namespace dstrain::metrics {
namespace {

namespace stdfs = std::filesystem;
namespace pb = dstrain::tbproto;

class TensorBoardSinkTest : public ::testing::Test {
 protected:
  void TearDown() override { stdfs::remove_all(dir_); }

  std::vector<pb::Event> read_events(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    std::vector<pb::Event> events;
    for (const auto& payload : read_tfrecords(s.str())) {
      pb::Event e;
      EXPECT_TRUE(e.ParseFromString(payload));
      events.push_back(e);
    }
    return events;
  }

  TensorBoardOptions options(int64_t start_step) {
    TensorBoardOptions o;
    o.dir = dir_.string();
    o.start_step = start_step;
    o.config_markdown = "```yaml\na: 1\n```\n";
    o.hparams = {{"training.lr", 0.5}, {"model.init", std::string("random")}};
    return o;
  }

  stdfs::path dir_ = stdfs::temp_directory_path() / ("dstrain_tb_" + std::to_string(::getpid()));
};

TEST_F(TensorBoardSinkTest, WritesHeaderScalarsAndEndInOrder) {
  std::string path;
  {
    TensorBoardSink sink(options(0));
    path = sink.path();
    Record r{5, {}};
    r.add("train/loss", 2.25);
    r.add("memory/rss_mb", 123.5);
    sink.write(r);
    sink.finish(RunStatus::kFailed, 1);
  }
  EXPECT_NE(stdfs::path(path).filename().string().find("events.out.tfevents."), std::string::npos);
  const auto events = read_events(path);
  ASSERT_EQ(events.size(), 6u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[1].session_log().status(), pb::SessionLog::START);
  EXPECT_EQ(events[1].step(), 0);  // a fresh run hides whatever an older run left in the directory
  EXPECT_EQ(events[2].summary().value(0).tag(), "config");
  EXPECT_EQ(events[2].summary().value(0).metadata().plugin_data().plugin_name(), "text");
  EXPECT_EQ(events[2].summary().value(0).tensor().string_val(0), "```yaml\na: 1\n```\n");
  const auto& start = events[3].summary().value(0);
  EXPECT_EQ(start.tag(), "_hparams_/session_start_info");
  pb::HParamsPluginData data;
  ASSERT_TRUE(data.ParseFromString(start.metadata().plugin_data().content()));
  EXPECT_EQ(data.session_start_info().hparams().at("training.lr").number_value(), 0.5);
  EXPECT_EQ(data.session_start_info().hparams().at("model.init").string_value(), "random");
  EXPECT_EQ(events[4].step(), 5);
  ASSERT_EQ(events[4].summary().value_size(), 2);
  EXPECT_EQ(events[4].summary().value(0).tag(), "train/loss");
  EXPECT_EQ(events[4].summary().value(0).simple_value(), 2.25f);
  EXPECT_EQ(events[4].summary().value(1).tag(), "memory/rss_mb");
  ASSERT_TRUE(
      data.ParseFromString(events[5].summary().value(0).metadata().plugin_data().content()));
  EXPECT_EQ(data.session_end_info().status(), pb::STATUS_FAILURE);
  EXPECT_EQ(events[5].step(), 5);
}

TEST_F(TensorBoardSinkTest, ResumedRunPurgesFromTheStepAfterItsCheckpoint) {
  std::string path;
  {
    TensorBoardSink sink(options(8));
    path = sink.path();
  }
  const auto events = read_events(path);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[1].session_log().status(), pb::SessionLog::START);
  EXPECT_EQ(events[1].step(), 9);
  EXPECT_EQ(events[2].step(), 8);  // the config as of the resumed step
}

TEST_F(TensorBoardSinkTest, EachSinkWritesItsOwnFile) {
  TensorBoardSink a(options(0));
  TensorBoardSink b(options(0));
  EXPECT_NE(a.path(), b.path());
}

}  // namespace
}  // namespace dstrain::metrics
