// `scripts/train.sbatch` on a private one-node Slurm cluster (slurm_cluster.h): the job starts
// one node agent with srun, which starts the ranks (`--exec` shell commands through DSTRAIN_EXEC
// for now) with the torchrun variables; SIGUSR1 to the batch shell reaches the ranks and the job
// requeues itself and runs again with SLURM_RESTART_COUNT=1.

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <regex>
#include <thread>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"
#include "tests/integration/shell_util.h"
#include "tests/integration/slurm_cluster.h"
#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

class LaunchSlurmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason = SlurmCluster::skip_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
    cluster_ = std::make_unique<SlurmCluster>();
    out_ = tmp_.file("job.out");
  }

  // Submits scripts/train.sbatch with DSTRAIN_EXEC=`exec_script`; returns the job id.
  std::string submit(const std::string& exec_script, int nproc) {
    std::string cmd = "cd " + tmp_.path() + " && DSTRAIN=" + DSTRAIN_BINARY +
                      " NPROC=" + std::to_string(nproc) + " SBATCH_ARGS='--output=" + out_ +
                      "' DSTRAIN_EXEC='" + exec_script +
                      "' " DSTRAIN_SOURCE_DIR "/scripts/train.sbatch - 1";
    std::string reply = cluster_->run(cmd);
    std::smatch m;
    if (!std::regex_search(reply, m, std::regex("Submitted batch job ([0-9]+)"))) {
      ADD_FAILURE() << "sbatch failed: " << reply;
      return "";
    }
    return m[1];
  }

  // Submits scripts/train.sbatch running the real trainer on `config`, with nothing else exported
  // (the requeued job finds the config's checkpoint.dir by itself); returns the job id.
  std::string submit_training(const std::string& config, int nproc, const std::string& extra = "") {
    std::string cmd = "cd " + tmp_.path() + " && env -u CHECKPOINT_DIR DSTRAIN=" + DSTRAIN_BINARY +
                      " NPROC=" + std::to_string(nproc) + " SBATCH_ARGS='--output=" + out_ +
                      "' " DSTRAIN_SOURCE_DIR "/scripts/train.sbatch " + config + " 1" + extra;
    std::string reply = cluster_->run(cmd);
    std::smatch m;
    if (!std::regex_search(reply, m, std::regex("Submitted batch job ([0-9]+)"))) {
      ADD_FAILURE() << "sbatch failed: " << reply;
      return "";
    }
    return m[1];
  }

  // Waits for `done` while lifting the hold Slurm puts on a requeued job (Reason=BeginTime, about
  // two minutes) so the test stays quick. Not sooner than 2 s after the requeue, and once a second:
  // slurmd refuses a job credential created in the same second the previous run's credential was
  // revoked ("Job credential revoked"), which is why Slurm holds requeued jobs at all.
  bool wait_requeued(const std::string& job, const std::function<bool()>& done, double timeout_s) {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    auto last = std::chrono::steady_clock::now() - std::chrono::seconds(1);
    return wait_until(
        [&] {
          if (std::chrono::steady_clock::now() - last >= std::chrono::seconds(1)) {
            cluster_->run("scontrol update JobId=" + job + " StartTime=now");
            last = std::chrono::steady_clock::now();
          }
          return done();
        },
        timeout_s);
  }

  TempDir tmp_;
  std::unique_ptr<SlurmCluster> cluster_;
  std::string out_;
};

TEST_F(LaunchSlurmTest, SbatchStartsRanksWithTheirEnvironment) {
  std::string job = submit(
      "echo \"ENV rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE lws=$LOCAL_WORLD_SIZE "
      "node=$NODE_RANK master=$MASTER_ADDR:$MASTER_PORT\"",
      2);
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(cluster_->wait_job_gone(job, 60)) << read_text(out_) << cluster_->logs();
  std::string out = read_text(out_);
  EXPECT_NE(out.find("restart count 0"), std::string::npos) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("\\[([^:\\]]+):0\\] ENV rank=0"))) << out;
  std::string host = m[1];
  std::string port = std::to_string(15000 + std::stol(job) % 15000);
  for (int rank = 0; rank < 2; ++rank) {
    std::string line = "[" + host + ":" + std::to_string(rank) +
                       "] ENV rank=" + std::to_string(rank) + " local=" + std::to_string(rank) +
                       " world=2 lws=2 node=0 master=" + host + ":" + port;
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
  }
  EXPECT_NE(out.find("all 2 rank(s) exited 0"), std::string::npos) << out;
  EXPECT_NE(out.find("srun --kill-on-bad-exit=1 --ntasks-per-node=1"), std::string::npos) << out;
}

