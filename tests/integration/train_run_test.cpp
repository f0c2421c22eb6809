// The training job as a user runs it: the loss falls, metrics and summary are written, bad input
// is one clear error with exit code 2.

#include <gtest/gtest.h>

#include <sched.h>
#include <signal.h>

#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

TEST(TrainRun, LossFallsOnTwoRanksAndSummaryIsWritten) {
  TempDir dir;
  JobSpec spec;
  spec.nproc = 2;
  spec.stage = 2;
  spec.max_steps = 60;
  spec.micro = 4;
  spec.max_length = 64;
  spec.save_final = true;
  const std::string cfg = write_job_config(dir.path(), spec);
  const RunResult r = launch_job(
      cfg, 2,
      {"training.eval_interval=30", "logging.progress=true", "logging.wall_clock_breakdown=true"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto loss = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(loss.size(), 60u);
  EXPECT_GT(loss.at(1), 5.0);  // ln(258) ≈ 5.55 for a fresh model
  EXPECT_LT(loss.at(60), loss.at(1) - 2.0);
  const auto eval = read_metric(dir.file("run/metrics.jsonl"), "eval/loss");
  EXPECT_EQ(eval.count(30), 1u);
  EXPECT_EQ(eval.count(60), 1u);
  for (const char* key : {"lr", "grad_norm", "tokens_per_s", "memory/rss_mb", "train/ppl"}) {
    EXPECT_EQ(read_metric(dir.file("run/metrics.jsonl"), key).size(), 60u) << key;
  }
  const auto summary = nlohmann::json::parse(read_text(dir.file("run/summary.json")));
  EXPECT_EQ(summary["status"], "completed");
  EXPECT_EQ(summary["steps"], 60);
  EXPECT_NEAR(summary["train_loss"].get<double>(), loss.at(60), 1e-9);
  EXPECT_TRUE(file_exists(summary["checkpoint"].get<std::string>() + "/manifest.json"));
  // Rank 0 alone prints progress; every line of it is prefixed by the launcher.
  EXPECT_NE(r.out.find("[rank 0] step 60/60"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[rank 1] step"), std::string::npos);
  // logging.wall_clock_breakdown: rank 0 prints the phases at each log step.
  EXPECT_NE(r.out.find("step 40 time (ms) | data: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| forward+backward: "), std::string::npos);
}

// A rank's intra-op threads are the cores it may run on (its CPU affinity: Slurm's
// --cpus-per-task, taskset) divided by the ranks of its machine, not every core of the machine;
// OMP_NUM_THREADS, when set, wins.
TEST(TrainRun, RanksShareTheCoresOfTheirCpuAffinity) {
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const std::string saved_omp = omp != nullptr ? omp : "";
  ::unsetenv("OMP_NUM_THREADS");
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  const int cores = CPU_COUNT(&all);
  if (cores < 2) GTEST_SKIP() << "needs 2 usable cores, this process has " << cores;
  TempDir dir;
  JobSpec spec;
  spec.nproc = 1;
  spec.max_steps = 1;
  const std::string cfg = write_job_config(dir.path(), spec);
  RunResult r = launch_job(cfg, 1);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("; " + std::to_string(cores) + " CPU thread(s) per rank"), std::string::npos)
      << r.out;
  // Pinned to one core (the launcher and its ranks inherit the affinity): one thread.
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &all)) {
      CPU_SET(cpu, &one);
      break;
    }
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  r = launch_job(cfg, 1);
  sched_setaffinity(0, sizeof(all), &all);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("; 1 CPU thread(s) per rank"), std::string::npos) << r.out;
  // OMP_NUM_THREADS=1 with every core usable: one thread.
  r = run_dstrain({"launch", "--nproc", "1", cfg}, {"OMP_NUM_THREADS=1"}, 300);
  if (!saved_omp.empty()) ::setenv("OMP_NUM_THREADS", saved_omp.c_str(), 1);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("; 1 CPU thread(s) per rank"), std::string::npos) << r.out;
}

