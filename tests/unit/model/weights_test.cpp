#include "model/weights.h"

#include <set>

#include <gtest/gtest.h>

#include "core/fs.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace dstrain::model {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;
using testing::expect_error;
using testing::small_config;
using testing::small_config_json;
using testing::TempDir;

void expect_same_parameters(DecoderModelImpl& a, DecoderModelImpl& b) {
  auto pb = b.named_parameters();
  ASSERT_EQ(a.named_parameters().size(), pb.size());
  for (const auto& item : a.named_parameters())
    EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
}

NamedTensors parameters_of(DecoderModelImpl& m) {
  NamedTensors out;
  for (const auto& item : m.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

TEST(Weights, SaveThenLoadIsBitIdentical) {
  TempDir dir;
  const ModelConfig c = load_model_config(testing::tiny_config_path());
  DecoderModel saved = build_model(c, torch::kFloat, 1);
  save_weights(*saved, dir.path(), torch::kFloat);
  EXPECT_TRUE(stdfs::exists(dir / "model.safetensors"));
  const ModelConfig back_cfg = load_model_config(dir.path());
  EXPECT_EQ(back_cfg.num_parameters(true), c.num_parameters(true));
  EXPECT_EQ(back_cfg.torch_dtype, "float32");
  DecoderModel loaded = build_model(back_cfg, torch::kFloat, 2);
  load_weights(*loaded, dir.path());
  expect_same_parameters(*saved, *loaded);
}

TEST(Weights, Bf16SaveLoadRoundTrip) {
  TempDir dir;
  DecoderModel fp32 = build_model(small_config(), torch::kFloat, 1);
  save_weights(*fp32, dir.path(), torch::kBFloat16);
  EXPECT_EQ(SafetensorsFile(dir / "model.safetensors").info("model.norm.weight").dtype, "BF16");
  const ModelConfig c = load_model_config(dir.path());
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  DecoderModel bf16 = build_model(c, resolve_dtype("auto", c), 2);
  load_weights(*bf16, dir.path());
  fp32->to(torch::kBFloat16);
  expect_same_parameters(*fp32, *bf16);
  // Loading converts to the model's dtype: bf16 file into an fp32 model.
  DecoderModel widened = build_model(c, torch::kFloat, 3);
  load_weights(*widened, dir.path());
  EXPECT_TRUE(
      torch::equal(widened->model->norm->weight, fp32->model->norm->weight.to(torch::kFloat)));
}

TEST(Weights, ShardedSaveLoadRoundTrip) {
  TempDir dir;
  DecoderModel saved = build_model(small_config("qwen2"), torch::kFloat, 4);
  save_weights(*saved, dir.path(), torch::kFloat, 40'000);
  EXPECT_TRUE(stdfs::exists(dir / kSafetensorsIndexFile));
  EXPECT_FALSE(stdfs::exists(dir / kSafetensorsFile));
  const json index = json::parse(fs::read_file(dir / kSafetensorsIndexFile));
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items())
    shards.insert(file.get<std::string>());
  EXPECT_GE(shards.size(), 3u);
  for (const std::string& f : shards) EXPECT_LE(stdfs::file_size(dir / f), 40'000u + 4096) << f;
  DecoderModel loaded = build_model(small_config("qwen2"), torch::kFloat, 5);
  load_weights(*loaded, dir.path());
  expect_same_parameters(*saved, *loaded);
}

TEST(Weights, MissingUnexpectedAndMisshapenTensorsAreNamed) {
  TempDir dir;
  DecoderModel m = build_model(small_config(), torch::kFloat, 1);
  NamedTensors t = parameters_of(*m);
  t.erase(t.begin() + 3);  // a q/k/v/o weight of layer 0
  const std::string dropped = parameters_of(*m)[3].first;
  t.emplace_back("model.layers.9.mlp.up_proj.weight", torch::zeros({2}));
  for (auto& nt : t)
    if (nt.first == "model.norm.weight") nt.second = torch::ones({63});
  write_safetensors(dir / kSafetensorsFile, t);
  expect_error([&] { load_weights(*m, dir.path()); }, ErrorKind::kInput,
               {dir.path().string(), "missing tensors: " + dropped,
                "unexpected tensors: model.layers.9.mlp.up_proj.weight",
                "model.norm.weight (file [63], model [64])"});
}

TEST(Weights, TiedModelToleratesLmHeadAndInvFreqInFile) {
  TempDir dir;
  json doc = small_config_json();
  doc["tie_word_embeddings"] = true;
  DecoderModel m = build_model(parse_model_config(doc), torch::kFloat, 1);
  NamedTensors t = parameters_of(*m);
  t.emplace_back("lm_head.weight", m->model->embed_tokens->weight);
  t.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", torch::ones({8}));
  write_safetensors(dir / kSafetensorsFile, t);
  DecoderModel loaded = build_model(parse_model_config(doc), torch::kFloat, 2);
  load_weights(*loaded, dir.path());
  expect_same_parameters(*m, *loaded);
}

TEST(Weights, UntiedModelNeedsLmHead) {
  TempDir dir;
  json doc = small_config_json();
  doc["tie_word_embeddings"] = true;
  DecoderModel tied = build_model(parse_model_config(doc), torch::kFloat, 1);
  save_weights(*tied, dir.path(), torch::kFloat);
  DecoderModel untied = build_model(small_config(), torch::kFloat, 1);
  expect_error([&] { load_weights(*untied, dir.path()); }, ErrorKind::kInput,
               {"missing tensors: lm_head.weight"});
}

}  // namespace
}  // namespace dstrain::model
