// `dstrain report RUN_DIR [-o FILE]`: flags → metrics/run_report.h. Runs in `dstrain` itself (no
// LibTorch).

#include <cstdio>
#include <memory>
#include <string>

#include "apps/dstrain/commands.h"
#include "metrics/run_report.h"

namespace dstrain::app {
namespace {

struct ReportArgs {
  std::string run_dir;
  std::string output;
};

}  // namespace

void set_report_command(CLI::App& root, int* exit_code) {
  auto* cmd = root.add_subcommand(
      "report", "Write a run's HTML report: config, world, final numbers and charts over steps");
  cmd->footer(
      "RUN_DIR is a run's logging.out_dir: metrics.jsonl is required, summary.json and\n"
      "config.yaml are shown when present. The page is one self-contained file (inline CSS and\n"
      "SVG, no script, nothing fetched). Every run also writes it at its end.\n"
      "Example:\n"
      "  dstrain report runs/tiny            # writes runs/tiny/report.html");
  auto a = std::make_shared<ReportArgs>();
  cmd->add_option("RUN_DIR", a->run_dir, "The run's output directory")->required()->type_name("");
  cmd->add_option("-o,--output", a->output, "Where to write [default: RUN_DIR/report.html]")
      ->type_name("FILE");
  cmd->callback([a, exit_code] {
    const metrics::ReportSources sources = metrics::report_sources(a->run_dir);
    const std::string out = a->output.empty() ? metrics::report_file(a->run_dir) : a->output;
    metrics::write_report(sources, out);
    std::printf("%s\n", out.c_str());
    *exit_code = 0;
  });
}

}  // namespace dstrain::app
