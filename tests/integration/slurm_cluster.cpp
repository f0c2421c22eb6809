#include "tests/integration/slurm_cluster.h"

#include <signal.h>
#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"
#include "tests/integration/shell_util.h"

namespace dstrain::testing {
namespace {

namespace fs = std::filesystem;

// Output and errors of `command`, together (Slurm's tools report on stderr).
std::string capture(const std::string& command) {
  return shell_output(command + " 2>&1");
}

void must(const std::string& command) {
  shell_must(command, "slurm cluster setup failed");
}

std::string first_line(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

}  // namespace

std::string SlurmCluster::skip_reason() {
  if (::geteuid() != 0) return "needs root (slurmd, munged)";
  for (const char* tool : {"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged",
                           "/usr/bin/sbatch", "/usr/bin/srun", "/usr/bin/squeue"}) {
    if (::access(tool, X_OK) != 0)
      return std::string("needs ") + tool + " (apt-get install slurm-wlm munge)";
  }
  return "";
}

SlurmCluster::SlurmCluster() {
  dir_ = make_temp_dir("dstrain_slurm_");
  try {
    fs::create_directories(dir_ + "/state");
    fs::create_directories(dir_ + "/spool");
    start_munge();
    write_config();
    start_daemons();
  } catch (...) {
    cleanup();
    throw;
  }
}

SlurmCluster::~SlurmCluster() {
  cleanup();
}

void SlurmCluster::cleanup() {
  if (dir_.empty()) return;
  run("scancel --full --signal=KILL $(squeue -h -o %i) 2>/dev/null; true");
  wait_until([&] { return run("squeue -h -o %i").empty(); }, 10);
  for (const std::string& pid_file : pid_files_) {
    int pid = std::atoi(read_text(pid_file).c_str());
    if (pid > 0) ::kill(pid, SIGTERM);
    if (pid > 0) wait_until([&] { return !is_alive(pid); }, 5);
    if (pid > 0) ::kill(pid, SIGKILL);
  }
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
  dir_.clear();
}

void SlurmCluster::start_munge() {
  std::random_device rd;
  std::string key;
  for (int i = 0; i < 1024; ++i) key += static_cast<char>(rd() & 0xff);
  std::ofstream(dir_ + "/munge.key", std::ios::binary) << key;
  fs::permissions(dir_ + "/munge.key", fs::perms::owner_read | fs::perms::owner_write);
  must("/usr/sbin/munged --force -S " + dir_ + "/munge.socket --key-file " + dir_ +
       "/munge.key --log-file " + dir_ + "/munged.log --pid-file " + dir_ +
       "/munged.pid --seed-file " + dir_ + "/munged.seed");
  pid_files_.push_back(dir_ + "/munged.pid");
}

void SlurmCluster::write_config() {
  std::string node = first_line(capture("/usr/sbin/slurmd -C"));
  std::string host = node.substr(9, node.find(' ') - 9);  // "NodeName=<host> CPUs=..."
  int base = 17000 + (::getpid() % 500) * 2;
  std::ofstream(dir_ + "/slurm.conf")
      << "ClusterName=dstraintest\nSlurmctldHost=" << host << "(127.0.0.1)\n"
      << "SlurmctldPort=" << base << "\nSlurmdPort=" << base + 1 << "\n"
      << "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=" << dir_ << "/munge.socket\n"
      << "SlurmUser=root\nSlurmdUser=root\n"
      << "StateSaveLocation=" << dir_ << "/state\nSlurmdSpoolDir=" << dir_ << "/spool\n"
      << "SlurmctldPidFile=" << dir_ << "/slurmctld.pid\nSlurmdPidFile=" << dir_ << "/slurmd.pid\n"
      << "SlurmctldLogFile=" << dir_ << "/slurmctld.log\nSlurmdLogFile=" << dir_ << "/slurmd.log\n"
      << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
      << "SchedulerType=sched/builtin\nSelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
      << "ReturnToService=2\nMpiDefault=none\nJobAcctGatherType=jobacct_gather/none\n"
      << "AccountingStorageType=accounting_storage/none\nJobRequeue=1\nKillWait=5\n"
      << "MinJobAge=2\nInactiveLimit=0\nSlurmdTimeout=30\n"
      << node.substr(0, node.find(" UpTime")) << " State=UNKNOWN\n"
      << "PartitionName=debug Nodes=" << host << " Default=YES MaxTime=INFINITE State=UP\n";
}

void SlurmCluster::start_daemons() {
  std::string conf = dir_ + "/slurm.conf";
  must("SLURM_CONF=" + conf + " /usr/sbin/slurmctld -i");
  pid_files_.push_back(dir_ + "/slurmctld.pid");
  must("SLURM_CONF=" + conf + " /usr/sbin/slurmd");
  pid_files_.push_back(dir_ + "/slurmd.pid");
  bool idle =
      wait_until([&] { return run("sinfo -h -o %t").find("idle") != std::string::npos; }, 30);
  if (!idle) {
    ADD_FAILURE() << "the Slurm node did not become idle: " << run("sinfo") << logs();
    throw std::runtime_error("slurm did not start");
  }
}

std::string SlurmCluster::run(const std::string& command) const {
  return capture("export SLURM_CONF=" + dir_ + "/slurm.conf; " + command);
}

bool SlurmCluster::wait_job_gone(const std::string& id, double timeout_s) const {
  return wait_until(
      [&] {
        return run("squeue -h -j " + id + " -o %i 2>/dev/null").find(id) == std::string::npos;
      },
      timeout_s);
}

std::string SlurmCluster::logs() const {
  return "\n--- slurmctld.log\n" + read_text(dir_ + "/slurmctld.log") + "\n--- slurmd.log\n" +
         read_text(dir_ + "/slurmd.log");
}

}  // namespace dstrain::testing
