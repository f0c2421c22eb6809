// `dstrain trace merge RUN_DIR [-o FILE]`: flags → metrics/trace_files.h. Runs in `dstrain` itself
// (no LibTorch).

#include <cstdio>
#include <memory>
#include <string>

#include "apps/dstrain/commands.h"
#include "metrics/trace_files.h"

namespace dstrain::app {
namespace {

struct MergeArgs {
  std::string run_dir;
  std::string output;
};

void set_merge_command(CLI::App& trace, int* exit_code) {
  auto* cmd = trace.add_subcommand(
      "merge", "Merge the ranks' trace files of a run into one Chrome/Perfetto trace");
  cmd->footer(
      "Reads RUN_DIR/trace/rank-<K>.json (written by every rank of a run with logging.trace:\n"
      "true or --trace) and writes one trace, a process per rank on one time line. Rank 0 already\n"
      "does this at the end of a run when it can read every rank's file; merge by hand after\n"
      "copying the files of other hosts into RUN_DIR/trace. Open the result in\n"
      "https://ui.perfetto.dev or chrome://tracing.\n"
      "Example:\n"
      "  dstrain trace merge runs/tiny        # writes runs/tiny/trace/trace.json");
  auto a = std::make_shared<MergeArgs>();
  cmd->add_option("RUN_DIR", a->run_dir, "The run's output directory")->required()->type_name("");
  cmd->add_option("-o,--output", a->output, "Where to write [default: RUN_DIR/trace/trace.json]")
      ->type_name("FILE");
  cmd->callback([a, exit_code] {
    const std::string out = a->output.empty() ? metrics::merged_trace_file(a->run_dir) : a->output;
    const metrics::MergeResult r =
        metrics::merge_traces(metrics::find_rank_traces(a->run_dir), out);
    std::printf("%s: %d rank(s), %zu spans", r.path.c_str(), r.ranks, r.events);
    if (r.dropped > 0)
      std::printf(", %llu dropped (buffers full)", static_cast<unsigned long long>(r.dropped));
    std::printf("\n");
    *exit_code = 0;
  });
}

}  // namespace

void set_trace_command(CLI::App& root, int* exit_code) {
  auto* cmd = root.add_subcommand("trace", "Trace tools (logging.trace)");
  cmd->footer(
      "Example:\n"
      "  dstrain trace merge runs/tiny        # writes runs/tiny/trace/trace.json");
  cmd->require_subcommand(1);
  set_merge_command(*cmd, exit_code);
}

}  // namespace dstrain::app
