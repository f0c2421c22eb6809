#pragma once
// `dstrain launch`: picks the mode from the flags and the environment, then runs it.
//   --node-rank K / --slurm-agent   node agent (started by the launcher itself, over SSH or srun)
//   --hostfile H                    multi-node over SSH (multi_node.h)
//   --slurm, or SLURM_JOB_ID set    one agent per node with srun (slurm.h); --no-slurm opts out
//   otherwise                       ranks on this machine (launch_local.h)
// In every mode the names given with --secret-env are secret (core/secrets.h) and are passed on to
// agents and ranks in DSTRAIN_REDACT_VARS.

#include <string>
#include <vector>

#include "launcher/host_select.h"
#include "launcher/launch_local.h"
#include "launcher/multi_node.h"
#include "launcher/ssh_client.h"

namespace dstrain::launcher {

struct LaunchOptions {
  LocalLaunchOptions launch;
  bool master_addr_given = false;
  std::vector<std::string> secret_env;  // --secret-env NAME: secret beyond core/secrets.h's rules
  // multi-node over SSH
  std::string hostfile;
  HostSelection selection;
  std::vector<std::string> env;
  std::string remote_cwd;
  SshSettings ssh;
  bool check = false;
  int min_nodes = 0;                // --min-nodes (multi_node.h)
  bool allow_batch_change = false;  // --elastic-batch allow-change
  // Hosts of the hostfile not to run on (`dstrain resume` leaves out the hosts that do not answer
  // when --min-nodes allows it; resume_plan.h).
  std::vector<std::string> left_out;
  // --resume-latest: resume from <checkpoint.dir>/latest of the config when it exists (else start
  // at step 0): a requeued Slurm job continues without its script reading the config.
  bool resume_latest = false;
  // Slurm
  bool slurm = false;
  bool no_slurm = false;
  // node agent (internal: set by the launcher on the command lines it builds)
  int node_rank = -1;
  bool slurm_agent = false;
  std::string nodes_nproc;
  std::string node_devices;
  std::string node_host;
  bool watch_stdin = false;
  bool env_on_stdin = false;  // read secret variables from stdin first (stdin_env.h)
};

// Runs the launch in the mode the flags and the environment select (above). A training launch
// (not --exec, not --dry-run) first records how it was launched in <checkpoint.dir>/launch.json
// (launch_record.h), when the config saves checkpoints.
int run_launch(const LaunchOptions& options);

// The options of the multi-node launcher for an SSH launch (--hostfile).
MultiNodeOptions multi_node_options(const LaunchOptions& options);

}  // namespace dstrain::launcher
