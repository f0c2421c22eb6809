#include "launcher/host_select.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace dstrain::launcher {
namespace {

std::vector<HostEntry> three_hosts() {
  return parse_hostfile("a slots=4\nb slots=2\nc slots=3\n", "hosts");
}

std::string render(const std::vector<SelectedNode>& nodes) {
  std::string out;
  for (const SelectedNode& n : nodes) {
    out += n.entry.host + ":";
    for (int s : n.slots) out += std::to_string(s);
    out += " ";
  }
  return out;
}

std::string usage_error(const HostSelection& s) {
  try {
    select_hosts(three_hosts(), s, "hosts");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(HostSelect, EverythingByDefault) {
  EXPECT_EQ(render(select_hosts(three_hosts(), {}, "hosts")), "a:0123 b:01 c:012 ");
}

TEST(HostSelect, IncludeKeepsHostfileOrderAndChosenSlots) {
  HostSelection s;
  s.include = "c@a:0,2";
  EXPECT_EQ(render(select_hosts(three_hosts(), s, "hosts")), "a:02 c:012 ");
}

TEST(HostSelect, ExcludeDropsSlotsAndWholeHosts) {
  HostSelection s;
  s.exclude = "a:1,3@b";
  EXPECT_EQ(render(select_hosts(three_hosts(), s, "hosts")), "a:02 c:012 ");
  s.exclude = "b:0,1";  // every slot excluded: the host is gone
  EXPECT_EQ(render(select_hosts(three_hosts(), s, "hosts")), "a:0123 c:012 ");
}

TEST(HostSelect, NumNodesAndNumGpus) {
  HostSelection s;
  s.num_nodes = 2;
  s.num_gpus = 3;
  EXPECT_EQ(render(select_hosts(three_hosts(), s, "hosts")), "a:012 b:01 ");
}

TEST(HostSelect, BadFiltersAreClearErrors) {
  HostSelection s;
  s.include = "a";
  s.exclude = "b";
  EXPECT_NE(usage_error(s).find("mutually exclusive"), std::string::npos);
  s = {};
  s.include = "zz:0";
  EXPECT_NE(usage_error(s).find("host 'zz' is not in the hostfile hosts"), std::string::npos);
  s = {};
  s.exclude = "zz";
  EXPECT_NE(usage_error(s).find("--exclude: host 'zz'"), std::string::npos);
  s = {};
  s.include = "b:2";
  EXPECT_NE(usage_error(s).find("slot '2' of host 'b' is not in 0..1"), std::string::npos);
  s.include = "b:x";
  EXPECT_NE(usage_error(s).find("slot 'x'"), std::string::npos);
  s.include = "b:";
  EXPECT_NE(usage_error(s).find("slot ''"), std::string::npos);
  s.include = "a@a";
  EXPECT_NE(usage_error(s).find("named twice"), std::string::npos);
  s.include = "a:1,1";
  EXPECT_NE(usage_error(s).find("named twice"), std::string::npos);
  s.include = "a@";
  EXPECT_NE(usage_error(s).find("empty host name"), std::string::npos);
  s = {};
  s.include = "a";
  s.num_nodes = 1;
  EXPECT_NE(usage_error(s).find("cannot be combined"), std::string::npos);
  s = {};
  s.num_gpus = 0;
  EXPECT_NE(usage_error(s).find("--num_gpus"), std::string::npos);
  s = {};
  s.exclude = "a@b@c";
  EXPECT_NE(usage_error(s).find("no host"), std::string::npos);
}

}  // namespace
}  // namespace dstrain::launcher
