#include "launcher/slurm.h"

#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "core/secrets.h"
#include "launcher/hostlist.h"
#include "launcher/program_path.h"
#include "launcher/shell_quote.h"
#include "launcher/text_util.h"

extern char** environ;

namespace dstrain::launcher {
namespace {

const std::string* find(const EnvMap& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

int int_var(const EnvMap& env, const std::string& name, int min_value) {
  const std::string* value = find(env, name);
  if (value == nullptr) fail(ErrorKind::kInput, "Slurm variable {} is not set", name);
  int parsed = 0;
  if (!parse_int(*value, &parsed) || parsed < min_value) {
    fail(ErrorKind::kInput, "Slurm variable {}='{}' is not an integer >= {}", name, *value,
         min_value);
  }
  return parsed;
}

std::string first_host(const EnvMap& env) {
  const std::string* list = find(env, "SLURM_JOB_NODELIST");
  if (list == nullptr) list = find(env, "SLURM_NODELIST");
  if (list == nullptr) fail(ErrorKind::kInput, "Slurm variable SLURM_JOB_NODELIST is not set");
  return expand_hostlist(*list).front();
}

int master_port(const EnvMap& env) {
  if (const std::string* port = find(env, "MASTER_PORT")) {
    int parsed = 0;
    if (parse_int(*port, &parsed)) return parsed;
  }
  return slurm_master_port(int_var(env, "SLURM_JOB_ID", 0));
}

// Ranks on this node: SLURM_NTASKS_PER_NODE, else this node's entry of SLURM_TASKS_PER_NODE
// ("2(x3),1"), else 1 entry per node: NTASKS / NNODES.
int local_world_size(const EnvMap& env, int node_id) {
  if (find(env, "SLURM_NTASKS_PER_NODE") != nullptr)
    return int_var(env, "SLURM_NTASKS_PER_NODE", 1);
  const std::string* spec = find(env, "SLURM_TASKS_PER_NODE");
  if (spec == nullptr) spec = find(env, "SLURM_STEP_TASKS_PER_NODE");
  if (spec == nullptr) fail(ErrorKind::kInput, "Slurm variable SLURM_TASKS_PER_NODE is not set");
  int node = 0;
  for (const std::string& piece : split(*spec, ',')) {
    size_t paren = piece.find("(x");
    int count = 0, repeat = 1;
    bool ok = parse_int(piece.substr(0, paren), &count);
    if (paren != std::string::npos)
      ok = ok && piece.back() == ')' &&
           parse_int(piece.substr(paren + 2, piece.size() - paren - 3), &repeat);
    if (!ok)
      fail(ErrorKind::kInput, "Slurm variable SLURM_TASKS_PER_NODE='{}' is malformed", *spec);
    if (node_id < node + repeat) return count;
    node += repeat;
  }
  fail(ErrorKind::kInput, "SLURM_TASKS_PER_NODE='{}' has no entry for node {}", *spec, node_id);
}

}  // namespace

EnvMap current_environment() {
  EnvMap env;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr)
      env.emplace(std::string(*e, static_cast<size_t>(eq - *e)), std::string(eq + 1));
  }
  return env;
}

int slurm_master_port(long job_id) {
  return 15000 + static_cast<int>(job_id % 15000);
}

EnvList torch_env_from_slurm(const EnvMap& env) {
  if (find(env, "RANK") != nullptr || find(env, "SLURM_PROCID") == nullptr) return {};
  int node_id = int_var(env, "SLURM_NODEID", 0);
  EnvList out = {
      {"RANK", std::to_string(int_var(env, "SLURM_PROCID", 0))},
      {"LOCAL_RANK", std::to_string(int_var(env, "SLURM_LOCALID", 0))},
      {"WORLD_SIZE", std::to_string(int_var(env, "SLURM_NTASKS", 1))},
      {"LOCAL_WORLD_SIZE", std::to_string(local_world_size(env, node_id))},
      {"GROUP_RANK", std::to_string(node_id)},
      {"NODE_RANK", std::to_string(node_id)},
      {"MASTER_ADDR", find(env, "MASTER_ADDR") ? *find(env, "MASTER_ADDR") : first_host(env)},
      {"MASTER_PORT", std::to_string(master_port(env))},
  };
  return out;
}

