// `dstrain launch --max-restarts` inside a Slurm allocation (scripts/train.sbatch with LAUNCH_ARGS)
// on a private Slurm cluster of several emulated nodes (slurm_cluster.h: one slurmd per node on
// this machine): a SIGKILLed rank brings the step back from `latest` with the losses of an
// uninterrupted run; a node that dies (its slurmd, step daemon and processes killed) is left out
// with --min-nodes and the job goes on with the same global batch; a rank that always fails stops
// after N restarts with the causes. No process of the job is left in any case.

#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/integration/process_util.h"
#include "tests/integration/slurm_cluster.h"
#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

class SlurmRestartTest : public ::testing::Test {
 protected:
  void start_cluster(int nodes) {
    std::string reason = SlurmCluster::skip_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
    cluster_ = std::make_unique<SlurmCluster>(nodes);
    out_ = tmp_.file("job.out");
  }

  // scripts/train.sbatch on `nodes` nodes of `nproc` ranks with LAUNCH_ARGS=`launch_args`, training
  // `config`, or running `exec` on every rank when given; returns the job id. The emulated nodes'
  // names resolve nowhere, and every node is this machine: the rendezvous is on 127.0.0.1.
  std::string submit(const std::string& config, int nodes, int nproc,
                     const std::string& launch_args, const std::string& exec = "") {
    std::string cmd =
        "cd " + tmp_.path() + " && DSTRAIN_TEST_MARKER=" + token_ + " DSTRAIN=" + DSTRAIN_BINARY +
        " NPROC=" + std::to_string(nproc) + " CHECKPOINT_DIR=" + tmp_.file("job/ckpt") +
        " LAUNCH_ARGS='--master-addr 127.0.0.1 " + launch_args + "' SBATCH_ARGS='--output=" + out_ +
        "'" + (exec.empty() ? "" : " DSTRAIN_EXEC='" + exec + "'") +
        " " DSTRAIN_SOURCE_DIR "/scripts/train.sbatch " + config + " " + std::to_string(nodes);
    std::string reply = cluster_->run(cmd);
    std::smatch m;
    if (!std::regex_search(reply, m, std::regex("Submitted batch job ([0-9]+)"))) {
      ADD_FAILURE() << "sbatch failed: " << reply;
      return "";
    }
    return m[1];
  }

  // The same run locally (`dstrain launch --nproc world`), for the losses to compare with.
  std::map<long, double> reference_losses(const JobSpec& spec, int world) {
    const std::string config = write_job_config(tmp_.file("ref"), spec);
    std::vector<std::string> sets;
    for (const std::string& kv : spec.extra_overrides) sets.push_back(kv);
    RunResult r = launch_job(config, world, sets, 300);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return read_metric(tmp_.file("ref/run/metrics.jsonl"), "train/loss");
  }

  std::string job_config(const JobSpec& spec) {
    std::string config = write_job_config(tmp_.file("job"), spec);
    return config;
  }

  void expect_no_process_left() {
    EXPECT_TRUE(wait_until([&] { return processes_with_marker(token_).empty(); }, 15))
        << processes_with_marker(token_).size() << " process(es) of the job survived";
  }

  TempDir tmp_;
  std::unique_ptr<SlurmCluster> cluster_;
  std::string out_;
  std::string token_ = unique_token();
};

// Every step logged, a checkpoint every 4 of 16 steps; `spec.extra_overrides` also go to the
// reference run.
JobSpec restartable(int micro, int accum) {
  JobSpec spec;
  spec.stage = 1;
  spec.micro = micro;
  spec.accum = accum;
  spec.max_steps = 16;
  spec.checkpoint_interval = 4;
  spec.extra_overrides = {"training.log_interval=1"};
  return spec;
}

