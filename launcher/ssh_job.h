#pragma once
// Supervising node agents over SSH: one thread per host (a 64-host job connects in parallel), each
// owning its SSH session; the main thread waits for the first failure or a signal.
//
// Contract:
//  - Right after starting an agent, its thread writes the job's secret variables on the agent's
//    stdin (stdin_env.h); they are in no command line. Known secret values are redacted from
//    everything relayed or printed.
//  - Agent output is relayed line by line: rank lines arrive already prefixed "[host:rank] ";
//    any other line of an agent (its own messages and summary) is prefixed "[host] ".
//  - The first failure anywhere — an agent exiting non-zero, a connection that cannot be made,
//    authenticated or kept — stops every other agent: a stop line, then end of file, on its stdin
//    (node_agent.h); the agent stops its own ranks (and only those). A second failure is not a
//    root cause.
//  - A lost host is a failure too: a connection that breaks (its sshd killed, the host rebooted)
//    fails at once; one that goes silent (link down) fails after ssh.keepalive_seconds without a
//    byte from its agent, whose keepalive line (node_agent.h) otherwise arrives 4 times as often.
//    On the far side the agent stops its ranks after as long without the launcher's pings.
//    SIGINT/SIGTERM/SIGHUP to the launcher do the same; SIGUSR1 is forwarded to every agent as a
//    line on its stdin (sshd refuses signal requests in some set-ups, e.g. for root) and by the
//    agents to every rank, and the job goes on.
//  - Exit code: 0; the failing agent's exit code (= its failed rank's code); 255 for an SSH
//    failure; 128 + signal when interrupted. A summary naming host, rank, cause and last lines is
//    printed on stderr. The outcome also says which kind of ending it was, for --max-restarts.

#include <string>

#include <vector>

#include "launcher/multi_node.h"
#include "launcher/restart.h"
#include "launcher/ssh_client.h"

namespace dstrain::launcher {

constexpr int kSshFailureExit = 255;

// The job's outcome: a failure names the first failed node's host and cause.
AttemptOutcome run_ssh_job(const MultiNodePlan& plan, const SshSettings& ssh, double grace_seconds);

struct HostCheck {
  std::string host;
  bool reachable = false;  // an SSH session could be opened and authenticated
  bool ok = false;         // and the commands exited 0
  std::string text;        // their output lines joined by "; ", or why not
};

// Connects to every host of the plan in parallel and runs `<binary> version` there; with
// `devices` also `<binary> debug devices --ranks N` with the node's CUDA_VISIBLE_DEVICES (the
// worker starts, loads LibTorch and finds the GPUs N ranks would take, or fails as they would).
std::vector<HostCheck> probe_hosts(const MultiNodePlan& plan, const SshSettings& ssh,
                                   const std::string& binary, bool devices = false);

// `--dry-run --check`: probe_hosts with devices, one line per host; returns 0 if every host
// passed, else kSshFailureExit.
int check_hosts(const MultiNodePlan& plan, const SshSettings& ssh, const std::string& binary);

}  // namespace dstrain::launcher
