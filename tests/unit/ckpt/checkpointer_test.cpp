// The checkpoint manager: components saved and restored by name, the save written in the
// background from a snapshot, `latest` moved by rank 0 only once every rank's done record exists,
// and a failed or missing rank leaving `latest` on the previous checkpoint. Two ranks are two
// Checkpointers over one directory, called in rank order from one thread (the barrier is then a
// no-op: rank 0 has prepared the directory before rank 1 writes).
#include "ckpt/checkpointer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "ckpt/layout.h"
#include "core/error.h"
#include "tests/common/temp_dir.h"

namespace dstrain::ckpt {
namespace {
namespace stdfs = std::filesystem;

// A component with a 10-element tensor "w" split between the ranks, a counter and a rank tensor.
class Counter : public Stateful {
 public:
  Counter(int rank, int world) : rank_(rank), world_(world) {}
  int state_version() const override { return version; }
  State snapshot_state(Snapshot how) const override {
    State s;
    s.json = {{"count", count}};
    const int64_t b = rank_ * 10 / world_, e = (rank_ + 1) * 10 / world_;
    s.pieces.push_back({"value", "w", {10}, b, e, snapshot_tensor(w.narrow(0, b, e - b), how)});
    if (bad_piece) s.pieces.back().end += 1;  // a numel mismatch: write_shard refuses it
    s.rank_tensors.emplace_back("mine", torch::full({2}, rank_ + 100 * count));
    return s;
  }
  void restore_state(const StateIn& in) override {
    count = in.json().at("count").get<int>();
    w = in.read("value", "w", 0, 10);
    mine = in.rank_tensor("mine");
  }
  int version = 1;
  int count = 0;
  bool bad_piece = false;
  torch::Tensor w = torch::arange(10, torch::kFloat32);
  torch::Tensor mine;

