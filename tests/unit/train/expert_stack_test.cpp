// A parameter placement the library's own blocks never declare, on a block defined only here: a
// stack of E expert matrices [E, C, C] split by experts over the tensor-parallel group
// (PlacementKind::kExperts). Through its placement alone it trains at TP 2 × DP 2 at ZeRO 2 and 3
// (the initial values sliced, the gradient norm counting each expert once), checkpoints in whole
// coordinates, and resumes at TP 1 and on one rank to the losses of the run that went on.
#include <filesystem>
#include <mutex>

#include <gtest/gtest.h>

#include "ckpt/checkpointer.h"
#include "model/model.h"
#include "model/model_config.h"
#include "model/storage.h"
#include "model/tensor_parallel.h"
#include "optim/optimizer.h"
#include "tests/common/temp_dir.h"
#include "tests/common/thread_communicator.h"
#include "tests/unit/model/test_util.h"
#include "tests/unit/train/engine_test_util.h"
#include "train/parallel_groups.h"
#include "train/parallelize.h"
#include "train/tensor_parallel.h"

namespace dstrain::train {
namespace {

using dstrain::testing::run_ranks;
using dstrain::testing::ThreadCommunicator;

constexpr int64_t kExperts = 4;

// h + Σ_e tanh(h·W_eᵀ) / E over the experts. With `tp` each rank holds E/T of them: the input
// enters the parallel region, each rank sums its experts, and the ranks' sums leave it added.
class ExpertStackImpl : public torch::nn::Module, public model::Block {
 public:
  ExpertStackImpl(int64_t C, model::TensorParallel* tp) : tp_(tp) {
    const int64_t local = tp ? kExperts / tp->size() : kExperts;
    stack = register_parameter("stack", model::unmaterialized({local, C, C}, torch::kFloat));
  }
  torch::Tensor forward(const torch::Tensor& h, const model::BlockContext&) override {
    const torch::Tensor x = model::enter_region(tp_, h);
    torch::Tensor sum = torch::zeros_like(x);
    for (int64_t e = 0; e < stack.size(0); ++e)
      sum = sum + torch::tanh(torch::matmul(x, stack[e].t()));
    return h + model::leave_region(tp_, sum / static_cast<double>(kExperts));
  }
  std::vector<torch::Tensor> weights() override { return {stack}; }
  std::vector<model::Placement> placements() override {
    return {tp_ ? model::Placement::split(model::PlacementKind::kExperts) : model::Placement{}};
  }
  model::ActivationMemory activation_memory(const model::ActivationRun&,
                                            model::Checkpointing) const override {
    return {};
  }

  torch::Tensor stack;  // [E/T, C, C]