// SIGUSR1 to the launcher reaches every rank: they agree to stop, save a checkpoint at the next
// step boundary and exit 0; `dstrain resume` then trains exactly the remaining steps.
TEST(TrainRun, Usr1SavesACheckpointStopsAndResumeFinishesTheRun) {
  TempDir dir;
  JobSpec spec;
  spec.nproc = 2;
  spec.stage = 1;
  spec.max_steps = 400;
  spec.save_final = true;
  const std::string cfg = write_job_config(dir.path(), spec);
  const std::string metrics = dir.file("run/metrics.jsonl");
  Child job = start_dstrain({"launch", "--nproc", "2", cfg});
  ASSERT_TRUE(wait_until([&] { return read_metric(metrics, "train/loss").size() >= 5; }, 120));
  ::kill(job.pid, SIGUSR1);
  RunResult r = finish(job, 60);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto summary = nlohmann::json::parse(read_text(dir.file("run/summary.json")));
  EXPECT_EQ(summary["status"], "preempted");
  const long stopped = summary["steps"].get<long>();
  ASSERT_LT(stopped, 400);
  EXPECT_EQ(read_text(dir.file("ckpt/latest")),
            "step_" + std::string(8 - std::to_string(stopped).size(), '0') +
                std::to_string(stopped) + "\n");
  r = run_dstrain({"resume", dir.file("ckpt/latest")}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto loss = read_metric(metrics, "train/loss");
  EXPECT_EQ(loss.size(), 400u);
  EXPECT_EQ(loss.count(stopped + 1), 1u);
  EXPECT_EQ(nlohmann::json::parse(read_text(dir.file("run/summary.json")))["status"], "completed");
}

TEST(TrainRun, PrintConfigShowsResolvedValues) {
  TempDir dir;
  const std::string cfg = write_job_config(dir.path(), JobSpec{});
  const RunResult r =
      run_dstrain({"train", "--print-config", cfg, "--set", "training.lr=0.5"}, {}, 20);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("lr: 0.5"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("stage: 0"), std::string::npos) << r.out;
}

TEST(TrainRun, MissingDatasetIsOneClearErrorWithExitTwo) {
  TempDir dir;
  const std::string cfg = write_job_config(dir.path(), JobSpec{});
  const RunResult r = launch_job(cfg, 2, {"data.train_path=" + dir.file("nope.txt")});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find(dir.file("nope.txt")), std::string::npos) << r.out << r.err;
  EXPECT_FALSE(file_exists(dir.file("ckpt/latest")));
}

TEST(TrainRun, DatasetSmallerThanOneGlobalBatchIsExitTwo) {
  TempDir dir;
  std::ofstream(dir.file("small.txt")) << "just a few words\n";
  const std::string cfg = write_job_config(dir.path(), JobSpec{});
  const RunResult r =
      launch_job(cfg, 2, {"data.train_path=" + dir.file("small.txt"), "data.eval_split=0"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("global batch"), std::string::npos) << r.out << r.err;
}

TEST(TrainRun, ProfileStepsWritesAChromeTraceOfTheOperatorsOfThoseSteps) {
  TempDir dir;
  JobSpec spec;
  spec.max_steps = 5;
  const RunResult r = run_job(dir, spec, {"logging.profile_steps=2"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // Two warm-up steps, then steps 3 and 4.
  EXPECT_NE(r.out.find("profile of steps 3-4: " + dir.file("run/profile/rank-0.json")),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(file_exists(dir.file("run/profile/rank-0.json.partial")));
  // Kineto's complaint about a machine without a CUDA driver is kept out of a CPU run's output.
  EXPECT_EQ((r.out + r.err).find("ERROR:"), std::string::npos) << r.out << r.err;
  std::ifstream in(dir.file("run/profile/rank-0.json"));
  ASSERT_TRUE(in.good());
  const nlohmann::json trace = nlohmann::json::parse(in);
  int matmuls = 0;
  for (const auto& e : trace.at("traceEvents")) {
    const std::string name = e.value("name", "");
    if (e.value("ph", "") != "X") continue;
    if (name == "aten::mm" || name == "aten::addmm" || name == "aten::matmul") ++matmuls;
  }
  EXPECT_GT(matmuls, 0) << "no matrix product in the profile";
  // A run shorter than the warm-up plus the profiled steps profiles its last steps.
  TempDir short_run;
  spec.max_steps = 2;
  const RunResult s = run_job(short_run, spec, {"logging.profile_steps=3"});
  ASSERT_EQ(s.exit_code, 0) << s.out << s.err;
  EXPECT_NE(s.out.find("profile of steps 1-2"), std::string::npos) << s.out;
}

}  // namespace
}  // namespace dstrain::testing
