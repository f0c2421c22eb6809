#include "launcher/resume_plan.h"

#include <unistd.h>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/common/expect_error.h"

namespace dstrain::launcher {
namespace {

namespace stdfs = std::filesystem;
using ::dstrain::testing::expect_error;

class ResumePlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = stdfs::temp_directory_path().string() + "/dstrain_resume_XXXXXX";
    dir_ = ::mkdtemp(pattern.data());
    hostfile_ = dir_ + "/hosts";
    std::ofstream(hostfile_) << "a slots=8\nb slots=8\nc slots=8\n";
    checkpoint_.tag_dir = dir_ + "/ckpt/step_00000100";
    checkpoint_.config_path = checkpoint_.tag_dir + "/config.yaml";
    checkpoint_.world_size = 16;
    checkpoint_.record_path = dir_ + "/ckpt/launch.json";
    env_.cwd = "/work/run";
  }
  void TearDown() override { stdfs::remove_all(dir_); }

  // A job launched over SSH on a and b (--exclude c), with restarts and a fixed master port.
  LaunchRecord ssh_record() const {
    LaunchRecord r;
    r.mode = LaunchMode::kSsh;
    r.cwd = "/work/run";
    r.world_size = 16;
    r.hostfile = hostfile_;
    r.selection.exclude = "c";
    r.hosts = {"a", "b"};
    r.ssh.key_file = "/home/u/.ssh/id_train";
    r.env = {"NCCL_SOCKET_IFNAME=ib0"};
    r.master_port = 29600;
    r.restart.max_restarts = 3;
    r.min_nodes = 1;
    return r;
  }

  ResumePlan plan(const ResumeRequest& request) const {
    return plan_resume(request, checkpoint_, env_);
  }

  std::string dir_;
  std::string hostfile_;
  ResumeCheckpoint checkpoint_;
  ResumeEnvironment env_;
};

TEST_F(ResumePlanTest, RecordedVariablesMissingHereAreSetAndOnesThatDifferAreNamed) {
  LaunchRecord r = ssh_record();
  r.environment = {"DSTRAIN_DEVICE=cuda", "HF_HOME=/data/hf", "NCCL_SOCKET_IFNAME=ib0"};
  checkpoint_.record = r;
  env_.variables = {"HF_HOME=/data/hf", "NCCL_SOCKET_IFNAME=ib1"};
  const ResumePlan p = plan({});
  EXPECT_EQ(p.set_env, std::vector<std::string>{"DSTRAIN_DEVICE=cuda"});
  std::string notes;
  for (const std::string& n : p.notes) notes += n + "\n";
  EXPECT_NE(notes.find("note: DSTRAIN_DEVICE not set in this environment; the ranks get the values "
                       "of the launch (launch.json)"),
            std::string::npos)
      << notes;
  EXPECT_NE(notes.find("note: NCCL_SOCKET_IFNAME is 'ib1' in this environment and was 'ib0' at "
                       "the launch; the ranks get 'ib1'"),
            std::string::npos)
      << notes;
  EXPECT_EQ(notes.find("HF_HOME"), std::string::npos) << "the same value needs no note: " << notes;
  // Everything here already: nothing to set, no note.
  env_.variables = r.environment;
  EXPECT_TRUE(plan({}).set_env.empty());
}

TEST_F(ResumePlanTest, ACheckpointWithoutARecordResumesLocallyAtItsWorldSizeWithANote) {
  const ResumePlan p = plan({});
  EXPECT_EQ(p.mode, LaunchMode::kLocal);
  EXPECT_EQ(p.options.launch.nproc, 16);
  EXPECT_TRUE(p.options.hostfile.empty());
  EXPECT_TRUE(p.options.no_slurm);  // on this machine even inside an allocation, as before
  EXPECT_EQ(p.options.launch.config_path, checkpoint_.tag_dir + "/config.yaml");
  EXPECT_EQ(p.options.launch.args,
            (std::vector<std::string>{"--resume-from", checkpoint_.tag_dir}));
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_NE(p.notes[0].find("no launch record"), std::string::npos) << p.notes[0];
  EXPECT_NE(p.notes[0].find(checkpoint_.record_path), std::string::npos) << p.notes[0];
}