 private:
  model::TensorParallel* tp_;
};

struct StackLayout {
  int world = 1;
  int tensor = 1;
};

// The small model with the expert stack between its layers, on `at`: steps [first, last) on
// the same 4 rows (each data-parallel rank its share), restored from `from` when given, saved to
// `save_dir` after step `save_at` when given. Returns rank 0's loss of each step (the data-parallel
// mean).
std::vector<double> train_stack(const StackLayout& at, int stage, int first, int last,
                                const std::string& from, const std::string& save_dir, int save_at) {
  nlohmann::json doc = model::testing::small_config_json();
  doc["vocab_size"] = 96;  // the vocabulary split in two
  const model::ModelConfig config = model::parse_model_config(doc);
  // The whole model's initial values, the expert stack's included.
  model::DecoderModel whole(config, model::Materialize::kNo);
  whole->add_block(2, "experts", std::make_shared<ExpertStackImpl>(config.hidden_size, nullptr));
  const model::ValueSource values = model::init_source(*whole, 3);
  torch::manual_seed(7);
  const torch::Tensor ids = torch::randint(0, config.vocab_size, {4, 12});
  std::vector<double> losses;
  std::mutex mutex;
  run_ranks(at.world, [&](ThreadCommunicator& world) {
    torch::set_num_threads(1);
    layout::Sizes sizes;
    sizes.tensor = at.tensor;
    ParallelGroups groups(world, layout::ParallelLayout(at.world, sizes));
    auto tp = std::make_shared<TensorParallelGroup>(groups.tensor(), groups.slice_replicas(),
                                                    /*sequence_parallel=*/false);
    model::DecoderModel m(config, model::Materialize::kNo,
                          tp->size() > 1 ? tp : std::shared_ptr<TensorParallelGroup>());
    m->add_block(2, "experts",
                 std::make_shared<ExpertStackImpl>(config.hidden_size, m->tensor_parallel()));
    ParallelPlan plan;
    plan.engine.stage = stage;
    plan.engine.gradient_clipping = 0.5;  // the norm counts every expert once
    plan.engine.model_parallel = {&world,
                                  [&groups](const model::Placement&) { return groups.tensor(); }};
    plan.optimizer = testing::adamw();
    plan.initial_values = tp->size() > 1 ? slice_source(values, *m, *tp) : values;
    SequenceParallel no_sp(nullptr);
    Parallelized parallel =
        parallelize(m, {groups.slice_replicas(), torch::kCPU, no_sp}, std::move(plan));
    WholeCoordinateState state(*parallel.engine, *m, nullptr, *tp);
    ckpt::CheckpointerOptions o;
    o.dir = save_dir.empty() ? from : save_dir;
    o.rank = world.rank();
    o.world_size = world.world_size();
    o.async = false;
    ckpt::Checkpointer checkpointer(o, [&world] { world.barrier(); });
    checkpointer.add("engine", &state);
    if (!from.empty()) checkpointer.restore(from);
    m->train();
    const int dp = groups.size(layout::Axis::kData), d = groups.coordinate(layout::Axis::kData);
    const torch::Tensor mine = ids.narrow(0, d * (4 / dp), 4 / dp);
    for (int s = first; s < last; ++s) {
      const torch::Tensor loss = m->loss_sum(mine, mine.roll(-1, 1), /*fused=*/true).mean();
      parallel.engine->backward(loss);
      parallel.engine->step(2e-2);
      torch::Tensor mean = loss.detach().reshape({1}).clone();
      world.all_reduce(mean, comm::ReduceOp::kAvg)->wait();
      if (world.rank() == 0) {
        std::lock_guard<std::mutex> lock(mutex);
        losses.push_back(mean.item<double>());
      }
      if (s + 1 == save_at && !save_dir.empty()) checkpointer.save(save_at, {}, {});
    }
    checkpointer.wait();
  });
  return losses;
}

class ExpertStack : public ::testing::TestWithParam<int> {};

TEST_P(ExpertStack, TrainsAtTp2Dp2AndResumesAtTp1AndOnOneRank) {
  const int stage = GetParam();
  dstrain::testing::TempDir dir;
  const std::string ckpt = (dir / "ckpt").string();
  // Steps 0-4 at TP 2 × DP 2, a checkpoint after step 3; and without tensor parallelism.
  const std::vector<double> tp2 = train_stack({4, 2}, stage, 0, 5, "", ckpt, 3);
  const std::vector<double> tp1 = train_stack({2, 1}, stage, 0, 5, "", "", 0);
  ASSERT_EQ(tp2.size(), 5u);
  // The ranks' partial sums add in another order: measured up to 4.7e-5 by step 4 (AdamW at
  // 2e-2 moves elements whose gradient is near zero by the learning rate on rounding alone); a
  // slice out of place differs by 2e-2 at step 0.
  for (size_t s = 0; s < tp2.size(); ++s) EXPECT_NEAR(tp2[s], tp1[s], 1e-4) << "step " << s;
  EXPECT_LT(tp2.back(), tp2.front());  // it trains
  const std::string tag = ckpt + "/step_00000003";
  for (const StackLayout& at : {StackLayout{2, 1}, StackLayout{1, 1}}) {
    const std::vector<double> resumed = train_stack(at, stage, 3, 5, tag, "", 0);
    ASSERT_EQ(resumed.size(), 2u);
    for (size_t s = 0; s < 2; ++s) {
      EXPECT_NEAR(resumed[s], tp2[3 + s], 1e-4) << "world " << at.world << ", step " << 3 + s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Zero, ExpertStack, ::testing::Values(2, 3),
                         [](const auto& info) { return "Stage" + std::to_string(info.param); });

}  // namespace
}  // namespace dstrain::train
