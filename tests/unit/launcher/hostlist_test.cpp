#include "launcher/hostlist.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace dstrain::launcher {
namespace {

using Hosts = std::vector<std::string>;

TEST(Hostlist, ExpandsRangesKeepingZeroPadding) {
  EXPECT_EQ(expand_hostlist("node[01-04,07],gpu-a[1-2]"),
            (Hosts{"node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2"}));
  EXPECT_EQ(expand_hostlist("n[098-101]"), (Hosts{"n098", "n099", "n100", "n101"}));
}

TEST(Hostlist, PlainNamesAndSingletons) {
  EXPECT_EQ(expand_hostlist("localhost"), (Hosts{"localhost"}));
  EXPECT_EQ(expand_hostlist("a,b.example.com,c[5]"), (Hosts{"a", "b.example.com", "c5"}));
}

TEST(Hostlist, SeveralBracketGroupsExpandAsAProduct) {
  EXPECT_EQ(expand_hostlist("r[1-2]n[08-09]"), (Hosts{"r1n08", "r1n09", "r2n08", "r2n09"}));
  EXPECT_EQ(expand_hostlist("rack[1-2]-x"), (Hosts{"rack1-x", "rack2-x"}));
}

TEST(Hostlist, MalformedExpressionsAreInputErrors) {
  for (const char* bad :
       {"", "node[1-2", "node1-2]", "node[]", "node[a-b]", "node[3-1]", "node[1-2],,x", "node[[1]]",
        "node[1-]", "node[-3]", ",a", "n[0-99999999]"}) {
    try {
      expand_hostlist(bad);
      ADD_FAILURE() << "no error for '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput) << bad;
      EXPECT_NE(std::string(e.what()).find("hostlist"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace dstrain::launcher