 private:
  int rank_, world_;
};

class CheckpointerTest : public ::testing::Test {
 protected:
  CheckpointerOptions options(int rank, int world) const {
    CheckpointerOptions o;
    o.dir = tmp_.path().string();
    o.rank = rank;
    o.world_size = world;
    o.commit_timeout_s = 5;
    o.node_lock_dir = tmp_.path().string();
    return o;
  }
  // Saves step `step` from `world` ranks whose counters hold `count`; returns rank 0's result.
  SaveResult save_all(int world, int64_t step, int count, int failing_rank = -1) {
    std::vector<std::unique_ptr<Counter>> parts;
    std::vector<std::unique_ptr<Checkpointer>> ranks;
    for (int r = 0; r < world; ++r) {
      parts.push_back(std::make_unique<Counter>(r, world));
      parts.back()->count = count;
      parts.back()->w += static_cast<float>(count);
      parts.back()->bad_piece = r == failing_rank;
      ranks.push_back(std::make_unique<Checkpointer>(options(r, world), [] {}));
      ranks.back()->add("counter", parts.back().get());
    }
    for (int r = 0; r < world; ++r) ranks[r]->save(step, Manifest{}, {{"note.txt", "hello"}});
    for (auto& c : ranks) c->wait();
    auto results = ranks[0]->take_finished();
    EXPECT_EQ(results.size(), 1u);
    return results.at(0);
  }
  dstrain::testing::TempDir tmp_;
};

TEST_F(CheckpointerTest, AsyncSaveCommitsAndRestoresAtAnotherWorldSize) {
  const SaveResult r = save_all(2, 10, 3);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(r.committed);
  EXPECT_EQ(read_latest(tmp_.path().string()), tag_for_step(10));
  const Manifest m = read_manifest(r.tag_dir);
  EXPECT_EQ(m.step, 10);
  EXPECT_EQ(m.world_size, 2);
  ASSERT_NE(m.component("counter"), nullptr);
  EXPECT_EQ(m.component("counter")->state.at("count"), 3);
  EXPECT_TRUE(stdfs::is_regular_file(stdfs::path(r.tag_dir) / "note.txt"));
  for (int world : {1, 3}) {
    for (int rank = 0; rank < world; ++rank) {
      Counter c(rank, world);
      Checkpointer ck(options(rank, world), [] {});
      ck.add("counter", &c);
      ck.restore(r.tag_dir);
      EXPECT_EQ(c.count, 3);
      EXPECT_TRUE(torch::equal(c.w, torch::arange(10, torch::kFloat32) + 3));
      // Rank 2 did not exist when the checkpoint was written: it finds no rank tensor.
      EXPECT_EQ(c.mine.defined(), rank < 2);
      if (c.mine.defined()) {
        EXPECT_EQ(c.mine[0].item<float>(), rank + 300);
      }
    }
  }
}

TEST_F(CheckpointerTest, SaveWritesTheSnapshotNotLaterChanges) {
  Counter c(0, 1);
  Checkpointer ck(options(0, 1), [] {});
  ck.add("counter", &c);
  c.count = 1;
  ck.save(5, Manifest{}, {});
  c.count = 2;  // training goes on while the writer works
  c.w.fill_(-1);
  ck.wait();
  const auto results = ck.take_finished();
  ASSERT_EQ(results.size(), 1u);
  ASSERT_TRUE(results[0].ok) << results[0].error;
  Counter back(0, 1);
  Checkpointer reader(options(0, 1), [] {});
  reader.add("counter", &back);
  reader.restore(results[0].tag_dir);
  EXPECT_EQ(back.count, 1);
  EXPECT_TRUE(torch::equal(back.w, torch::arange(10, torch::kFloat32)));
}

// A synchronous save writes before it returns, so host tensors go to the writer as they are (no
// copy of the state); an asynchronous one hands over copies (above).
TEST_F(CheckpointerTest, SynchronousSaveWritesTheLiveTensorsWithoutACopy) {
  const torch::Tensor live = torch::arange(4, torch::kFloat32);
  EXPECT_EQ(snapshot_tensor(live, Snapshot::kView).data_ptr(), live.data_ptr());
  EXPECT_NE(snapshot_tensor(live, Snapshot::kCopy).data_ptr(), live.data_ptr());
  Counter c(0, 1);
  CheckpointerOptions o = options(0, 1);
  o.async = false;
  Checkpointer ck(o, [] {});
  ck.add("counter", &c);
  c.w += 7;
  ck.save(6, Manifest{}, {});
  const auto results = ck.take_finished();  // already written: no wait()
  ASSERT_EQ(results.size(), 1u);
  ASSERT_TRUE(results[0].ok) << results[0].error;
  EXPECT_EQ(read_latest(tmp_.path().string()), tag_for_step(6));
  Counter back(0, 1);
  Checkpointer reader(options(0, 1), [] {});
  reader.add("counter", &back);
  reader.restore(results[0].tag_dir);
  EXPECT_TRUE(torch::equal(back.w, torch::arange(10, torch::kFloat32) + 7));
}

TEST_F(CheckpointerTest, AFailedRankLeavesLatestOnThePreviousCheckpoint) {
  ASSERT_TRUE(save_all(2, 10, 1).ok);
  const SaveResult r = save_all(2, 20, 2, /*failing_rank=*/1);
  EXPECT_FALSE(r.ok);
  EXPECT_FALSE(r.committed);
  EXPECT_NE(r.error.find("rank 1"), std::string::npos) << r.error;
  EXPECT_EQ(read_latest(tmp_.path().string()), tag_for_step(10));
  EXPECT_FALSE(stdfs::exists(tmp_.path() / tag_for_step(20) / kManifestFile));
  EXPECT_TRUE(stdfs::exists(tmp_.path() / tag_for_step(20) / shard_error_file_name(1)));
  // The next save succeeds and prunes the abandoned one.
  ASSERT_TRUE(save_all(2, 30, 3).ok);
  EXPECT_EQ(read_latest(tmp_.path().string()), tag_for_step(30));
  EXPECT_FALSE(stdfs::exists(tmp_.path() / tag_for_step(20)));
}

TEST_F(CheckpointerTest, ARankThatNeverWritesTimesOutTheCommit) {
  Counter c(0, 2);
  CheckpointerOptions o = options(0, 2);
  o.commit_timeout_s = 0.3;
  Checkpointer ck(o, [] {});
  ck.add("counter", &c);
  ck.save(7, Manifest{}, {});
  ck.wait();
  const auto results = ck.take_finished();
  ASSERT_EQ(results.size(), 1u);
  EXPECT_FALSE(results[0].ok);
  EXPECT_NE(results[0].error.find("rank 1 did not record its shard"), std::string::npos)
      << results[0].error;
  EXPECT_FALSE(read_latest(tmp_.path().string()).has_value());
}

TEST_F(CheckpointerTest, WritersWaitForAFreeSlotOfTheNode) {
  CheckpointerOptions o = options(0, 1);
  o.max_writers_per_node = 1;
  o.job_key = "slots";
  const std::string slot = (tmp_.path() / "dstrain-ckpt-slots-0.lock").string();
  const int fd = ::open(slot.c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);  // another writer of this node holds the only slot
  Counter c(0, 1);
  Checkpointer ck(o, [] {});
  ck.add("counter", &c);
  ck.save(3, Manifest{}, {});
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(stdfs::exists(tmp_.path() / tag_for_step(3) / shard_file_name(0)));
  ::close(fd);  // the slot frees
  ck.wait();
  const auto results = ck.take_finished();
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(results[0].ok) << results[0].error;
}

TEST_F(CheckpointerTest, RestoreRefusesMissingExtraOrNewerState) {
  const std::string tag_dir = save_all(1, 4, 1).tag_dir;
  auto restore_error = [&](auto&& setup) {
    Counter c(0, 1);
    Checkpointer ck(options(0, 1), [] {});
    setup(ck, c);
    try {
      ck.restore(tag_dir);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Counter other(0, 1);
  EXPECT_NE(restore_error([&](Checkpointer& ck, Counter& c) {
              ck.add("counter", &c);
              ck.add("other", &other);
            }).find("has no \"other\" state"),
            std::string::npos);
  EXPECT_NE(restore_error([](Checkpointer&, Counter&) {}).find("holds \"counter\" state"),
            std::string::npos);
  EXPECT_NE(restore_error([](Checkpointer& ck, Counter& c) {
              c.version = 0;
              ck.add("counter", &c);
            }).find("newer"),
            std::string::npos);
}

}  // namespace
}  // namespace dstrain::ckpt
