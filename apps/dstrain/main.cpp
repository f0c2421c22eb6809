// dstrain: the launcher and the rank worker in one binary. main() only builds the command tree,
// runs it, and maps errors to exit codes: 0 success, 2 bad input (flags, config, files), 1 other
// failures.

#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "apps/dstrain/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"dstrain: distributed training for Hugging Face decoder LLMs", "dstrain"};
  app.require_subcommand(1);
  app.fallthrough(false);
  app.set_help_all_flag("--help-all", "Print help for every subcommand");
  int exit_code = 0;
  dstrain::app::set_launch_command(app, &exit_code);
  dstrain::app::set_train_command(app, &exit_code);
  dstrain::app::set_resume_command(app, &exit_code);
  dstrain::app::set_export_command(app, &exit_code);
  dstrain::app::set_estimate_command(app, &exit_code);
  dstrain::app::set_data_command(app, &exit_code);
  dstrain::app::set_debug_command(app, &exit_code);
  dstrain::app::set_version_command(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr,
                 "dstrain: error: %s\nRun 'dstrain --help' (or 'dstrain <command> --help').\n",
                 e.what());
    return 2;
  } catch (const dstrain::Error& e) {
    std::fprintf(stderr, "dstrain: %s: %s\n", dstrain::to_string(e.kind()), e.what());
    return dstrain::exit_code(e.kind());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dstrain: internal error: %s\n", e.what());
    return 70;
  }
  return exit_code;
}
