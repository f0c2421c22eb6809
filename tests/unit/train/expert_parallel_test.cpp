// Expert parallelism (train/expert_parallel.h, model/moe.h): a MoE layer whose 4 experts are spread
// over 2 ranks, each rank routing its own tokens, against the same layer holding every expert on
// each rank: the outputs, the inputs' and the router's gradients, and each rank's expert gradients
// (those of both ranks' tokens) equal; the all-to-all bytes each rank sends are exactly what the
// routing asks for (the counts, then the rows crossing to the other rank and back, forward and
// backward), so an exchange that moved expert weights, or every row, would fail it. With a routing
// that sends every token of both ranks to the first rank's experts the second computes nothing
// and the results are still equal. Through parallelize() each rank holds half of every expert
// stack, placed over the expert-parallel group, and its engine holds half of the experts' bytes.
#include <mutex>

#include <gtest/gtest.h>

#include "model/model.h"
#include "model/moe.h"
#include "tests/common/thread_communicator.h"
#include "tests/unit/model/test_util.h"
#include "tests/unit/train/engine_test_util.h"
#include "train/expert_parallel.h"
#include "train/parallelize.h"
#include "train/run_plan.h"

namespace dstrain::train {
namespace {

using dstrain::testing::run_ranks;
using dstrain::testing::ThreadCommunicator;

constexpr int64_t kTokens = 24;

model::ModelConfig moe_config() {
  nlohmann::json doc = model::testing::small_config_json("qwen3_moe");
  doc["num_experts"] = 4;
  doc["num_experts_per_tok"] = 2;
  doc["moe_intermediate_size"] = 16;
  doc["norm_topk_prob"] = true;
  return model::parse_model_config(doc);
}

// The layer with every expert, with `values` (drawn once: the ranks' threads share the generator).
model::SparseMoe whole_layer(const model::ModelConfig& c,
                             const std::vector<torch::Tensor>& values) {
  model::SparseMoe moe(c, model::Materialize::kYes);
  torch::NoGradGuard no_grad;
  const auto params = moe->parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(values.at(i));
  return moe;
}

// The layer's values; `skewed`: every token with positive inputs picks experts 0 and 1.
std::vector<torch::Tensor> layer_values(const model::ModelConfig& c, bool skewed) {
  torch::manual_seed(5);
  model::SparseMoe moe(c, model::Materialize::kYes);
  std::vector<torch::Tensor> out;
  for (const auto& p : moe->parameters()) out.push_back(torch::randn(p.sizes()) * 0.3);
  if (skewed) {
    out.at(0).narrow(0, 0, 2).fill_(1.0);  // the router
    out.at(0).narrow(0, 2, 2).fill_(-1.0);
  }
  return out;
}

// Within float32 rounding of sums over the ranks' rows, relative to the largest element.
::testing::AssertionResult close(const torch::Tensor& got, const torch::Tensor& want) {
  const double diff = (got - want).abs().max().item<double>();
  const double scale = want.abs().max().item<double>();
  if (diff <= 1e-6 * scale + 1e-7) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "differs by " << diff << " of " << scale;
}

class ExpertDispatch : public ::testing::TestWithParam<bool> {};

TEST_P(ExpertDispatch, EqualsEveryExpertOnEachRankAndSendsWhatTheRoutingAsks) {
  const bool skewed = GetParam();
  const model::ModelConfig c = moe_config();
  const int64_t C = c.hidden_size, E = c.moe.experts;
  const std::vector<torch::Tensor> values = layer_values(c, skewed);
  std::vector<torch::Tensor> inputs, weights;
  torch::manual_seed(100);
  for (int r = 0; r < 2; ++r) {
    inputs.push_back(skewed ? torch::randn({kTokens, C}).abs() + 0.1 : torch::randn({kTokens, C}));
    weights.push_back(torch::randn({kTokens, C}));
  }
  std::mutex mutex;
  std::vector<int64_t> computed(2);
  run_ranks(2, [&](ThreadCommunicator& world) {
    torch::set_num_threads(1);
    const int r = world.rank();
    model::SparseMoe whole = whole_layer(c, values);
    ExpertParallelGroup group(world);
    model::SparseMoe mine(c, model::Materialize::kYes, 0, &group);
    {
      torch::NoGradGuard no_grad;
      mine->gate->weight.copy_(whole->gate->weight);
      mine->experts->gate_up_proj.copy_(whole->experts->gate_up_proj.narrow(0, r * E / 2, E / 2));
      mine->experts->down_proj.copy_(whole->experts->down_proj.narrow(0, r * E / 2, E / 2));
    }
    const torch::Tensor x = inputs[r], weight = weights[r];
    const torch::Tensor x_whole = x.clone().requires_grad_(true);
    const torch::Tensor x_mine = x.clone().requires_grad_(true);

    const torch::Tensor want = whole->forward(x_whole);
    (want * weight).sum().backward();
    world.reset_stats();
    const torch::Tensor got = mine->forward(x_mine);
    (got * weight).sum().backward();
    const uint64_t sent = world.stats().bytes_sent.at(comm::CollectiveKind::kAllToAll);

    EXPECT_TRUE(close(got, want));
    EXPECT_TRUE(close(x_mine.grad(), x_whole.grad()));
    EXPECT_TRUE(close(mine->gate->weight.grad(), whole->gate->weight.grad()));
    // This rank's experts' gradients are those of both ranks' tokens.
    for (const auto& [local, all] :
         {std::pair{mine->experts->gate_up_proj, whole->experts->gate_up_proj},
          std::pair{mine->experts->down_proj, whole->experts->down_proj}}) {
      torch::Tensor sum = all.grad().clone();
      world.all_reduce(sum, comm::ReduceOp::kSum)->wait();
      EXPECT_TRUE(close(local.grad(), sum.narrow(0, r * E / 2, E / 2)));
    }
    // The rows this rank's routing sends to the other rank's experts, and the other's to this.
    const auto [top, chosen] =
        torch::softmax(torch::matmul(x, whole->gate->weight.t()), -1).topk(c.moe.top_k, -1);
    const torch::Tensor crossing = (chosen.div(E / 2, "floor") != r).sum().to(torch::kDouble);
    torch::Tensor both = crossing.reshape({1}).clone();
    world.all_reduce(both, comm::ReduceOp::kSum)->wait();
    const auto rows = static_cast<uint64_t>(both.item<double>());
    // The counts ([2, 2] float64, half of them to the other rank), then each crossing row
    // (C float32) once there and once back, forward and backward.
    EXPECT_EQ(sent, 2 * 2 * 8 / 2 + 2 * rows * C * 4) << "rank " << r;
    std::lock_guard<std::mutex> lock(mutex);
    computed[r] = mine->experts->gate_up_proj.grad().abs().sum().item<double>() > 0;
  });
  if (skewed) {
    EXPECT_EQ(computed, (std::vector<int64_t>{1, 0}));  // every token on the first rank's experts
  } else {
    EXPECT_EQ(computed, (std::vector<int64_t>{1, 1}));
  }
}

INSTANTIATE_TEST_SUITE_P(Routing, ExpertDispatch, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Skewed" : "Spread"; });

// Each rank's model and engine hold half of every expert stack.
TEST(ExpertParallelize, EachRankHoldsItsShareOfTheExperts) {
  nlohmann::json doc = model::testing::small_config_json("qwen3_moe");
  doc["num_experts"] = 4;
  doc["num_experts_per_tok"] = 2;
  doc["moe_intermediate_size"] = 16;
  const model::ModelConfig config = model::parse_model_config(doc);
  model::DecoderModel whole(config, model::Materialize::kNo);
  const model::ValueSource values = model::init_source(*whole, 3);
  int64_t expert_numel = 0;
  for (const auto& item : whole->named_parameters()) {
    if (item.key().find(".experts.") != std::string::npos) expert_numel += item.value().numel();
  }
  ASSERT_GT(expert_numel, 0);
  std::mutex mutex;
  std::map<int, int64_t> bytes;  // expert_parallel_size → rank 0's parameter bytes
  for (const int ep : {1, 2}) {
    run_ranks(2, [&](ThreadCommunicator& world) {
      torch::set_num_threads(1);
      layout::Sizes sizes;
      sizes.expert = ep;
      ParallelPlan plan;
      plan.optimizer = testing::adamw();
      plan.initial_values = values;
      Parallelized p =
          parallelize(world, layout::ParallelLayout(2, sizes), torch::kCPU, config, plan);
      for (const auto& block : p.model->blocks()) {
        for (const model::BlockParameter& bp : block->parameters) {
          if (bp.name.find(".experts.") == std::string::npos) continue;
          EXPECT_EQ(bp.tensor.size(0), 4 / ep) << bp.name;
          EXPECT_EQ(bp.placement.group == model::PlacementGroup::kExpert, ep > 1) << bp.name;
        }
      }
      if (world.rank() != 0) return;
      std::lock_guard<std::mutex> lock(mutex);
      bytes[ep] = p.engine->bytes().compute_params;
    });
  }
  // Stage 0 in float32: every parameter's bytes, the flat buffers padded to the ranks.
  EXPECT_NEAR(static_cast<double>(bytes[1] - bytes[2]), expert_numel * 4 / 2.0, 16);
  // The memory model (`dstrain estimate`, the planners) holds what the engine holds: the rest of
  // the model over both ranks and this rank's experts over the ranks that hold them.
  config::Config run;
  run.parallel.expert_parallel_size = 2;
  const RunMemory memory(run, config, 2, /*cuda=*/false);
  ASSERT_TRUE(memory.expert_parallel());
  const auto params = [&](model::PlacementGroup group) {
    return estimate::estimate_row(memory.model_states_input(0, group), 0, false, false).params;
  };
  EXPECT_EQ(params(model::PlacementGroup::kTensor) + params(model::PlacementGroup::kExpert),
            bytes[2]);
}

}  // namespace
}  // namespace dstrain::train