TEST_F(LaunchSlurmTest, Usr1CheckpointsRequeuesAndRunsAgain) {
  std::string job = submit(
      "if [ \"${SLURM_RESTART_COUNT:-0}\" -gt 0 ]; then echo \"resumed $SLURM_RESTART_COUNT\"; "
      "exit 0; fi; trap \"echo saving checkpoint; exit 0\" USR1; echo waiting; "
      "while :; do sleep 0.2; done",
      1);
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(
      wait_until([&] { return read_text(out_).find(":0] waiting") != std::string::npos; }, 60))
      << read_text(out_) << cluster_->logs();
  cluster_->run("scancel --batch --signal=USR1 " + job);  // what --signal=B:USR1@90 does
  ASSERT_TRUE(
      wait_until([&] { return read_text(out_).find("requeueing") != std::string::npos; }, 30))
      << read_text(out_);
  bool resumed = wait_requeued(
      job, [&] { return read_text(out_).find("resumed 1") != std::string::npos; }, 60);
  std::string out = read_text(out_);
  ASSERT_TRUE(resumed) << out << cluster_->run("scontrol show job " + job);
  EXPECT_NE(out.find("saving checkpoint"), std::string::npos) << out;
  EXPECT_NE(out.find("requeueing job " + job), std::string::npos) << out;
  EXPECT_NE(out.find("restart count 1"), std::string::npos) << out;
  EXPECT_TRUE(cluster_->wait_job_gone(job, 30));
}

