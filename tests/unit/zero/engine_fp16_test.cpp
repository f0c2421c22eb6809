// fp16 compute: an overflow on any rank skips the step on every rank and halves the loss scale.
#include <gtest/gtest.h>

#include <limits>

#include "tests/unit/zero/zero_fixtures.h"

namespace dstrain::zero::testing {
namespace {

void run_overflow_case(int stage) {
  const Problem problem = make_problem(4);
  run_ranks(2, [&](ThreadCommunicator& comm) {
    TinyMlp model = make_model(problem);
    EngineOptions options;
    options.stage = stage;
    options.compute_dtype = torch::kHalf;
    options.reduce_bucket_size = 64;
    options.loss_scaling = {/*initial_scale_power=*/8, /*window=*/1000, /*hysteresis=*/1, 1.0};
    auto engine = make_engine(named_parameters(model), comm, adamw_factory(), options);
    std::vector<StepResult> results;
    for (int s = 0; s < 4; ++s) {
      std::vector<torch::Tensor> before;
      for (const auto& p : model->parameters()) before.push_back(p.detach().clone());
      torch::Tensor x = micro_batch(problem.x[s], 2, comm.rank(), 1, 0);
      torch::Tensor y = micro_batch(problem.y[s], 2, comm.rank(), 1, 0);
      torch::Tensor loss = torch::mse_loss(model->forward_fp32(x), y);
      // Step 1: rank 1 alone overflows; the verdict must reach rank 0 too.
      if (s == 1 && comm.rank() == 1) loss = loss * 1e30;
      engine->backward(loss);
      results.push_back(engine->step(1e-3));
      const auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_EQ(params[i].equal(before[i]), s == 1) << "rank " << comm.rank() << " step " << s;
      }
    }
    EXPECT_FALSE(results[0].skipped);
    EXPECT_TRUE(results[1].skipped);
    EXPECT_FALSE(results[2].skipped);
    EXPECT_EQ(results[1].loss_scale, 256.0);
    EXPECT_EQ(results[2].loss_scale, 128.0);
    EXPECT_EQ(engine->loss_scaler_state().scale, 128.0);
    EXPECT_EQ(engine->step_count(), 3);
    EXPECT_TRUE(std::isfinite(results[2].grad_norm()));
  });
}

TEST(ZeroFp16, OverflowOnOneRankSkipsStepEverywhereAndHalvesScaleStage1) {
  run_overflow_case(1);
}
TEST(ZeroFp16, OverflowOnOneRankSkipsStepEverywhereAndHalvesScaleStage2) {
  run_overflow_case(2);
}
TEST(ZeroFp16, OverflowOnOneRankSkipsStepEverywhereAndHalvesScaleStage0) {
  run_overflow_case(0);
}

}  // namespace
}  // namespace dstrain::zero::testing
