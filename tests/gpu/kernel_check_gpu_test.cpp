// The fused paths' first-use check (model/kernel_check.h) on a GPU, as a run makes it before its
// first step: every path passes against the eager ops and the exact answer at the shapes of real
// models (Llama-3-8B's layer, the widest hidden size the add + RMSNorm kernel takes at more than
// 8192 rows, Qwen2's q/k/v biases, a sliding window for packed documents' attention), in float32
// and bfloat16; a path wrong by 100 units in the last
// place fails, one unit passes; the grouped expert product at Qwen3-30B-A3B's MoE shapes, and an
// expert with no rows gets an exactly zero gradient there. Exits 77 (skipped) without a device.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "model/kernel_check.h"
#include "model/moe.h"

namespace dstrain::model {
namespace {

struct Shape {
  const char* name;
  FusedCheckShapes s;
};

FusedCheckShapes shapes(int64_t rows, int64_t seq, int64_t hidden, int64_t inter, int64_t heads,
                        int64_t kv, int64_t dim, bool bias) {
  FusedCheckShapes s;
  s.rows = rows;
  s.seq_len = seq;
  s.hidden = hidden;
  s.intermediate = inter;
  s.heads = heads;
  s.kv_heads = kv;
  s.head_dim = dim;
  s.qkv_bias = bias;
  s.device = torch::Device(torch::kCUDA, 0);
  return s;
}

std::vector<Shape> models() {
  FusedCheckShapes windowed = shapes(2048, 1024, 896, 4864, 14, 2, 64, true);
  windowed.sliding_window = 256;  // packed documents' attention over a window shorter than some
  // Qwen3-30B-A3B's MoE layer (128 experts of 768; the check takes as many as its budget allows).
  FusedCheckShapes moe = shapes(4096, 2048, 2048, 6144, 32, 4, 128, false);
  moe.experts = 128;
  moe.expert_size = 768;
  // Qwen2.5-0.5B's shapes with 8 experts of 1408 (Qwen1.5-MoE's width): the faults' model.
  FusedCheckShapes small = shapes(1024, 1024, 896, 4864, 14, 2, 64, true);
  small.experts = 8;
  small.expert_size = 1408;
  return {{"llama-3-8b, 4 x 2048", shapes(8192, 2048, 4096, 14336, 32, 8, 128, false)},
          {"hidden 8192, 9000 rows", shapes(9000, 1000, 8192, 8192, 64, 8, 128, false)},
          {"qwen2.5-0.5b with 8 experts, 1 x 1024", small},
          {"qwen2.5-0.5b with a window of 256, 2 x 1024", windowed},
          {"qwen3-30b-a3b, 2 x 2048", moe}};
}

class KernelCheckGpu : public ::testing::TestWithParam<torch::Dtype> {};

TEST_P(KernelCheckGpu, EveryPathPassesAtRealModelsShapes) {
  for (Shape m : models()) {
    m.s.dtype = GetParam();
    for (const FusedCheck& c : check_fused_paths(m.s)) {
      EXPECT_TRUE(c.passed) << m.name << ", " << fused_path_name(c.path) << ": " << c.tensor
                            << " error " << c.error << " > bound " << c.bound << " (" << c.rows
                            << " rows)";
    }
  }
}

TEST_P(KernelCheckGpu, APathWrongBy100UlpsFailsAndOneUlpPasses) {
  FusedCheckShapes s = models()[2].s;
  s.dtype = GetParam();
  for (int p = 0; p < kFusedPathCount; ++p) {
    const auto path = static_cast<FusedPath>(p);
    for (const FusedCheck& c : check_fused_paths(s, PlantedFault{path, 100})) {
      // A path the run does not take here (packed documents' attention in float32) is not checked.
      if (c.tensor.rfind("not used", 0) == 0) continue;
      EXPECT_EQ(c.passed, c.path != path)
          << fused_path_name(path) << " planted, " << fused_path_name(c.path) << ": " << c.error
          << " vs " << c.bound;
    }
    for (const FusedCheck& c : check_fused_paths(s, PlantedFault{path, 1})) {
      EXPECT_TRUE(c.passed) << "1 ulp in " << fused_path_name(path) << ", "
                            << fused_path_name(c.path) << ": " << c.error << " > " << c.bound;
    }
  }
}

// at::_grouped_mm's known hazards on the card, in bfloat16: an expert with no rows gets an exactly
// zero weight gradient, and every output row is written (none left as the allocator had it).
TEST(GroupedExpertsGpu, AnEmptyExpertGetsAnExactlyZeroGradient) {
  const torch::TensorOptions bf16 =
      torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA, 0);
  torch::manual_seed(3);
  const int64_t E = 4, C = 256, I = 128, M = 96;
  const torch::Tensor rows = torch::randn({M, C}, bf16);
  const torch::Tensor gate_up = (torch::randn({E, 2 * I, C}, bf16) * 0.05).requires_grad_(true);
  const torch::Tensor down = (torch::randn({E, C, I}, bf16) * 0.05).requires_grad_(true);
  // Expert 2 gets no row.
  const torch::Tensor ends = torch::tensor({40, 64, 64, 96}, torch::kInt32).to(rows.device());
  ASSERT_TRUE(grouped_experts_on(rows));
  for (int pass = 0; pass < 2; ++pass) {
    // The second time over memory the first left dirty.
    const torch::Tensor out = experts_mlp(rows, gate_up, down, ends, true);
    out.backward(torch::ones_like(out));
    EXPECT_EQ(gate_up.grad()[2].abs().max().item<float>(), 0.0f);
    EXPECT_EQ(down.grad()[2].abs().max().item<float>(), 0.0f);
    EXPECT_GT(gate_up.grad()[1].abs().max().item<float>(), 0.0f);
    const torch::Tensor loop = experts_mlp(rows, gate_up, down, ends, false);
    EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
    EXPECT_LT((out - loop).abs().max().item<float>(), 0.05 * loop.abs().max().item<float>());
    gate_up.mutable_grad() = torch::Tensor();
    down.mutable_grad() = torch::Tensor();
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KernelCheckGpu, ::testing::Values(torch::kFloat, torch::kBFloat16),
                         [](const auto& info) {
                           return info.param == torch::kFloat ? "float32" : "bfloat16";
                         });

}  // namespace
}  // namespace dstrain::model
