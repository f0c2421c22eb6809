#include <memory>

#include "apps/dstrain/commands.h"
#include "launcher/launch.h"

namespace dstrain::app {
namespace {

struct LaunchFlags {
  launcher::LaunchOptions options;
  std::string first;   // the first positional: CONFIG, or with --exec the program
  bool trace = false;  // --trace: --set logging.trace=true
};

void add_local_flags(CLI::App* cmd, LaunchFlags* f) {
  launcher::LocalLaunchOptions& o = f->options.launch;
  cmd->add_option("--nproc,--nproc-per-node,--nproc_per_node", o.nproc,
                  "Ranks on this machine (with --slurm: per node)")
      ->type_name("N")
      ->default_val(1);
  cmd->add_option("--set", o.overrides, "Config override key.path=value, passed to every rank")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  cmd->add_option_function<std::string>(
         "--master-addr,--master_addr",
         [f](const std::string& addr) {
           f->options.launch.master_addr = addr;
           f->options.master_addr_given = true;
         },
         "MASTER_ADDR of every rank [default: 127.0.0.1; with --hostfile the first host]")
      ->type_name("ADDR");
  cmd->add_option("--master-port,--master_port", o.master_port,
                  "MASTER_PORT of every rank [default: a free port; 29500 with --hostfile]")
      ->type_name("PORT");
  cmd->add_option("--log-dir", o.log_dir, "Also write each rank's output to DIR/rank_K.log")
      ->type_name("DIR");
  cmd->add_option("--stage-dir", o.stage_dir,
                  "Copy the model and token cache to this node-local DIR on each node first "
                  "[default: data.stage_dir]")
      ->type_name("DIR");
  cmd->add_option("--grace", o.grace_seconds, "Seconds between SIGTERM and SIGKILL when stopping")
      ->type_name("SECONDS")
      ->default_val(5.0);
  cmd->add_option("--max-restarts,--max_restarts", o.restart.max_restarts,
                  "Restart a failed job from the newest checkpoint, at most N times in a row "
                  "without a new checkpoint")
      ->type_name("N")
      ->default_val(0);
  cmd->add_option("--restart-backoff", o.restart.backoff_seconds,
                  "Seconds to wait before a restart")
      ->type_name("SECONDS")
      ->default_val(1.0);
  cmd->add_flag("--dry-run", o.dry_run, "Validate, print the plan, start nothing");
  cmd->add_flag("--share-gpu", o.share_gpu,
                "Every local rank computes on the one visible GPU (NCCL over loopback), for "
                "checking multi-rank code on one GPU; also DSTRAIN_SHARE_GPU=1");
  cmd->add_flag("--trace", f->trace,
                "Record a Chrome/Perfetto trace per rank (same as --set logging.trace=true)");
  cmd->add_option("--secret-env", f->options.secret_env,
                  "Variable whose value is secret (repeatable): redacted from all output, sent to "
                  "remote hosts on the SSH channel, never on a command line")
      ->type_name("NAME")
      ->allow_extra_args(false);
  cmd->add_flag("--resume-latest", f->options.resume_latest,
                "Resume from <checkpoint.dir>/latest of the config when it exists, else start at "
                "step 0");
  cmd->add_flag("--exec", o.exec, "Run PROGRAM [ARGS...] (after --) instead of 'dstrain train'");
  cmd->add_option("CONFIG", f->first, "The run's YAML config (with --exec: the program)")
      ->type_name("");
  cmd->add_option("ARGS", o.args, "After --: extra arguments for 'dstrain train' or the program")
      ->type_name("");
}

void add_multi_node_flags(CLI::App* cmd, LaunchFlags* f) {
  launcher::LaunchOptions& o = f->options;
  const char* group = "Multi-node (SSH)";
  cmd->add_option("--hostfile", o.hostfile, "Hosts to run on: lines 'host slots=N'")
      ->type_name("FILE")
      ->group(group);
  cmd->add_option("--include", o.selection.include, "Only these hosts/slots: host1:0,2@host2")
      ->type_name("SPEC")
      ->group(group);
  cmd->add_option("--exclude", o.selection.exclude, "All but these hosts/slots: host1:0@host2")
      ->type_name("SPEC")
      ->group(group);
  cmd->add_option("--num_nodes,--num-nodes", o.selection.num_nodes, "Use the first N hosts")
      ->type_name("N")
      ->group(group);
  cmd->add_option("--num_gpus,--num-gpus", o.selection.num_gpus, "Use the first G slots per host")
      ->type_name("G")
      ->group(group);
  cmd->add_option("--env", o.env, "Extra variable for remote ranks (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false)
      ->group(group);
  cmd->add_option("--remote-cwd", o.remote_cwd, "Working directory on the hosts [default: this]")
      ->type_name("DIR")
      ->group(group);
  cmd->add_option("--ssh-key", o.ssh.key_file, "Private key [default: ssh-agent, ~/.ssh/id_*]")
      ->type_name("FILE")
      ->group(group);
  cmd->add_option("--ssh-known-hosts", o.ssh.known_hosts, "known_hosts file to check keys against")
      ->type_name("FILE")
      ->group(group);
  cmd->add_flag("--ssh-accept-new-host-keys", o.ssh.accept_new_host_keys,
                "Add unknown host keys to known_hosts instead of failing")
      ->group(group);
  cmd->add_option("--ssh-timeout", o.ssh.connect_timeout, "SSH connect timeout in seconds")
      ->type_name("SECONDS")
      ->default_val(10.0)
      ->group(group);
  cmd->add_option("--ssh-keepalive", o.ssh.keepalive_seconds,
                  "A host silent this long is lost: the job stops and the summary names it")
      ->type_name("SECONDS")
      ->default_val(10.0)
      ->check(CLI::Range(1.0, 3600.0))
      ->group(group);
  cmd->add_flag("--check", o.check, "With --dry-run: connect to each host, run 'dstrain version'")
      ->group(group);
  cmd->add_option(
         "--min-nodes", o.min_nodes,
         "With --max-restarts (SSH or Slurm): leave out hosts that cannot be reached (Slurm "
         "nodes that cannot run a step) again and restart on the others while at least M "
         "remain (the global batch is kept)")
      ->type_name("M")
      ->group(group);
  auto* elastic = cmd->add_option_function<std::string>(
      "--elastic-batch",
      [f](const std::string& v) { f->options.allow_batch_change = v == "allow-change"; },
      "keep: a smaller world keeps the global batch exactly or the job stops (exit 2); "
      "allow-change: the nearest global batch");
  elastic->type_name("keep|allow-change")
      ->check(CLI::IsMember({"keep", "allow-change"}))
      ->group(group);
}

void add_slurm_and_agent_flags(CLI::App* cmd, LaunchFlags* f) {
  launcher::LaunchOptions& o = f->options;
  cmd->add_flag("--slurm", o.slurm, "Start one node agent per node of the allocation with srun")
      ->group("Slurm");
  cmd->add_flag("--no-slurm", o.no_slurm, "Run on this machine even inside a Slurm job")
      ->group("Slurm");
  const char* internal = "";  // set by the launcher on the agents' command lines; hidden
  cmd->add_option("--node-rank", o.node_rank, "Run as node agent K")->group(internal);
  cmd->add_flag("--slurm-agent", o.slurm_agent, "Run as node agent SLURM_NODEID")->group(internal);
  cmd->add_option("--nodes-nproc", o.nodes_nproc, "Ranks per node")->group(internal);
  cmd->add_option("--node-devices", o.node_devices, "CUDA_VISIBLE_DEVICES")->group(internal);
  cmd->add_option("--node-host", o.node_host, "Host label")->group(internal);
  cmd->add_flag("--watch-stdin", o.watch_stdin, "Stop at end of stdin")->group(internal);
  cmd->add_flag("--env-on-stdin", o.env_on_stdin, "Read secret variables from stdin first")
      ->group(internal);
}

}  // namespace

void set_launch_command(CLI::App& root, int* exit_code) {
  auto* cmd = root.add_subcommand(
      "launch", "Start the ranks of 'dstrain train CONFIG' (here, over SSH or with Slurm)");
  cmd->footer(
      "Every rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK,\n"
      "MASTER_ADDR and MASTER_PORT. If a rank fails, all ranks on all hosts are stopped and the\n"
      "launcher exits with that rank's exit code (128+signal for a signal).\n"
      "Examples:\n"
      "  dstrain launch --nproc 4 run.yaml --set training.max_steps=10\n"
      "  dstrain launch --hostfile hosts --include 'node1:0,1@node2' run.yaml\n"
      "  dstrain launch --nproc 2 --exec -- python3 train.py --lr 1e-4\n"
      "See docs/launch.md.");
  auto flags = std::make_shared<LaunchFlags>();
  add_local_flags(cmd, flags.get());
  add_multi_node_flags(cmd, flags.get());
  add_slurm_and_agent_flags(cmd, flags.get());
  cmd->callback([flags, exit_code] {
    launcher::LaunchOptions options = flags->options;
    if (flags->trace) options.launch.overrides.push_back("logging.trace=true");
    if (options.launch.exec) {
      if (!flags->first.empty())
        options.launch.args.insert(options.launch.args.begin(), flags->first);
    } else {
      options.launch.config_path = flags->first;
    }
    *exit_code = launcher::run_launch(options);
  });
}

}  // namespace dstrain::app
