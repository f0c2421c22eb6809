#pragma once
// The node agent: `dstrain launch --node-rank K ...`, started on every node of a multi-node job (by
// the SSH launcher or by srun). It rebuilds the same world plan as the root launcher from the
// per-node rank counts, then runs this node's ranks with run_local_job: same spawning, output
// ("[host:rank] " prefixes), first-failure teardown and summary as a local launch.
//
// Teardown from outside: SIGTERM/SIGINT/SIGHUP stop the ranks (supervisor.h). With watch_stdin,
// stdin is a control channel (over SSH it is the connection itself): a line kAgentStopLine or end
// of file acts as SIGTERM, a line kAgentStopForFailedRankLine (which names the failed rank) as
// SIGTERM after the ranks were told which rank failed (core/teardown_reason.h: they record their
// runs as FAILED, not KILLED), a line kAgentUsr1Line as SIGUSR1 (forwarded to the ranks). So a root
// launcher that closes the channel, exits or loses its connection stops this node's ranks, and
// only them (the agent signals only the process groups it created).
//
// Keepalive (with watch_stdin and keepalive_seconds > 0): a link that goes silent — a cable or
// switch port down, a host frozen — closes nothing, so both ends watch for traffic instead. The
// launcher writes kAgentPingLine to stdin every keepalive_seconds / 4; when nothing at all arrives
// on stdin for keepalive_seconds, the agent says so on stderr and stops its ranks as for SIGTERM.
// The agent writes kAgentAliveLine to stdout as often (from the thread that writes rank lines, so
// it never lands inside one); the launcher drops those lines and declares the host lost after
// keepalive_seconds of silence (ssh_job.h).
//
// Secrets (stdin_env.h): with env_on_stdin, stdin starts with the secret variables of the job, read
// and put into the agent's environment before anything else; the control lines follow them.
//
// Staging (stage_inputs.h): with --stage-dir or data.stage_dir, the agent stages the run's inputs
// on its node before it starts its ranks, writing the keepalive line meanwhile, and prints one
// "stage: node <host>: ..." line; a staging failure ends the agent with exit code 2 and no rank
// started on its node.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/teardown_reason.h"
#include "launcher/launch_local.h"
#include "launcher/plan.h"

namespace dstrain::launcher {

constexpr const char* kAgentStopLine = "dstrain-agent-stop";
constexpr const char* kAgentStopForFailedRankLine = "dstrain-agent-stop-rank-failed";
constexpr const char* kAgentUsr1Line = "dstrain-agent-usr1";
constexpr const char* kAgentPingLine = "dstrain-agent-ping";    // launcher → agent keepalive
constexpr const char* kAgentAliveLine = "dstrain-agent-alive";  // agent → launcher keepalive

// kAgentStopForFailedRankLine naming `failure` (one line, without its newline).
std::string agent_stop_line_for(const teardown::RankFailure& failure);
// The failure a kAgentStopForFailedRankLine names (a rank not known when the line names none);
// nullopt for any other line.
std::optional<teardown::RankFailure> failure_of_agent_stop_line(std::string_view line);

// How often each end of an agent's connection sends its keepalive line.
double keepalive_send_interval(double keepalive_seconds);

struct AgentOptions {
  LocalLaunchOptions launch;     // program, master address/port, grace, log dir (nproc unused)
  std::vector<int> nodes_nproc;  // ranks per node, every node of the job in node order
  int node_rank = 0;             // this node
  std::vector<int> devices;      // this node's CUDA_VISIBLE_DEVICES; empty = leave it alone
  std::string host;              // this node's name in output and summaries
  bool watch_stdin = false;      // stop the ranks when stdin reaches end of file
  double keepalive_seconds = 0;  // with watch_stdin: the keepalive described above; 0 = none
  bool env_on_stdin = false;     // stdin starts with secret variables (stdin_env.h)
};

// The world plan as this agent sees it (only its own node's devices are known).
WorldPlan plan_node_agent(const AgentOptions& options);

// Runs this node's ranks; returns the exit code like run_local_launch.
int run_node_agent(const AgentOptions& options);

// "2,2,4" → {2, 2, 4}; Error(kUsage) naming `flag` for anything but positive integers.
std::vector<int> parse_int_list(const std::string& text, const char* flag, int min_value);

}  // namespace dstrain::launcher
