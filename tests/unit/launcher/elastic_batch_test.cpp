#include "launcher/elastic_batch.h"

#include <set>

#include <gtest/gtest.h>

namespace dstrain::launcher {
namespace {

TEST(ElasticBatch, ShrunkWorldsAreTheSumsOfAtLeastMinNodes) {
  EXPECT_EQ(shrunk_worlds({1, 1, 1}, 2), (std::set<int>{2}));
  EXPECT_EQ(shrunk_worlds({2, 2, 2, 2}, 1), (std::set<int>{2, 4, 6}));
  EXPECT_EQ(shrunk_worlds({1, 2, 4}, 1), (std::set<int>{1, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(shrunk_worlds({4}, 1).empty());
}

}  // namespace
}  // namespace dstrain::launcher
