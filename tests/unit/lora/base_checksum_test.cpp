// The base-model checksum identifies weights, whatever built them, and changes with any bit.
#include <gtest/gtest.h>

#include "lora/base_checksum.h"
#include "model/weights.h"
#include "tests/unit/lora/lora_test_util.h"

namespace dstrain::lora::testing {
namespace {

TEST(BaseChecksum, SameWeightsGiveTheSameChecksumWhicheverWayBuilt) {
  TempDir dir;
  auto a = small_model(1);
  const std::string sum = base_checksum(*a);
  EXPECT_EQ(sum.size(), 8u);
  EXPECT_EQ(base_checksum(*small_model(1)), sum);
  model::save_weights(*a, dir.path(), torch::kFloat);
  model::DecoderModel loaded(small_config());
  model::load_weights(*loaded, dir.path());
  EXPECT_EQ(base_checksum(*loaded), sum);
  EXPECT_NE(base_checksum(*small_model(2)), sum);
}

TEST(BaseChecksum, OneChangedElementOrDtypeChangesIt) {
  auto m = small_model(1);
  const std::string sum = base_checksum(*m);
  {
    torch::NoGradGuard no_grad;
    m->model->norm->weight[5].add_(1e-3);
  }
  EXPECT_NE(base_checksum(*m), sum);
  auto bf16 = small_model(1);
  bf16->to(torch::kBFloat16);
  EXPECT_NE(base_checksum(*bf16), sum);
}

}  // namespace
}  // namespace dstrain::lora::testing
