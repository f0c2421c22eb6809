#include <memory>

#include "apps/dstrain/commands.h"
#include "launcher/launch_local.h"

namespace dstrain::app {
namespace {

struct LaunchFlags {
  launcher::LocalLaunchOptions options;
  std::string first;  // the first positional: CONFIG, or with --exec the program
};

void add_launch_flags(CLI::App* cmd, LaunchFlags* f) {
  launcher::LocalLaunchOptions& o = f->options;
  cmd->add_option("--nproc", o.nproc, "Number of ranks to start on this machine")
      ->type_name("N")
      ->default_val(1);
  cmd->add_option("--set", o.overrides,
                  "Config override key.path=value, passed to every rank "
                  "(repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  cmd->add_option("--master-addr", o.master_addr, "MASTER_ADDR given to every rank")
      ->type_name("ADDR")
      ->default_val("127.0.0.1");
  cmd->add_option("--master-port", o.master_port,
                  "MASTER_PORT given to every rank [default: a free port]")
      ->type_name("PORT");
  cmd->add_option("--log-dir", o.log_dir, "Also write each rank's output to DIR/rank_K.log")
      ->type_name("DIR");
  cmd->add_option("--grace", o.grace_seconds,
                  "Seconds between SIGTERM and SIGKILL when stopping ranks")
      ->type_name("SECONDS")
      ->default_val(5.0);
  cmd->add_flag("--dry-run", o.dry_run,
                "Validate the config, print each rank's env and command, start nothing");
  cmd->add_flag("--exec", o.exec,
                "Run PROGRAM [ARGS...] (after --) on every rank instead of 'dstrain train'");
  cmd->add_option("CONFIG", f->first, "The run's YAML config (with --exec: the program)")
      ->type_name("");
  cmd->add_option("ARGS", o.args,
                  "After --: extra arguments for 'dstrain train' (with --exec: the program's)")
      ->type_name("");
}

}  // namespace

void set_launch_command(CLI::App& root, int* exit_code) {
  auto* cmd = root.add_subcommand(
      "launch", "Start N ranks of 'dstrain train CONFIG' on this machine and supervise them");
  cmd->footer(
      "Every rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK,\n"
      "MASTER_ADDR and MASTER_PORT. Output is prefixed with [rank K]. If a rank fails, all ranks "
      "are\n"
      "stopped and the launcher exits with that rank's exit code (128+signal for a signal).\n"
      "Examples:\n"
      "  dstrain launch --nproc 4 run.yaml --set training.max_steps=10\n"
      "  dstrain launch --nproc 2 --exec -- python3 train.py --lr 1e-4\n"
      "See docs/launch.md.");
  auto flags = std::make_shared<LaunchFlags>();
  add_launch_flags(cmd, flags.get());
  cmd->callback([flags, exit_code] {
    launcher::LocalLaunchOptions options = flags->options;
    if (options.exec) {
      if (!flags->first.empty()) options.args.insert(options.args.begin(), flags->first);
    } else {
      options.config_path = flags->first;
    }
    *exit_code = launcher::run_local_launch(options);
  });
}

}  // namespace dstrain::app
