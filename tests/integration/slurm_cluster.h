#pragma once
// A private Slurm cluster on localhost for tests: munged, slurmctld and one slurmd per node from
// Debian's slurm-wlm, each with its own socket, ports, state and log files in a temporary
// directory; clients find it through SLURM_CONF (env()). SlurmUser=root,
// ProctrackType=proctrack/linuxproc, TaskPlugin=task/none; the node's CPUs and memory come from
// `slurmd -C`.
//
// One node (the default) is this machine under its own name. Several nodes are emulated: node k is
// "dn<k>" (NodeHostname dn<k>, NodeAddr 127.0.0.1, its own slurmd port, spool and pid file), a
// separate `slurmd -N dn<k>` each, so srun places tasks on them, steps and node failures are
// per node, and `kill_node` makes one of them die the way a crashed host does. What this cannot
// emulate: separate kernels and file systems (every node sees the same /tmp), node names that
// resolve (dn<k> is in no hosts file: jobs rendezvous on 127.0.0.1), and a network that fails by
// going silent (a dead slurmd refuses connections at once).
//
// The destructor cancels every job and stops the daemons it started (by pid). Tests call
// skip_reason() first and GTEST_SKIP when it is not empty (not root, Slurm or munge missing).

#include <string>
#include <vector>

namespace dstrain::testing {

class SlurmCluster {
 public:
  static std::string skip_reason();

  explicit SlurmCluster(int nodes = 1);  // ADD_FAILURE + throw when a daemon does not come up
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
  const std::vector<std::string>& nodes() const { return nodes_; }
  // Node `name` dies: SIGKILL to its slurmd, to the slurmstepd of every step on it and to every
  // process of those steps (found by SLURMD_NODENAME=<name> in their environment).
  void kill_node(const std::string& name) const;

 private:
  void start_munge();
  void write_config();
  void start_daemons();
  void cleanup();

  std::string dir_;
  std::vector<std::string> nodes_;
  std::vector<std::string> pid_files_;
};

}  // namespace dstrain::testing
