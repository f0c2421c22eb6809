#include "hub/model_files.h"

#include <gtest/gtest.h>

#include "hub_test_util.h"

namespace dstrain::hub {
namespace {

using Files = std::vector<std::string>;
using testing::TempDir;

TEST(ModelFiles, ConfigTokenizerAndSingleFileWeightsOnly) {
  const Files repo = {
      ".gitattributes",    "README.md",         "config.json",          "generation_config.json",
      "model.safetensors", "pytorch_model.bin", "tokenizer.json",       "tokenizer_config.json",
      "vocab.json",        "merges.txt",        "original/params.json", "consolidated.safetensors"};
  EXPECT_EQ(model_files(repo, true, "Org/M"),
            (Files{"config.json", "generation_config.json", "tokenizer.json",
                   "tokenizer_config.json", "vocab.json", "merges.txt", "model.safetensors"}));
}

TEST(ModelFiles, ShardedWeightsGoThroughTheIndex) {
  const Files repo = {"config.json", "model-00001-of-00002.safetensors",
                      "model-00002-of-00002.safetensors", "model.safetensors.index.json",
                      "model.safetensors"};
  EXPECT_EQ(model_files(repo, true, "Org/M"),
            (Files{"config.json", "model.safetensors.index.json"}));
}

TEST(ModelFiles, WithoutWeightsOnlyConfigAndTokenizer) {
  EXPECT_EQ(model_files({"config.json", "model.safetensors", "tokenizer.model"}, false, "Org/M"),
            (Files{"config.json", "tokenizer.model"}));
}

TEST(ModelFiles, RepoWithoutConfigOrSafetensorsIsInputError) {
  testing::expect_error([] { model_files({"README.md"}, true, "Org/M"); }, ErrorKind::kInput,
                        {"Org/M", "config.json", "README.md"});
  testing::expect_error(
      [] {
        model_files({"config.json", "pytorch_model.bin"}, true, "Org/M");
      },
      ErrorKind::kInput, {"Org/M", "safetensors", "pytorch_model.bin"});
}

TEST(ModelFiles, IndexShardsAreSortedAndUnique) {
  TempDir dir;
  testing::write(dir / "index.json",
                 R"({"metadata": {}, "weight_map": {"a": "s-2.safetensors", "b": "s-1.safetensors",
                 "c": "s-2.safetensors"}})");
  EXPECT_EQ(index_shards(dir / "index.json"), (Files{"s-1.safetensors", "s-2.safetensors"}));
  testing::write(dir / "bad.json", R"({"metadata": {}})");
  testing::expect_error([&] { index_shards(dir / "bad.json"); }, ErrorKind::kInput,
                        {"bad.json", "weight_map"});
}

TEST(ModelFiles, MissingFilesOfASnapshot) {
  TempDir dir;
  EXPECT_EQ(missing_model_files(dir.path(), false), (Files{"config.json"}));
  testing::write(dir / "config.json");
  EXPECT_TRUE(missing_model_files(dir.path(), false).empty());
  EXPECT_EQ(missing_model_files(dir.path(), true).size(), 1u);
  testing::write(dir / "model.safetensors.index.json",
                 R"({"weight_map": {"a": "s-1.safetensors", "b": "s-2.safetensors"}})");
  testing::write(dir / "s-1.safetensors");
  EXPECT_EQ(missing_model_files(dir.path(), true), (Files{"s-2.safetensors"}));
  testing::write(dir / "s-2.safetensors");
  EXPECT_TRUE(missing_model_files(dir.path(), true).empty());
}

}  // namespace
}  // namespace dstrain::hub
