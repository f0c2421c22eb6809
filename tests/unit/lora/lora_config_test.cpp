// The `lora:` config section as users write it: the seed project's train.yaml section applies to
// the tiny Llama as written.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "config/config.h"
#include "model/model_config.h"
#include "tests/unit/lora/lora_test_util.h"
#include "train/lora_setup.h"

namespace dstrain::lora::testing {
namespace {

// The shared folder sits beside the main checkout, or two levels up from a worktree.
std::string seed_config() {
  for (const char* rel : {"/../shared", "/../../shared"}) {
    const std::string p = std::string(DSTRAIN_SOURCE_DIR) + rel + "/seed-configs/train.yaml";
    if (std::ifstream(p)) return p;
  }
  return "";
}

// The top-level `lora:` block of a YAML file, verbatim.
std::string lora_section(const std::string& path) {
  std::ifstream in(path);
  std::string line, out;
  bool inside = false;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != ' ' && line[0] != '#') inside = line.rfind("lora:", 0) == 0;
    if (inside) out += line + "\n";
  }
  return out;
}

// Loads a config file (in a temporary directory) on the tiny model with `lora_yaml` appended.
config::Config tiny_config_with(const std::string& lora_yaml) {
  TempDir dir;
  const std::string yaml = std::string("model:\n  name_or_path: ") + DSTRAIN_SOURCE_DIR +
                           "/configs/models/tiny\n  init: random\n  tokenizer: byte\n"
                           "data:\n  train_path: corpus.txt\ntraining:\n  seed: 42\n" +
                           lora_yaml;
  std::ofstream(dir / "test.yaml") << yaml;
  return config::load_config((dir / "test.yaml").string());
}

TEST(LoraConfig, SeedTrainYamlSectionAppliesToTheTinyLlama) {
  const std::string seed = seed_config();
  if (seed.empty()) GTEST_SKIP() << "the shared seed-configs/train.yaml is absent";
  const std::string section = lora_section(seed);
  ASSERT_NE(section.find("target_modules"), std::string::npos) << section;
  const config::Config c = tiny_config_with(section);
  ASSERT_TRUE(c.lora.enabled);
  const LoraOptions o = train::lora_options(c);
  EXPECT_EQ(o.r, 16);
  EXPECT_EQ(o.alpha, 32);
  EXPECT_EQ(o.dropout, 0.05);
  EXPECT_FALSE(o.target_regex);
  EXPECT_DOUBLE_EQ(o.scale(), 2.0);
  EXPECT_EQ(o.seed, 42u);
  const auto mc = model::load_model_config(DSTRAIN_SOURCE_DIR "/configs/models/tiny/config.json");
  model::DecoderModel m = model::build_model(mc, torch::kFloat, 42);
  LoraModel lora(m, o, c.source_path);
  EXPECT_EQ(lora.modules().size(), 16u);  // 4 layers × q, k, v, o
  EXPECT_EQ(lora.modules().back(), "model.layers.3.self_attn.o_proj");
}

TEST(LoraConfig, UnknownTargetInTheConfigNamesTheFileAndKey) {
  const config::Config c = tiny_config_with("lora:\n  target_modules: [q_proj, c_attn]\n");
  const auto mc = model::load_model_config(DSTRAIN_SOURCE_DIR "/configs/models/tiny/config.json");
  model::DecoderModel m = model::build_model(mc, torch::kFloat, 1);
  expect_error([&] { LoraModel lora(m, train::lora_options(c), c.source_path); },
               ErrorKind::kConfig,
               {"test.yaml: lora.target_modules", "'c_attn' matches no module", "q_proj, k_proj"});
}

TEST(LoraConfig, BiasOtherThanNoneIsRefusedByTheConfigLoader) {
  expect_error([&] { tiny_config_with("lora:\n  bias: all\n"); }, ErrorKind::kConfig,
               {"test.yaml", "lora.bias", "'all' is not supported", "only none"});
}

// lora.init_from: the adapter's shape-defining settings win over the config's; the training ones
// (dropout, seed, init) stay the config's.
TEST(LoraConfig, InitFromTakesRankAlphaTargetsAndRsLoraFromTheAdapter) {
  LoraOptions config = small_options();
  config.dropout = 0.1;
  Adapter adapter;
  adapter.options.r = 32;
  adapter.options.alpha = 64;
  adapter.options.dropout = 0.0;
  adapter.options.target_modules = {R"(.*\.o_proj)"};
  adapter.options.target_regex = true;
  adapter.options.use_rslora = true;
  const LoraOptions o = train::options_from_adapter(config, adapter, "adapter_dir");
  EXPECT_EQ(o.r, 32);
  EXPECT_EQ(o.alpha, 64);
  EXPECT_EQ(o.target_modules, adapter.options.target_modules);
  EXPECT_TRUE(o.target_regex);
  EXPECT_TRUE(o.use_rslora);
  EXPECT_EQ(o.dropout, 0.1);
  EXPECT_EQ(o.seed, config.seed);
}

}  // namespace
}  // namespace dstrain::lora::testing
