#pragma once
// One function per subcommand registers it on the root app. Callbacks only translate flags into a
// library call and store the library's exit code in `*exit_code`; no logic lives in apps/.

#include <CLI/CLI.hpp>

namespace dstrain::app {

void set_launch_command(CLI::App& root, int* exit_code);
void set_train_command(CLI::App& root, int* exit_code);
void set_resume_command(CLI::App& root, int* exit_code);
void set_export_command(CLI::App& root, int* exit_code);
void set_estimate_command(CLI::App& root, int* exit_code);
void set_download_command(CLI::App& root, int* exit_code);
void set_data_command(CLI::App& root, int* exit_code);
void set_ckpt_command(CLI::App& root, int* exit_code);
void set_debug_command(CLI::App& root, int* exit_code);  // hidden: reference checks
// Run tools without LibTorch, run by `dstrain` itself: the HTML report and the trace merge.
void set_report_command(CLI::App& root, int* exit_code);
void set_trace_command(CLI::App& root, int* exit_code);
void set_version_command(CLI::App& root, int* exit_code);

}  // namespace dstrain::app
