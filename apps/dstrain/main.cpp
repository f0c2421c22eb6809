// dstrain: the command users type. It links no LibTorch and runs `launch` (the local and SSH
// launchers and the node agent), `report`, `trace` and `version` itself; every other command is
// handed, arguments untouched, to dstrain-worker beside it (command_info.h says why). main() only
// builds the command tree and runs it; run_cli.h maps errors to exit codes.

#include <CLI/CLI.hpp>

#include "apps/dstrain/command_info.h"
#include "apps/dstrain/commands.h"
#include "apps/dstrain/run_cli.h"

int main(int argc, char** argv) {
  if (argc > 1 && dstrain::app::runs_in_worker(argv[1])) return dstrain::app::exec_worker(argv);
  CLI::App app;
  dstrain::app::configure_root(app);
  int exit_code = 0;
  dstrain::app::set_launch_command(app, &exit_code);
  dstrain::app::set_worker_commands(app, argv, &exit_code);
  dstrain::app::set_report_command(app, &exit_code);
  dstrain::app::set_trace_command(app, &exit_code);
  dstrain::app::set_version_command(app, &exit_code);
  return dstrain::app::run_cli(app, argc, argv, exit_code);
}
