// The fused paths' first-use check (model/kernel_check.h) on the CPU, where the CUDA kernels'
// float32 references stand in for the kernels: every path passes at a layer's shapes, a path
// wrong by 100 units in the last place fails alone, a path wrong by 1 unit still passes; the
// grouped expert product is not used by a dense model.
#include "model/kernel_check.h"

#include <gtest/gtest.h>

namespace dstrain::model {
namespace {

// A small layer (Qwen2-like: GQA, q/k/v biases optional) at 600 rows, so that the add + RMSNorm
// backward splits its rows over several blocks.
FusedCheckShapes layer(bool qkv_bias) {
  FusedCheckShapes s;
  s.rows = 600;
  s.seq_len = 40;
  s.hidden = 96;
  s.intermediate = 160;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 24;
  s.qkv_bias = qkv_bias;
  s.eps = 1e-6;
  s.experts = 6;  // a MoE model's: the grouped expert product too
  s.expert_size = 32;
  return s;
}

TEST(KernelCheck, EveryPathPassesAtALayersShapes) {
  for (const bool bias : {false, true}) {
    const std::vector<FusedCheck> checks = check_fused_paths(layer(bias));
    ASSERT_EQ(checks.size(), static_cast<size_t>(kFusedPathCount));
    for (int p = 0; p < kFusedPathCount; ++p) {
      const FusedCheck& c = checks[p];
      EXPECT_EQ(c.path, static_cast<FusedPath>(p));
      EXPECT_TRUE(c.passed) << fused_path_name(c.path) << ": " << c.tensor << " " << c.error
                            << " > " << c.bound;
      EXPECT_LE(c.error, c.bound);
      EXPECT_GT(c.bound, 0) << fused_path_name(c.path);
      EXPECT_EQ(c.rows, 600) << fused_path_name(c.path);
    }
  }
}

TEST(KernelCheck, APathWrongBy100UlpsFailsAloneAndOneUlpPasses) {
  for (int faulty = 0; faulty < kFusedPathCount; ++faulty) {
    const auto path = static_cast<FusedPath>(faulty);
    const std::vector<FusedCheck> checks = check_fused_paths(layer(true), PlantedFault{path, 100});
    for (const FusedCheck& c : checks) {
      EXPECT_EQ(c.passed, c.path != path)
          << "fault in " << fused_path_name(path) << ", checked " << fused_path_name(c.path) << ": "
          << c.tensor << " " << c.error << " vs " << c.bound;
      if (c.path == path) {
        EXPECT_GT(c.error, c.bound);
        EXPECT_FALSE(c.tensor.empty());
      }
    }
    for (const FusedCheck& c : check_fused_paths(layer(true), PlantedFault{path, 1})) {
      EXPECT_TRUE(c.passed) << "1 ulp in " << fused_path_name(path) << ": " << c.tensor << " "
                            << c.error << " > " << c.bound;
    }
  }
}

TEST(KernelCheck, ADenseModelDoesNotUseTheGroupedExpertProduct) {
  FusedCheckShapes dense = layer(false);
  dense.experts = 0;
  const FusedCheck c = check_fused_paths(dense).back();
  EXPECT_EQ(c.path, FusedPath::kGroupedExperts);
  EXPECT_TRUE(c.passed);
  EXPECT_EQ(c.tensor, "not used by a dense model");
}

TEST(KernelCheck, TheCheckLeavesTheGlobalGeneratorAsItWas) {
  torch::manual_seed(7);
  const torch::Tensor expected = torch::rand({4});
  torch::manual_seed(7);
  check_fused_paths(layer(false));
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected));
}

TEST(KernelCheck, EachPathHasItsOwnSwitch) {
  for (int p = 0; p < kFusedPathCount; ++p) {
    const auto path = static_cast<FusedPath>(p);
    ASSERT_TRUE(fused_path_on(path));
    set_fused_path_on(path, false);
    for (int q = 0; q < kFusedPathCount; ++q) {
      EXPECT_EQ(fused_path_on(static_cast<FusedPath>(q)), q != p);
    }
    set_fused_path_on(path, true);
  }
}

}  // namespace
}  // namespace dstrain::model
