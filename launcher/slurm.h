#pragma once
// Slurm: reading an allocation from SLURM_* variables, and the two ways of running in one.
//
//  1. `dstrain launch` inside an allocation (SLURM_JOB_ID set, or --slurm) replaces itself with
//     `srun --kill-on-bad-exit=1 --ntasks-per-node=1 ...` starting one node agent per node
//     (`dstrain launch --slurm-agent`), which takes its node rank from SLURM_NODEID. srun forwards
//     signals (SIGUSR1 included) to the agents; agents forward SIGUSR1 to their ranks.
//     With --max-restarts the launcher stays: it runs srun as a child (slurm_step.h) and after a
//     failure runs it again from `latest`, with --min-nodes on the nodes that can still run a step
//     (--nodelist; the global batch kept as over SSH, elastic_batch.h).
//  2. srun starting every rank itself (`srun --ntasks-per-node=G dstrain train CONFIG`): the rank
//     maps SLURM_PROCID/LOCALID/NTASKS/NODEID to the torchrun variables with
//     torch_env_from_slurm() when RANK is unset.
// MASTER_ADDR is the first host of SLURM_JOB_NODELIST; MASTER_PORT, unless given, is derived from
// the job id so that every node computes the same port without talking to the others.

#include <map>
#include <string>
#include <vector>

#include "launcher/launch_local.h"
#include "launcher/plan.h"

namespace dstrain::launcher {

using EnvMap = std::map<std::string, std::string>;

// The process environment as a map.
EnvMap current_environment();

// 15000 + job_id mod 15000: below the Linux ephemeral range, identical on every node.
int slurm_master_port(long job_id);

// torchrun variables from SLURM_* for a rank started directly by srun. Empty when RANK is already
// set or SLURM_PROCID is not. Error(kInput) naming the variable when one is malformed or missing.
EnvList torch_env_from_slurm(const EnvMap& env);

struct SlurmLaunchOptions {
  LocalLaunchOptions launch;  // nproc = ranks per node
  bool master_addr_given = false;
  std::string srun = "srun";
  int min_nodes = 0;  // --min-nodes: restart on the nodes left while at least M remain
  bool allow_batch_change = false;  // --elastic-batch allow-change
  // The step, as the restart loop sets it: its nodes ("" = every node of the allocation; else
  // --nodelist, and MASTER_ADDR is the first of them unless given), --overlap (an older step Slurm
  // still lists on a lost node must not hold the new one back) and its name (--job-name).
  std::vector<std::string> nodes;
  bool overlap = false;
  std::string step_name;
};

// The srun command line that starts one agent per node of the allocation described by `env` (or
// of options.nodes).
std::vector<std::string> srun_command(const SlurmLaunchOptions& options, const EnvMap& env,
                                      const std::string& binary);

// Runs `dstrain launch` in Slurm mode: prints the srun line, then execs it (or, with --dry-run,
// only prints it). Returns only for a dry run or throws. With --max-restarts: runs the step as a
// child, again after a failure (restart.h), and returns the exit code.
int run_slurm_launch(const SlurmLaunchOptions& options);

struct SlurmAgentPlacement {
  int node_rank = 0;
  int num_nodes = 1;
  std::string host;
};

// This agent's node rank, the step's node count and the host name, from SLURM_NODEID,
// SLURM_STEP_NUM_NODES (or SLURM_NNODES) and SLURMD_NODENAME.
SlurmAgentPlacement slurm_agent_placement(const EnvMap& env);

}  // namespace dstrain::launcher
