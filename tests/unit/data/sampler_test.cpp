#include <algorithm>
#include <set>

#include <gtest/gtest.h>

#include "data/eval_sampler.h"
#include "data/sampler.h"
#include "test_util.h"

namespace dstrain::data {
namespace {

using testing::expect_error;

SamplerOptions make(int64_t n, int64_t micro, int64_t accum, int64_t world, int64_t rank) {
  SamplerOptions o;
  o.num_samples = n;
  o.micro_batch = micro;
  o.accum_steps = accum;
  o.world_size = world;
  o.rank = rank;
  o.seed = 1234;
  o.dataset_name = "train.jsonl";
  return o;
}

// Every sample index one optimizer step consumes, over all ranks and micro-steps, sorted.
std::vector<int64_t> step_set(int64_t n, int64_t micro, int64_t accum, int64_t world, int64_t epoch,
                              int64_t step) {
  std::vector<int64_t> all;
  for (int64_t r = 0; r < world; ++r) {
    DistributedSampler s(make(n, micro, accum, world, r));
    s.set_epoch(epoch);
    for (int64_t k = 0; k < accum; ++k) {
      auto idx = s.micro_batch_indices(step, k);
      all.insert(all.end(), idx.begin(), idx.end());
    }
  }
  std::sort(all.begin(), all.end());
  return all;
}

TEST(DistributedSampler, RanksAreDisjointAndCoverEachStep) {
  const int64_t n = 103, micro = 2, accum = 3, world = 3;  // G = 18, 5 steps, 13 dropped
  std::set<int64_t> seen;
  for (int64_t step = 0; step < 5; ++step) {
    auto set = step_set(n, micro, accum, world, 0, step);
    ASSERT_EQ(set.size(), 18u);
    EXPECT_EQ(std::adjacent_find(set.begin(), set.end()), set.end()) << "duplicate in step";
    for (int64_t i : set) EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " twice";
    DistributedSampler s(make(n, micro, accum, world, 0));
    s.set_epoch(0);
    auto block = s.step_indices(step);
    std::sort(block.begin(), block.end());
    EXPECT_EQ(block, set);
  }
  EXPECT_EQ(seen.size(), 90u);
  EXPECT_EQ(DistributedSampler(make(n, micro, accum, world, 0)).steps_per_epoch(), 5);
}

TEST(DistributedSampler, SameSamplesPerStepForWorldSizes1To3WithEqualGlobalBatch) {
  const int64_t n = 200;
  for (int64_t epoch : {0, 1}) {
    for (int64_t step = 0; step < 3; ++step) {
      const auto one = step_set(n, 2, 6, 1, epoch, step);    // G = 12
      const auto two = step_set(n, 3, 2, 2, epoch, step);    // G = 12
      const auto three = step_set(n, 2, 2, 3, epoch, step);  // G = 12
      EXPECT_EQ(one, two) << "epoch " << epoch << " step " << step;
      EXPECT_EQ(one, three) << "epoch " << epoch << " step " << step;
    }
  }
}

TEST(DistributedSampler, DocumentedIndexFormula) {
  // Rank r, micro-step k, row b of step s gets P_e[s*G + k*W*B + r*B + b].
  const auto perm = epoch_permutation(60, 1234, 2, true);
  DistributedSampler s(make(60, 2, 3, 2, 1));
  s.set_epoch(2);
  EXPECT_EQ(s.micro_batch_indices(1, 2),
            (std::vector<int64_t>{perm[12 + 8 + 2], perm[12 + 8 + 3]}));
}

TEST(DistributedSampler, DeterministicAndReshuffledEachEpoch) {
  DistributedSampler a(make(50, 5, 1, 1, 0)), b(make(50, 5, 1, 1, 0));
  a.set_epoch(0);
  b.set_epoch(0);
  EXPECT_EQ(a.step_indices(0), b.step_indices(0));
  const auto e0 = epoch_permutation(50, 1234, 0, true);
  const auto e1 = epoch_permutation(50, 1234, 1, true);
  EXPECT_NE(e0, e1);
  auto sorted = e1;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, epoch_permutation(50, 0, 0, false));  // a permutation of 0..49
  EXPECT_NE(e0, epoch_permutation(50, 99, 0, true));      // the seed matters
  a.set_epoch(1);
  EXPECT_NE(a.step_indices(0), b.step_indices(0));
}

TEST(DistributedSampler, NoShuffleKeepsOrder) {
  auto o = make(10, 2, 1, 2, 1);
  o.shuffle = false;
  DistributedSampler s(o);
  s.set_epoch(3);
  EXPECT_EQ(s.micro_batch_indices(1, 0), (std::vector<int64_t>{6, 7}));
}

TEST(DistributedSampler, WithoutDropLastTheLastStepWrapsAround) {
  auto o = make(10, 2, 1, 2, 1);
  o.shuffle = false;
  o.drop_last = false;
  DistributedSampler s(o);
  EXPECT_EQ(s.steps_per_epoch(), 3);
  s.set_epoch(0);
  EXPECT_EQ(s.micro_batch_indices(2, 0), (std::vector<int64_t>{0, 1}));  // positions 10, 11
}

TEST(DistributedSampler, DatasetSmallerThanGlobalBatchIsInputError) {
  expect_error([] { DistributedSampler(make(7, 2, 2, 2, 0)); }, ErrorKind::kInput,
               {"train.jsonl", "7 samples", "global batch needs 8"});
}

TEST(DistributedSampler, BadRankIsConfigError) {
  expect_error([] { DistributedSampler(make(70, 2, 2, 2, 2)); }, ErrorKind::kConfig, {"rank 2"});
}

TEST(EvalSampler, CoversEverySampleOnceWithFillerRowsAndEqualBatchCounts) {
  const int64_t n = 11, micro = 2, world = 3;  // block 6 → 2 batches, 1 filler row
  std::vector<int64_t> seen;
  int64_t fillers = 0;
  for (int64_t r = 0; r < world; ++r) {
    EvalSampler s(n, micro, world, r);
    EXPECT_EQ(s.num_batches(), 2);
    for (int64_t b = 0; b < s.num_batches(); ++b) {
      for (int64_t i : s.batch_indices(b)) {
        if (i < 0) {
          ++fillers;
        } else {
          seen.push_back(i);
        }
      }
    }
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, epoch_permutation(11, 0, 0, false));
  EXPECT_EQ(fillers, 1);
  EXPECT_EQ(EvalSampler(n, micro, world, 2).batch_indices(1), (std::vector<int64_t>{10, -1}));
}

}  // namespace
}  // namespace dstrain::data
