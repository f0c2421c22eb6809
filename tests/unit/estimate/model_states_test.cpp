// `dstrain estimate`'s numbers: parameter shapes against the model, and the per-rank bytes against
// what the engine holds for the tiny model.
#include <gtest/gtest.h>

#include <mutex>

#include <nlohmann/json.hpp>

#include "estimate/model_states.h"
#include "model/model.h"
#include "optim/optimizer.h"
#include "qwen25_config.h"
#include "tests/common/thread_communicator.h"
#include "zero/engine.h"

namespace dstrain::estimate {
using zero::EngineOptions;
using zero::MemoryReport;
using zero::NamedParameter;
namespace {

model::ModelConfig tiny_config() {
  return model::load_model_config(DSTRAIN_SOURCE_DIR "/configs/models/tiny");
}

// Block by block, each block's parameters in the order of its weights() (a decoder layer's q, k
// and v weights first, then their biases: the engines' layout), every parameter once.
TEST(Estimate, ParameterShapesAreTheModelsParametersBlockByBlock) {
  model::ModelConfig qwen3 = tiny_config();
  qwen3.model_type = "qwen3";
  qwen3.qk_norm = true;
  qwen3.tie_word_embeddings = false;
  model::ModelConfig biased = tiny_config();
  biased.qkv_bias = biased.o_bias = biased.mlp_bias = true;
  for (const model::ModelConfig& c : {tiny_config(), qwen3, biased}) {
    model::DecoderModel model(c);
    std::vector<std::pair<std::string, int64_t>> in_blocks;
    for (const auto& block : model->blocks()) {
      for (const auto& p : block->parameters) in_blocks.emplace_back(p.name, p.tensor.numel());
    }
    const std::vector<ParamShape> shapes = parameter_shapes(*model);
    ASSERT_EQ(shapes.size(), in_blocks.size());
    ASSERT_EQ(shapes.size(), model->named_parameters().size());
    int64_t sum = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_EQ(shapes[i].name, in_blocks[i].first);
      EXPECT_EQ(shapes[i].numel, in_blocks[i].second) << shapes[i].name;
      sum += shapes[i].numel;
    }
    EXPECT_EQ(shapes[1].name, "model.layers.0.self_attn.q_proj.weight");
    EXPECT_EQ(shapes[2].name, "model.layers.0.self_attn.k_proj.weight");
    EXPECT_EQ(shapes[3].name, "model.layers.0.self_attn.v_proj.weight");
    EXPECT_EQ(sum, c.num_parameters(true));
  }
}

// Qwen2.5-0.5B's config.json (the seed train.yaml's model): 494,032,768 parameters as published.
// In bf16 with AdamW on 8 ranks: stage 0 holds 16 bytes per parameter, stage 2 + optimizer offload
// keeps 2Ψ on the device and 16Ψ/8 on the host (DeepSpeed's ZeRO-Offload estimate).
TEST(Estimate, Qwen25HalfBillionMatchesThePublishedCountAndFormulas) {
  const model::ModelConfig c = testing::qwen25_half_billion();
  EstimateInput in;
  in.params = parameter_shapes(*model::DecoderModel(c, model::Materialize::kNo));
  in.world_size = 8;
  int64_t psi = 0;
  for (const ParamShape& p : in.params) psi += p.numel;
  EXPECT_EQ(psi, 494'032'768);
  EXPECT_EQ(estimate_row(in, 0, false, false).device(), 16 * psi);
  const EstimateRow offload = estimate_row(in, 2, true, false);
  EXPECT_EQ(offload.device(), 2 * psi);
  EXPECT_EQ(offload.host, 16 * psi / 8);
}

// The engine's MemoryReport for the tiny model, rank 0, with Adam and bf16 or fp32 compute.
MemoryReport engine_bytes(int stage, int world, bool offload_opt, bool offload_param,
                          torch::ScalarType dtype, int64_t threshold) {
  MemoryReport report;
  std::mutex mu;
  dstrain::testing::run_ranks(world, [&](dstrain::testing::ThreadCommunicator& comm) {
    torch::manual_seed(0);
    model::DecoderModel model(tiny_config());
    std::vector<NamedParameter> params;
    for (const ParamShape& s : parameter_shapes(*model)) {
      params.push_back({s.name, model->named_parameters()[s.name], s.unit});
    }
    EngineOptions o;
    o.stage = stage;
    o.compute_dtype = dtype;
    o.offload_optimizer = offload_opt;
    o.offload_param = offload_param;
    o.param_persistence_threshold = threshold;
    o.reduce_bucket_size = 100'000;
    auto engine = zero::make_engine(
        params, comm,
        [](int64_t n, std::vector<optim::Range> no_decay) {
          optim::AdamWOptions a;
          a.no_decay = std::move(no_decay);
          return optim::make_adamw(n, a);
        },
        o);
    std::lock_guard<std::mutex> lock(mu);
    if (comm.rank() == 0) report = engine->bytes();
  });
  return report;
}

TEST(Estimate, MatchesTheEngineBytesForTheTinyModel) {
  torch::set_num_threads(1);
  struct Point {
    int stage, world;
    bool offload_opt, offload_param;
    torch::ScalarType dtype;
  };
  const int64_t threshold = 1000;  // the tiny model's matrices are sharded, norms persistent
  for (const Point& p :
       {Point{0, 1, false, false, torch::kBFloat16}, Point{0, 2, false, false, torch::kFloat32},
        Point{1, 3, false, false, torch::kBFloat16}, Point{1, 2, true, false, torch::kFloat32},
        Point{2, 4, true, false, torch::kBFloat16}, Point{3, 2, false, false, torch::kBFloat16},
        Point{3, 3, true, false, torch::kFloat32}, Point{3, 4, true, true, torch::kBFloat16}}) {
    EstimateInput in;
    in.params = parameter_shapes(*model::DecoderModel(tiny_config(), model::Materialize::kNo));
    in.world_size = p.world;
    in.compute_bytes = p.dtype == torch::kFloat32 ? 4 : 2;
    in.optimizer_bytes = 8;
    in.param_persistence_threshold = threshold;
    const EstimateRow want = estimate_row(in, p.stage, p.offload_opt, p.offload_param);
    const MemoryReport got =
        engine_bytes(p.stage, p.world, p.offload_opt, p.offload_param, p.dtype, threshold);
    const auto what = fmt::format("stage {} world {} offload {}/{} {}", p.stage, p.world,
                                  p.offload_opt, p.offload_param, c10::toString(p.dtype));
    auto near = [&](int64_t a, int64_t b, const char* field) {
      EXPECT_NEAR(static_cast<double>(a), static_cast<double>(b), 0.02 * std::max<int64_t>(b, 64))
          << what << " " << field;
    };
    near(want.params, got.compute_params, "params");
    near(want.gradients, got.gradients, "gradients");
    near(want.master, got.master_weights, "master");
    near(want.optimizer, got.optimizer_state, "optimizer");
    near(want.host, got.host_bytes, "host");
    near(want.device(), got.device_model_states(), "device");
  }
}

TEST(Estimate, TableListsEveryStageWithAndWithoutOffload) {
  EstimateInput in;
  in.params = parameter_shapes(*model::DecoderModel(tiny_config(), model::Materialize::kNo));
  in.world_size = 8;
  const std::string table = format_estimate(in, "tiny");
  for (const char* row :
       {"0     none", "1     none", "1     optimizer", "2     none", "2     optimizer",
        "3     none", "3     optimizer ", "3     optimizer+param"}) {
    EXPECT_NE(table.find(row), std::string::npos) << row << "\n" << table;
  }
  const std::string psi =
      fmt::format("{} trainable parameters", tiny_config().num_parameters(true));
  EXPECT_NE(table.find(psi), std::string::npos) << table;
  EXPECT_NE(table.find("8 ranks"), std::string::npos) << table;
}

}  // namespace
}  // namespace dstrain::estimate
