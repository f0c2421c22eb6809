#include "launcher/output.h"

#include <fcntl.h>
#include <unistd.h>
#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>

#include "core/fs.h"
#include "core/secrets.h"

namespace dstrain::launcher {
namespace {

std::vector<std::string> split_all(const std::vector<std::string>& chunks, size_t max_line,
                                   bool finish) {
  LineSplitter splitter(max_line);
  std::vector<std::string> lines;
  auto collect = [&](std::string_view line) { lines.emplace_back(line); };
  for (const std::string& c : chunks) splitter.feed(c, collect);
  if (finish) splitter.finish(collect);
  return lines;
}

TEST(LineSplitter, JoinsChunksIntoLines) {
  EXPECT_EQ(split_all({"he", "llo\nwor", "ld\n"}, 1024, false),
            (std::vector<std::string>{"hello", "world"}));
  EXPECT_EQ(split_all({"a\n\nb\n"}, 1024, false), (std::vector<std::string>{"a", "", "b"}));
}

TEST(LineSplitter, PartialLastLineOnlyOnFinish) {
  EXPECT_EQ(split_all({"a\nta", "il"}, 1024, false), (std::vector<std::string>{"a"}));
  EXPECT_EQ(split_all({"a\nta", "il"}, 1024, true), (std::vector<std::string>{"a", "tail"}));
  EXPECT_TRUE(split_all({}, 1024, true).empty());
}

TEST(LineSplitter, LongLinesAreCutAtTheLimit) {
  EXPECT_EQ(split_all({"abcdefg\n"}, 3, true), (std::vector<std::string>{"abc", "def", "g"}));
  // A newline right after a full piece does not produce an extra empty line.
  EXPECT_EQ(split_all({"abc\nd"}, 3, true), (std::vector<std::string>{"abc", "d"}));
  EXPECT_EQ(split_all({"ab", "cd", "ef", "\n"}, 3, true), (std::vector<std::string>{"abc", "def"}));
}

TEST(TailBuffer, KeepsTheLastLines) {
  TailBuffer tail(2);
  tail.push("1");
  tail.push("2");
  tail.push("3");
  EXPECT_EQ(tail.lines(), (std::vector<std::string>{"2", "3"}));
}

class RankOutputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("dstrain_output_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    out_fd_ = ::open((dir_ / "out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    err_fd_ = ::open((dir_ / "err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  void TearDown() override {
    ::close(out_fd_);
    ::close(err_fd_);
    std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
  int out_fd_ = -1;
  int err_fd_ = -1;
};

TEST_F(RankOutputTest, PrefixesConsoleAndWritesRawLog) {
  {
    RankOutput output(7, (dir_ / "rank_7.log").string(), {out_fd_, err_fd_, ""}, 2);
    output.write(Stream::kStdout, "one\ntw");
    output.write(Stream::kStderr, "oops\n");
    output.write(Stream::kStdout, "o\nthree");
    output.finish();
    EXPECT_EQ(output.tail(), (std::vector<std::string>{"two", "three"}));
  }
  EXPECT_EQ(fs::read_file(dir_ / "out"), "[rank 7] one\n[rank 7] two\n[rank 7] three\n");
  EXPECT_EQ(fs::read_file(dir_ / "err"), "[rank 7] oops\n");
  EXPECT_EQ(fs::read_file(dir_ / "rank_7.log"), "one\ntwoops\no\nthree");
}

TEST_F(RankOutputTest, SecretValuesAreRedactedFromConsoleTailAndLog) {
  secrets::add_secret_value("hf_rank_output_secret");
  {
    RankOutput output(3, (dir_ / "rank_3.log").string(), {out_fd_, err_fd_, ""}, 5);
    output.write(Stream::kStdout, "token=hf_rank_out");  // split across two reads of the pipe
    output.write(Stream::kStdout, "put_secret done\n");
    output.write(Stream::kStderr, "failed with hf_rank_output_secret\n");
    output.finish();
    EXPECT_EQ(output.tail(),
              (std::vector<std::string>{"token=<redacted> done", "failed with <redacted>"}));
  }
  EXPECT_EQ(fs::read_file(dir_ / "out"), "[rank 3] token=<redacted> done\n");
  EXPECT_EQ(fs::read_file(dir_ / "err"), "[rank 3] failed with <redacted>\n");
  EXPECT_EQ(fs::read_file(dir_ / "rank_3.log"), "token=<redacted> done\nfailed with <redacted>\n");
}

}  // namespace
}  // namespace dstrain::launcher
