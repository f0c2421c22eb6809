// The fused paths' check agreed over the ranks (train/fused_check.h): a fault on one rank of two
// switches that path off on both, and the warning names the rank.
#include "train/fused_check.h"

#include <gtest/gtest.h>

#include "tests/common/thread_communicator.h"

namespace dstrain::train {
namespace {

model::FusedCheckShapes layer() {
  model::FusedCheckShapes s;
  s.rows = 96;
  s.seq_len = 24;
  s.hidden = 64;
  s.intermediate = 128;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 16;
  return s;
}

// Puts every switch back on, whatever a test left.
struct SwitchesOn {
  ~SwitchesOn() {
    for (int p = 0; p < model::kFusedPathCount; ++p) {
      model::set_fused_path_on(static_cast<model::FusedPath>(p), true);
    }
  }
};

TEST(FusedCheck, AFaultOnOneRankSwitchesThatPathOffOnEveryRank) {
  const SwitchesOn restore;
  std::vector<std::vector<FusedPathVerdict>> verdicts(2);
  dstrain::testing::run_ranks(2, [&](dstrain::testing::ThreadCommunicator& comm) {
    std::optional<model::PlantedFault> fault;
    if (comm.rank() == 1) fault = model::PlantedFault{model::FusedPath::kSwiglu, 100};
    verdicts[comm.rank()] = check_fused_kernels(comm, layer(), fault);
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(verdicts[r].size(), static_cast<size_t>(model::kFusedPathCount));
    for (const FusedPathVerdict& v : verdicts[r]) {
      const bool faulty = v.path == model::FusedPath::kSwiglu;
      EXPECT_EQ(v.on, !faulty) << "rank " << r << ": " << model::fused_path_name(v.path);
      EXPECT_EQ(v.failed_ranks, faulty ? std::vector<int>{1} : std::vector<int>{});
      if (faulty) {
        EXPECT_GT(v.error, v.bound);
        const std::string said = describe_verdict(v);
        EXPECT_NE(said.find("SwiGLU"), std::string::npos) << said;
        EXPECT_NE(said.find("rank(s) 1"), std::string::npos) << said;
        // The tensor is named where the failing rank is the one describing it.
        EXPECT_EQ(v.tensor.empty(), r != 1) << said;
      } else {
        EXPECT_EQ(describe_verdict(v), "");
      }
    }
  }
  EXPECT_FALSE(model::fused_path_on(model::FusedPath::kSwiglu));
  EXPECT_TRUE(model::fused_path_on(model::FusedPath::kAddRmsNorm));
}

TEST(FusedCheck, NoFaultLeavesEveryPathOn) {
  const SwitchesOn restore;
  dstrain::testing::run_ranks(2, [&](dstrain::testing::ThreadCommunicator& comm) {
    for (const FusedPathVerdict& v : check_fused_kernels(comm, layer())) {
      EXPECT_TRUE(v.on) << model::fused_path_name(v.path);
      EXPECT_TRUE(v.failed_ranks.empty());
    }
  });
  for (int p = 0; p < model::kFusedPathCount; ++p) {
    EXPECT_TRUE(model::fused_path_on(static_cast<model::FusedPath>(p)));
  }
}

}  // namespace
}  // namespace dstrain::train
