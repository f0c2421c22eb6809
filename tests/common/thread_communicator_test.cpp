#include "tests/common/thread_communicator.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include "core/error.h"

namespace dstrain::testing {
namespace {

using comm::CollectiveKind;
using comm::ReduceOp;

TEST(ThreadCommunicator, CollectivesMatchTheirDefinitions) {
  run_ranks(3, [](ThreadCommunicator& comm) {
    const int r = comm.rank();
    torch::Tensor t = torch::full({4}, static_cast<float>(r + 1));
    comm.all_reduce(t, ReduceOp::kSum)->wait();
    EXPECT_TRUE(t.equal(torch::full({4}, 6.0f)));

    torch::Tensor in = torch::arange(6, torch::kFloat32) * (r + 1);  // chunks of 2
    torch::Tensor out = torch::empty({2});
    comm.reduce_scatter(out, in, ReduceOp::kAvg)->wait();
    EXPECT_TRUE(out.allclose(torch::arange(2 * r, 2 * r + 2, torch::kFloat32) * 2));

    torch::Tensor gathered = torch::empty({3});
    comm.all_gather(gathered, torch::full({1}, static_cast<float>(r)))->wait();
    EXPECT_TRUE(gathered.equal(torch::arange(3, torch::kFloat32)));

    torch::Tensor b = torch::full({2}, static_cast<float>(r));
    comm.broadcast(b, 2)->wait();
    EXPECT_TRUE(b.equal(torch::full({2}, 2.0f)));
    comm.barrier();
  });
}

TEST(ThreadCommunicator, CountsRingBytes) {
  run_ranks(4, [](ThreadCommunicator& comm) {
    torch::Tensor t = torch::zeros({100});  // 400 bytes
    comm.all_reduce(t, ReduceOp::kSum)->wait();
    torch::Tensor out = torch::empty({25});
    comm.reduce_scatter(out, t, ReduceOp::kSum)->wait();
    comm.all_gather(t, out)->wait();
    EXPECT_EQ(comm.stats().bytes_sent.at(CollectiveKind::kAllReduce), 600u);
    EXPECT_EQ(comm.stats().bytes_sent.at(CollectiveKind::kReduceScatter), 300u);
    EXPECT_EQ(comm.stats().bytes_sent.at(CollectiveKind::kAllGather), 300u);
  });
}

TEST(ThreadCommunicator, AllToAllSendsChunkJToRankJ) {
  run_ranks(3, [](ThreadCommunicator& comm) {
    const int r = comm.rank();
    torch::Tensor in = torch::arange(6, torch::kFloat32) + 10 * r;  // chunks of 2
    torch::Tensor out = torch::empty({6});
    comm.all_to_all(out, in)->wait();
    // Chunk q of the output is rank q's chunk r.
    for (int q = 0; q < 3; ++q) {
      EXPECT_TRUE(
          out.narrow(0, 2 * q, 2).equal(torch::arange(2 * r, 2 * r + 2, torch::kFloat32) + 10 * q));
    }
    EXPECT_EQ(comm.stats().bytes_sent.at(CollectiveKind::kAllToAll), 16u);
  });
}

TEST(ThreadCommunicator, TransfersArriveInOrderAndAreCounted) {
  run_ranks(3, [](ThreadCommunicator& comm) {
    const int r = comm.rank(), next = (r + 1) % 3, prev = (r + 2) % 3;
    torch::Tensor got = torch::empty({4});
    comm.exchange({{CollectiveKind::kSend, torch::full({4}, static_cast<float>(r)), next},
                   {CollectiveKind::kRecv, got, prev}})
        ->wait();
    EXPECT_TRUE(got.equal(torch::full({4}, static_cast<float>(prev))));
    if (r == 0) {
      for (int i = 0; i < 3; ++i) comm.send(torch::full({2}, static_cast<float>(i)), 1)->wait();
      comm.barrier();
    } else if (r == 1) {
      for (int i = 0; i < 3; ++i) {
        torch::Tensor m = torch::empty({2});
        comm.recv(m, 0)->wait();
        EXPECT_TRUE(m.equal(torch::full({2}, static_cast<float>(i)))) << "message " << i;
      }
      comm.send(torch::ones({2}), 2)->wait();
      comm.barrier();
    } else {
      comm.barrier();
      torch::Tensor wrong = torch::empty({3});
      EXPECT_THROW(comm.recv(wrong, 1)->wait(), Error) << "a size that does not match";
    }
    EXPECT_EQ(comm.stats().bytes_sent.at(CollectiveKind::kSend),
              r == 0 ? 16u + 24u : (r == 1 ? 16u + 8u : 16u));
    EXPECT_THROW(comm.send(torch::ones({1}), r), Error) << "a transfer to itself";
  });
}

TEST(ThreadCommunicator, SplitGroupsRanksOfOneColorInRankOrder) {
  run_ranks(4, [](ThreadCommunicator& comm) {
    const int r = comm.rank();
    auto group = comm.split(r / 2);  // {0, 1} and {2, 3}
    EXPECT_EQ(group->world_size(), 2);
    EXPECT_EQ(group->rank(), r % 2);
    torch::Tensor t = torch::full({1}, static_cast<float>(r));
    group->all_reduce(t, ReduceOp::kSum)->wait();
    EXPECT_EQ(t.item<float>(), r < 2 ? 1.0f : 5.0f);
    comm.barrier();  // the world still works beside its groups
  });
}

// Inputs are read in wait(), as an asynchronous backend may: changing them before wait() shows.
TEST(ThreadCommunicator, ReadsBuffersOnlyWhenWaitedOn) {
  run_ranks(2, [](ThreadCommunicator& comm) {
    torch::Tensor t = torch::ones({2});
    auto work = comm.all_reduce(t, ReduceOp::kSum);
    t.fill_(5);
    work->wait();
    EXPECT_TRUE(t.equal(torch::full({2}, 10.0f)));
  });
}

TEST(ThreadCommunicator, MismatchedCollectivesFail) {
  EXPECT_THROW(run_ranks(2,
                         [](ThreadCommunicator& comm) {
                           torch::Tensor t = torch::ones({comm.rank() + 1});
                           comm.all_reduce(t, ReduceOp::kSum)->wait();
                         }),
               Error);
}

}  // namespace
}  // namespace dstrain::testing
