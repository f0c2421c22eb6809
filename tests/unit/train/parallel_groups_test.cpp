#include "train/parallel_groups.h"

#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include <torch/torch.h>

#include "tests/common/thread_communicator.h"

namespace dstrain::train {
namespace {

using dstrain::testing::run_ranks;
using dstrain::testing::ThreadCommunicator;
using layout::Axis;

// The world ranks of a communicator's members, in its rank order (an all-gather of them).
std::vector<int> members(comm::Communicator& c, int world_rank) {
  torch::Tensor all = torch::empty({c.world_size()}, torch::kInt64);
  c.all_gather(all, torch::tensor({int64_t{world_rank}}))->wait();
  std::vector<int> out;
  for (int64_t i = 0; i < all.numel(); ++i) out.push_back(static_cast<int>(all[i].item<int64_t>()));
  return out;
}

// Each group the trainer uses holds exactly the layout's ranks, in the layout's order.
TEST(ParallelGroups, EveryGroupIsTheLayoutsRanksInItsOrder) {
  for (const layout::Sizes sizes :
       {layout::Sizes{2, 1, 2}, layout::Sizes{1, 2, 2}, layout::Sizes{2, 1, 1},
        layout::Sizes{1, 1, 1}, layout::Sizes{1, 4, 1}}) {
    const int n = 8;
    const layout::ParallelLayout l(n, sizes);
    std::mutex mutex;
    run_ranks(n, [&](ThreadCommunicator& world) {
      ParallelGroups g(world, l);
      const int r = world.rank();
      const auto check = [&](comm::Communicator* c, layout::Axes axes, const char* what) {
        const std::vector<int> want = l.group_ranks(axes, r);
        const std::vector<int> got = c ? members(*c, r) : std::vector<int>{r};
        std::lock_guard<std::mutex> lock(mutex);
        EXPECT_EQ(got, want) << what << " of rank " << r << ", " << l.describe();
      };
      check(&g.stage(), layout::kStage, "stage");
      check(&g.slice_replicas(), layout::kSliceReplicas, "slice replicas");
      check(g.pipeline(), Axis::kPipeline, "pipeline");
      check(g.tensor(), Axis::kTensor, "tensor");
      check(g.sequence(), Axis::kSequence, "sequence");
    });
  }
}

}  // namespace
}  // namespace dstrain::train
