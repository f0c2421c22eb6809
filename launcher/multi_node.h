#pragma once
// `dstrain launch --hostfile H`: a job over several hosts. The root launcher plans the whole world
// (pure, see plan.h), then starts one node agent per host over SSH (`dstrain launch --node-rank K`,
// node_agent.h) and supervises the agents (ssh_job.h).
//
// Rank layout: hosts in hostfile order, each with the ranks of its selected slots, contiguous:
// node 0 holds ranks 0..n0-1, node 1 the next n1, ... LOCAL_RANK counts within a node,
// LOCAL_WORLD_SIZE is that node's rank count, CUDA_VISIBLE_DEVICES lists the node's selected
// slots. MASTER_ADDR defaults to the first selected host.

#include <string>
#include <vector>

#include "launcher/host_select.h"
#include "launcher/launch_local.h"
#include "launcher/plan.h"
#include "launcher/ssh_client.h"

namespace dstrain::launcher {

struct MultiNodeOptions {
  LocalLaunchOptions launch;  // program, master port, grace, log dir, dry run (nproc unused)
  bool master_addr_given = false;
  std::string hostfile;
  HostSelection selection;
  std::vector<std::string> env;         // --env KEY=VALUE
  std::vector<std::string> secret_env;  // --secret-env NAME: forwarded, and secret
  std::string remote_cwd;               // "" = this directory
  std::string remote_binary;            // "" = this binary's path
  SshSettings ssh;
  bool check = false;  // with dry_run: connect and report each host
  // --min-nodes: with --max-restarts, a host that cannot be reached again after a failure is left
  // out and the job restarts on the others while at least this many remain; 0 = never leave one
  // out (restart on the same hosts).
  int min_nodes = 0;
  bool allow_batch_change = false;    // --elastic-batch allow-change (see next_attempt_options)
  std::vector<std::string> left_out;  // hosts removed from the selection (after a failure)
};

struct MultiNodePlan {
  WorldPlan world;
  std::vector<SelectedNode> nodes;          // node k = nodes[k]
  std::vector<std::string> agent_commands;  // the shell command run on node k
  EnvList secret_env;  // never in a command: sent to every agent on its stdin (stdin_env.h)
};

// Reads the hostfile, selects hosts, validates, builds the world and every agent's command.
// `environ` supplies forwarded variables (see remote_env.h); the secret ones (core/secrets.h) are
// kept out of the commands, in secret_env.
MultiNodePlan plan_multi_node(const MultiNodeOptions& options, const char* const* environ);

// The argv of node k's agent (before quoting).
std::vector<std::string> agent_argv(const MultiNodeOptions& options, const MultiNodePlan& plan,
                                    int node_rank, const std::string& binary);

// --dry-run output: per host, its address, ranks with their variables, the agent command, and the
// names of the secret variables sent on its stdin (values redacted).
std::string format_multi_node_plan(const MultiNodePlan& plan);

// The global batch kept when the world shrinks: elastic_batch.h.

// Runs the job (or the dry run / check); returns the exit code. With --max-restarts a failed job
// is restarted from `latest` (restart.h); with --min-nodes on the hosts that can still be reached.
int run_multi_node_launch(const MultiNodeOptions& options);

}  // namespace dstrain::launcher
