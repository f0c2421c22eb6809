// `dstrain export` streams parameters from the checkpoint into the safetensors files: what it
// writes equals the checkpoint's fp32 master weights cast to the chosen dtype, in one file or in
// shards with an index, from a stage-3 checkpoint written by 2 ranks.

#include <gtest/gtest.h>

#include <filesystem>

#include "ckpt/layout.h"
#include "ckpt/shards.h"
#include "estimate/model_states.h"
#include "model/model.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "tests/integration/train_util.h"
#include "train/train.h"

namespace dstrain::testing {
namespace {

// Every parameter of the model, each equal to the checkpoint's master cast to `dtype`.
void expect_equals_master(const std::string& tag_dir, const std::string& out_dir,
                          torch::ScalarType dtype) {
  const ckpt::CheckpointReader reader(tag_dir);
  const model::ModelConfig mc = model::load_model_config(out_dir);
  const model::SafetensorsSet set(out_dir);
  const std::vector<estimate::ParamShape> params =
      estimate::parameter_shapes(*model::DecoderModel(mc, model::Materialize::kNo));
  EXPECT_EQ(set.names().size(), params.size());
  for (const estimate::ParamShape& p : params) {
    ASSERT_TRUE(set.contains(p.name)) << p.name;
    const torch::Tensor got = set.read(p.name);
    const torch::Tensor want = reader.read_full("master", p.name).to(dtype);
    EXPECT_EQ(got.scalar_type(), dtype) << p.name;
    EXPECT_TRUE(torch::equal(got, want)) << p.name;
  }
}

TEST(ExportStream, Stage3CheckpointExportsMasterWeightsInOneFileAndInShards) {
  TempDir dir;
  JobSpec spec;
  spec.nproc = 2;
  spec.stage = 3;
  spec.max_steps = 4;
  spec.save_final = true;
  // Matrices sharded over the ranks, norms persistent.
  spec.extra_overrides = {"zero.stage3_param_persistence_threshold=1000"};
  const std::string cfg = write_job_config(dir.path(), spec);
  RunResult r = launch_job(cfg, 2, spec.extra_overrides);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string tag = ckpt::resolve_checkpoint(dir.file("ckpt/latest"));

  r = run_dstrain({"export", dir.file("ckpt/latest"), "--out", dir.file("hf32")}, {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(std::filesystem::exists(dir.file("hf32/model.safetensors")));
  expect_equals_master(tag, dir.file("hf32"), torch::kFloat32);

  train::ExportOptions o;
  o.checkpoint = dir.file("ckpt/latest");
  o.out_dir = dir.file("hf16");
  o.dtype = "bfloat16";
  o.max_shard_bytes = 300'000;  // the tiny model (~2 MB in bf16) in several shards
  ASSERT_EQ(train::run_export(o), 0);
  EXPECT_TRUE(std::filesystem::exists(dir.file("hf16/model.safetensors.index.json")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("hf16/model.safetensors")));
  int shards = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.file("hf16"))) {
    shards += entry.path().filename().string().rfind("model-0", 0) == 0;
  }
  EXPECT_GE(shards, 5);
  expect_equals_master(tag, dir.file("hf16"), torch::kBFloat16);
}

}  // namespace
}  // namespace dstrain::testing
