#include "launcher/hostfile.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace dstrain::launcher {
namespace {

// Expects parse_hostfile(text) to throw Error(kInput) whose message contains every `parts`.
void expect_error(const std::string& text, std::vector<std::string> parts) {
  try {
    parse_hostfile(text, "hosts.txt");
    FAIL() << "no error for:\n" << text;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(Hostfile, ParsesDeepSpeedSyntaxWithCommentsAndBlankLines) {
  auto hosts = parse_hostfile(
      "# cluster\n\nworker-1 slots=4\n  worker-2   slots=2  # half node\n\t\nworker-3 slots=8\n",
      "h");
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].host, "worker-1");
  EXPECT_EQ(hosts[0].slots, 4);
  EXPECT_EQ(hosts[0].line, 3);
  EXPECT_EQ(hosts[1].host, "worker-2");
  EXPECT_EQ(hosts[1].slots, 2);
  EXPECT_EQ(hosts[2].line, 6);
  EXPECT_EQ(hosts[0].user, "");
  EXPECT_EQ(hosts[0].ssh_port, 0);
}

TEST(Hostfile, ParsesUserPortAndSshPort) {
  auto hosts = parse_hostfile(
      "alice@10.0.0.1:2222 slots=1\nnode2 slots=2 ssh_port=2200\r\n"
      "bob@node3 ssh_port=22 slots=1\n",
      "h");
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].user, "alice");
  EXPECT_EQ(hosts[0].host, "10.0.0.1");
  EXPECT_EQ(hosts[0].ssh_port, 2222);
  EXPECT_EQ(hosts[1].ssh_port, 2200);
  EXPECT_EQ(hosts[2].user, "bob");
  EXPECT_EQ(hosts[2].ssh_port, 22);
}

TEST(Hostfile, SameHostOnDifferentPortsIsAllowed) {
  auto hosts = parse_hostfile("a:2201 slots=1\na:2202 slots=1\n", "h");
  EXPECT_EQ(hosts.size(), 2u);
}

TEST(Hostfile, MalformedLinesNameFileAndLine) {
  expect_error("a slots=1\nb\n", {"hosts.txt:2", "no slots"});
  expect_error("a slots=0\n", {"hosts.txt:1", "slots", "positive"});
  expect_error("a slots=-2\n", {"hosts.txt:1", "slots"});
  expect_error("a slots=x\n", {"hosts.txt:1", "'x'"});
  expect_error("a slots=\n", {"hosts.txt:1", "slots"});
  expect_error("a slots=4 gpus=2\n", {"hosts.txt:1", "unknown setting 'gpus'"});
  expect_error("a 4\n", {"hosts.txt:1", "unexpected '4'"});
  expect_error("a:xx slots=1\n", {"hosts.txt:1", "port"});
  expect_error("a:70000 slots=1\n", {"hosts.txt:1", "70000"});
  expect_error("a:22 slots=1 ssh_port=23\n", {"hosts.txt:1", "disagree"});
  expect_error("a;rm slots=1\n", {"hosts.txt:1", "invalid host name"});
  expect_error("-oProxyCommand=x slots=1\n", {"hosts.txt:1", "invalid host name"});
  expect_error("$(id)@a slots=1\n", {"hosts.txt:1", "invalid user name"});
  expect_error("@a slots=1\n", {"hosts.txt:1", "invalid user name"});
  expect_error("a slots=99999999999\n", {"hosts.txt:1", "slots"});
}

TEST(Hostfile, DuplicateHostIsAnErrorNamingBothLines) {
  expect_error("a slots=1\n# x\na slots=2\n", {"hosts.txt:3", "duplicate host 'a'", "line 1"});
}

TEST(Hostfile, EmptyFileIsAnError) {
  expect_error("", {"hosts.txt", "no hosts"});
  expect_error("# only a comment\n\n", {"hosts.txt", "no hosts"});
}

TEST(Hostfile, MissingFileIsAnInputError) {
  try {
    read_hostfile("/nonexistent/hostfile");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/hostfile"), std::string::npos);
  }
}

}  // namespace
}  // namespace dstrain::launcher
