#include "launcher/slurm.h"

#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "core/secrets.h"
#include "launcher/elastic_batch.h"
#include "launcher/hostlist.h"
#include "launcher/output.h"
#include "launcher/plan.h"
#include "launcher/program_path.h"
#include "launcher/shell_quote.h"
#include "launcher/slurm_step.h"
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
  int num_nodes = static_cast<int>(o.nodes.size());
  if (o.nodes.empty()) {
    const char* var = find(env, "SLURM_JOB_NUM_NODES") ? "SLURM_JOB_NUM_NODES" : "SLURM_NNODES";
    if (find(env, var) == nullptr)
      fail(ErrorKind::kInput, "Slurm variable SLURM_JOB_NUM_NODES is not set");
    num_nodes = int_var(env, var, 1);
  }
  const LocalLaunchOptions& l = o.launch;
  std::string addr = o.master_addr_given ? l.master_addr
                     : o.nodes.empty()   ? first_host(env)
                                         : o.nodes.front();
  int port = l.master_port != 0 ? l.master_port : master_port(env);
  std::vector<std::string> argv = {o.srun, "--kill-on-bad-exit=1", "--ntasks-per-node=1",
                                   "--nodes=" + std::to_string(num_nodes),
                                   "--ntasks=" + std::to_string(num_nodes)};
  if (!o.nodes.empty()) {
    std::string list;
    for (const std::string& node : o.nodes) list += (list.empty() ? "" : ",") + node;
    argv.push_back("--nodelist=" + list);
  }
  if (o.overlap) argv.push_back("--overlap");
  if (!o.step_name.empty()) argv.push_back("--job-name=" + o.step_name);
  argv.insert(argv.end(), {binary, "launch", "--slurm-agent", "--nproc", std::to_string(l.nproc),
                           "--master-addr", addr, "--master-port", std::to_string(port), "--grace",
                           fmt::format("{}", l.grace_seconds)});
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

namespace {

constexpr double kNodeCheckSeconds = 20;  // every node checked in parallel after a failed step

std::vector<std::string> job_nodes(const EnvMap& env) {
  const std::string* list = find(env, "SLURM_JOB_NODELIST");
  if (list == nullptr) list = find(env, "SLURM_NODELIST");
  if (list == nullptr) fail(ErrorKind::kInput, "Slurm variable SLURM_JOB_NODELIST is not set");
  return expand_hostlist(*list);
}

// After a failed step: the nodes that can still run one (slurm_step.h), in their order. Error
// (kRuntime) when fewer than --min-nodes remain.
std::vector<std::string> usable_nodes(const SlurmLaunchOptions& o, const std::string& job,
                                      const std::vector<std::string>& nodes) {
  std::vector<std::string> usable;
  for (const NodeCheck& c : check_slurm_nodes(job, nodes, kNodeCheckSeconds)) {
    if (c.usable) {
      usable.push_back(c.node);
      continue;
    }
    write_all(2,
              secrets::redact(fmt::format(
                  "dstrain launch: Slurm node {} cannot run a step again: {}\n", c.node, c.why)));
  }
  if (usable.size() < nodes.size() && static_cast<int>(usable.size()) < o.min_nodes) {
    fail(ErrorKind::kRuntime,
         "only {} of {} Slurm node(s) can run a step, fewer than --min-nodes {}; not restarting",
         usable.size(), nodes.size(), o.min_nodes);
  }
  return usable;
}

void print_srun_line(const std::string& job, const std::vector<std::string>& argv) {
  // The environment, secrets included, reaches the agents through srun, never on its command line.
  write_all(2,
            "dstrain launch: Slurm job " + job + ": " + secrets::redact(shell_join(argv)) + "\n");
}

// --max-restarts: one srun step per attempt; after a failure the same nodes again, or with
// --min-nodes those that can still run a step, with the global batch kept.
int run_steps_with_restarts(const SlurmLaunchOptions& o, const EnvMap& env) {
  const std::string job = std::to_string(int_var(env, "SLURM_JOB_ID", 0));
  const std::vector<std::string> all = job_nodes(env);
  const int nproc = o.launch.nproc;
  const int first_world = static_cast<int>(all.size()) * nproc;
  check_elastic_batch(o.launch, o.allow_batch_change, o.min_nodes,
                      std::vector<int>(all.size(), nproc), "Slurm node(s)");
  const RunDirs dirs = run_dirs(o.launch, first_world);
  SlurmLaunchOptions next = o;
  next.nodes = all;
  return run_with_restarts(o.launch.restart, dirs, [&](int k, const std::string& resume_from) {
    if (k > 0) {
      if (o.min_nodes > 0) next.nodes = usable_nodes(o, job, next.nodes);
      next.overlap = true;
      next.launch.overrides = o.launch.overrides;
      const int world = static_cast<int>(next.nodes.size()) * nproc;
      for (const std::string& kv :
           batch_overrides(o.launch, o.allow_batch_change, first_world, world))
        next.launch.overrides.push_back(kv);
      next.launch.args =
          resume_from.empty() ? o.launch.args : with_resume_from(o.launch.args, resume_from);
    }
    next.step_name = fmt::format("dstrain-agents-{}", k);
    SrunStep step;
    step.argv = srun_command(next, env, launcher_executable());
    print_srun_line(job, step.argv);
    step.argv[0] = resolve_program(step.argv[0]);
    step.nodes = next.nodes;
    step.nproc = nproc;
    step.job_id = job;
    step.name = next.step_name;
    step.grace_seconds = o.launch.grace_seconds;
    return run_srun_step(step);
  });
}

}  // namespace

int run_slurm_launch(const SlurmLaunchOptions& options) {
  check_local_options(options.launch);
  check_restart_options(options.launch.restart);
  if (options.min_nodes < 0)
    fail(ErrorKind::kUsage, "--min-nodes must be >= 0, got {}", options.min_nodes);
  EnvMap env = current_environment();
  SlurmLaunchOptions resolved = options;
  if (!resolved.launch.exec) {
    resolved.launch.config_path = std::filesystem::absolute(resolved.launch.config_path).string();
    int nodes =
        int_var(env, find(env, "SLURM_JOB_NUM_NODES") ? "SLURM_JOB_NUM_NODES" : "SLURM_NNODES", 1);
    const config::ParallelSection parallel =
        validate_config(resolved.launch, nodes * resolved.launch.nproc);
    std::vector<std::string> hosts;
    for (int n = 0; n < nodes; ++n) hosts.push_back(fmt::format("Slurm node {}", n));
    check_tensor_parallel_nodes(
        parallel, std::vector<int>(static_cast<size_t>(nodes), resolved.launch.nproc), hosts);
  } else {
    resolved.launch.args[0] = resolve_program(resolved.launch.args[0]);
  }
  if (options.launch.restart.max_restarts > 0 && !options.launch.dry_run)
    return run_steps_with_restarts(resolved, env);
  std::vector<std::string> argv = srun_command(resolved, env, launcher_executable());
  std::fflush(stderr);
  print_srun_line(env["SLURM_JOB_ID"], argv);
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
