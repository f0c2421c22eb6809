// Checkpoints end to end: resume bit-identity, resume at another world size, a rank killed with
// SIGKILL while checkpoints are being written, corrupted shards, export to Hugging Face files.

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {
namespace stdfs = std::filesystem;

std::string metrics(const TempDir& d) {
  return d.file("run/metrics.jsonl");
}

// Runs `spec` in `dir` (failing the test unless it exits 0) and returns its train/loss by step in
// *loss; the metrics file is then moved aside, so that a resume writes a fresh one.
void train_and_set_metrics_aside(const TempDir& dir, const JobSpec& spec,
                                 std::map<long, double>* loss) {
  const RunResult r = run_job(dir, spec);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  *loss = read_metric(metrics(dir), "train/loss");
  stdfs::rename(metrics(dir), dir.file("full.jsonl"));
}

// `dstrain resume <dir>/<checkpoint> <args...>`, failing the test unless it exits 0; *loss gets the
// resumed run's train/loss by step (the metrics file is removed after reading, for the next run).
void resume_run(const TempDir& dir, const std::string& checkpoint,
                const std::vector<std::string>& args, std::map<long, double>* loss) {
  std::vector<std::string> all = {"resume", dir.file(checkpoint)};
  all.insert(all.end(), args.begin(), args.end());
  const RunResult r = run_dstrain(all, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  *loss = read_metric(metrics(dir), "train/loss");
  stdfs::remove(metrics(dir));
}

// A finished two-rank run of `max_steps` steps that saves its final checkpoint.
JobSpec short_run_saving_the_end(int max_steps) {
  JobSpec spec;
  spec.nproc = 2;
  spec.max_steps = max_steps;
  spec.save_final = true;
  return spec;
}

TEST(Resume, SameWorldSizeContinuesBitIdentically) {
  TempDir dir;
  std::map<long, double> full, resumed;
  ASSERT_NO_FATAL_FAILURE(train_and_set_metrics_aside(dir, resumable_job(), &full));
  ASSERT_EQ(full.size(), 20u);

  ASSERT_NO_FATAL_FAILURE(resume_run(dir, "ckpt/step_00000010", {}, &resumed));
  ASSERT_EQ(resumed.size(), 10u);
  expect_same_losses_after(10, resumed, full);
}

TEST(Resume, OtherWorldSizeAndStageContinuesTheCurve) {
  TempDir dir;
  JobSpec spec;
  spec.nproc = 2;
  spec.stage = 2;
  spec.checkpoint_interval = 10;
  std::map<long, double> full, resumed;
  ASSERT_NO_FATAL_FAILURE(train_and_set_metrics_aside(dir, spec, &full));

  ASSERT_NO_FATAL_FAILURE(
      resume_run(dir, "ckpt/step_00000010", {"--nproc", "3", "--set", "zero.stage=1"}, &resumed));
  ASSERT_FALSE(resumed.empty());
  EXPECT_EQ(resumed.begin()->first, 11);
  // The restored weights carry on where step 10 left off: no jump back to the initial loss.
  EXPECT_LT(resumed.begin()->second, full.at(1) - 0.5);
  EXPECT_NEAR(resumed.begin()->second, full.at(11), 0.15 * full.at(11));
}

// A ZeRO-3 checkpoint (2 ranks, every parameter sharded per layer) resumes on one rank at stage 3
// with the same global batch and follows the uninterrupted run, resumes on three ranks at stage 0,
// and exports to a Hugging Face directory.
TEST(Resume, Stage3CheckpointResumesAtOtherWorldSizesAndExports) {
  TempDir dir;
  JobSpec spec;
  spec.nproc = 2;
  spec.stage = 3;
  spec.checkpoint_interval = 10;
  spec.extra_overrides = {"zero.stage3_param_persistence_threshold=100"};
  std::map<long, double> full, one, three;
  ASSERT_NO_FATAL_FAILURE(train_and_set_metrics_aside(dir, spec, &full));
  ASSERT_EQ(full.size(), 20u);

  ASSERT_NO_FATAL_FAILURE(
      resume_run(dir, "ckpt/step_00000010",
                 {"--nproc", "1", "--set", "training.per_device_train_batch_size=4", "--set",
                  "checkpoint.interval=0"},
                 &one));
  ASSERT_EQ(one.size(), 10u);
  for (const auto& [step, loss] : one) {
    EXPECT_NEAR(loss, full.at(step), 1e-4 * full.at(step)) << "step " << step;
  }

  ASSERT_NO_FATAL_FAILURE(resume_run(dir, "ckpt/step_00000010",
                                     {"--nproc", "3", "--set", "zero.stage=0", "--set",
                                      "checkpoint.interval=0", "--set", "training.max_steps=12"},
                                     &three));
  ASSERT_FALSE(three.empty());
  EXPECT_EQ(three.begin()->first, 11);
  EXPECT_NEAR(three.begin()->second, full.at(11), 0.15 * full.at(11));

  const RunResult r =
      run_dstrain({"export", dir.file("ckpt/step_00000010"), "--out", dir.file("hf")}, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(stdfs::exists(dir.file("hf/model.safetensors")));
  EXPECT_TRUE(stdfs::exists(dir.file("hf/config.json")));
}

TEST(Resume, CorruptedShardIsAClearInputError) {
  TempDir dir;
  RunResult r = run_job(dir, short_run_saving_the_end(4));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string shard = dir.file("ckpt/step_00000004/shard_r00001.safetensors");
  ASSERT_TRUE(file_exists(shard));
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(stdfs::file_size(shard) - 3));
    f.put('\x5a');
  }
  r = run_dstrain({"resume", dir.file("ckpt/latest"), "--set", "training.max_steps=6"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("corrupted"), std::string::npos) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("shard_r00001.safetensors"), std::string::npos);
}

// A fresh run writing into a directory that holds an older run's checkpoint of the same step
// replaces it: `latest` ends up naming the new run's state, never the old one.
TEST(Checkpoint, FreshRunReplacesAnOlderRunsCheckpointOfTheSameStep) {
  TempDir dir;
  RunResult r = run_job(dir, short_run_saving_the_end(4));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = run_job(dir, short_run_saving_the_end(4), {"training.seed=8"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto loss = read_metric(metrics(dir), "train/loss");
  const auto manifest =
      nlohmann::json::parse(read_text(dir.file("ckpt/step_00000004/manifest.json")));
  EXPECT_EQ(read_text(dir.file("ckpt/latest")), "step_00000004\n");
  EXPECT_EQ(manifest["train_loss"].get<double>(), loss.at(4));
  EXPECT_NE(manifest["config"].get<std::string>().find("seed: 8"), std::string::npos);
}

// SIGKILL to one rank at several instants of a run that checkpoints every step: whatever the
// instant, `latest` names a complete checkpoint that resumes.
TEST(Resume, RankKilledDuringSavesLeavesLoadableLatest) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    TempDir dir;
    JobSpec spec;
    spec.nproc = 2;
    spec.stage = 1;
    spec.max_steps = 400;
    spec.checkpoint_interval = 1;
    const std::string cfg = write_job_config(dir.path(), spec);
    const std::string token = unique_token();
    Child job = start_dstrain({"launch", "--nproc", "2", cfg, "--set", "checkpoint.keep_last=2"},
                              {"DSTRAIN_TEST_MARKER=" + token});
    // Wait for the first complete checkpoint, then a little more (different each attempt).
    ASSERT_TRUE(wait_until([&] { return file_exists(dir.file("ckpt/latest")); }, 60));
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + 170 * attempt));
    pid_t victim = -1;
    ASSERT_TRUE(wait_until(
        [&] {
          victim = rank_pid(processes_with_marker(token), 1);
          return victim > 0;
        },
        10));
    ::kill(victim, SIGKILL);
    RunResult r = finish(job, 30);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_TRUE(wait_until([&] { return processes_with_marker(token).empty(); }, 10));
    const std::string tag = read_text(dir.file("ckpt/latest"));
    ASSERT_EQ(tag.rfind("step_", 0), 0u) << tag;
    const long step = std::stol(tag.substr(5));
    r = run_dstrain(
        {"resume", dir.file("ckpt/latest"), "--nproc", "1", "--set",
         "training.max_steps=" + std::to_string(step + 2), "--set", "checkpoint.save_final=false"},
        {}, 120);
    EXPECT_EQ(r.exit_code, 0) << "attempt " << attempt << "\n" << r.out << r.err;
    const auto resumed = read_metric(metrics(dir), "train/loss");
    EXPECT_EQ(resumed.count(step + 1), 1u) << "attempt " << attempt;
    // The steps the killed run logged after `latest` were dropped, not logged twice.
    std::map<long, int> lines_per_step;
    std::ifstream in(metrics(dir));
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("train/loss")) ++lines_per_step[j["step"].get<long>()];
    }
    for (const auto& [s, n] : lines_per_step) EXPECT_EQ(n, 1) << "step " << s << " logged " << n;
  }
}

