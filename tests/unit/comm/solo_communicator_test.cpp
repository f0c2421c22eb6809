// A world of one rank (comm/solo_communicator.h): every collective is what it is over one rank.
#include "comm/solo_communicator.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/error.h"

namespace dstrain::comm {
namespace {

TEST(SoloCommunicator, EveryCollectiveIsItsOneRankResult) {
  const auto c = make_solo_communicator();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->world_size(), 1);
  const torch::Tensor x = torch::arange(6, torch::kFloat);
  for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    torch::Tensor t = x.clone();
    c->all_reduce(t, op)->wait();
    EXPECT_TRUE(torch::equal(t, x));
  }
  for (int kind = 0; kind < 3; ++kind) {
    torch::Tensor out = torch::zeros({6});
    if (kind == 0) c->all_gather(out, x)->wait();
    if (kind == 1) c->reduce_scatter(out, x, ReduceOp::kAvg)->wait();
    if (kind == 2) c->all_to_all(out, x)->wait();
    EXPECT_TRUE(torch::equal(out, x)) << kind;
  }
  torch::Tensor b = x.clone();
  c->broadcast(b, 0)->wait();
  EXPECT_TRUE(torch::equal(b, x));
  EXPECT_THROW(c->broadcast(b, 1), Error);
  torch::Tensor small = torch::zeros({5});
  EXPECT_THROW(c->all_gather(small, x), Error);
  c->barrier();
  EXPECT_EQ(c->split(0)->world_size(), 1);
  EXPECT_EQ(c->stats().calls.at(CollectiveKind::kAllReduce), 3u);
}

}  // namespace
}  // namespace dstrain::comm
