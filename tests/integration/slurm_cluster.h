#pragma once
// A private one-node Slurm cluster on localhost for tests: munged, slurmctld and slurmd from
// Debian's slurm-wlm, each with its own socket, ports, state and log files in a temporary
// directory; clients find it through SLURM_CONF (env()). SlurmUser=root,
// ProctrackType=proctrack/linuxproc, TaskPlugin=task/none; the node line comes from `slurmd -C`.
// The destructor cancels every job and stops the daemons it started (by pid). Tests call
// skip_reason() first and GTEST_SKIP when it is not empty (not root, Slurm or munge missing).

#include <string>
#include <vector>

namespace dstrain::testing {

class SlurmCluster {
 public:
  static std::string skip_reason();

  SlurmCluster();  // ADD_FAILURE + throw when a daemon does not come up
  ~SlurmCluster();
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  const std::string& dir() const { return dir_; }
  // "SLURM_CONF=..." (and nothing else): add to the environment of Slurm client commands.
  std::vector<std::string> env() const { return {"SLURM_CONF=" + dir_ + "/slurm.conf"}; }
  // Runs a shell command with env(); returns its stdout (stderr appended).
  std::string run(const std::string& command) const;
  // Waits until job `id` has left the queue; false after `timeout_s`.
  bool wait_job_gone(const std::string& id, double timeout_s) const;
  std::string logs() const;  // slurmctld and slurmd logs, for failure messages

 private:
  void start_munge();
  void write_config();
  void start_daemons();
  void cleanup();

  std::string dir_;
  std::vector<std::string> pid_files_;
};

}  // namespace dstrain::testing
