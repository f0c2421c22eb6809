#pragma once
// The node agent: `dstrain launch --node-rank K ...`, started on every node of a multi-node job (by
// the SSH launcher or by srun). It rebuilds the same world plan as the root launcher from the
// per-node rank counts, then runs this node's ranks with run_local_job: same spawning, output
// ("[host:rank] " prefixes), first-failure teardown and summary as a local launch.
//
// Teardown from outside: SIGTERM/SIGINT/SIGHUP stop the ranks (supervisor.h). With watch_stdin,
// stdin is a control channel (over SSH it is the connection itself): a line kAgentStopLine or end
// of file acts as SIGTERM, a line kAgentUsr1Line as SIGUSR1 (forwarded to the ranks). So a root
// launcher that closes the channel, exits or loses its connection stops this node's ranks, and
// only them (the agent signals only the process groups it created).

#include <string>
#include <vector>

#include "launcher/launch_local.h"
#include "launcher/plan.h"

namespace dstrain::launcher {

constexpr const char* kAgentStopLine = "dstrain-agent-stop";
constexpr const char* kAgentUsr1Line = "dstrain-agent-usr1";

struct AgentOptions {
  LocalLaunchOptions launch;     // program, master address/port, grace, log dir (nproc unused)
  std::vector<int> nodes_nproc;  // ranks per node, every node of the job in node order
  int node_rank = 0;             // this node
  std::vector<int> devices;      // this node's CUDA_VISIBLE_DEVICES; empty = leave it alone
  std::string host;              // this node's name in output and summaries
  bool watch_stdin = false;      // stop the ranks when stdin reaches end of file
};

// The world plan as this agent sees it (only its own node's devices are known).
WorldPlan plan_node_agent(const AgentOptions& options);

// Runs this node's ranks; returns the exit code like run_local_launch.
int run_node_agent(const AgentOptions& options);

// "2,2,4" → {2, 2, 4}; Error(kUsage) naming `flag` for anything but positive integers.
std::vector<int> parse_int_list(const std::string& text, const char* flag, int min_value);

}  // namespace dstrain::launcher