TEST_F(ResumePlanTest, AnSshRecordResumesOverSshFromTheRecordedHostfileAndFlags) {
  checkpoint_.record = ssh_record();
  const ResumePlan p = plan({});
  EXPECT_EQ(p.mode, LaunchMode::kSsh);
  EXPECT_EQ(p.options.hostfile, hostfile_);
  EXPECT_EQ(p.options.selection.exclude, "c");
  EXPECT_EQ(p.options.ssh.key_file, "/home/u/.ssh/id_train");
  EXPECT_EQ(p.options.env, std::vector<std::string>{"NCCL_SOCKET_IFNAME=ib0"});
  EXPECT_EQ(p.options.launch.master_port, 29600);
  EXPECT_EQ(p.options.launch.restart.max_restarts, 3);
  EXPECT_EQ(p.options.min_nodes, 1);
  EXPECT_FALSE(p.options.master_addr_given);
  EXPECT_NE(p.how.find("over SSH on the hosts of " + hostfile_ + " --exclude c (as recorded)"),
            std::string::npos)
      << p.how;
  EXPECT_TRUE(p.notes.empty());
}

TEST_F(ResumePlanTest, ExplicitFlagsOverrideTheRecord) {
  checkpoint_.record = ssh_record();
  ResumeRequest local;
  local.local = true;
  ResumePlan p = plan(local);
  EXPECT_EQ(p.mode, LaunchMode::kLocal);
  EXPECT_EQ(p.options.launch.nproc, 16);       // the checkpoint's world size
  EXPECT_EQ(p.options.launch.master_port, 0);  // the SSH port is not the local one
  EXPECT_EQ(p.options.min_nodes, 0);
  EXPECT_EQ(p.options.launch.restart.max_restarts, 3);  // mode-independent flags stay
  local.nproc = 3;
  local.max_restarts = 0;
  p = plan(local);
  EXPECT_EQ(p.options.launch.nproc, 3);
  EXPECT_EQ(p.options.launch.restart.max_restarts, 0);

  const std::string other = dir_ + "/hosts2";
  std::ofstream(other) << "x slots=4\n";
  ResumeRequest elsewhere;
  elsewhere.hostfile = other;
  p = plan(elsewhere);
  EXPECT_EQ(p.mode, LaunchMode::kSsh);
  EXPECT_EQ(p.options.hostfile, other);
  EXPECT_EQ(p.options.selection.exclude, "");  // the recorded filter named the old file's hosts
  EXPECT_EQ(p.options.ssh.key_file, "/home/u/.ssh/id_train");  // the same cluster's access

  ResumeRequest fewer;
  fewer.selection.num_nodes = 1;
  fewer.nproc = 4;
  fewer.master_port = 29700;
  p = plan(fewer);
  EXPECT_EQ(p.options.hostfile, hostfile_);
  EXPECT_EQ(p.options.selection.exclude, "");
  EXPECT_EQ(p.options.selection.num_nodes, 1);
  EXPECT_EQ(p.options.selection.num_gpus, 4);  // --nproc over SSH: the first N slots per host
  EXPECT_EQ(p.options.launch.master_port, 29700);
}

TEST_F(ResumePlanTest, NprocOverSshDoesNotCombineWithARecordedExclude) {
  checkpoint_.record = ssh_record();
  ResumeRequest r;
  r.nproc = 4;
  expect_error([&] { plan(r); }, ErrorKind::kUsage, {"--nproc 4", "--exclude c", "--include"});
}

