#include "launcher/launch.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/secrets.h"
#include "launcher/multi_node.h"
#include "launcher/node_agent.h"
#include "launcher/remote_env.h"
#include "launcher/slurm.h"

extern char** environ;

namespace dstrain::launcher {
namespace {

int run_agent(const LaunchOptions& o) {
  AgentOptions agent;
  agent.launch = o.launch;
  agent.watch_stdin = o.watch_stdin;
  agent.env_on_stdin = o.env_on_stdin;
  agent.keepalive_seconds = o.ssh.keepalive_seconds;
  if (o.slurm_agent) {
    SlurmAgentPlacement p = slurm_agent_placement(current_environment());
    agent.node_rank = p.node_rank;
    agent.host = p.host;
    agent.nodes_nproc.assign(static_cast<size_t>(p.num_nodes), o.launch.nproc);
  } else {
    agent.node_rank = o.node_rank;
    agent.host = o.node_host;
    agent.nodes_nproc = parse_int_list(o.nodes_nproc, "--nodes-nproc", 1);
    agent.devices = parse_int_list(o.node_devices, "--node-devices", 0);
  }
  return run_node_agent(agent);
}

void reject_multi_node_flags(const LaunchOptions& o) {
  const HostSelection& s = o.selection;
  bool given = !s.include.empty() || !s.exclude.empty() || s.num_nodes != -1 || s.num_gpus != -1 ||
               !o.env.empty() || !o.remote_cwd.empty() || o.check || !o.ssh.key_file.empty() ||
               o.min_nodes != 0 || o.allow_batch_change;
  if (given) {
    fail(ErrorKind::kUsage,
         "--include/--exclude/--num_nodes/--num_gpus/--env/--remote-cwd/--check/--ssh-key/"
         "--min-nodes/--elastic-batch need --hostfile (--min-nodes and --elastic-batch also work "
         "under Slurm)");
  }
}

// --secret-env names join the secret ones here, their values are learnt from the environment, and
// DSTRAIN_REDACT_VARS carries every added name to what this process starts (ranks inherit it; over
// SSH it is forwarded like any DSTRAIN_ variable; srun passes the environment on).
void adopt_secret_names(const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    if (!is_env_name(name))
      fail(ErrorKind::kUsage, "--secret-env expects a variable name, got '{}'", name);
  }
  secrets::add_secret_names(names);
  secrets::learn_environment(environ);
  const std::vector<std::string> all = secrets::added_secret_names();
  if (all.empty()) return;
  const std::string value = secrets::join_names(all);
  if (::setenv(secrets::kExtraNamesVariable, value.c_str(), 1) != 0) {
    fail(ErrorKind::kIo, "cannot set {}: {}", secrets::kExtraNamesVariable, std::strerror(errno));
  }
}

bool in_slurm_allocation(const LaunchOptions& o) {
  if (o.no_slurm) return false;
  const char* job = std::getenv("SLURM_JOB_ID");
  return o.slurm || (job != nullptr && *job != '\0');
}

}  // namespace

int run_launch(const LaunchOptions& o) {
  if (o.slurm && o.no_slurm) fail(ErrorKind::kUsage, "--slurm and --no-slurm exclude each other");
  adopt_secret_names(o.secret_env);
  if (o.node_rank >= 0 || o.slurm_agent) return run_agent(o);
  if (!o.hostfile.empty()) {
    if (o.slurm) fail(ErrorKind::kUsage, "--hostfile and --slurm exclude each other");
    MultiNodeOptions m;
    m.launch = o.launch;
    m.master_addr_given = o.master_addr_given;
    m.hostfile = o.hostfile;
    m.selection = o.selection;
    m.env = o.env;
    m.secret_env = secrets::added_secret_names();
    m.remote_cwd = o.remote_cwd;
    m.ssh = o.ssh;
    m.check = o.check;
    m.min_nodes = o.min_nodes;
    m.allow_batch_change = o.allow_batch_change;
    return run_multi_node_launch(m);
  }
  if (in_slurm_allocation(o)) {
    LaunchOptions ssh_only = o;  // --min-nodes and --elastic-batch apply under Slurm too
    ssh_only.min_nodes = 0;
    ssh_only.allow_batch_change = false;
    reject_multi_node_flags(ssh_only);
    SlurmLaunchOptions s;
    s.launch = o.launch;
    s.master_addr_given = o.master_addr_given;
    s.min_nodes = o.min_nodes;
    s.allow_batch_change = o.allow_batch_change;
    return run_slurm_launch(s);
  }
  reject_multi_node_flags(o);
  return run_local_launch(o.launch);
}

}  // namespace dstrain::launcher