std::vector<std::string> srun_command(const SlurmLaunchOptions& o, const EnvMap& env,
                                      const std::string& binary) {
  const std::string* nodes = find(env, "SLURM_JOB_NUM_NODES");
  if (nodes == nullptr) nodes = find(env, "SLURM_NNODES");
  if (nodes == nullptr) fail(ErrorKind::kInput, "Slurm variable SLURM_JOB_NUM_NODES is not set");
  int num_nodes =
      int_var(env, find(env, "SLURM_JOB_NUM_NODES") ? "SLURM_JOB_NUM_NODES" : "SLURM_NNODES", 1);
  const LocalLaunchOptions& l = o.launch;
  std::string addr = o.master_addr_given ? l.master_addr : first_host(env);
  int port = l.master_port != 0 ? l.master_port : master_port(env);
  std::vector<std::string> argv = {o.srun,
                                   "--kill-on-bad-exit=1",
                                   "--ntasks-per-node=1",
                                   "--nodes=" + std::to_string(num_nodes),
                                   "--ntasks=" + std::to_string(num_nodes),
                                   binary,
                                   "launch",
                                   "--slurm-agent",
                                   "--nproc",
                                   std::to_string(l.nproc),
                                   "--master-addr",
                                   addr,
                                   "--master-port",
                                   std::to_string(port),
                                   "--grace",
                                   fmt::format("{}", l.grace_seconds)};
  if (!l.log_dir.empty()) argv.insert(argv.end(), {"--log-dir", l.log_dir});
  if (!l.stage_dir.empty()) argv.insert(argv.end(), {"--stage-dir", l.stage_dir});
  for (const std::string& kv : l.overrides) argv.insert(argv.end(), {"--set", kv});
  if (l.exec) {
    argv.insert(argv.end(), {"--exec", "--"});
    argv.insert(argv.end(), l.args.begin(), l.args.end());
  } else {
    argv.push_back(l.config_path);
    if (!l.args.empty()) argv.push_back("--");
    argv.insert(argv.end(), l.args.begin(), l.args.end());
  }
  return argv;
}

int run_slurm_launch(const SlurmLaunchOptions& options) {
  check_local_options(options.launch);
  EnvMap env = current_environment();
  SlurmLaunchOptions resolved = options;
  if (!resolved.launch.exec) {
    resolved.launch.config_path = std::filesystem::absolute(resolved.launch.config_path).string();
    int nodes =
        int_var(env, find(env, "SLURM_JOB_NUM_NODES") ? "SLURM_JOB_NUM_NODES" : "SLURM_NNODES", 1);
    validate_config(resolved.launch, nodes * resolved.launch.nproc);
  } else {
    resolved.launch.args[0] = resolve_program(resolved.launch.args[0]);
  }
  std::vector<std::string> argv = srun_command(resolved, env, self_executable());
  // The environment, secrets included, reaches the agents through srun, never on its command line.
  std::string line =
      "dstrain launch: Slurm job " + env["SLURM_JOB_ID"] + ": " + secrets::redact(shell_join(argv));
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  if (options.launch.dry_run) return 0;
  std::vector<char*> c_argv;
  for (std::string& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  ::execvp(c_argv[0], c_argv.data());
  fail(ErrorKind::kIo, "cannot run {}: {} (is Slurm installed on this node?)", argv[0],
       std::strerror(errno));
}

SlurmAgentPlacement slurm_agent_placement(const EnvMap& env) {
  SlurmAgentPlacement p;
  p.node_rank = int_var(env, "SLURM_NODEID", 0);
  p.num_nodes = find(env, "SLURM_STEP_NUM_NODES") ? int_var(env, "SLURM_STEP_NUM_NODES", 1)
                                                  : int_var(env, "SLURM_NNODES", 1);
  const std::string* host = find(env, "SLURMD_NODENAME");
  p.host = host != nullptr ? *host : "";
  if (p.node_rank >= p.num_nodes) {
    fail(ErrorKind::kInput, "SLURM_NODEID={} is not below the step's node count {}", p.node_rank,
         p.num_nodes);
  }
  return p;
}

}  // namespace dstrain::launcher