TEST_F(ResumePlanTest, AMissingRecordedHostfileIsAnInputErrorNamingItAndTheWayOut) {
  checkpoint_.record = ssh_record();
  stdfs::remove(hostfile_);
  expect_error([&] { plan({}); }, ErrorKind::kInput,
               {hostfile_, checkpoint_.record_path, "does not exist", "--hostfile", "--local"});
  EXPECT_EQ(exit_code(ErrorKind::kInput), 2);
  ResumeRequest local;  // the way out works
  local.local = true;
  EXPECT_EQ(plan(local).mode, LaunchMode::kLocal);
  ResumeRequest given;
  given.hostfile = dir_ + "/nowhere";
  expect_error([&] { plan(given); }, ErrorKind::kInput, {"--hostfile", "nowhere"});
}

TEST_F(ResumePlanTest, ASlurmRecordResumesOnlyInsideAnAllocation) {
  LaunchRecord r;
  r.mode = LaunchMode::kSlurm;
  r.cwd = "/work/run";
  r.nproc = 8;
  r.world_size = 16;
  r.slurm_job_id = "812";
  r.slurm_nodes = 2;
  checkpoint_.record = r;
  expect_error([&] { plan({}); }, ErrorKind::kUsage,
               {"launched under Slurm (job 812)", "inside a Slurm allocation", "--local"});
  env_.in_slurm_allocation = true;
  env_.slurm_nodes = 4;
  ResumePlan p = plan({});
  EXPECT_EQ(p.mode, LaunchMode::kSlurm);
  EXPECT_TRUE(p.options.slurm);
  EXPECT_EQ(p.options.launch.nproc, 8);  // ranks per node as launched; 4 nodes re-shard
  EXPECT_NE(p.how.find("4 node(s), 8 rank(s) each"), std::string::npos) << p.how;
  ResumeRequest local;
  local.local = true;
  p = plan(local);
  EXPECT_EQ(p.mode, LaunchMode::kLocal);
  EXPECT_TRUE(p.options.no_slurm);
}

TEST_F(ResumePlanTest, SlurmWithoutARecordSplitsTheCheckpointWorldOverTheNodes) {
  env_.in_slurm_allocation = true;
  env_.slurm_nodes = 2;
  ResumeRequest r;
  r.slurm = true;
  EXPECT_EQ(plan(r).options.launch.nproc, 8);
  env_.slurm_nodes = 3;
  expect_error([&] { plan(r); }, ErrorKind::kUsage, {"16 rank(s)", "3 node(s)", "--nproc"});
  r.nproc = 4;
  EXPECT_EQ(plan(r).options.launch.nproc, 4);
  env_.in_slurm_allocation = false;
  expect_error([&] { plan(r); }, ErrorKind::kUsage, {"--slurm", "SLURM_JOB_ID"});
}

TEST_F(ResumePlanTest, FlagsThatExcludeEachOtherAreUsageErrors) {
  ResumeRequest r;
  r.local = true;
  r.hostfile = hostfile_;
  expect_error([&] { plan(r); }, ErrorKind::kUsage, {"exclude each other"});
  ResumeRequest selection;
  selection.selection.include = "a";
  expect_error([&] { plan(selection); }, ErrorKind::kUsage, {"--include", "hostfile"});
  ResumeRequest negative;
  negative.nproc = -2;
  expect_error([&] { plan(negative); }, ErrorKind::kUsage, {"--nproc", "-2"});
}

TEST_F(ResumePlanTest, ALocalRecordKeepsItsRanksAndSaysWhenTheDirectoryDiffers) {
  LaunchRecord r;
  r.mode = LaunchMode::kLocal;
  r.cwd = "/elsewhere";
  r.nproc = 2;
  r.world_size = 2;
  r.log_dir = "/logs";
  checkpoint_.record = r;
  checkpoint_.world_size = 2;
  const ResumePlan p = plan({});
  EXPECT_EQ(p.options.launch.nproc, 2);
  EXPECT_EQ(p.options.launch.log_dir, "/logs");
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_NE(p.notes[0].find("launched from /elsewhere"), std::string::npos) << p.notes[0];
}

}  // namespace
}  // namespace dstrain::launcher