// `dstrain resume` follows the launch record beside the checkpoint (launcher/launch_record.h):
// the same local ranks by default, the SSH launch a record describes, clear errors (exit 2, nothing
// started) when its hostfile is gone or its hosts do not answer, explicit flags first, and the
// checkpoint's world size on this machine, with a note, when there is no record.
TEST(Resume, FollowsTheLaunchRecordUnlessToldOtherwise) {
  TempDir dir;
  RunResult r = run_job(dir, short_run_saving_the_end(4));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string record_path = dir.file("ckpt/launch.json");
  auto record = nlohmann::json::parse(read_text(record_path));
  EXPECT_EQ(record["mode"], "local");
  EXPECT_EQ(record["nproc"], 2);
  const std::string latest = dir.file("ckpt/latest");
  auto resume = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"resume", latest};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_dstrain(args, {}, 60);
  };

  r = resume({"--dry-run"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("dstrain launch plan: 2 rank(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("on this machine with 2 rank(s) (as recorded)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--resume-from " + dir.file("ckpt/step_00000004")), std::string::npos);

  // The same checkpoint as if launched over SSH on two hosts that refuse connections.
  std::ofstream(dir.file("hosts")) << "127.0.0.1:1 slots=1\nlocalhost:1 slots=1\n";
  record["mode"] = "ssh";
  record["ssh"] = {{"hostfile", dir.file("hosts")}, {"connect_timeout", 5}};
  std::ofstream(record_path) << record.dump(2);
  r = resume({"--dry-run"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("2 rank(s) on 2 host(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("over SSH on the hosts of " + dir.file("hosts") + " (as recorded)"),
            std::string::npos)
      << r.out;
  r = resume({});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("2 of 2 host(s) of " + dir.file("hosts") + " do not answer"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("--min-nodes"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("[rank"), std::string::npos) << r.out;  // no rank started
  r = resume({"--min-nodes", "1"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("only 0 of 2 host(s)"), std::string::npos) << r.err;
  stdfs::remove(dir.file("hosts"));
  r = resume({"--dry-run"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("from the hostfile " + dir.file("hosts") + " (recorded in " + record_path +
                       "), which does not exist any more"),
            std::string::npos)
      << r.err;
  r = resume({"--local", "--nproc", "1", "--dry-run"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("dstrain launch plan: 1 rank(s)"), std::string::npos) << r.out;

  // A checkpoint from before launches were recorded: this machine, its world size, one note.
  stdfs::remove(record_path);
  r = resume({"--dry-run"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("dstrain launch plan: 2 rank(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("note: no launch record"), std::string::npos) << r.out;
  EXPECT_FALSE(file_exists(record_path));  // a dry run records nothing
}

// `dstrain launch --resume-latest`: the config's own checkpoint.dir decides, not the caller.
TEST(Launch, ResumeLatestContinuesFromTheConfigsCheckpointDirectory) {
  TempDir dir;
  const JobSpec spec = short_run_saving_the_end(4);
  const std::string cfg = write_job_config(dir.path(), spec);
  RunResult r = run_dstrain({"launch", "--nproc", "2", "--resume-latest", "--dry-run", cfg});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("no checkpoint in " + dir.file("ckpt") + " yet: starting at step 0"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("--resume-from"), std::string::npos) << r.out;

  r = run_job(dir, spec);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  stdfs::rename(metrics(dir), dir.file("first.jsonl"));
  r = run_dstrain(
      {"launch", "--nproc", "2", "--resume-latest", cfg, "--set", "training.max_steps=6"}, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("resuming from " + dir.file("ckpt/latest") + " (step_00000004)"),
            std::string::npos)
      << r.err;
  const auto resumed = read_metric(metrics(dir), "train/loss");
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_EQ(resumed.begin()->first, 5);
}

TEST(Export, WritesHuggingFaceDirectoryThatTrainsOnFromTheCheckpoint) {
  TempDir dir;
  JobSpec spec = short_run_saving_the_end(12);
  spec.stage = 2;
  RunResult r = run_job(dir, spec);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto first = read_metric(metrics(dir), "train/loss");
  r = run_dstrain({"export", dir.file("ckpt/latest"), "--out", dir.file("hf")}, {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_TRUE(file_exists(dir.file("hf/config.json")));
  ASSERT_TRUE(file_exists(dir.file("hf/model.safetensors")));
  // Train on from the exported weights: the loss starts where the checkpoint left off, far below
  // a fresh model's.
  TempDir again;
  JobSpec spec2;
  spec2.max_steps = 2;
  r = run_job(again, spec2, {"model.name_or_path=" + dir.file("hf"), "model.init=pretrained"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto cont = read_metric(again.file("run/metrics.jsonl"), "train/loss");
  ASSERT_FALSE(cont.empty());
  EXPECT_LT(cont.begin()->second, first.at(1) - 1.0);
  EXPECT_NEAR(cont.begin()->second, first.rbegin()->second, 0.2 * first.rbegin()->second);
}

}  // namespace
}  // namespace dstrain::testing
