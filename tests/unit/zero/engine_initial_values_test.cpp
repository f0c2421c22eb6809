// Stages 0-2 built from an initial-value source (the trainer's way: a model without values, a
// seeded generator or safetensors files behind the source) read each element once and train
// exactly like an engine built from parameters that hold the values.
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "tests/unit/zero/zero_fixtures.h"

namespace dstrain::zero::testing {
namespace {

struct SourceRun {
  RunResult result;
  std::vector<int64_t> elements_read;  // per rank
};

// The problem's model with every parameter zeroed, its initial values behind a counting source.
SourceRun run_from_source(const Problem& problem, const RunConfig& config) {
  SourceRun run;
  run.elements_read.assign(config.world, 0);
  std::mutex mutex;
  drive_ranks(config, run.result, [&](ThreadCommunicator& comm) {
    const int rank = comm.rank();
    TinyMlp model = make_model(problem);
    std::map<std::string, torch::Tensor> init;
    {
      torch::NoGradGuard no_grad;
      for (const auto& item : model->named_parameters()) {
        init[item.key()] = item.value().detach().clone();
        item.value().zero_();
      }
    }
    EngineOptions options = config.options;
    options.initial_values = [&, init, rank](const std::string& name, int64_t begin, int64_t end) {
      std::lock_guard<std::mutex> lock(mutex);
      run.elements_read[rank] += end - begin;
      return init.at(name).reshape({-1}).narrow(0, begin, end - begin);
    };
    RankSide side;
    side.engine = make_engine(named_parameters(model), comm, config.optimizer, options);
    side.loss = [&problem, &config, model, rank](int s, int m) mutable {
      const torch::Tensor x = micro_batch(problem.x[s], config.world, rank, config.accum, m);
      const torch::Tensor y = micro_batch(problem.y[s], config.world, rank, config.accum, m);
      return torch::mse_loss(model->forward(x.to(config.options.compute_dtype)).to(torch::kFloat32),
                             y);
    };
    side.record = [&run, model](int r, Engine&) mutable {
      if (r != 0) return;
      for (const auto& p : model->parameters())
        run.result.params.push_back(p.detach().to(torch::kFloat32).clone());
    };
    return side;
  });
  return run;
}

TEST(ZeroInitialValues, EachElementIsReadOnceAndTrainsLikeHeldValues) {
  torch::set_num_threads(1);
  const Problem problem = make_problem(3);
  const int64_t numel = 245;
  for (int stage : {0, 1, 2}) {
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      RunConfig config;
      config.world = 2;
      config.steps = 3;
      config.options.stage = stage;
      config.options.compute_dtype = dtype;
      config.options.reduce_bucket_size = 64;  // several buckets, parameters cut across ranks
      const std::string what = "stage " + std::to_string(stage) + " " + c10::toString(dtype);
      const SourceRun from_source = run_from_source(problem, config);
      const RunResult held = run_engine(problem, config);
      for (int r = 0; r < config.world; ++r) {
        EXPECT_EQ(from_source.elements_read[r], numel) << what << " rank " << r;
      }
      EXPECT_EQ(from_source.result.losses, held.losses) << what;
      ASSERT_EQ(from_source.result.params.size(), held.params.size()) << what;
      for (size_t i = 0; i < held.params.size(); ++i) {
        EXPECT_TRUE(torch::equal(from_source.result.params[i], held.params[i]))
            << what << " parameter " << i;
      }
    }
  }
}

}  // namespace
}  // namespace dstrain::zero::testing
