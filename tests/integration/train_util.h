#pragma once
// Helpers for end-to-end training tests: a small config on the built-in tiny model and corpus,
// running it through `dstrain launch`, and reading the metrics it wrote.

#include <functional>
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

// Two ranks at ZeRO stage 2 with gradient accumulation and clipping, 20 steps, a checkpoint every
// 10: the run the bit-identical resume tests repeat from step 10.
JobSpec resumable_job();

// Every step of `resumed` comes after `from` and has exactly the loss `full` logged at that step.
void expect_same_losses_after(long from, const std::map<long, double>& resumed,
                              const std::map<long, double>& full);

// Writes <dir>/run.yaml for `spec` (absolute paths to the repository's tiny model and corpus;
// logging.out_dir = <dir>/run, checkpoint.dir = <dir>/ckpt) and returns its path.
std::string write_job_config(const std::string& dir, const JobSpec& spec);

// `dstrain launch --nproc N <config> --set ...`, bounded by `timeout_s`.
RunResult launch_job(const std::string& config, int nproc,
                     const std::vector<std::string>& overrides = {}, double timeout_s = 300);

// write_job_config(dir.path(), spec) + launch_job on spec.nproc ranks with spec.extra_overrides,
// then `overrides`.
RunResult run_job(const TempDir& dir, const JobSpec& spec,
                  const std::vector<std::string>& overrides = {}, double timeout_s = 300);

// The text of `cat > NAME <<'EOF'` ... `EOF` in docs/quickstart-gpu.md ("" when the page has none).
std::string quick_start_block(const std::string& name);

// The GPU quick start's data as the tests run it: <dir>/data/train.txt, the first 520 lines of the
// tiny corpus (about 5 steps of the page's config on 4 ranks) in place of the page's download.
void write_quick_start_data(const std::string& dir);

// step → value of `key` from every line of a metrics.jsonl that has it.
std::map<long, double> read_metric(const std::string& metrics_path, const std::string& key);

// The curves of one run, for comparing a parallel layout against one rank. The gradient norm is
// compared too: AdamW's update hardly changes when every gradient is scaled alike, so equal
// losses alone would not show a gradient off by a constant factor.
struct Curves {
  std::map<long, double> train, grad_norm, eval;
};

// `steps` steps of the tiny model on `nproc` ranks at ZeRO `stage` with accumulation `accum`,
// clipping at 1.0, stage 3 sharding the small parameters too, then `extra` overrides; `inspect`
// sees the run's directory before it goes. Expects exit 0.
Curves run_curves(int nproc, int stage, int accum, const std::vector<std::string>& extra,
                  const std::function<void(const TempDir&)>& inspect = {}, int steps = 6);

// Every step of `want` in `got` within `tol` relative, and no other step.
void expect_same_curve(const std::map<long, double>& got, const std::map<long, double>& want,
                       double tol, const std::string& what);

}  // namespace dstrain::testing
