// Stages 0, 1 and 2 at world sizes 1–4 against a single-process run on the full global batch.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/unit/zero/zero_fixtures.h"

namespace dstrain::zero::testing {
namespace {

struct Case {
  int stage;
  int world;
  int accum;
  double clip;
  bool overlap = true;
  bool contiguous = true;
  bool real_adamw = false;   // lib/optim's AdamW instead of the test's reference one
  bool set_step_lr = false;  // the lr said before backward: buckets updated during it (no clip)
};

std::string name_of(const Case& c) {
  return fmt::format("stage{}_world{}_accum{}{}{}{}{}{}", c.stage, c.world, c.accum,
                     c.clip > 0 ? "_clip" : "", c.overlap ? "" : "_nooverlap",
                     c.contiguous ? "" : "_noncontiguous", c.real_adamw ? "_optim_adamw" : "",
                     c.set_step_lr ? "_step_lr" : "");
}

class ZeroMatchesSingleProcess : public ::testing::TestWithParam<Case> {};

void expect_close(double a, double b, double rtol, const std::string& what) {
  EXPECT_LE(std::abs(a - b), rtol * std::max(std::abs(b), 1e-3))
      << what << ": " << a << " vs " << b;
}

TEST_P(ZeroMatchesSingleProcess, LossesGradNormsAndParametersOver20Steps) {
  const Case c = GetParam();
  torch::set_num_threads(1);
  static const Problem problem = make_problem(20);
  RunConfig config;
  config.world = c.world;
  config.options.stage = c.stage;
  config.accum = c.accum;
  config.options.gradient_clipping = c.clip;
  config.options.reduce_bucket_size = 40;  // several buckets, parameters straddling them
  config.options.overlap_comm = c.overlap;
  config.options.contiguous_gradients = c.contiguous;
  if (c.real_adamw) config.optimizer = real_adamw_factory();
  config.set_step_lr = c.set_step_lr;
  const RunResult got = run_engine(problem, config);
  const RunResult want = run_reference(problem, 20, c.clip);
  int clipped = 0;
  for (int s = 0; s < 20; ++s) {
    expect_close(got.losses[s], want.losses[s], 1e-5, fmt::format("loss at step {}", s));
    expect_close(got.steps[s].grad_norm(), want.steps[s].grad_norm(), 1e-5,
                 fmt::format("grad norm at step {}", s));
    EXPECT_FALSE(got.steps[s].skipped);
    clipped += c.clip > 0 && want.steps[s].grad_norm() > c.clip;
  }
  if (c.clip > 0) {
    EXPECT_GT(clipped, 0) << "the clipping threshold never bit";
  }
  ASSERT_EQ(got.params.size(), want.params.size());
  for (size_t i = 0; i < got.params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got.params[i], want.params[i], 1e-5, 1e-6))
        << "parameter " << i << " max diff "
        << (got.params[i] - want.params[i]).abs().max().item<double>();
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int stage : {0, 1, 2}) {
    for (int world : {1, 2, 3, 4}) out.push_back({stage, world, 1, 0.0});
    out.push_back({stage, 2, 2, 0.0});
    out.push_back({stage, 3, 2, 0.5});
    out.push_back({stage, 4, 1, 0.5});
  }
  out.push_back({0, 3, 2, 0.0, false});
  out.push_back({1, 3, 2, 0.0, false});
  out.push_back({2, 3, 2, 0.5, false});
  out.push_back({2, 2, 2, 0.0, true, false});
  out.push_back({2, 4, 2, 0.5, false, false});
  for (int stage : {0, 1, 2}) out.push_back({stage, 3, 2, 0.5, true, true, true});
  for (int stage : {0, 1, 2}) {
    out.push_back({stage, 1, 1, 0.0, true, true, false, true});
    out.push_back({stage, 3, 2, 0.0, true, true, false, true});
    out.push_back({stage, 2, 2, 0.5, true, true, false, true});  // clipping: updated in step()
  }
  out.push_back({1, 3, 2, 0.0, false, true, false, true});
  out.push_back({2, 4, 2, 0.0, true, false, true, true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroMatchesSingleProcess, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return name_of(info.param); });

}  // namespace
}  // namespace dstrain::zero::testing
