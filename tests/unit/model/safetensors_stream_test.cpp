// write_safetensors_dir_streamed(): values asked one tensor at a time, in order; the files read
// back like write_safetensors_dir()'s, in one file or in shards with an index.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "core/fs.h"
#include "model/safetensors.h"
#include "tests/unit/model/test_util.h"

namespace dstrain::model {
namespace {

std::vector<TensorSpec> specs() {
  return {{"a", {3, 4}}, {"b", {5}}, {"c", {2, 2, 2}}, {"empty", {0, 3}}};
}

torch::Tensor values_of(const TensorSpec& spec) {
  const int64_t seed = static_cast<int64_t>(spec.name[0]);
  return torch::arange(1, 1 + torch::ones(spec.shape).numel(), torch::kFloat32)
      .reshape(spec.shape)
      .mul(0.1 * seed);
}

TEST(SafetensorsStreamed, AsksEachTensorOnceInOrderAndReadsBackCast) {
  testing::TempDir dir;
  std::vector<std::string> asked;
  const auto files = write_safetensors_dir_streamed(
      dir.path(), specs(), torch::kBFloat16,
      [&](const TensorSpec& s) {
        asked.push_back(s.name);
        return values_of(s);
      },
      1'000'000);
  EXPECT_EQ(asked, (std::vector<std::string>{"a", "b", "c", "empty"}));
  ASSERT_EQ(files.size(), 1u);
  const SafetensorsSet set(dir.path());
  for (const TensorSpec& s : specs()) {
    const torch::Tensor got = set.read(s.name);
    EXPECT_EQ(got.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(got, values_of(s).to(torch::kBFloat16))) << s.name;
  }
}

TEST(SafetensorsStreamed, SplitsIntoShardsWithAnIndexLikeTheInMemoryWriter) {
  testing::TempDir streamed, in_memory;
  NamedTensors tensors;
  for (const TensorSpec& s : specs()) tensors.emplace_back(s.name, values_of(s));
  // 24 bytes per shard in fp16: a (24 B) alone, b + c (10 + 16 B) split.
  const auto a =
      write_safetensors_dir_streamed(streamed.path(), specs(), torch::kHalf, values_of, 24);
  const auto b = write_safetensors_dir(in_memory.path(), tensors, 24, torch::kHalf);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 2u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].filename(), b[i].filename());
    EXPECT_EQ(fs::read_file(a[i]), fs::read_file(b[i])) << a[i];
  }
}

TEST(SafetensorsStreamed, WrongShapeFromTheSourceIsAnError) {
  testing::TempDir dir;
  try {
    write_safetensors_dir_streamed(
        dir.path(), specs(), torch::kFloat32, [](const TensorSpec&) { return torch::zeros({7}); },
        1'000'000);
    FAIL() << "a tensor of the wrong shape was written";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path() / kSafetensorsFile));
}

}  // namespace
}  // namespace dstrain::model
