// Tensor parallelism's regions (comm/autograd.h) over in-process ranks: Megatron's MLP — the first
// weight split by columns between enter_parallel and the second split by rows before
// leave_parallel — gives every rank the whole layer's output and, summed as the regions define,
// the input's gradient and each shard's weight gradient of one process running the whole layer;
// the same with the tokens outside the region split over the ranks (gather_rows before the
// column-parallel matmul, reduce_scatter_rows after the row-parallel one).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "comm/autograd.h"
#include "tests/common/thread_communicator.h"

namespace dstrain::comm {
namespace {

using dstrain::testing::run_ranks;
using dstrain::testing::ThreadCommunicator;
using torch::Tensor;

constexpr int64_t kTokens = 12, kHidden = 8, kInner = 12;

struct Whole {
  Tensor x, w1, w2, grad_out;
};

// The layer on one process: gelu(x · w1ᵀ) · w2ᵀ, w1 [inner, hidden], w2 [hidden, inner].
Whole whole_layer() {
  torch::manual_seed(4);
  Whole w;
  w.x = torch::randn({kTokens, kHidden}, torch::kDouble);
  w.w1 = torch::randn({kInner, kHidden}, torch::kDouble);
  w.w2 = torch::randn({kHidden, kInner}, torch::kDouble);
  w.grad_out = torch::randn({kTokens, kHidden}, torch::kDouble);
  return w;
}

Tensor mlp(const Tensor& x, const Tensor& w1, const Tensor& w2) {
  return torch::gelu(x.matmul(w1.t())).matmul(w2.t());
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  EXPECT_TRUE(torch::allclose(got, want, 1e-10, 1e-10))
      << what << ": max difference " << (got - want).abs().max().item<double>();
}

// The layer split over 2 and 3 ranks against the whole layer on one process; with
// `split_tokens` each rank holds its rows of x and of the output's gradient.
void expect_the_whole_layer(bool split_tokens) {
  const Whole w = whole_layer();
  const Tensor x = w.x.clone().requires_grad_(true), w1 = w.w1.clone().requires_grad_(true),
               w2 = w.w2.clone().requires_grad_(true);
  const Tensor want = mlp(x, w1, w2);
  want.backward(w.grad_out);
  for (const int ranks : {2, 3}) {
    run_ranks(ranks, [&](ThreadCommunicator& comm) {
      const int64_t shard = kInner / ranks, r = comm.rank();
      const auto mine = [&](const Tensor& t) {
        return split_tokens ? t.narrow(0, r * (kTokens / ranks), kTokens / ranks) : t;
      };
      const Tensor xr = mine(w.x).clone().requires_grad_(true);
      const Tensor w1r = w.w1.narrow(0, r * shard, shard).clone().requires_grad_(true);
      const Tensor w2r = w.w2.narrow(1, r * shard, shard).clone().requires_grad_(true);
      const Tensor out = split_tokens
                             ? reduce_scatter_rows(comm, mlp(gather_rows(comm, xr), w1r, w2r))
                             : leave_parallel(comm, mlp(enter_parallel(comm, xr), w1r, w2r));
      expect_close(out, mine(want.detach()), "output on rank " + std::to_string(r));
      out.backward(mine(w.grad_out));
      expect_close(xr.grad(), mine(x.grad()), "input gradient");
      expect_close(w1r.grad(), w1.grad().narrow(0, r * shard, shard), "w1 shard gradient");
      expect_close(w2r.grad(), w2.grad().narrow(1, r * shard, shard), "w2 shard gradient");
    });
  }
}

TEST(TensorParallelRegions, ColumnThenRowParallelMlpIsTheWholeLayer) {
  expect_the_whole_layer(/*split_tokens=*/false);
}

TEST(TensorParallelRegions, WithTheTokensSplitOutsideTheRegion) {
  expect_the_whole_layer(/*split_tokens=*/true);
}

TEST(TensorParallelRegions, OneRankIsTheIdentity) {
  run_ranks(1, [](ThreadCommunicator& comm) {
    const Tensor x = torch::randn({4, 3});
    EXPECT_TRUE(enter_parallel(comm, x).is_same(x));
    EXPECT_TRUE(leave_parallel(comm, x).is_same(x));
    EXPECT_TRUE(gather_rows(comm, x).is_same(x));
    EXPECT_TRUE(reduce_scatter_rows(comm, x).is_same(x));
  });
}

}  // namespace
}  // namespace dstrain::comm
