#include "zero/partition.h"

#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"
#include "model/weight_decay.h"
#include "zero/no_decay.h"

namespace dstrain::zero {
namespace {

TEST(Partition, PadsFlatSizeToMultipleOfWorldSize) {
  Partition p({3, 4}, 3, 100);
  EXPECT_EQ(p.numel(), 7);
  EXPECT_EQ(p.padded_numel(), 9);
  EXPECT_EQ(p.shard_numel(), 3);
  EXPECT_EQ(p.param_offset(0), 0);
  EXPECT_EQ(p.param_offset(1), 3);
  Partition exact({4, 4}, 4, 100);
  EXPECT_EQ(exact.padded_numel(), 8);
}

TEST(Partition, BucketsAreMultiplesOfWorldSizeAndCoverThePaddedBuffer) {
  Partition p({10, 7, 5}, 4, 10);  // 22 → 24; bucket 10 → 8
  ASSERT_EQ(p.buckets().size(), 3u);
  EXPECT_EQ(p.buckets()[0].begin, 0);
  EXPECT_EQ(p.buckets()[0].end, 8);
  EXPECT_EQ(p.buckets()[1].end, 16);
  EXPECT_EQ(p.buckets()[2].begin, 16);
  EXPECT_EQ(p.buckets()[2].end, 24);
  Partition tiny({5}, 3, 1);  // bucket smaller than the world: one element per rank
  EXPECT_EQ(tiny.buckets()[0].end - tiny.buckets()[0].begin, 3);
}

TEST(Partition, RankOwnsChunkOfEveryBucketAndShardOffsetsFollowBuckets) {
  Partition p({10, 7, 5}, 4, 10);
  EXPECT_EQ(p.owned(0, 0).begin, 0);
  EXPECT_EQ(p.owned(0, 3).begin, 6);
  EXPECT_EQ(p.owned(0, 3).end, 8);
  EXPECT_EQ(p.owned(2, 1).begin, 18);
  EXPECT_EQ(p.owned(2, 1).end, 20);
  EXPECT_EQ(p.shard_offset(0), 0);
  EXPECT_EQ(p.shard_offset(1), 2);
  EXPECT_EQ(p.shard_offset(2), 4);
}

TEST(Partition, PiecesMapFlatRangeToParameterElements) {
  Partition p({3, 0, 4, 2}, 1, 100);  // includes an empty parameter
  auto pieces = p.pieces({2, 8});
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].param, 0u);
  EXPECT_EQ(pieces[0].elements.begin, 2);
  EXPECT_EQ(pieces[0].elements.end, 3);
  EXPECT_EQ(pieces[0].offset, 0);
  EXPECT_EQ(pieces[1].param, 2u);
  EXPECT_EQ(pieces[1].elements.begin, 0);
  EXPECT_EQ(pieces[1].elements.end, 4);
  EXPECT_EQ(pieces[1].offset, 1);
  EXPECT_EQ(pieces[2].param, 3u);
  EXPECT_EQ(pieces[2].elements.end, 1);
  EXPECT_EQ(pieces[2].offset, 5);
}

TEST(Partition, PaddingBelongsToNoParameter) {
  Partition p({5}, 4, 100);  // padded to 8; rank 3 owns [6, 8), rank 2 owns [4, 6)
  EXPECT_TRUE(p.owned_pieces(3).empty());
  auto mine = p.owned_pieces(2);
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0].elements.begin, 4);
  EXPECT_EQ(mine[0].elements.end, 5);
}

// Whatever the sizes, the ranks' owned pieces cover every element of every parameter exactly once,
// and each piece sits inside its rank's shard.
TEST(Partition, OwnedPiecesCoverEveryElementOnceForAnyWorldAndBucketSize) {
  const std::vector<int64_t> numels{7, 1, 0, 13, 4, 9};
  const int64_t total = std::accumulate(numels.begin(), numels.end(), int64_t{0});
  for (int world = 1; world <= 5; ++world) {
    for (int64_t bucket : {1, 3, 5, 8, 1000}) {
      Partition p(numels, world, bucket);
      std::vector<int> seen(static_cast<size_t>(total), 0);
      for (int r = 0; r < world; ++r) {
        for (const ParamPiece& piece : p.owned_pieces(r)) {
          ASSERT_GE(piece.offset, 0);
          ASSERT_LE(piece.offset + piece.elements.end - piece.elements.begin, p.shard_numel());
          for (int64_t e = piece.elements.begin; e < piece.elements.end; ++e) {
            ++seen[static_cast<size_t>(p.param_offset(piece.param) + e)];
          }
        }
      }
      for (int count : seen) ASSERT_EQ(count, 1) << "world " << world << " bucket " << bucket;
    }
  }
}

TEST(Partition, BucketsOfParameterSpanStraddledBuckets) {
  Partition p({3, 10, 2}, 2, 4);  // buckets [0,4) [4,8) [8,12) [12,15→16)
  EXPECT_EQ(p.buckets_of(0), (std::pair<size_t, size_t>{0, 0}));
  EXPECT_EQ(p.buckets_of(1), (std::pair<size_t, size_t>{0, 3}));
  EXPECT_EQ(p.buckets_of(2), (std::pair<size_t, size_t>{3, 3}));
}

TEST(Partition, RejectsNonPositiveBucketSize) {
  try {
    Partition({4}, 2, 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(e.what()).find("reduce_bucket_size"), std::string::npos);
  }
}

TEST(NoDecay, NormsBiasesAndVectorsTakeNoDecay) {
  EXPECT_TRUE(model::takes_no_decay("model.layers.0.input_layernorm.weight", 1));
  EXPECT_TRUE(model::takes_no_decay("model.norm.weight", 2));
  EXPECT_TRUE(model::takes_no_decay("fc.bias", 2));
  EXPECT_TRUE(model::takes_no_decay("scale", 1));
  EXPECT_FALSE(model::takes_no_decay("model.layers.0.mlp.up_proj.weight", 2));
}

TEST(NoDecay, MergeRangesJoinsTouchingAndDropsEmpty) {
  auto merged = merge_ranges({{5, 7}, {0, 2}, {2, 3}, {9, 9}, {6, 8}});
  ASSERT_EQ(merged.size(), 2u);
  EXPECT_EQ(merged[0].begin, 0);
  EXPECT_EQ(merged[0].end, 3);
  EXPECT_EQ(merged[1].begin, 5);
  EXPECT_EQ(merged[1].end, 8);
}

}  // namespace
}  // namespace dstrain::zero
