#include "apps/dstrain/run_cli.h"

#include <cstdio>
#include <exception>

#include "core/error.h"
#include "core/secrets.h"

extern char** environ;

namespace dstrain::app {

void configure_root(CLI::App& app) {
  app.name("dstrain");
  app.description("dstrain: distributed training for Hugging Face decoder LLMs");
  app.require_subcommand(1);
  app.fallthrough(false);
  app.set_help_all_flag("--help-all", "Print help for every subcommand");
  app.footer(
      "Example (from the repository root: the built-in tiny model, 2 local CPU ranks, ~1 min):\n"
      "  dstrain launch --nproc 2 configs/tiny.yaml\n"
      "'dstrain <command> --help' shows a command's options and an example; README.md and docs/\n"
      "have the rest.");
}

int run_cli(CLI::App& app, int argc, char** argv, const int& exit_code) {
  // Before anything can print: the values of secret variables are redacted from all output.
  secrets::learn_environment(environ);
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
                 secrets::redact(e.what()).c_str());
    return 2;
  } catch (const dstrain::Error& e) {
    std::fprintf(stderr, "dstrain: %s: %s\n", dstrain::to_string(e.kind()),
                 secrets::redact(e.what()).c_str());
    return dstrain::exit_code(e.kind());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dstrain: internal error: %s\n", secrets::redact(e.what()).c_str());
    return 70;
  }
  return exit_code;
}

}  // namespace dstrain::app
