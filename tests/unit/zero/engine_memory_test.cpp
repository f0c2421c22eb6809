// Model-state memory and communication volume per rank against the ZeRO paper's formulas.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/unit/zero/zero_fixtures.h"
#include "zero/sharded_engine.h"

namespace dstrain::zero::testing {
namespace {

// Bytes per rank of model states with bf16 compute and Adam (K = 12), Ψ elements, N ranks:
// stage 0: 2Ψ + 2Ψ + 12Ψ; stage 1: 2Ψ + 2Ψ + 12Ψ/N; stage 2: 2Ψ + (2 + 12)Ψ/N.
double zero_formula_bytes(int stage, double psi, int n) {
  if (stage == 0) return 16 * psi;
  if (stage == 1) return 4 * psi + 12 * psi / n;
  return 2 * psi + 14 * psi / n;
}

RunConfig bf16_config(int stage, int world) {
  RunConfig config;
  config.world = world;
  config.steps = 1;
  config.options.stage = stage;
  config.options.compute_dtype = torch::kBFloat16;
  config.options.reduce_bucket_size = 500;
  return config;
}

// Excluded from the comparison: padding (< N elements) and transient buffers, which step() frees
// (bucket buffers, the fp32 gradient copy, stage 1's gradient shard); comm_buffers must be 0 here.
TEST(ZeroMemory, ModelStateBytesPerRankMatchPaperFormulaInBf16) {
  torch::set_num_threads(1);
  const Problem problem = make_problem(1, /*hidden=*/256);
  for (int stage : {0, 1, 2}) {
    for (int world = 1; world <= 4; ++world) {
      const RunResult run = run_engine(problem, bf16_config(stage, world));
      const double psi = 8 * 256 + 256 + 256 + 256 * 5 + 5;
      for (int r = 0; r < world; ++r) {
        const MemoryReport& m = run.memory[r];
        const double want = zero_formula_bytes(stage, psi, world);
        EXPECT_NEAR(m.model_states() / want, 1.0, 0.02)
            << "stage " << stage << " world " << world << " rank " << r << ": " << m.model_states()
            << " bytes, formula " << want;
        EXPECT_EQ(m.comm_buffers, 0);
        EXPECT_NEAR(m.compute_params / (2 * psi), 1.0, 0.01);
      }
    }
  }
}

// Ring theory: stage 0 all-reduces Ψ elements (2(N-1)/N·Ψ·bytes sent); stages 1/2 reduce-scatter
// and all-gather Ψ elements ((N-1)/N·Ψ·bytes each). Plus one 8-byte norm all-reduce.
TEST(ZeroCommunication, BytesSentPerStepMatchRingTheory) {
  torch::set_num_threads(1);
  const Problem problem = make_problem(1, /*hidden=*/256);
  const double psi = 8 * 256 + 256 + 256 + 256 * 5 + 5;
  for (int stage : {0, 1, 2}) {
    for (int world = 2; world <= 4; ++world) {
      const RunResult run = run_engine(problem, bf16_config(stage, world));
      const double want = 2.0 * (world - 1) / world * psi * 2;
      for (int r = 0; r < world; ++r) {
        uint64_t total = 0;
        for (const auto& [kind, bytes] : run.comm[r].bytes_sent) total += bytes;
        EXPECT_NEAR(total / want, 1.0, 0.01) << "stage " << stage << " world " << world;
        const bool sharded = stage > 0;
        EXPECT_EQ(run.comm[r].bytes_sent.count(comm::CollectiveKind::kReduceScatter) > 0, sharded);
        EXPECT_EQ(run.comm[r].bytes_sent.count(comm::CollectiveKind::kAllGather) > 0, sharded);
      }
    }
  }
}

// Stage 2 keeps only its gradient shard: parameters hold no .grad after backward, and the transient
// bucket buffers stay within the design bound (buckets spanned by the largest parameter plus the
// collectives in flight), far below a full-size gradient buffer. Model: 8 Linear(32, 32) layers.
TEST(ZeroStage2, NeverHoldsAFullSizeGradientBuffer) {
  torch::set_num_threads(1);
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({2, 8, 32});
  const torch::Tensor y = torch::randn({2, 8, 32});
  run_ranks(4, [&](ThreadCommunicator& comm) {
    torch::nn::Sequential model;
    for (int i = 0; i < 8; ++i) model->push_back(torch::nn::Linear(32, 32));
    std::vector<NamedParameter> params;
    for (const auto& item : model->named_parameters()) params.push_back({item.key(), item.value()});
    EngineOptions options;
    options.stage = 2;
    options.reduce_bucket_size = 512;
    ShardedEngine engine(params, comm, adamw_factory(), options);
    const int64_t full_bytes = engine.partition().padded_numel() * 4;
    for (int s = 0; s < 2; ++s) {
      for (int m = 0; m < 2; ++m) {
        const torch::Tensor xb = micro_batch(x[s], 4, comm.rank(), 2, m);
        const torch::Tensor yb = micro_batch(y[s], 4, comm.rank(), 2, m);
        engine.backward(torch::mse_loss(model->forward(xb), yb), {m, 2});
        for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
        EXPECT_EQ(engine.bytes().gradients, engine.partition().shard_numel() * 4);
      }
      engine.step(1e-3);
    }
    const MemoryReport m = engine.bytes();
    // Largest parameter (1024) spans at most 3 buckets of 512; 2 in flight, each with its chunk.
    const int64_t bound = (3 + 2) * 512 * 4 + 2 * 128 * 4;
    EXPECT_EQ(m.gradients, full_bytes / 4);
    EXPECT_GT(m.comm_buffers_peak, 0);
    EXPECT_LE(m.comm_buffers_peak, bound);
    EXPECT_LT(m.comm_buffers_peak, full_bytes / 2);
    EXPECT_EQ(m.comm_buffers, 0);
  });
}

TEST(ZeroMemory, Fp32Stage0MasterAliasesTheParameterBuffer) {
  const Problem problem = make_problem(1);
  run_ranks(1, [&](ThreadCommunicator& comm) {
    TinyMlp model = make_model(problem);
    auto engine = make_engine(named_parameters(model), comm, adamw_factory(), EngineOptions{});
    EXPECT_EQ(engine->bytes().master_weights, 0);
    const StatePiece piece = engine->owned_state().front();
    EXPECT_EQ(piece.tensors.at("master").data_ptr(),
              model->named_parameters()[piece.param].data_ptr());
  });
}

}  // namespace
}  // namespace dstrain::zero::testing
