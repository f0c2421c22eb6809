#include <gtest/gtest.h>
#include <torch/torch.h>

#include "optim/optimizer.h"

namespace dstrain::optim {
namespace {

torch::Tensor seeded(int64_t numel, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn({numel});
}

TEST(Sgd, MatchesTorchSgdWithMomentumWeightDecayAndANoDecayRange) {
  const int64_t n = 1000;
  SgdOptions o;
  o.momentum = 0.9;
  o.weight_decay = 0.05;
  o.no_decay = {{600, n}};
  torch::Tensor ours = seeded(n, 1);
  auto optimizer = make_sgd(n, o);

  auto decay_part = seeded(n, 1).narrow(0, 0, 600).clone().requires_grad_(true);
  auto plain_part = seeded(n, 1).narrow(0, 600, 400).clone().requires_grad_(true);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{decay_part},
                      std::make_unique<torch::optim::SGDOptions>(
                          torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.05)));
  groups.emplace_back(
      std::vector<torch::Tensor>{plain_part},
      std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.1).momentum(0.9)));
  torch::optim::SGD reference(groups, torch::optim::SGDOptions(0.1));

  for (int step = 0; step < 30; ++step) {
    torch::Tensor grad = seeded(n, 10 + step);
    optimizer->step(ours, grad, 0.1);
    decay_part.mutable_grad() = grad.narrow(0, 0, 600).clone();
    plain_part.mutable_grad() = grad.narrow(0, 600, 400).clone();
    reference.step();
  }
  torch::Tensor expected = torch::cat({decay_part.detach(), plain_part.detach()});
  EXPECT_TRUE(torch::allclose(ours, expected, 1e-6, 1e-7));
  EXPECT_FALSE(torch::allclose(ours, seeded(n, 1)));
}

TEST(Sgd, UpdateInPiecesIsBitIdenticalToAWholeStep) {
  const int64_t n = 1000;
  SgdOptions o;
  o.momentum = 0.9;
  o.weight_decay = 0.05;
  o.no_decay = {{300, 700}};
  torch::Tensor whole = seeded(n, 1);
  torch::Tensor pieces = whole.clone();
  auto first = make_sgd(n, o);
  auto second = make_sgd(n, o);
  torch::Tensor copy = torch::zeros({n}, torch::kBFloat16);  // the pieces' compute copy
  for (int step = 0; step < 5; ++step) {
    const torch::Tensor grad = seeded(n, 10 + step);
    first->step(whole, grad, 0.1);
    second->begin_step(0.1);
    for (const Range& r : {Range{500, n}, Range{0, 500}}) {
      torch::Tensor p = pieces.narrow(0, r.begin, r.end - r.begin);
      second->update(p, grad.narrow(0, r.begin, r.end - r.begin), r.begin,
                     copy.narrow(0, r.begin, r.end - r.begin));
    }
  }
  EXPECT_TRUE(pieces.equal(whole));
  EXPECT_TRUE(copy.equal(whole.to(torch::kBFloat16)));
  EXPECT_FALSE(whole.equal(seeded(n, 1)));
}

}  // namespace
}  // namespace dstrain::optim
