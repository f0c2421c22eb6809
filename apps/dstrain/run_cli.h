#pragma once
// What both executables (`dstrain` and `dstrain-worker`, see command_info.h) share: the root of the
// command tree and the one place that maps errors to exit codes: 0 success, 2 bad input (flags,
// config, files), 1 other failures, 70 internal errors. Callbacks store their command's own exit
// code in `exit_code`.

#include <CLI/CLI.hpp>

namespace dstrain::app {

// Name, description and root flags of `dstrain`, the same in both executables.
void configure_root(CLI::App& app);

// Parses argv (running the chosen command's callback) and returns the process exit code.
int run_cli(CLI::App& app, int argc, char** argv, const int& exit_code);

}  // namespace dstrain::app
