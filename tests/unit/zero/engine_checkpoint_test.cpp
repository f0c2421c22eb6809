// Checkpoint pieces are re-shardable: saved at one world size and stage, loaded at others.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/unit/zero/zero_fixtures.h"

namespace dstrain::zero::testing {
namespace {

// Everything the ranks saved, assembled per (kind, param) into full flattened fp32 tensors.
struct Saved {
  std::map<std::pair<std::string, std::string>, torch::Tensor> state;
  std::map<std::pair<std::string, std::string>, torch::Tensor> covered;  // element counts
  int64_t step_count = 0;
  LossScalerState scaler;
};

void add_pieces(Saved& saved, const std::vector<StatePiece>& pieces) {
  for (const StatePiece& piece : pieces) {
    int64_t numel = 1;
    for (int64_t d : piece.shape) numel *= d;
    for (const auto& [kind, values] : piece.tensors) {
      auto key = std::make_pair(kind, piece.param);
      if (!saved.state.count(key)) {
        saved.state[key] = torch::zeros({numel});
        saved.covered[key] = torch::zeros({numel}, torch::kInt32);
      }
      const int64_t n = piece.elements.end - piece.elements.begin;
      saved.state[key].narrow(0, piece.elements.begin, n).copy_(values);
      saved.covered[key].narrow(0, piece.elements.begin, n).add_(1);
    }
  }
}

// Trains `steps` steps at (world, stage) from the problem's start (or from `resume`), then returns
// what the ranks' owned_state() pieces hold.
Saved train_and_save(const Problem& problem, int world, int stage, int first_step, int steps,
                     const Saved* resume) {
  Saved saved;
  std::mutex mutex;
  run_ranks(world, [&](ThreadCommunicator& comm) {
    TinyMlp model = make_model(problem);
    EngineOptions options;
    options.stage = stage;
    options.reduce_bucket_size = 32;
    auto engine = make_engine(named_parameters(model), comm, adamw_factory(), options);
    if (resume) {
      engine->load_state(
          [&](const std::string& kind, const std::string& param, Range r) {
            auto it = resume->state.find({kind, param});
            if (it == resume->state.end()) fail(ErrorKind::kInput, "no {} for {}", kind, param);
            return it->second.narrow(0, r.begin, r.end - r.begin);
          },
          resume->step_count, resume->scaler);
      // The compute parameters were refreshed from the loaded master.
      for (const auto& item : model->named_parameters()) {
        EXPECT_TRUE(
            item.value().detach().reshape({-1}).equal(resume->state.at({"master", item.key()})))
            << item.key();
      }
    }
    for (int s = first_step; s < first_step + steps; ++s) {
      torch::Tensor x = micro_batch(problem.x[s], world, comm.rank(), 1, 0);
      torch::Tensor y = micro_batch(problem.y[s], world, comm.rank(), 1, 0);
      engine->backward(torch::mse_loss(model->forward(x), y));
      engine->step(1e-2);
    }
    std::lock_guard<std::mutex> lock(mutex);
    add_pieces(saved, engine->owned_state());
    saved.step_count = engine->step_count();
    saved.scaler = engine->loss_scaler_state();
  });
  return saved;
}

void expect_same_state(const Saved& a, const Saved& b, double tol) {
  ASSERT_EQ(a.state.size(), b.state.size());
  for (const auto& [key, tensor] : a.state) {
    ASSERT_TRUE(b.state.count(key)) << key.first << " " << key.second;
    EXPECT_TRUE(torch::allclose(tensor, b.state.at(key), tol, tol * 1e-1))
        << key.first << " of " << key.second;
  }
  EXPECT_EQ(a.step_count, b.step_count);
}

TEST(ZeroCheckpoint, PiecesCoverEveryElementOnceAtEveryStage) {
  const Problem problem = make_problem(1);
  for (int stage : {0, 1, 2}) {
    const Saved saved = train_and_save(problem, 3, stage, 0, 1, nullptr);
    EXPECT_EQ(saved.state.size(), 3u * 5u);  // master, exp_avg, exp_avg_sq × 5 parameters
    for (const auto& [key, covered] : saved.covered) {
      EXPECT_TRUE(covered.eq(1).all().item<bool>()) << key.first << " of " << key.second;
    }
  }
}

TEST(ZeroCheckpoint, SavedAtWorld2Stage2LoadsIdenticallyAtWorld3Stage1AndWorld1Stage0) {
  const Problem problem = make_problem(6);
  const Saved saved = train_and_save(problem, 2, 2, 0, 3, nullptr);
  EXPECT_EQ(saved.step_count, 3);
  for (auto [world, stage] : {std::pair{3, 1}, std::pair{1, 0}, std::pair{4, 2}}) {
    const Saved reloaded = train_and_save(problem, world, stage, 3, 0, &saved);
    expect_same_state(reloaded, saved, 0.0);  // bit-identical after the round trip
  }
  // Training continues the same way whatever the layout it resumed in.
  const Saved continued = train_and_save(problem, 2, 2, 3, 2, &saved);
  const Saved resharded = train_and_save(problem, 3, 1, 3, 2, &saved);
  const Saved uninterrupted = train_and_save(problem, 1, 0, 0, 5, nullptr);
  expect_same_state(resharded, continued, 1e-5);
  expect_same_state(uninterrupted, continued, 1e-5);
}

TEST(ZeroCheckpoint, MissingStateIsAnInputError) {
  const Problem problem = make_problem(1);
  Saved empty;
  EXPECT_THROW(
      {
        try {
          train_and_save(problem, 1, 1, 0, 0, &empty);
        } catch (const Error& e) {
          EXPECT_EQ(e.kind(), ErrorKind::kInput);
          throw;
        }
      },
      Error);
}

}  // namespace
}  // namespace dstrain::zero::testing
