// dstrain-worker: every dstrain command, LibTorch included. `dstrain` execs it for the commands it
// does not run itself (command_info.h), and `dstrain launch` starts each rank of a training job as
// `dstrain-worker train CONFIG` directly. It answers the whole CLI (launch, report, trace and
// version too), so `dstrain --help-all`, which it serves, documents every command.

#include <CLI/CLI.hpp>

#include "apps/dstrain/commands.h"
#include "apps/dstrain/run_cli.h"

int main(int argc, char** argv) {
  CLI::App app;
  dstrain::app::configure_root(app);
  int exit_code = 0;
  dstrain::app::set_launch_command(app, &exit_code);
  dstrain::app::set_train_command(app, &exit_code);
  dstrain::app::set_resume_command(app, &exit_code);
  dstrain::app::set_export_command(app, &exit_code);
  dstrain::app::set_estimate_command(app, &exit_code);
  dstrain::app::set_download_command(app, &exit_code);
  dstrain::app::set_data_command(app, &exit_code);
  dstrain::app::set_ckpt_command(app, &exit_code);
  dstrain::app::set_debug_command(app, &exit_code);
  dstrain::app::set_report_command(app, &exit_code);
  dstrain::app::set_trace_command(app, &exit_code);
  dstrain::app::set_version_command(app, &exit_code);
  return dstrain::app::run_cli(app, argc, argv, exit_code);
}
