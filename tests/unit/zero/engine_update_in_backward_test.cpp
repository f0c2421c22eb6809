// Without clipping: once the step's learning rate is said (Engine::set_step_lr), each bucket
// (stages 0-2) or unit (stage 3) is updated as soon as its gradient is reduced, during backward,
// with the same values as the update in step().
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <set>

#include "core/error.h"
#include "tests/unit/zero/stage3_fixtures.h"
#include "tests/unit/zero/zero_fixtures.h"

namespace dstrain::zero::testing {
namespace {

struct InBackwardCase {
  int stage;
  int world;
  int accum;
  torch::ScalarType dtype;
  bool offload = false;
};

RunConfig config_of(const InBackwardCase& c, bool set_step_lr) {
  RunConfig config;
  config.world = c.world;
  config.steps = 6;
  config.accum = c.accum;
  config.options.stage = c.stage;
  config.options.compute_dtype = c.dtype;
  config.options.reduce_bucket_size = 40;  // several buckets, parameters straddling them
  config.options.offload_optimizer = c.offload;
  config.optimizer = real_adamw_factory();
  config.set_step_lr = set_step_lr;
  return config;
}

// Equal losses, gradient norms equal but for the last bits (Σg² is summed bucket by bucket or unit
// by unit instead of over the whole shard), and a run that trains.
void expect_same_losses_and_norms(const EngineRecord& in_backward, const EngineRecord& in_step,
                                  const std::string& what) {
  ASSERT_EQ(in_backward.losses.size(), in_step.losses.size()) << what;
  for (size_t s = 0; s < in_step.losses.size(); ++s) {
    EXPECT_EQ(in_backward.losses[s], in_step.losses[s]) << what << " step " << s;
    EXPECT_NEAR(in_backward.steps[s].grad_norm(), in_step.steps[s].grad_norm(),
                1e-6 * in_step.steps[s].grad_norm())
        << what << " step " << s;
  }
  EXPECT_LT(in_step.losses.back(), in_step.losses.front()) << what << ": does not train";
}

TEST(ZeroUpdateInBackward, GivesBitForBitTheUpdateInStep) {
  torch::set_num_threads(1);
  const Problem problem = make_problem(6);
  const std::vector<InBackwardCase> cases = {
      {0, 1, 1, torch::kFloat32},       {0, 3, 2, torch::kFloat32},
      {0, 2, 1, torch::kBFloat16},      {1, 1, 1, torch::kFloat32},
      {1, 3, 2, torch::kBFloat16},      {2, 2, 1, torch::kFloat32},
      {2, 4, 2, torch::kBFloat16},      {1, 2, 2, torch::kBFloat16, true},
      {2, 3, 2, torch::kFloat32, true},
  };
  for (const InBackwardCase& c : cases) {
    const auto what = fmt::format("stage {} world {} accum {} {}{}", c.stage, c.world, c.accum,
                                  c10::toString(c.dtype), c.offload ? " offload" : "");
    const RunResult in_step = run_engine(problem, config_of(c, false));
    const RunResult in_backward = run_engine(problem, config_of(c, true));
    expect_same_losses_and_norms(in_backward, in_step, what);
    ASSERT_EQ(in_backward.params.size(), in_step.params.size());
    for (size_t i = 0; i < in_step.params.size(); ++i) {
      EXPECT_TRUE(torch::equal(in_backward.params[i], in_step.params[i]))
          << what << " parameter " << i << " max diff "
          << (in_backward.params[i] - in_step.params[i]).abs().max().item<double>();
    }
  }
}

// Which of this rank's master pieces differ from `before` now, by parameter name.
std::map<std::string, bool> changed_since(const Engine& engine,
                                          const std::map<std::string, torch::Tensor>& before) {
  std::map<std::string, bool> changed;
  for (const StatePiece& piece : engine.owned_state()) {
    const std::string key = fmt::format("{}@{}", piece.param, piece.elements.begin);
    changed[piece.param] =
        changed[piece.param] || !torch::equal(piece.tensors.at("master"), before.at(key));
  }
  return changed;
}

struct Observed {
  std::map<std::string, bool> at_first_layer;  // when backward reaches fc1's output
  std::map<std::string, bool> after_step;
  bool can_update = false;
};

// One step of the MLP on `world` ranks with set_step_lr; each rank looks at its master pieces when
// the gradient of fc1's output arrives: fc2's gradients (the last buckets) are final by then and
// fc1's are not computed yet. Returns rank 0's observations.
Observed observe_one_step(int stage, double clip, bool set_step_lr) {
  const Problem problem = make_problem(1);
  Observed observed;
  std::mutex mutex;
  run_ranks(2, [&](ThreadCommunicator& comm) {
    TinyMlp model = make_model(problem);
    EngineOptions options;
    options.stage = stage;
    options.gradient_clipping = clip;
    options.reduce_bucket_size = 20;  // 13 buckets: fc2's weight and bias fill the last five
    std::unique_ptr<Engine> engine =
        make_engine(named_parameters(model), comm, real_adamw_factory(), options);
    std::map<std::string, torch::Tensor> before;
    for (const StatePiece& piece : engine->owned_state()) {
      before[fmt::format("{}@{}", piece.param, piece.elements.begin)] =
          piece.tensors.at("master").clone();
    }
    const double lr = 1e-2;
    if (set_step_lr) engine->set_step_lr(lr);
    const torch::Tensor x = micro_batch(problem.x[0], 2, comm.rank(), 1, 0);
    const torch::Tensor y = micro_batch(problem.y[0], 2, comm.rank(), 1, 0);
    torch::Tensor h = model->fc1(x);
    std::map<std::string, bool> at_first_layer;
    h.register_hook([&](const torch::Tensor&) { at_first_layer = changed_since(*engine, before); });
    const torch::Tensor out = model->fc2(torch::tanh(h) * model->norm_weight);
    engine->backward(torch::mse_loss(out, y));
    engine->step(lr);
    if (comm.rank() != 0) return;
    std::lock_guard<std::mutex> lock(mutex);
    observed.at_first_layer = at_first_layer;
    observed.after_step = changed_since(*engine, before);
    observed.can_update = engine->can_update_during_backward();
  });
  return observed;
}

TEST(ZeroUpdateInBackward, LastBucketsAreUpdatedBeforeBackwardReachesTheFirstLayer) {
  torch::set_num_threads(1);
  for (int stage : {0, 1, 2}) {
    const Observed o = observe_one_step(stage, 0.0, true);
    EXPECT_TRUE(o.can_update) << "stage " << stage;
    EXPECT_TRUE(o.at_first_layer.at("fc2.bias")) << "stage " << stage;
    EXPECT_FALSE(o.at_first_layer.at("fc1.weight")) << "stage " << stage;
    for (const auto& [param, changed] : o.after_step) {
      EXPECT_TRUE(changed) << "stage " << stage << ": " << param << " not updated";
    }
  }
}

// Without set_step_lr, or with clipping (the update needs the global norm), nothing is updated
// before step().
TEST(ZeroUpdateInBackward, NothingIsUpdatedDuringBackwardOtherwise) {
  torch::set_num_threads(1);
  for (const auto& [clip, set_step_lr] : {std::pair{0.0, false}, std::pair{0.5, true}}) {
    const Observed o = observe_one_step(2, clip, set_step_lr);
    EXPECT_EQ(o.can_update, clip == 0.0);
    for (const auto& [param, changed] : o.at_first_layer) {
      EXPECT_FALSE(changed) << param << " clip " << clip;
    }
    EXPECT_TRUE(o.after_step.at("fc1.weight")) << "clip " << clip;
  }
}

// Stage 3 on the layered model (tied embedding, persistent small parameters or not, offload): the
// master and optimizer state after 8 steps are those of updating in step(), bit for bit.
TEST(ZeroUpdateInBackward, Stage3GivesBitForBitTheUpdateInStep) {
  torch::set_num_threads(1);
  const StackProblem problem = make_stack_problem({}, 8);
  struct Stage3Case {
    int world, accum;
    torch::ScalarType dtype;
    int64_t persistence;
    bool offload;
  };
  for (const Stage3Case& c :
       {Stage3Case{1, 1, torch::kFloat32, 0, false}, Stage3Case{3, 2, torch::kFloat32, 7, false},
        Stage3Case{2, 2, torch::kBFloat16, 0, false},
        Stage3Case{4, 1, torch::kBFloat16, 7, true}}) {
    const auto what =
        fmt::format("world {} accum {} {} persistence {}{}", c.world, c.accum,
                    c10::toString(c.dtype), c.persistence, c.offload ? " offload" : "");
    auto result = [&](bool set_step_lr) {
      StackRun run;
      run.world = c.world;
      run.accum = c.accum;
      run.steps = 8;
      run.options.stage = 3;
      run.options.compute_dtype = c.dtype;
      run.options.param_persistence_threshold = c.persistence;
      run.options.offload_optimizer = c.offload;
      run.options.offload_param = c.offload;
      run.optimizer = real_adamw_factory();
      run.set_step_lr = set_step_lr;
      return run_stack(problem, run);
    };
    const StackResult in_step = result(false);
    const StackResult in_backward = result(true);
    expect_same_losses_and_norms(in_backward, in_step, what);
    ASSERT_EQ(in_backward.state.size(), in_step.state.size()) << what;
    for (const auto& [key, values] : in_step.state) {
      EXPECT_TRUE(torch::equal(in_backward.state.at(key), values))
          << what << ": " << key.first << " of " << key.second;
    }
  }
}

// At stage 3 every unit is reduced, and so updated, inside backward(): the master has moved before
// step() is called.
TEST(ZeroUpdateInBackward, Stage3MasterIsUpdatedBeforeStep) {
  torch::set_num_threads(1);
  const StackProblem problem = make_stack_problem({}, 1);
  for (const bool set_step_lr : {true, false}) {
    run_ranks(2, [&](ThreadCommunicator& comm) {
      TinyStack model = make_stack(problem);
      EngineOptions options;
      options.stage = 3;
      options.segments = model->segments();
      options.param_persistence_threshold = 0;
      std::unique_ptr<Engine> engine =
          make_engine(model->units(), comm, real_adamw_factory(), options);
      std::map<std::string, torch::Tensor> before;
      for (const StatePiece& piece : engine->owned_state()) {
        before[fmt::format("{}@{}", piece.param, piece.elements.begin)] =
            piece.tensors.at("master").clone();
      }
      if (set_step_lr) engine->set_step_lr(1e-2);
      const torch::Tensor ids = micro_batch(problem.ids[0], 2, comm.rank(), 1, 0);
      const torch::Tensor labels = micro_batch(problem.labels[0], 2, comm.rank(), 1, 0);
      const torch::Tensor logits = model->forward(ids, engine.get());
      engine->backward(
          torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), labels.reshape({-1})));
      const std::map<std::string, bool> after_backward = changed_since(*engine, before);
      engine->step(1e-2);
      const std::map<std::string, bool> after_step = changed_since(*engine, before);
      if (comm.rank() != 0) return;
      ASSERT_FALSE(after_backward.empty());
      for (const auto& [param, changed] : after_backward) {
        EXPECT_EQ(changed, set_step_lr) << param << " set_step_lr " << set_step_lr;
        EXPECT_TRUE(after_step.at(param)) << param;
      }
    });
  }
}

TEST(ZeroUpdateInBackward, StepWithAnotherLearningRateThanSaidIsAnError) {
  const Problem problem = make_problem(1);
  run_ranks(1, [&](ThreadCommunicator& comm) {
    TinyMlp model = make_model(problem);
    std::unique_ptr<Engine> engine =
        make_engine(named_parameters(model), comm, real_adamw_factory(), EngineOptions{});
    engine->set_step_lr(1e-2);
    engine->backward(torch::mse_loss(model->forward(problem.x[0]), problem.y[0]));
    try {
      engine->step(2e-2);
      ADD_FAILURE() << "step() with another lr was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInternal);
      EXPECT_NE(std::string(e.what()).find("set_step_lr"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace dstrain::zero::testing
