#include "launcher/stage_inputs.h"

#include <cstdlib>
#include <fstream>

#include <gtest/gtest.h>

#include "tests/common/temp_dir.h"

namespace dstrain::launcher {
namespace {

namespace stdfs = std::filesystem;
using testing::TempDir;

void write(const stdfs::path& p, const std::string& text) {
  stdfs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

std::string env_value(const EnvList& env, const std::string& name) {
  for (const auto& [k, v] : env) {
    if (k == name) return v;
  }
  return "";
}

// A shared-storage layout: a model folder and a run whose token cache holds an entry of the
// train file and one of some other data.
struct SharedInputs {
  TempDir tmp;
  config::Config config;
  SharedInputs() {
    write(tmp / "model/config.json", "{}");
    write(tmp / "model/model.safetensors", std::string(3000, 'w'));
    write(tmp / "model/tokenizer.json", "{\"tok\": 1}");
    write(tmp / "model/README.md", "not read by the ranks");
    config.model.name_or_path = (tmp / "model").string();
    config.data.train_path = "data/train.jsonl";
    config.logging.out_dir = (tmp / "run").string();
    write(tmp / "run/data_cache/aaaa.tokens", "tokens of train");
    write(tmp / "run/data_cache/aaaa.json", R"({"source": "data/train.jsonl"})");
    write(tmp / "run/data_cache/aaaa.lock", "");
    write(tmp / "run/data_cache/bbbb.tokens", "tokens of other data");
    write(tmp / "run/data_cache/bbbb.json", R"({"source": "data/other.jsonl"})");
  }
};

TEST(StageInputs, StagesTheModelFilesAndTheTrainCacheEntriesThenReusesThem) {
  SharedInputs in;
  const std::string stage = (in.tmp / "local").string();
  StageReport first = stage_inputs(in.config, stage);
  EXPECT_EQ(first.copied_files, 5) << "config, tokenizer, weights, and one cache entry (2 files)";
  EXPECT_EQ(first.reused_files, 0);
  EXPECT_TRUE(first.notes.empty());
  const stdfs::path model(first.model_dir);
  EXPECT_EQ(model.parent_path(), stdfs::path(stage) / "models");
  EXPECT_TRUE(stdfs::exists(model / "config.json"));
  EXPECT_TRUE(stdfs::exists(model / "tokenizer.json"));
  EXPECT_EQ(stdfs::file_size(model / "model.safetensors"), 3000u);
  EXPECT_FALSE(stdfs::exists(model / "README.md"));
  const stdfs::path cache(first.data_cache_dir);
  EXPECT_TRUE(stdfs::exists(cache / "aaaa.tokens"));
  EXPECT_TRUE(stdfs::exists(cache / "aaaa.json"));
  EXPECT_FALSE(stdfs::exists(cache / "bbbb.tokens"));
  EXPECT_EQ(env_value(first.env, kStagedModelDirEnv), first.model_dir);
  EXPECT_EQ(env_value(first.env, kStagedModelSourceEnv), in.config.model.name_or_path + "@main");
  EXPECT_EQ(env_value(first.env, kStagedDataCacheEnv), first.data_cache_dir);

  StageReport second = stage_inputs(in.config, stage);
  EXPECT_EQ(second.copied_files, 0);
  EXPECT_EQ(second.reused_files, 5);
  EXPECT_EQ(second.reused_bytes, first.copied_bytes);
  EXPECT_EQ(second.model_dir, first.model_dir);
  EXPECT_EQ(second.data_cache_dir, first.data_cache_dir);
}

TEST(StageInputs, RandomInitStagesNoWeights) {
  SharedInputs in;
  in.config.model.init = "random";
  StageReport r = stage_inputs(in.config, (in.tmp / "local").string());
  EXPECT_FALSE(stdfs::exists(stdfs::path(r.model_dir) / "model.safetensors"));
  EXPECT_TRUE(stdfs::exists(stdfs::path(r.model_dir) / "config.json"));
}

TEST(StageInputs, NoCacheEntryYetIsANoteAndNoDataVariable) {
  SharedInputs in;
  in.config.data.train_path = "data/new.jsonl";
  StageReport r = stage_inputs(in.config, (in.tmp / "local").string());
  EXPECT_TRUE(r.data_cache_dir.empty());
  EXPECT_EQ(env_value(r.env, kStagedDataCacheEnv), "");
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("no tokenized cache of data/new.jsonl"), std::string::npos)
      << r.notes[0];
}

TEST(StageInputs, HubModelNotInTheCacheIsANoteNotADownload) {
  SharedInputs in;
  ::setenv("HF_HUB_CACHE", (in.tmp / "hf").string().c_str(), 1);
  in.config.model.name_or_path = "SomeOrg/some-model";
  StageReport r = stage_inputs(in.config, (in.tmp / "local").string());
  ::unsetenv("HF_HUB_CACHE");
  EXPECT_TRUE(r.model_dir.empty());
  EXPECT_EQ(env_value(r.env, kStagedModelDirEnv), "");
  ASSERT_FALSE(r.notes.empty());
  EXPECT_NE(r.notes[0].find("'SomeOrg/some-model' (revision 'main') is not in the Hugging Face"),
            std::string::npos)
      << r.notes[0];
}

TEST(StageInputs, HubModelInTheCacheIsStagedFromItsSnapshot) {
  SharedInputs in;
  const stdfs::path repo = in.tmp / "hf/models--SomeOrg--some-model";
  const std::string commit(40, 'a');
  write(repo / "refs/main", commit);
  write(repo / "blobs/cfg", "{}");
  write(repo / "blobs/w", "weights");
  stdfs::create_directories(repo / "snapshots" / commit);
  stdfs::create_symlink("../../blobs/cfg", repo / "snapshots" / commit / "config.json");
  stdfs::create_symlink("../../blobs/w", repo / "snapshots" / commit / "model.safetensors");
  ::setenv("HF_HUB_CACHE", (in.tmp / "hf").string().c_str(), 1);
  in.config.model.name_or_path = "SomeOrg/some-model";
  StageReport r = stage_inputs(in.config, (in.tmp / "local").string());
  ::unsetenv("HF_HUB_CACHE");
  ASSERT_FALSE(r.model_dir.empty());
  std::ifstream weights(stdfs::path(r.model_dir) / "model.safetensors");
  std::string text;
  weights >> text;
  EXPECT_EQ(text, "weights");
  EXPECT_FALSE(stdfs::is_symlink(stdfs::path(r.model_dir) / "model.safetensors"));
}

TEST(StageInputs, RankTakesTheStagedModelOnlyForTheModelItCopies) {
  config::ModelSection m;
  m.name_or_path = "/shared/models/x";
  ::setenv(kStagedModelDirEnv, "/local/models/abc", 1);
  ::setenv(kStagedModelSourceEnv, model_source_label(m).c_str(), 1);
  EXPECT_EQ(staged_model_dir(m), "/local/models/abc");
  m.revision = "v2";
  EXPECT_EQ(staged_model_dir(m), "");
  ::unsetenv(kStagedModelDirEnv);
  ::unsetenv(kStagedModelSourceEnv);
  EXPECT_EQ(staged_model_dir(m), "");
}

TEST(StageInputs, ReportLineSaysWhatWasCopiedAndReused) {
  StageReport r;
  r.copied_files = 3;
  r.copied_bytes = int64_t{1288490189};
  r.reused_files = 1;
  r.reused_bytes = 512;
  r.seconds = 2.14;
  r.notes = {"a note"};
  EXPECT_EQ(format_stage_report(r, "h1", "/local/stage"),
            "stage: node h1: copied 3 files (1.2 GiB), reused 1 (512 B) in 2.1 s into "
            "/local/stage\nstage: node h1: a note\n");
}

TEST(StageInputs, FlagWinsOverTheConfigKey) {
  config::Config c;
  c.data.stage_dir = "/from/config";
  EXPECT_EQ(stage_dir_of("", c), "/from/config");
  EXPECT_EQ(stage_dir_of("/from/flag", c), "/from/flag");
}

}  // namespace
}  // namespace dstrain::launcher
