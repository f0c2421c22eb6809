// model.gradient_checkpointing: auto end to end: the choice is made and logged once (rank 0) when
// training starts, every rank trains with it, the run's config.yaml and its checkpoint keep `auto`,
// and a resumed run chooses again; each pipeline rank chooses for its stages; a misspelt value is
// exit code 2 naming the key and the values.

#include <gtest/gtest.h>

#include <string>

#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

const std::string kChoseNone = "gradient_checkpointing: auto chose false: predicted peak";

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The tiny model fits in any machine's memory without checkpointing, so auto takes `false`, and
// the two ranks (ZeRO stage 2) agree on it: the losses are those of an explicit `false`.
TEST(CheckpointingAuto, ChoosesAtStartKeepsAutoAndChoosesAgainOnResume) {
  TempDir dir;
  JobSpec spec;
  spec.nproc = 2;
  spec.stage = 2;
  spec.max_steps = 4;
  spec.save_final = true;
  spec.extra_overrides = {"model.gradient_checkpointing=auto"};
  const RunResult r = run_job(dir, spec);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string log = r.out + r.err;
  EXPECT_EQ(count(log, kChoseNone), 1u) << log;
  EXPECT_NE(log.find("; limit "), std::string::npos) << log;
  const auto auto_loss = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(auto_loss.size(), 4u);
  EXPECT_NE(read_text(dir.file("run/config.yaml")).find("gradient_checkpointing: \"auto\""),
            std::string::npos);
  const std::string saved = dir.file("ckpt/step_00000004");
  EXPECT_NE(read_text(saved + "/config.yaml").find("gradient_checkpointing: \"auto\""),
            std::string::npos);

  const RunResult resumed =
      run_dstrain({"resume", saved, "--set", "training.max_steps=5"}, {}, 120);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_EQ(count(resumed.out + resumed.err, kChoseNone), 1u) << resumed.out << resumed.err;

  TempDir plain;
  spec.save_final = false;
  spec.extra_overrides = {"model.gradient_checkpointing=false"};
  const RunResult off = run_job(plain, spec);
  ASSERT_EQ(off.exit_code, 0) << off.out << off.err;
  EXPECT_EQ(read_metric(plain.file("run/metrics.jsonl"), "train/loss"), auto_loss);
}

// With pipeline parallelism each pipeline rank chooses for its own stages, and says so.
TEST(CheckpointingAuto, EachPipelineRankChoosesForItsStages) {
  TempDir dir;
  JobSpec spec;
  spec.nproc = 2;
  spec.stage = 1;
  spec.accum = 2;
  spec.max_steps = 2;
  spec.extra_overrides = {"model.gradient_checkpointing=auto", "parallel.pipeline_parallel_size=2"};
  const RunResult r = run_job(dir, spec);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string log = r.out + r.err;
  EXPECT_EQ(count(log, "pipeline rank 0: " + kChoseNone), 1u) << log;
  EXPECT_EQ(count(log, "pipeline rank 1: " + kChoseNone), 1u) << log;
}

TEST(CheckpointingAuto, AMisspeltValueIsExitTwoNamingTheKeyAndTheValues) {
  TempDir dir;
  JobSpec spec;
  spec.max_steps = 1;
  spec.extra_overrides = {"model.gradient_checkpointing=autox"};
  const RunResult r = run_job(dir, spec);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE((r.out + r.err)
                .find("model.gradient_checkpointing: expected true, false, offload, selective "
                      "or auto, got \"autox\""),
            std::string::npos)
      << r.out << r.err;
}

}  // namespace
}  // namespace dstrain::testing
