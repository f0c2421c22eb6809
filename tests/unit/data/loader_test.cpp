#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "data/loader.h"
#include "data/prefetch.h"
#include "test_util.h"

namespace dstrain::data {
namespace {

using testing::expect_error;

// 40 documents of 3 tokens each: pad mode gives 40 samples whose first token identifies them.
std::shared_ptr<const SampleSet> numbered_samples(int64_t n = 40) {
  auto c = std::make_shared<Corpus>();
  for (int32_t i = 0; i < n; ++i) {
    const std::vector<int32_t> d = {1000 + i, 1, 2};
    c->add_document(d.data(), 3);
  }
  std::vector<int64_t> docs(n);
  for (int64_t i = 0; i < n; ++i) docs[i] = i;
  SampleOptions o;
  o.max_length = 4;
  o.packing = Packing::kPad;
  o.eos_id = 7;
  return std::make_shared<SampleSet>(c, docs, o, "numbered");
}

std::vector<int64_t> first_column(const Batch& b) {
  auto col = b.input_ids.select(1, 0).contiguous();
  return {col.data_ptr<int64_t>(), col.data_ptr<int64_t>() + col.numel()};
}

LoaderOptions loader_options() {
  LoaderOptions o;
  o.micro_batch = 2;
  o.accum_steps = 2;
  o.world_size = 2;
  o.rank = 1;
  o.seed = 5;
  return o;
}

TEST(Loader, YieldsSamplerOrderAcrossEpochs) {
  auto samples = numbered_samples();
  Loader loader(samples, loader_options());
  EXPECT_EQ(loader.steps_per_epoch(), 5);  // 40 / (2*2*2)
  SamplerOptions so{40, 2, 2, 2, 1, 5, true, true, "numbered"};
  DistributedSampler sampler(so);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    sampler.set_epoch(epoch);
    for (int64_t step = 0; step < 5; ++step) {
      for (int64_t k = 0; k < 2; ++k) {
        Batch b = loader.next();
        EXPECT_EQ(b.epoch, epoch);
        EXPECT_EQ(b.step, step);
        EXPECT_EQ(b.micro_step, k);
        EXPECT_EQ(b.micro_steps, 2);
        EXPECT_EQ(b.last_micro_step, k == 1);
        auto expected = sampler.micro_batch_indices(step, k);
        for (auto& i : expected) i += 1000;
        EXPECT_EQ(first_column(b), expected);
      }
    }
  }
}

TEST(Loader, SavedStateResumesWithTheExactNextBatch) {
  auto samples = numbered_samples();
  Loader a(samples, loader_options());
  for (int i = 0; i < 13; ++i) a.next();  // into epoch 1, mid-step
  const std::string saved = loader_state_to_json(a.state());
  const LoaderState st = loader_state_from_json(saved, "ckpt/data.json");
  EXPECT_EQ(st.epoch, 1);
  EXPECT_EQ(st.step, 1);
  EXPECT_EQ(st.micro_step, 1);
  Loader b(samples, loader_options(), st);
  for (int i = 0; i < 12; ++i) {
    Batch x = a.next(), y = b.next();
    EXPECT_TRUE(torch::equal(x.input_ids, y.input_ids)) << "batch " << i;
    EXPECT_TRUE(torch::equal(x.labels, y.labels));
    EXPECT_EQ(x.step, y.step);
  }
  EXPECT_EQ(loader_state_to_json(a.state()), loader_state_to_json(b.state()));
}

TEST(Loader, RestoreDropsPrefetchedBatches) {
  auto samples = numbered_samples();
  Loader a(samples, loader_options());
  const LoaderState start = a.state();
  Batch first = a.next();
  a.next();
  a.restore(start);
  EXPECT_TRUE(torch::equal(a.next().input_ids, first.input_ids));
}

TEST(Loader, StateForAnotherGlobalBatchIsRefused) {
  auto samples = numbered_samples();
  LoaderState st;
  st.global_batch = 16;
  expect_error([&] { Loader(samples, loader_options(), st); }, ErrorKind::kInput,
               {"global batch of 16", "this run has 8"});
  expect_error([] { loader_state_from_json("{\"epoch\": 1}", "ckpt/data.json"); },
               ErrorKind::kInput, {"ckpt/data.json"});
}

TEST(Loader, DestroyedEarlyStopsItsThread) {
  auto samples = numbered_samples();
  for (int i = 0; i < 20; ++i) {
    Loader loader(samples, loader_options());
    if (i % 2) loader.next();
  }  // each destructor joins its thread; a hang or crash fails the test
  SUCCEED();
}

TEST(Loader, DatasetSmallerThanGlobalBatchNamesCounts) {
  expect_error([] { Loader(numbered_samples(7), loader_options()); }, ErrorKind::kInput,
               {"numbered", "7 samples", "needs 8"});
}

TEST(EvalLoader, OnePassWithEqualBatchCountsPerRank) {
  auto samples = numbered_samples(11);
  int64_t real_rows = 0;
  for (int64_t r = 0; r < 3; ++r) {
    EvalLoader loader(samples, 2, 3, r);
    int64_t batches = 0;
    while (auto b = loader.next()) {
      EXPECT_EQ(b->input_ids.size(0), 2);
      real_rows += b->num_rows;
      ++batches;
    }
    EXPECT_EQ(batches, 2);
  }
  EXPECT_EQ(real_rows, 11);
}

TEST(Prefetcher, ProducerErrorReachesConsumerAfterEarlierItems) {
  int produced = 0;
  Prefetcher<int> p(
      [&]() -> std::optional<int> {
        if (produced == 3) throw Error(ErrorKind::kInput, "bad record 3");
        return produced++;
      },
      2);
  EXPECT_EQ(p.next(), 0);
  EXPECT_EQ(p.next(), 1);
  EXPECT_EQ(p.next(), 2);
  expect_error([&] { p.next(); }, ErrorKind::kInput, {"bad record 3"});
}

TEST(Prefetcher, BoundedQueueAndCleanShutdownWhileProducerIsBlocked) {
  std::atomic<int> produced{0};
  {
    Prefetcher<int> p([&]() -> std::optional<int> { return produced++; }, 3);
    EXPECT_EQ(p.next(), 0);
    // Wait (bounded) until the producer has filled the queue and blocks.
    for (int i = 0; i < 200 && produced.load() < 4; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_LE(produced.load(), 5);  // 1 consumed + 3 queued + at most 1 in hand
  }
  const int after = produced.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(produced.load(), after);  // the thread is gone
}

TEST(Prefetcher, EndOfStreamIsNullopt) {
  int n = 0;
  Prefetcher<int> p(
      [&]() -> std::optional<int> {
        if (n == 2) return std::nullopt;
        return n++;
      },
      4);
  EXPECT_EQ(p.next(), 0);
  EXPECT_EQ(p.next(), 1);
  EXPECT_EQ(p.next(), std::nullopt);
  EXPECT_EQ(p.next(), std::nullopt);
}

}  // namespace
}  // namespace dstrain::data
