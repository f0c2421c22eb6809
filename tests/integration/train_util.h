#pragma once
// Helpers for end-to-end training tests: a small config on the built-in tiny model and corpus,
// running it through `dstrain launch`, and reading the metrics it wrote.

#include <map>
#include <string>
#include <vector>

#include "tests/integration/process_util.h"

namespace dstrain::testing {

struct JobSpec {
  int nproc = 1;
  int stage = 0;
  int micro = 2;
  int accum = 1;
  double clip = 0.0;
  int max_steps = 20;
  int max_length = 32;
  int checkpoint_interval = 0;
  bool save_final = false;
  std::vector<std::string> extra_overrides;
};

// Writes <dir>/run.yaml for `spec` (absolute paths to the repository's tiny model and corpus;
// logging.out_dir = <dir>/run, checkpoint.dir = <dir>/ckpt) and returns its path.
std::string write_job_config(const std::string& dir, const JobSpec& spec);

// `dstrain launch --nproc N <config> --set ...`, bounded by `timeout_s`.
RunResult launch_job(const std::string& config, int nproc,
                     const std::vector<std::string>& overrides = {}, double timeout_s = 120);

// step → value of `key` from every line of a metrics.jsonl that has it.
std::map<long, double> read_metric(const std::string& metrics_path, const std::string& key);

}  // namespace dstrain::testing
