#include "layout/parallel_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "config/config.h"
#include "core/error.h"

namespace dstrain::layout {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// P 2 x D 2 x S 1 x T 2 over 8 ranks: stages {0-3}, {4-7}; tensor pairs {0,1}, {2,3}, ...
ParallelLayout p2_d2_t2() {
  return ParallelLayout(8, Sizes{2, 1, 2, 1, 1});
}

TEST(ParallelLayout, CoordinatesFollowTheMeshOutermostFirst) {
  const ParallelLayout l = p2_d2_t2();
  EXPECT_EQ(l.size(Axis::kData), 2);
  // rank 6 = ((1·2 + 1)·1 + 0)·2 + 0
  EXPECT_EQ(l.coordinate(Axis::kPipeline, 6), 1);
  EXPECT_EQ(l.coordinate(Axis::kData, 6), 1);
  EXPECT_EQ(l.coordinate(Axis::kSequence, 6), 0);
  EXPECT_EQ(l.coordinate(Axis::kTensor, 6), 0);
  EXPECT_EQ(l.coordinate(Axis::kTensor, 7), 1);
}

TEST(ParallelLayout, GroupsAreTheRanksThatDifferOnlyOnTheirAxes) {
  const ParallelLayout l = p2_d2_t2();
  EXPECT_THAT(l.group_ranks(Axis::kTensor, 5), ElementsAre(4, 5));
  EXPECT_THAT(l.group_ranks(Axis::kPipeline, 5), ElementsAre(1, 5));
  EXPECT_THAT(l.group_ranks(kStage, 5), ElementsAre(4, 5, 6, 7));
  EXPECT_THAT(l.group_ranks(kSliceReplicas, 5), ElementsAre(5, 7));
  EXPECT_THAT(l.group_ranks(kSameSamples, 2), ElementsAre(2, 3, 6, 7));
  EXPECT_EQ(l.group_rank(kSliceReplicas, 7), 1);
  EXPECT_EQ(l.group_rank(Axis::kPipeline, 7), 1);
  EXPECT_EQ(l.group_size(kStage), 4);
}

TEST(ParallelLayout, GroupIndexIsOneColorPerGroupAndEveryGroupIsCovered) {
  // Every (axes, group) pair: the ranks with one color are exactly the group, and the colors are
  // 0 .. world / group size − 1.
  const ParallelLayout l(24, Sizes{2, 3, 2, 1, 1});
  for (Axes axes : {Axes(Axis::kPipeline), Axes(Axis::kData), Axes(Axis::kSequence),
                    Axes(Axis::kTensor), kStage, kSliceReplicas, kSameSamples}) {
    std::vector<std::vector<int>> by_color(static_cast<size_t>(24 / l.group_size(axes)));
    for (int r = 0; r < 24; ++r) {
      by_color.at(static_cast<size_t>(l.group_index(axes, r))).push_back(r);
    }
    for (int r = 0; r < 24; ++r) {
      const auto& members = by_color[static_cast<size_t>(l.group_index(axes, r))];
      EXPECT_EQ(members, l.group_ranks(axes, r));
      EXPECT_EQ(members.at(static_cast<size_t>(l.group_rank(axes, r))), r);
    }
  }
}

TEST(ParallelLayout, TheExpertMeshRefoldsEachStagesRanks) {
  // P 2, stage of 8 ranks (D 2 x S 2 x T 2) folded as ED 2 x E 2 x ET 2, then as ED 1 x E 8.
  const ParallelLayout l(16, Sizes{2, 2, 2, 2, 2});
  EXPECT_EQ(l.size(Axis::kExpertData), 2);
  EXPECT_THAT(l.group_ranks(Axis::kExpert, 9), ElementsAre(9, 11));
  EXPECT_THAT(l.group_ranks(Axis::kExpertData, 9), ElementsAre(9, 13));
  EXPECT_THAT(l.group_ranks(Axis::kExpertTensor, 9), ElementsAre(8, 9));
  const ParallelLayout wide(16, Sizes{2, 2, 2, 8, 1});
  EXPECT_THAT(wide.group_ranks(Axis::kExpert, 3), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_EQ(wide.size(Axis::kExpertData), 1);
  EXPECT_THROW(l.group_ranks(Axis::kExpert | Axis::kTensor, 0), Error);
}

TEST(ParallelLayout, RefusesSizesThatDoNotDivideTheWorldWithTheNumbers) {
  try {
    ParallelLayout(6, Sizes{2, 1, 2, 1, 1});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_THAT(e.what(), HasSubstr("the world size (6) is not divisible by "
                                    "parallel.pipeline_parallel_size (2) x "
                                    "parallel.sequence_parallel_size (1) x "
                                    "parallel.tensor_parallel_size (2)"));
  }
  EXPECT_THROW(ParallelLayout(8, Sizes{1, 1, 1, 3, 1}), Error);
  EXPECT_THROW(ParallelLayout(8, Sizes{0, 1, 1, 1, 1}), Error);
}

TEST(ParallelLayout, LayoutOfAConfigTakesItsParallelSection) {
  config::ParallelSection p;
  p.pipeline_parallel_size = 2;
  p.tensor_parallel_size = 2;
  const ParallelLayout l = layout_of(p, 8);
  EXPECT_EQ(l.size(Axis::kData), 2);
  EXPECT_EQ(l.describe(), "pipeline 2 x data 2 x sequence 1 x tensor 2 (8 ranks)");
}

}  // namespace
}  // namespace dstrain::layout
