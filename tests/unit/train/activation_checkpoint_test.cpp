// Activation checkpointing in training, plain and selective (attention kept, not recomputed): LoRA
// dropout replayed in the recompute, and the ZeRO engine (every stage relies on parameters'
// post-accumulate hooks; stage 3 also regathers each layer's parameters from a hook on its output)
// training exactly as without checkpointing, both applied by parallelize().
#include <gtest/gtest.h>

#include <cmath>

#include "lora/lora_model.h"
#include "model/model.h"
#include "optim/optimizer.h"
#include "tests/common/thread_communicator.h"
#include "tests/unit/model/op_calls.h"
#include "tests/unit/model/test_util.h"
#include "train/parallelize.h"
#include "zero/engine.h"

namespace dstrain::train {
namespace {

using dstrain::testing::run_ranks;
using dstrain::testing::ThreadCommunicator;

model::DecoderModel small_model(int64_t layers) {
  nlohmann::json doc = model::testing::small_config_json();
  doc["num_hidden_layers"] = layers;
  return model::build_model(model::parse_model_config(doc), torch::kFloat, 7);
}

torch::Tensor input_ids(int64_t batch, int64_t len) {
  torch::manual_seed(5);
  return torch::randint(0, 97, {batch, len}, torch::kLong);
}

// Loss and the adapters' gradients of one training pass with dropout seeded by `seed`.
std::vector<torch::Tensor> lora_gradients(lora::LoraModel& lora, model::DecoderModel& m,
                                          const torch::Tensor& ids, uint64_t seed, double* loss) {
  torch::manual_seed(seed);
  const torch::Tensor l = model::causal_lm_loss(m->forward(ids), ids.roll(-1, 1));
  l.backward();
  *loss = l.item<double>();
  std::vector<torch::Tensor> grads;
  for (auto& [name, p] : lora.named_parameters()) {
    grads.push_back(p.grad().clone());
    p.mutable_grad() = torch::Tensor();
  }
  return grads;
}

// Parameter: selective checkpointing (else plain).
class CheckpointedLora : public ::testing::TestWithParam<bool> {};

TEST_P(CheckpointedLora, LoraDropoutDrawsTheSameMasksInTheRecompute) {
  auto m = small_model(2);
  for (auto& p : m->parameters()) p.set_requires_grad(false);  // frozen base, as the trainer does
  lora::LoraOptions o;
  o.r = 4;
  o.alpha = 8;
  o.dropout = 0.3;
  o.target_modules = {"q_proj", "v_proj", "up_proj", "down_proj"};
  o.seed = 11;
  lora::LoraModel lora(m, o, "lora.target_modules");
  {
    torch::NoGradGuard no_grad;
    torch::manual_seed(12);
    for (const auto& w : lora.weights()) w.B.copy_(torch::randn(w.B.sizes()) * 0.05);
  }
  m->train();
  const torch::Tensor ids = input_ids(2, 12);
  double plain_loss = 0, ckpt_loss = 0, other_loss = 0;
  const auto plain = lora_gradients(lora, m, ids, 21, &plain_loss);
  const auto other_seed = lora_gradients(lora, m, ids, 22, &other_loss);
  m->wrap_blocks(model::WrapperSlot::kCheckpointing,
                 GetParam() ? model::selective_checkpoint_layers() : model::checkpoint_layers());
  const auto ckpt = lora_gradients(lora, m, ids, 21, &ckpt_loss);
  EXPECT_EQ(ckpt_loss, plain_loss);
  EXPECT_NE(other_loss, plain_loss) << "dropout is not active, so this test proves nothing";
  ASSERT_EQ(plain.size(), ckpt.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::allclose(ckpt[i], plain[i], 1e-6, 1e-9)) << "adapter tensor " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpointing, CheckpointedLora, ::testing::Values(false, true),
                         [](const auto& info) {
                           return std::string(info.param ? "selective" : "plain");
                         });

zero::OptimizerFactory adamw() {
  return [](int64_t n, std::vector<optim::Range> no_decay) {
    optim::AdamWOptions o;
    o.weight_decay = 0.0;
    o.no_decay = std::move(no_decay);
    return optim::make_adamw(n, o);
  };
}

// Losses of `steps` steps on 2 ranks (each rank its half of the batch), per rank.
using Ckpt = model::Checkpointing;

// `attention_calls`: if given, the CPU attention kernel's forward calls of both ranks.
std::vector<std::vector<double>> engine_losses(int stage, Ckpt checkpointing, int steps,
                                               int* attention_calls = nullptr) {
  const model::testing::OpCalls calls;
  const torch::Tensor ids = input_ids(4, 16);
  std::vector<std::vector<double>> losses(2);
  run_ranks(2, [&](ThreadCommunicator& comm) {
    torch::set_num_threads(1);
    auto m = small_model(3);
    m->train();
    ParallelPlan plan;
    plan.checkpointing = checkpointing;
    plan.engine.stage = stage;
    plan.engine.reduce_bucket_size = 2000;
    plan.engine.param_persistence_threshold = 0;  // stage 3: every layer gathered around use
    plan.engine.prefetch_bucket_size = 0;
    plan.optimizer = adamw();
    SequenceParallel no_sp(nullptr);
    Parallelized parallel = parallelize(m, {comm, torch::kCPU, no_sp}, plan);
    zero::Engine* engine = parallel.engine.get();
    const torch::Tensor mine = ids.narrow(0, 2 * comm.rank(), 2);
    for (int step = 0; step < steps; ++step) {
      const torch::Tensor loss = model::causal_lm_loss(m->forward(mine), mine.roll(-1, 1));
      engine->backward(loss);
      engine->step(1e-2);
      losses[static_cast<size_t>(comm.rank())].push_back(loss.item<double>());
    }
  });
  if (attention_calls)
    *attention_calls = calls.count("aten::_scaled_dot_product_flash_attention_for_cpu");
  return losses;
}

class CheckpointedEngine : public ::testing::TestWithParam<int> {};

void expect_same_losses(const std::vector<std::vector<double>>& want,
                        const std::vector<std::vector<double>>& got, int steps) {
  for (size_t r = 0; r < 2; ++r) {
    ASSERT_EQ(got[r].size(), static_cast<size_t>(steps));
    for (int s = 0; s < steps; ++s) {
      EXPECT_NEAR(got[r][s], want[r][s], 1e-6 * std::abs(want[r][s]))
          << "rank " << r << " step " << s;
    }
    EXPECT_LT(want[r].back(), want[r].front()) << "rank " << r << ": training did not train";
  }
}

TEST_P(CheckpointedEngine, TwoRanksTrainWithTheSameLosses) {
  const int steps = 4;
  const auto plain = engine_losses(GetParam(), Ckpt::kNone, steps);
  expect_same_losses(plain, engine_losses(GetParam(), Ckpt::kPlain, steps), steps);
}

// parallelize() installs selective checkpointing: attention runs once per layer per step (3 layers,
// 4 steps, 2 ranks), against twice with plain checkpointing.
TEST_P(CheckpointedEngine, SelectiveTrainsWithTheSameLosses) {
  const int steps = 4;
  int plain_calls = 0, selective_calls = 0;
  const auto none = engine_losses(GetParam(), Ckpt::kNone, steps);
  (void)engine_losses(GetParam(), Ckpt::kPlain, steps, &plain_calls);
  expect_same_losses(none, engine_losses(GetParam(), Ckpt::kSelective, steps, &selective_calls),
                     steps);
  EXPECT_EQ(selective_calls, 3 * 4 * 2);
  EXPECT_EQ(plain_calls, 2 * selective_calls);
}

INSTANTIATE_TEST_SUITE_P(Stages, CheckpointedEngine, ::testing::Values(0, 2, 3),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

}  // namespace
}  // namespace dstrain::train
