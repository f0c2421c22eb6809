// Our flat-shard AdamW against LibTorch's own torch::optim::AdamW on the same numbers.

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/error.h"
#include "optim/optimizer.h"
#include "optim/shard_segments.h"

namespace dstrain::optim {
namespace {

constexpr int64_t kNumel = 10007;

torch::Tensor random_shard(int64_t numel, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn({numel});
}

// Runs torch::optim::AdamW over the shard split into segments: decay ones in a group with
// weight_decay, no-decay ones in a group without. Returns the shard after `steps` updates.
torch::Tensor reference_adamw(const AdamWOptions& o, const std::vector<Segment>& segments,
                              int steps, double lr) {
  torch::Tensor start = random_shard(kNumel, 1);
  std::vector<torch::Tensor> decay, no_decay, pieces;
  for (const Segment& s : segments) {
    auto piece = start.narrow(0, s.begin, s.end - s.begin).clone().requires_grad_(true);
    (s.decay ? decay : no_decay).push_back(piece);
    pieces.push_back(piece);
  }
  auto group_options = [&](double wd) {
    auto opts = std::make_unique<torch::optim::AdamWOptions>(lr);
    opts->betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(wd);
    return opts;
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decay.empty()) groups.emplace_back(decay, group_options(o.weight_decay));
  if (!no_decay.empty()) groups.emplace_back(no_decay, group_options(0.0));
  torch::optim::AdamW reference(groups, torch::optim::AdamWOptions(lr));
  for (int step = 0; step < steps; ++step) {
    torch::Tensor grad = random_shard(kNumel, 100 + step);
    for (size_t i = 0; i < pieces.size(); ++i) {
      pieces[i].mutable_grad() =
          grad.narrow(0, segments[i].begin, segments[i].end - segments[i].begin).clone();
    }
    reference.step();
  }
  std::vector<torch::Tensor> detached;
  for (auto& p : pieces) detached.push_back(p.detach());
  return torch::cat(detached);
}

torch::Tensor our_adamw(const AdamWOptions& o, int steps, double lr) {
  torch::Tensor params = random_shard(kNumel, 1);
  auto optimizer = make_adamw(kNumel, o);
  for (int step = 0; step < steps; ++step) {
    optimizer->step(params, random_shard(kNumel, 100 + step), lr);
  }
  EXPECT_EQ(optimizer->step_count(), steps);
  return params;
}

void expect_close(const torch::Tensor& ours, const torch::Tensor& reference) {
  // Relative to the shard's scale: elements near zero would make a per-element ratio meaningless,
  // and ATen's kernels use fused multiply-adds where ours do not, so the last bit can differ.
  double max_diff = (ours - reference).abs().max().item<double>();
  double scale = reference.abs().max().item<double>();
  EXPECT_LE(max_diff, 1e-6 * scale) << "largest difference from torch::optim::AdamW";
  EXPECT_FALSE(ours.equal(random_shard(kNumel, 1))) << "parameters did not move";
}

TEST(AdamW, MatchesTorchAdamWWithoutWeightDecay) {
  AdamWOptions o;
  expect_close(our_adamw(o, 50, 1e-3), reference_adamw(o, decay_segments(kNumel, {}), 50, 1e-3));
}

TEST(AdamW, MatchesTorchAdamWWithWeightDecayAndOtherBetas) {
  AdamWOptions o;
  o.beta1 = 0.8;
  o.beta2 = 0.95;
  o.eps = 1e-6;
  o.weight_decay = 0.1;
  expect_close(our_adamw(o, 50, 3e-3), reference_adamw(o, decay_segments(kNumel, {}), 50, 3e-3));
}

TEST(AdamW, NoDecayRangesMatchASecondParamGroupWithoutDecay) {
  AdamWOptions o;
  o.weight_decay = 0.5;
  o.no_decay = {{100, 1100}, {5000, 5001}, {9000, kNumel}};
  torch::Tensor ours = our_adamw(o, 50, 1e-2);
  expect_close(ours, reference_adamw(o, decay_segments(kNumel, o.no_decay), 50, 1e-2));
  // And it differs from decaying everything: the ranges really matter.
  AdamWOptions all_decay = o;
  all_decay.no_decay.clear();
  EXPECT_FALSE(torch::allclose(ours, our_adamw(all_decay, 50, 1e-2)));
}

TEST(AdamW, MultiThreadedResultIsBitIdenticalToSingleThreaded) {
  const int64_t numel = 300001;  // several parallel chunks, with a ragged tail
  AdamWOptions o;
  o.weight_decay = 0.1;
  o.no_decay = {{32760, 32780}, {100003, 200001}};
  auto run = [&](int threads) {
    at::set_num_threads(threads);
    torch::Tensor params = random_shard(numel, 7);
    auto optimizer = make_adamw(numel, o);
    for (int step = 0; step < 5; ++step)
      optimizer->step(params, random_shard(numel, 50 + step), 1e-3);
    return params;
  };
  const int saved = at::get_num_threads();
  torch::Tensor single = run(1);
  torch::Tensor multi = run(4);
  at::set_num_threads(saved);
  EXPECT_TRUE(single.equal(multi));
}

// Pieces in a scrambled order whose borders fall inside decay and no-decay segments.
const std::vector<Range> kPieces = {{7000, kNumel}, {0, 99}, {1050, 7000}, {99, 1050}};

TEST(AdamW, UpdateInPiecesIsBitIdenticalToAWholeStep) {
  AdamWOptions o;
  o.weight_decay = 0.1;
  o.no_decay = {{100, 1100}, {5000, 5001}, {9000, kNumel}};
  torch::Tensor whole = random_shard(kNumel, 1);
  torch::Tensor pieces = whole.clone();
  auto first = make_adamw(kNumel, o);
  auto second = make_adamw(kNumel, o);
  for (int step = 0; step < 5; ++step) {
    const torch::Tensor grad = random_shard(kNumel, 100 + step);
    first->step(whole, grad, 1e-2);
    second->begin_step(1e-2);
    for (const Range& r : kPieces) {
      torch::Tensor p = pieces.narrow(0, r.begin, r.end - r.begin);
      second->update(p, grad.narrow(0, r.begin, r.end - r.begin), r.begin);
    }
  }
  EXPECT_EQ(second->step_count(), 5);
  EXPECT_TRUE(pieces.equal(whole));
  for (const auto& [name, t] : first->state()) EXPECT_TRUE(second->state().at(name).equal(t));
}

TEST(AdamW, Bf16GradientsAndTheComputeCopyGiveTheFloat32Update) {
  // bf16 gradients are read exactly (the update equals the one from their float32 values); a
  // compute copy receives the updated piece rounded to bf16.
  AdamWOptions o;
  o.weight_decay = 0.1;
  torch::Tensor reference = random_shard(kNumel, 4);
  torch::Tensor updated = reference.clone();
  auto first = make_adamw(kNumel, o);
  auto second = make_adamw(kNumel, o);
  torch::Tensor copy = torch::zeros({kNumel}, torch::kBFloat16);
  for (int step = 0; step < 3; ++step) {
    const torch::Tensor grad = random_shard(kNumel, 300 + step).to(torch::kBFloat16);
    first->step(reference, grad.to(torch::kFloat), 1e-2);
    second->begin_step(1e-2);
    for (const Range& r : kPieces) {
      torch::Tensor p = updated.narrow(0, r.begin, r.end - r.begin);
      second->update(p, grad.narrow(0, r.begin, r.end - r.begin), r.begin,
                     copy.narrow(0, r.begin, r.end - r.begin));
    }
  }
  EXPECT_TRUE(updated.equal(reference));
  EXPECT_TRUE(copy.equal(reference.to(torch::kBFloat16)));
  // A compute copy of another dtype or size is refused.
  second->begin_step(1e-2);
  torch::Tensor p = updated.narrow(0, 0, 4);
  EXPECT_THROW(second->update(p, torch::zeros({4}), 0, torch::zeros({4})), Error);
  EXPECT_THROW(second->update(p, torch::zeros({4}), 0, torch::zeros({5}, torch::kBFloat16)), Error);
}

TEST(AdamW, APieceOutsideTheShardOrBeforeBeginStepIsAnInternalError) {
  auto optimizer = make_adamw(10, AdamWOptions{});
  torch::Tensor p = torch::zeros({4});
  EXPECT_THROW(optimizer->update(p, torch::zeros({4}), 0), Error);  // no begin_step()
  optimizer->begin_step(1e-3);
  try {
    optimizer->update(p, torch::zeros({4}), 7);
    ADD_FAILURE() << "a piece past the shard's end was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_NE(std::string(e.what()).find("[7, 11)"), std::string::npos) << e.what();
  }
  optimizer->update(p, torch::zeros({4}), 6);
}

TEST(AdamW, SavedAndLoadedStateContinuesIdentically) {
  AdamWOptions o;
  o.weight_decay = 0.01;
  torch::Tensor params = random_shard(kNumel, 3);
  auto first = make_adamw(kNumel, o);
  for (int step = 0; step < 10; ++step) first->step(params, random_shard(kNumel, 200 + step), 1e-3);
  std::map<std::string, torch::Tensor> saved;
  for (const auto& [name, t] : first->state()) saved[name] = t.clone();
  torch::Tensor saved_params = params.clone();
  for (int step = 10; step < 20; ++step)
    first->step(params, random_shard(kNumel, 200 + step), 1e-3);

  auto second = make_adamw(kNumel, o);
  second->load_state(saved, 10);
  for (int step = 10; step < 20; ++step)
    second->step(saved_params, random_shard(kNumel, 200 + step), 1e-3);
  EXPECT_EQ(second->step_count(), 20);
  EXPECT_TRUE(saved_params.equal(params));
}

TEST(AdamW, LoadStateRejectsWrongNamesAndSizes) {
  auto optimizer = make_adamw(10, AdamWOptions{});
  auto expect_input_error = [&](std::map<std::string, torch::Tensor> state, const char* fragment) {
    try {
      optimizer->load_state(state, 1);
      ADD_FAILURE() << "expected an input error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_input_error({{"exp_avg", torch::zeros({10})}}, "'exp_avg_sq' is missing");
  expect_input_error({{"exp_avg", torch::zeros({10})}, {"exp_avg_sq", torch::zeros({9})}},
                     "has 9 elements");
  expect_input_error({{"exp_avg", torch::zeros({10})},
                      {"exp_avg_sq", torch::zeros({10})},
                      {"m", torch::zeros({10})}},
                     "unexpected tensor 'm'");
}

TEST(AdamW, BadHyperparametersAreConfigErrors) {
  AdamWOptions o;
  o.beta2 = 1.0;
  EXPECT_THROW(make_adamw(10, o), Error);
}

TEST(DecaySegments, SplitsTheShardAroundSortedMergedNoDecayRanges) {
  auto segments = decay_segments(20, {{12, 15}, {2, 5}, {4, 8}, {15, 16}});
  std::vector<std::tuple<int64_t, int64_t, bool>> got;
  for (const auto& s : segments) got.emplace_back(s.begin, s.end, s.decay);
  std::vector<std::tuple<int64_t, int64_t, bool>> want = {
      {0, 2, true}, {2, 8, false}, {8, 12, true}, {12, 16, false}, {16, 20, true}};
  EXPECT_EQ(got, want);
  EXPECT_THROW(decay_segments(20, {{5, 21}}), Error);
}

}  // namespace
}  // namespace dstrain::optim
