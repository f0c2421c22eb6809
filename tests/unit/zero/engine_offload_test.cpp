// offload_optimizer at stages 1 and 2: the same training as without offload, with master weights
// and optimizer state counted in host memory.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/unit/zero/zero_fixtures.h"

namespace dstrain::zero::testing {
namespace {

struct OffloadCase {
  int stage;
  int world;
  torch::ScalarType dtype;
};

RunConfig offload_config(const OffloadCase& c, bool offload, int steps) {
  RunConfig config;
  config.world = c.world;
  config.steps = steps;
  config.options.stage = c.stage;
  config.options.compute_dtype = c.dtype;
  config.accum = 2;
  config.options.gradient_clipping = 0.5;
  config.options.reduce_bucket_size = 40;
  config.options.offload_optimizer = offload;
  config.optimizer = real_adamw_factory();
  return config;
}

// The update runs on a host copy of the same fp32 values with the same optimizer, so the runs are
// identical, not just close — except stage 2 in bf16 with accumulation: offloaded, the gradient
// shard is fp32 on the host, so micro-steps accumulate in fp32 instead of bf16 (closer, not equal).
TEST(ZeroOffload, Stages1And2GiveTheSameTrainingAsWithoutOffload) {
  torch::set_num_threads(1);
  const Problem problem = make_problem(10);
  for (const OffloadCase& c :
       {OffloadCase{1, 1, torch::kFloat32}, OffloadCase{1, 3, torch::kBFloat16},
        OffloadCase{2, 2, torch::kFloat32}, OffloadCase{2, 4, torch::kBFloat16}}) {
    const auto what = fmt::format("stage {} world {} {}", c.stage, c.world, c10::toString(c.dtype));
    const RunResult off = run_engine(problem, offload_config(c, false, 10));
    const RunResult on = run_engine(problem, offload_config(c, true, 10));
    ASSERT_EQ(on.losses.size(), off.losses.size());
    const bool exact = !(c.stage == 2 && c.dtype == torch::kBFloat16);
    for (size_t s = 0; s < off.losses.size(); ++s) {
      if (exact) {
        EXPECT_EQ(on.losses[s], off.losses[s]) << what << " step " << s;
        EXPECT_EQ(on.steps[s].grad_norm(), off.steps[s].grad_norm()) << what << " step " << s;
      } else {
        EXPECT_NEAR(on.losses[s], off.losses[s], 0.02 * std::abs(off.losses[s])) << what;
        EXPECT_NEAR(on.steps[s].grad_norm(), off.steps[s].grad_norm(),
                    0.05 * off.steps[s].grad_norm())
            << what << " step " << s;
      }
    }
    EXPECT_LT(off.losses.back(), off.losses.front()) << what << ": training does not train";
    ASSERT_EQ(on.params.size(), off.params.size());
    for (size_t i = 0; i < off.params.size(); ++i) {
      if (exact) {
        EXPECT_TRUE(torch::equal(on.params[i], off.params[i])) << what << " parameter " << i;
      } else {
        EXPECT_LT((on.params[i] - off.params[i]).abs().max().item<double>(), 0.02)
            << what << " parameter " << i;
      }
    }
  }
}

// bf16 compute with Adam, Ψ elements, N ranks: offload moves the master and the optimizer state
// (12Ψ/N) to the host; at stage 2 the gradient shard lives there too, in fp32 (4Ψ/N), streamed
// bucket by bucket. The device keeps 2Ψ + 2Ψ (stage 1: parameters and the flat gradient) or 2Ψ
// (stage 2: parameters only; gradients pass through transient bucket buffers).
TEST(ZeroOffload, DeviceBytesDropByMasterOptimizerStateAndGradientShard) {
  torch::set_num_threads(1);
  const Problem problem = make_problem(1, /*hidden=*/256);
  const double psi = 8 * 256 + 256 + 256 + 256 * 5 + 5;
  for (int stage : {1, 2}) {
    for (int world = 1; world <= 4; ++world) {
      RunConfig config = offload_config(OffloadCase{stage, world, torch::kBFloat16}, true, 1);
      config.accum = 1;
      config.options.reduce_bucket_size = 500;
      const RunResult run = run_engine(problem, config);
      const double host = (stage == 1 ? 12 : 16) * psi / world;
      const double device = stage == 1 ? 4 * psi : 2 * psi;
      for (int r = 0; r < world; ++r) {
        const MemoryReport& m = run.memory[r];
        const auto what = fmt::format("stage {} world {} rank {}", stage, world, r);
        EXPECT_NEAR(m.host_bytes / host, 1.0, 0.02) << what;
        EXPECT_NEAR(m.device_model_states() / device, 1.0, 0.02) << what;
        EXPECT_EQ(m.host_bytes,
                  m.master_weights + m.optimizer_state + (stage == 2 ? m.gradients : 0))
            << what;
      }
    }
  }
}

}  // namespace
}  // namespace dstrain::zero::testing
