#pragma once
// Slurm: reading an allocation from SLURM_* variables, and the two ways of running in one.
//
//  1. `dstrain launch` inside an allocation (SLURM_JOB_ID set, or --slurm) replaces itself with
//     `srun --kill-on-bad-exit=1 --ntasks-per-node=1 ...` starting one node agent per node
//     (`dstrain launch --slurm-agent`), which takes its node rank from SLURM_NODEID. srun forwards
//     signals (SIGUSR1 included) to the agents; agents forward SIGUSR1 to their ranks.
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
};

// The srun command line that starts one agent per node of the allocation described by `env`.
std::vector<std::string> srun_command(const SlurmLaunchOptions& options, const EnvMap& env,
                                      const std::string& binary);

// Runs `dstrain launch` in Slurm mode: prints the srun line, then execs it (or, with --dry-run,
// only prints it). Returns only for a dry run or throws.
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
