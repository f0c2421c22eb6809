// The micro-step protocol every engine shares: backward() takes the micro-steps of one optimizer
// step in order, step() only after the last one; anything else is a bug of the caller.
#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"
#include "tests/unit/zero/zero_fixtures.h"

namespace dstrain::zero::testing {
namespace {

void expect_internal_error(const std::function<void()>& f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal) << what;
  }
}

TEST(ZeroEngine, MicroStepsOutOfOrderAndEarlyStepsAreInternalErrors) {
  const Problem problem = make_problem(2);
  for (int stage : {0, 1, 2}) {
    run_ranks(1, [&](ThreadCommunicator& comm) {
      TinyMlp model = make_model(problem);
      EngineOptions options;
      options.stage = stage;
      auto engine = make_engine(named_parameters(model), comm, adamw_factory(), options);
      const auto loss = [&] { return torch::mse_loss(model->forward(problem.x[0]), problem.y[0]); };
      const auto what = [&](const char* c) { return fmt::format("stage {}: {}", stage, c); };
      expect_internal_error([&] { engine->step(1e-3); }, what("step() before any backward()"));
      expect_internal_error([&] { engine->backward(loss(), {1, 2}); }, what("starts at 1"));
      engine->backward(loss(), {0, 2});
      expect_internal_error([&] { engine->step(1e-3); }, what("step() before the last"));
      expect_internal_error([&] { engine->backward(loss(), {1, 3}); }, what("count changes"));
      expect_internal_error([&] { engine->backward(loss(), {0, 2}); }, what("micro-step repeated"));
      engine->backward(loss(), {1, 2});
      expect_internal_error([&] { engine->backward(loss(), {2, 2}); }, what("past the last"));
      EXPECT_FALSE(engine->step(1e-3).skipped) << what("in order");
      engine->backward(loss());  // the default: a whole step in one micro-step
      EXPECT_EQ(engine->step(1e-3).loss_scale, 1.0) << what("one micro-step");
      EXPECT_EQ(engine->step_count(), 2) << what("two steps");
    });
  }
}

}  // namespace
}  // namespace dstrain::zero::testing
