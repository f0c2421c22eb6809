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

SlurmCluster::SlurmCluster(int nodes) {
  dir_ = make_temp_dir("dstrain_slurm_");
  std::string node = first_line(capture("/usr/sbin/slurmd -C"));
  if (nodes == 1) nodes_ = {node.substr(9, node.find(' ') - 9)};  // "NodeName=<host> CPUs=..."
  for (int k = 1; nodes > 1 && k <= nodes; ++k) nodes_.push_back("dn" + std::to_string(k));
  try {
    fs::create_directories(dir_ + "/state");
    for (const std::string& name : nodes_) fs::create_directories(dir_ + "/spool/" + name);
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
  std::string hardware = node.substr(node.find(' '), node.find(" UpTime") - node.find(' '));
  int base = 17000 + (::getpid() % 500) * 8;
  std::ofstream conf(dir_ + "/slurm.conf");
  conf << "ClusterName=dstraintest\nSlurmctldHost=" << host << "(127.0.0.1)\n"
       << "SlurmctldPort=" << base << "\nSlurmdPort=" << base + 1 << "\n"
       << "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=" << dir_ << "/munge.socket\n"
       << "SlurmUser=root\nSlurmdUser=root\n"
       << "StateSaveLocation=" << dir_ << "/state\nSlurmdSpoolDir=" << dir_ << "/spool/%n\n"
       << "SlurmctldPidFile=" << dir_ << "/slurmctld.pid\nSlurmdPidFile=" << dir_
       << "/slurmd.%n.pid\n"
       << "SlurmctldLogFile=" << dir_ << "/slurmctld.log\nSlurmdLogFile=" << dir_
       << "/slurmd.%n.log\n"
       << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
       << "SchedulerType=sched/builtin\nSelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
       << "ReturnToService=2\nMpiDefault=none\nJobAcctGatherType=jobacct_gather/none\n"
       << "AccountingStorageType=accounting_storage/none\nJobRequeue=1\nKillWait=5\n"
       << "MinJobAge=2\nInactiveLimit=0\nSlurmdTimeout=30\n";
  std::string list;
  for (size_t k = 0; k < nodes_.size(); ++k) {
    conf << "NodeName=" << nodes_[k];
    if (nodes_.size() > 1) {
      conf << " NodeHostname=" << nodes_[k] << " NodeAddr=127.0.0.1 Port=" << base + 2 + k;
    }
    conf << hardware << " State=UNKNOWN\n";
    list += (list.empty() ? "" : ",") + nodes_[k];
  }
  conf << "PartitionName=debug Nodes=" << list << " Default=YES MaxTime=INFINITE State=UP\n";
}

void SlurmCluster::start_daemons() {
  std::string conf = dir_ + "/slurm.conf";
  must("SLURM_CONF=" + conf + " /usr/sbin/slurmctld -i");
  pid_files_.push_back(dir_ + "/slurmctld.pid");
  for (const std::string& name : nodes_) {
    must("SLURM_CONF=" + conf + " /usr/sbin/slurmd -N " + name);
    pid_files_.push_back(dir_ + "/slurmd." + name + ".pid");
  }
  const std::string all_idle = std::to_string(nodes_.size()) + " idle";
  bool idle = wait_until(
      [&] { return run("sinfo -h -o '%D %t'").find(all_idle) != std::string::npos; }, 30);
  if (!idle) {
    ADD_FAILURE() << "the Slurm nodes did not become idle: " << run("sinfo") << logs();
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
  std::string out = "\n--- slurmctld.log\n" + read_text(dir_ + "/slurmctld.log");
  for (const std::string& name : nodes_) {
    out += "\n--- slurmd." + name + ".log\n" + read_text(dir_ + "/slurmd." + name + ".log");
  }
  return out;
}

void SlurmCluster::kill_node(const std::string& name) const {
  int slurmd = std::atoi(read_text(dir_ + "/slurmd." + name + ".pid").c_str());
  if (slurmd > 1) ::kill(slurmd, SIGKILL);
  // A step's tasks are children of its slurmstepd; their children inherit the variable.
  for (pid_t pid : processes_with_env("SLURMD_NODENAME=" + name)) {
    std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
    size_t paren = stat.rfind(')');
    int parent = paren == std::string::npos ? 0 : std::atoi(stat.c_str() + paren + 4);
    std::string parent_comm = read_text("/proc/" + std::to_string(parent) + "/comm");
    if (parent > 1 && parent_comm.rfind("slurmstepd", 0) == 0) ::kill(parent, SIGKILL);
    if (pid > 1) ::kill(pid, SIGKILL);
  }
}

}  // namespace dstrain::testing