TEST_F(SlurmRestartTest, RankKilledAfterTheFirstCommitRestartsTheStepFromLatestWithTheSameLosses) {
  start_cluster(2);
  const JobSpec spec = restartable(2, 1);
  std::filesystem::create_directories(tmp_.file("ref"));
  std::filesystem::create_directories(tmp_.file("job"));
  const auto reference = reference_losses(spec, 2);
  ASSERT_EQ(reference.size(), 16u);

  std::string job = submit(job_config(spec), 2, 1,
                           "--max-restarts 2 --restart-backoff 0.2 --set training.log_interval=1");
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(wait_until([&] { return file_exists(tmp_.file("job/ckpt/latest")); }, 180))
      << read_text(out_) << cluster_->logs();
  pid_t victim = -1;
  ASSERT_TRUE(
      wait_until([&] { return (victim = rank_pid(processes_with_marker(token_), 1)) > 0; }, 20));
  ::kill(victim, SIGKILL);
  ASSERT_TRUE(cluster_->wait_job_gone(job, 240)) << read_text(out_) << cluster_->logs();
  const std::string out = read_text(out_);
  EXPECT_NE(out.find("dstrain launch: restart 1 (0 of at most 2 counted)"), std::string::npos)
      << out;
  EXPECT_NE(out.find("--overlap --job-name=dstrain-agents-1"), std::string::npos) << out;

  const auto got = read_metric(tmp_.file("job/run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(got.size(), reference.size()) << out;
  for (const auto& [step, loss] : reference) EXPECT_EQ(got.at(step), loss) << "step " << step;
  const auto summary = nlohmann::json::parse(read_text(tmp_.file("job/run/summary.json")));
  EXPECT_EQ(summary["status"].get<std::string>(), "completed") << summary.dump();
  EXPECT_EQ(summary["restarts"].get<int>(), 1) << summary.dump();
  EXPECT_EQ(summary["restart_causes"][0]["host"].get<std::string>(), "dn2") << summary.dump();
  expect_no_process_left();
}

TEST_F(SlurmRestartTest, ALostNodeIsLeftOutAndTheJobGoesOnWithTheSameGlobalBatch) {
  start_cluster(3);
  // 3 ranks x micro 2 x accumulation 2 = 12, kept on 2 ranks by accumulating 3.
  const JobSpec spec = restartable(2, 2);
  std::filesystem::create_directories(tmp_.file("ref"));
  std::filesystem::create_directories(tmp_.file("job"));
  const auto reference = reference_losses(spec, 3);
  ASSERT_EQ(reference.size(), 16u);

  std::string job = submit(job_config(spec), 3, 1,
                           "--max-restarts 1 --min-nodes 2 --restart-backoff 0.2 --set "
                           "training.log_interval=1");
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(wait_until([&] { return file_exists(tmp_.file("job/ckpt/latest")); }, 180))
      << read_text(out_) << cluster_->logs();
  cluster_->kill_node("dn3");
  ASSERT_TRUE(cluster_->wait_job_gone(job, 300)) << read_text(out_) << cluster_->logs();
  const std::string out = read_text(out_);
  EXPECT_NE(out.find("Slurm node dn3 cannot run a step again"), std::string::npos) << out;
  EXPECT_NE(out.find("--nodelist=dn1,dn2 --overlap"), std::string::npos) << out;
  EXPECT_NE(out.find("dstrain launch: restart 1"), std::string::npos) << out;

  const auto got = read_metric(tmp_.file("job/run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(got.size(), reference.size()) << out;
  for (const auto& [step, loss] : reference)
    EXPECT_NEAR(got.at(step), loss, 1e-3 * std::abs(loss)) << "step " << step;
  const auto summary = nlohmann::json::parse(read_text(tmp_.file("job/run/summary.json")));
  EXPECT_EQ(summary["status"].get<std::string>(), "completed") << summary.dump();
  EXPECT_EQ(summary["world_size"].get<int>(), 2);
  EXPECT_EQ(summary["restarts"].get<int>(), 1);
  expect_no_process_left();
}

// `dstrain resume` of a job launched under Slurm (launcher/resume_plan.h): the job (2 nodes, no
// restarts) fails when a rank is SIGKILLed after a checkpoint; a new 2-node allocation running
// `dstrain resume <ckpt>/latest`, with no other flag, starts one agent per node of that allocation
// (as recorded: one rank per node, the recorded --master-addr) and logs the uninterrupted run's
// losses.
TEST_F(SlurmRestartTest, ResumeInANewAllocationRunsOverItsNodesWithTheUninterruptedLosses) {
  start_cluster(2);
  const JobSpec spec = restartable(2, 1);
  std::filesystem::create_directories(tmp_.file("ref"));
  std::filesystem::create_directories(tmp_.file("job"));
  const auto reference = reference_losses(spec, 2);
  ASSERT_EQ(reference.size(), 16u);

  std::string job = submit(job_config(spec), 2, 1, "--set training.log_interval=1");
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(wait_until([&] { return file_exists(tmp_.file("job/ckpt/latest")); }, 180))
      << read_text(out_) << cluster_->logs();
  pid_t victim = -1;
  ASSERT_TRUE(
      wait_until([&] { return (victim = rank_pid(processes_with_marker(token_), 1)) > 0; }, 20));
  ::kill(victim, SIGKILL);
  ASSERT_TRUE(cluster_->wait_job_gone(job, 120)) << read_text(out_) << cluster_->logs();
  expect_no_process_left();
  const auto record = nlohmann::json::parse(read_text(tmp_.file("job/ckpt/launch.json")));
  EXPECT_EQ(record["mode"], "slurm") << record.dump();
  EXPECT_EQ(record["slurm"]["job_id"], job) << record.dump();
  const std::string tag = read_text(tmp_.file("job/ckpt/latest"));
  const long saved = std::stol(tag.substr(5));
  ASSERT_LT(saved, 16) << "the job finished before the kill";
  std::filesystem::rename(tmp_.file("job/run/metrics.jsonl"), tmp_.file("job/failed.jsonl"));

  const std::string out = tmp_.file("resume.out");
  const std::string reply = cluster_->run(
      "cd " + tmp_.path() + " && DSTRAIN_TEST_MARKER=" + token_ + " sbatch -N2 --output=" + out +
      " --wrap='" DSTRAIN_BINARY " resume " + tmp_.file("job/ckpt/latest") + "'");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(reply, m, std::regex("Submitted batch job ([0-9]+)"))) << reply;
  ASSERT_TRUE(cluster_->wait_job_gone(m[1], 240)) << read_text(out) << cluster_->logs();
  const std::string text = read_text(out);
  EXPECT_NE(text.find("under Slurm over the allocation's 2 node(s), 1 rank(s) each (as recorded)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("srun --kill-on-bad-exit=1 --ntasks-per-node=1 --nodes=2"), std::string::npos)
      << text;
  EXPECT_NE(text.find("--master-addr 127.0.0.1"), std::string::npos) << text;
  const auto resumed = read_metric(tmp_.file("job/run/metrics.jsonl"), "train/loss");
  EXPECT_EQ(resumed.size(), static_cast<size_t>(16 - saved)) << text;
  expect_same_losses_after(saved, resumed, reference);
  expect_no_process_left();
}

TEST_F(SlurmRestartTest, ARankThatAlwaysFailsStopsAfterTheRestartsWithItsCauses) {
  start_cluster(2);
  std::string job = submit("-", 2, 1, "--max-restarts 2 --restart-backoff 0.1",
                           "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 60");
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(cluster_->wait_job_gone(job, 180)) << read_text(out_) << cluster_->logs();
  const std::string out = read_text(out_);
  EXPECT_NE(out.find("giving up: 3 failure(s) without a new checkpoint, more than "
                     "--max-restarts 2"),
            std::string::npos)
      << out;
  for (int attempt = 0; attempt < 3; ++attempt) {
    EXPECT_NE(out.find("attempt " + std::to_string(attempt) +
                       ": dn2: node 1 (ranks 1-1): " + "Exited with exit code 3"),
              std::string::npos)
        << out;
  }
  EXPECT_EQ(out.find("dstrain launch: restart 3 "), std::string::npos) << out;
  EXPECT_NE(cluster_->run("scontrol show job " + job).find("ExitCode=3:0"), std::string::npos)
      << cluster_->run("scontrol show job " + job) << out;
  expect_no_process_left();
}

}  // namespace
}  // namespace dstrain::testing
