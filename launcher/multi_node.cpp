#include "launcher/multi_node.h"

#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "core/secrets.h"
#include "launcher/elastic_batch.h"
#include "launcher/free_port.h"
#include "launcher/output.h"
#include "launcher/program_path.h"
#include "launcher/remote_command.h"
#include "launcher/remote_env.h"
#include "launcher/shell_quote.h"
#include "launcher/ssh_job.h"

extern char** environ;

namespace dstrain::launcher {
namespace {

std::string join_ints(const std::vector<int>& values) {
  std::string out;
  for (int v : values) out += (out.empty() ? "" : ",") + std::to_string(v);
  return out;
}

std::string current_dir() {
  return std::filesystem::current_path().string();
}

// The options as the root resolves them: absolute config path (so it means the same file on every
// host) and a concrete port.
LocalLaunchOptions resolved_launch(const MultiNodeOptions& o) {
  LocalLaunchOptions launch = o.launch;
  if (!launch.exec && !launch.config_path.empty())
    launch.config_path = std::filesystem::absolute(launch.config_path).string();
  if (!launch.log_dir.empty()) launch.log_dir = std::filesystem::absolute(launch.log_dir).string();
  if (!launch.stage_dir.empty())
    launch.stage_dir = std::filesystem::absolute(launch.stage_dir).string();
  if (launch.master_port == 0) launch.master_port = 29500;
  return launch;
}

PlanRequest world_request(const MultiNodeOptions& o, const LocalLaunchOptions& launch,
                          const std::vector<SelectedNode>& nodes) {
  PlanRequest request;
  for (const SelectedNode& node : nodes) {
    request.nodes.push_back(
        NodeSpec{node.entry.host, static_cast<int>(node.slots.size()), node.slots});
  }
  request.master_addr = o.master_addr_given ? launch.master_addr : nodes.front().entry.host;
  request.master_port = launch.master_port;
  request.command = rank_command(launch);
  return request;
}

std::string remote_binary(const MultiNodeOptions& o) {
  return o.remote_binary.empty() ? launcher_executable() : o.remote_binary;
}

}  // namespace

std::vector<std::string> agent_argv(const MultiNodeOptions& options, const MultiNodePlan& plan,
                                    int node_rank, const std::string& binary) {
  LocalLaunchOptions launch = resolved_launch(options);
  std::vector<int> nproc;
  for (const SelectedNode& n : plan.nodes) nproc.push_back(static_cast<int>(n.slots.size()));
  std::vector<std::string> argv = {binary,
                                   "launch",
                                   "--node-rank",
                                   std::to_string(node_rank),
                                   "--nodes-nproc",
                                   join_ints(nproc),
                                   "--node-devices",
                                   join_ints(plan.nodes[node_rank].slots),
                                   "--node-host",
                                   plan.nodes[node_rank].entry.host,
                                   "--watch-stdin",
                                   "--env-on-stdin",
                                   "--master-addr",
                                   plan.world.master_addr,
                                   "--master-port",
                                   std::to_string(plan.world.master_port),
                                   "--grace",
                                   fmt::format("{}", launch.grace_seconds),
                                   "--ssh-keepalive",
                                   fmt::format("{}", options.ssh.keepalive_seconds)};
  if (!launch.log_dir.empty()) argv.insert(argv.end(), {"--log-dir", launch.log_dir});
  if (!launch.stage_dir.empty()) argv.insert(argv.end(), {"--stage-dir", launch.stage_dir});
  for (const std::string& kv : launch.overrides) argv.insert(argv.end(), {"--set", kv});
  if (launch.exec) {
    argv.insert(argv.end(), {"--exec", "--"});
    argv.insert(argv.end(), plan.world.ranks.front().argv.begin(),
                plan.world.ranks.front().argv.end());
  } else {
    argv.push_back(launch.config_path);
    if (!launch.args.empty()) argv.push_back("--");
    argv.insert(argv.end(), launch.args.begin(), launch.args.end());
  }
  return argv;
}

MultiNodePlan plan_multi_node(const MultiNodeOptions& o, const char* const* environ) {
  check_local_options(o.launch);
  LocalLaunchOptions launch = resolved_launch(o);
  MultiNodePlan plan;
  plan.nodes = select_hosts(read_hostfile(o.hostfile), o.selection, o.hostfile);
  plan.nodes.erase(std::remove_if(plan.nodes.begin(), plan.nodes.end(),
                                  [&](const SelectedNode& n) {
                                    return std::find(o.left_out.begin(), o.left_out.end(),
                                                     n.entry.host) != o.left_out.end();
                                  }),
                   plan.nodes.end());
  if (plan.nodes.empty()) fail(ErrorKind::kRuntime, "no host left to run on");
  plan.world = make_world_plan(world_request(o, launch, plan.nodes));
  if (!launch.exec) {
    plan.world.parallel = validate_config(launch, plan.world.world_size);
    check_tensor_parallel_nodes(plan.world);
  }
  RemoteEnvSources sources;
  sources.environ = environ;
  const char* home = std::getenv("HOME");
  sources.home = home != nullptr ? home : "";
  sources.cwd = current_dir();
  sources.flags = o.env;
  sources.named = o.secret_env;
  SplitEnv env = split_secret_env(collect_remote_env(sources));
  plan.secret_env = env.secret;
  RemoteCommand command;
  command.env = env.exported;
  command.cwd = o.remote_cwd.empty() ? current_dir() : o.remote_cwd;
  const std::string binary = remote_binary(o);
  for (size_t k = 0; k < plan.nodes.size(); ++k) {
    command.argv = agent_argv(o, plan, static_cast<int>(k), binary);
    plan.agent_commands.push_back(build_remote_command(command));
  }
  return plan;
}

std::string format_multi_node_plan(const MultiNodePlan& plan) {
  std::string out = fmt::format("dstrain launch plan: {} rank(s) on {} host(s), master {}:{}\n",
                                plan.world.world_size, plan.nodes.size(), plan.world.master_addr,
                                plan.world.master_port);
  for (size_t k = 0; k < plan.nodes.size(); ++k) {
    const HostEntry& h = plan.nodes[k].entry;
    SshTarget target{h.host, h.user, h.ssh_port};
    out += fmt::format("host {} (node {}, ssh {}, devices {})\n", h.host, k,
                       describe_target(target), join_ints(plan.nodes[k].slots));
    for (const RankSpec& rank : ranks_on_node(plan.world, static_cast<int>(k))) {
      std::string env;
      for (const auto& kv : rank.env)
        env += " " + kv.first + "=" + shell_quote(secrets::shown_value(kv.first, kv.second));
      out += fmt::format("  rank {}:{}\n", rank.rank, env);
    }
    out += "  remote command:\n";
    std::string script = plan.agent_commands[k];
    size_t pos = 0;
    while (pos < script.size()) {
      size_t nl = script.find('\n', pos);
      if (nl == std::string::npos) nl = script.size();
      out += "    " + secrets::redact(script.substr(pos, nl - pos)) + "\n";
      pos = nl + 1;
    }
    if (plan.secret_env.empty()) continue;
    out += "  on the connection (stdin), never on a command line:";
    for (const auto& kv : plan.secret_env) out += " " + kv.first + "=" + secrets::kRedacted;
    out += "\n";
  }
  return out;
}

namespace {

// After a failed attempt: the hosts that cannot be reached again, left out while at least
// min_nodes remain. Error(kRuntime) when fewer would.
std::vector<std::string> unreachable_hosts(const MultiNodeOptions& o, const MultiNodePlan& plan) {
  std::vector<std::string> lost;
  for (const HostCheck& c : probe_hosts(plan, o.ssh, remote_binary(o))) {
    if (c.reachable) continue;
    write_all(2, secrets::redact(fmt::format(
                     "dstrain launch: host {} cannot be reached again ({})\n", c.host, c.text)));
    lost.push_back(c.host);
  }
  const int remaining = static_cast<int>(plan.nodes.size() - lost.size());
  if (!lost.empty() && remaining < o.min_nodes) {
    fail(ErrorKind::kRuntime,
         "only {} of {} host(s) can be reached, fewer than --min-nodes {}; not restarting",
         remaining, plan.nodes.size(), o.min_nodes);
  }
  return lost;
}

std::vector<int> node_sizes(const MultiNodePlan& plan) {
  std::vector<int> sizes;
  for (const SelectedNode& n : plan.nodes) sizes.push_back(static_cast<int>(n.slots.size()));
  return sizes;
}

}  // namespace

int run_multi_node_launch(const MultiNodeOptions& options) {
  check_restart_options(options.launch.restart);
  if (options.min_nodes < 0)
    fail(ErrorKind::kUsage, "--min-nodes must be >= 0, got {}", options.min_nodes);
  MultiNodePlan plan = plan_multi_node(options, environ);
  check_elastic_batch(resolved_launch(options), options.allow_batch_change, options.min_nodes,
                      node_sizes(plan), "host(s)");
  if (options.launch.dry_run) {
    std::fputs(format_multi_node_plan(plan).c_str(), stdout);
    std::fputs(format_parallel_groups(plan.world).c_str(), stdout);
    std::fflush(stdout);
    if (!options.check) return 0;
    return check_hosts(plan, options.ssh, remote_binary(options));
  }
  const int first_world = plan.world.world_size;
  const RunDirs dirs = run_dirs(resolved_launch(options), first_world);
  MultiNodeOptions next = options;
  return run_with_restarts(
      options.launch.restart, dirs, [&](int k, const std::string& resume_from) {
        if (k > 0) {  // the same hosts, or those still reachable, from the checkpoint
          if (options.min_nodes > 0) {
            for (const std::string& host : unreachable_hosts(options, plan))
              next.left_out.push_back(host);
          }
          next.launch.overrides = options.launch.overrides;
          next.launch.args = resume_from.empty()
                                 ? options.launch.args
                                 : with_resume_from(options.launch.args, resume_from);
          MultiNodePlan shrunk = plan_multi_node(next, environ);
          for (const std::string& kv :
               batch_overrides(resolved_launch(options), options.allow_batch_change, first_world,
                               shrunk.world.world_size))
            next.launch.overrides.push_back(kv);
          plan = plan_multi_node(next, environ);
        }
        std::fflush(stdout);
        std::fflush(stderr);
        return run_ssh_job(plan, options.ssh, options.launch.grace_seconds);
      });
}

}  // namespace dstrain::launcher