// The real trainer under Slurm: 2 ranks train, SIGUSR1 (what --signal=B:USR1@90 sends) makes them
// save a checkpoint and stop, the job requeues itself, and the second run resumes from the
// checkpoint.dir that the submission's `-- --set checkpoint.dir=...` override names
// (`dstrain launch --resume-latest` reads it; nothing exported) and finishes the remaining steps.
TEST_F(LaunchSlurmTest, PreemptedTrainingSavesRequeuesAndResumesFromLatest) {
  JobSpec spec;
  spec.nproc = 2;
  spec.stage = 2;
  spec.max_steps = 150;
  spec.save_final = true;
  const std::string config = write_job_config(tmp_.path(), spec);
  const std::string metrics = tmp_.file("run/metrics.jsonl");
  std::string job = submit_training(config, 2, " -- --set checkpoint.dir=" + tmp_.file("ckpt2"));
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(wait_until([&] { return read_metric(metrics, "train/loss").size() >= 5; }, 90))
      << read_text(out_) << cluster_->logs();
  cluster_->run("scancel --batch --signal=USR1 " + job);
  ASSERT_TRUE(
      wait_until([&] { return read_text(out_).find("requeueing") != std::string::npos; }, 60))
      << read_text(out_);
  const std::string tag = read_text(tmp_.file("ckpt2/latest"));
  ASSERT_EQ(tag.rfind("step_", 0), 0u) << read_text(out_);
  const long saved_step = std::stol(tag.substr(5));
  EXPECT_LT(saved_step, 150);
  const std::string record = read_text(tmp_.file("ckpt2/launch.json"));
  EXPECT_NE(record.find("\"mode\": \"slurm\""), std::string::npos) << record;
  bool done = wait_requeued(
      job,
      [&] {
        return read_text(tmp_.file("run/summary.json")).find("\"completed\"") != std::string::npos;
      },
      180);
  const std::string out = read_text(out_);
  ASSERT_TRUE(done) << out << cluster_->run("scontrol show job " + job) << cluster_->logs();
  EXPECT_NE(out.find("restart count 1"), std::string::npos) << out;
  EXPECT_NE(out.find("dstrain launch: resuming from " + tmp_.file("ckpt2/latest") + " (" +
                     tag.substr(0, tag.find('\n')) + ")"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
  // Every step trained exactly once across the two runs, the second starting after the save.
  const auto loss = read_metric(metrics, "train/loss");
  EXPECT_EQ(loss.size(), 150u);
  EXPECT_EQ(loss.count(saved_step + 1), 1u);
  EXPECT_LT(loss.at(150), loss.at(1) - 1.0);
  EXPECT_TRUE(cluster_->wait_job_gone(job, 30));
}

// docs/quickstart-gpu.md under Slurm, on the CPU, on a private 2-node cluster: the page's config,
// `scripts/train.sbatch qwen-lora.yaml 2`, then `dstrain resume runs/qwen-lora/checkpoints/latest`
// inside an allocation of the same nodes (salloc). What differs from the page: no
// GPUS_PER_NODE (the cluster has no GPUs) and NPROC=1 rank per node; the job's output file, the
// dstrain binary and the master address named (the cluster's node names do not resolve); the tiny
// model (`-- --set ...`) where the page downloads Qwen2.5-0.5B; 520 lines of the demo corpus where
// it uses curl.
TEST(QuickStartGpuSlurm, TheSbatchAndResumeCommandsOfThePageRunOnTwoNodes) {
  const std::string reason = SlurmCluster::skip_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  SlurmCluster cluster(2);
  TempDir tmp;
  const std::string config = quick_start_block("qwen-lora.yaml");
  ASSERT_NE(config, "") << "docs/quickstart-gpu.md has no qwen-lora.yaml block";
  std::ofstream(tmp.file("qwen-lora.yaml")) << config;
  write_quick_start_data(tmp.path());
  const std::string out = tmp.file("job.out");
  const std::string tiny = " --set model.name_or_path=" DSTRAIN_SOURCE_DIR
                           "/configs/models/tiny --set model.init=random --set "
                           "model.tokenizer=byte";
  const std::string reply =
      cluster.run("cd " + tmp.path() +
                  " && env -u CHECKPOINT_DIR DSTRAIN=" DSTRAIN_BINARY
                  " NPROC=1 LAUNCH_ARGS='--master-addr 127.0.0.1' SBATCH_ARGS='--output=" +
                  out + "' " DSTRAIN_SOURCE_DIR "/scripts/train.sbatch qwen-lora.yaml 2 --" + tiny);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(reply, m, std::regex("Submitted batch job ([0-9]+)"))) << reply;
  ASSERT_TRUE(cluster.wait_job_gone(m[1], 180)) << read_text(out) << cluster.logs();
  const std::string job = read_text(out);
  EXPECT_NE(job.find("done: "), std::string::npos) << job;
  EXPECT_NE(job.find("(2 node(s), 1 rank(s) each)"), std::string::npos) << job;
  EXPECT_TRUE(file_exists(tmp.file("runs/qwen-lora/lora_adapter/adapter_model.safetensors")));
  ASSERT_TRUE(file_exists(tmp.file("runs/qwen-lora/checkpoints/latest"))) << job;

  const std::string resumed = cluster.run("cd " + tmp.path() +
                                          " && timeout 150 salloc --nodes=2 " DSTRAIN_BINARY
                                          " resume runs/qwen-lora/checkpoints/latest 2>&1");
  EXPECT_NE(resumed.find("done: "), std::string::npos) << resumed << cluster.logs();
}

// Submitting: with GPUS_PER_NODE the script asks sbatch for that many GPUs per node (one rank
// each; the test cluster has none, so the request is read off a stand-in sbatch's arguments).
TEST(TrainSbatch, AsksForGpusPerNodeOnlyWhenGpusPerNodeIsSet) {
  TempDir dir;
  std::ofstream(dir.file("sbatch")) << "#!/bin/sh\necho \"sbatch $*\"\n";
  std::filesystem::permissions(dir.file("sbatch"), std::filesystem::perms::owner_all);
  const std::string run = "env -u SLURM_JOB_ID PATH=" + dir.path() + ":$PATH ";
  const std::string script = DSTRAIN_SOURCE_DIR "/scripts/train.sbatch run.yaml 2";
  std::string out = shell_output(run + "GPUS_PER_NODE=8 " + script);
  EXPECT_NE(out.find("sbatch --nodes=2 --gpus-per-node=8 "), std::string::npos) << out;
  out = shell_output(run + "env -u GPUS_PER_NODE " + script);
  EXPECT_NE(out.find("sbatch --nodes=2 "), std::string::npos) << out;
  EXPECT_EQ(out.find("--gpus-per-node"), std::string::npos) << out;
}

// `sbatch scripts/train.sbatch run.yaml 2` (the script given to sbatch instead of run): the job has
// the one node sbatch gave it, and the script says so and exits 2 before launching anything.
TEST(TrainSbatch, AJobWithFewerNodesThanAskedForSaysHowToSubmitIt) {
  const std::string job =
      "env -u SLURM_RESTART_COUNT SLURM_JOB_ID=7 SLURM_JOB_NUM_NODES=1 "
      "DSTRAIN=/bin/false " DSTRAIN_SOURCE_DIR "/scripts/train.sbatch run.yaml 2";
  const std::string out = shell_output(job + " 2>&1; echo rc=$?");
  EXPECT_NE(out.find("scripts/train.sbatch: this job has 1 node(s) but 2 were asked for: run "
                     "'scripts/train.sbatch run.yaml 2' (it submits itself with --nodes=2)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("rc=2"), std::string::npos) << out;
}

}  // namespace
}  // namespace dstrain::testing
