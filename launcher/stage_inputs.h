#pragma once
// Node-local staging of a run's inputs (`dstrain launch --stage-dir DIR`, or data.stage_dir in the
// config). Before a node's ranks start, the process that starts them — the local launcher, or the
// node agent of a multi-node job, once per node — copies into DIR (stage_store.h) what the ranks
// would otherwise read from shared storage:
//  - the model: model.name_or_path when it is a directory, or the snapshot of a hub id that is
//    already in the Hugging Face cache (nothing is downloaded here: a hub id not cached yet is
//    left to the ranks, which resolve it as without staging, and a note says so). Its files are
//    those the ranks read (hub/model_files.h): config.json, the tokenizer files, and the
//    safetensors weights when model.init is pretrained.
//  - the tokenized dataset cache: the entries of the shared token cache (data/token_cache.h) made
//    from data.train_path or data.eval_path. When there is none yet, the ranks tokenize into the
//    shared cache as without staging (a note says so), and the next launch stages the result.
//
// The ranks learn of the copies from their environment (the config is not changed, so checkpoints
// still name the model as the config does, and every output still goes where the config says):
//   DSTRAIN_STAGED_MODEL_DIR     the node-local model directory
//   DSTRAIN_STAGED_MODEL_SOURCE  model_source_label() of the model it copies; a rank whose config
//                                names another model ignores the copy
//   DSTRAIN_STAGED_DATA_CACHE    node-local token cache entries, looked up before the shared cache
// Both readers below are what the rank (lib/train) calls; resume and eval go through them too.

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "launcher/plan.h"

namespace dstrain::launcher {

constexpr const char* kStagedModelDirEnv = "DSTRAIN_STAGED_MODEL_DIR";
constexpr const char* kStagedModelSourceEnv = "DSTRAIN_STAGED_MODEL_SOURCE";
constexpr const char* kStagedDataCacheEnv = "DSTRAIN_STAGED_DATA_CACHE";

struct StageReport {
  int copied_files = 0;
  int64_t copied_bytes = 0;
  int reused_files = 0;  // already in the stage directory: nothing copied
  int64_t reused_bytes = 0;
  double seconds = 0;
  std::string model_dir;           // the node-local model, "" when not staged
  std::string data_cache_dir;      // the node-local token cache entries, "" when none
  std::vector<std::string> notes;  // what was not staged, and why
  EnvList env;                     // the variables above, for every rank of the node
};

// Stages `config`'s inputs into `stage_dir` (see above), holding the store's lock throughout.
// Error(kInput) naming the path for a stage directory that cannot be created or written (disk
// full included) and for a source that cannot be read; nothing is left under a final name then.
StageReport stage_inputs(const config::Config& config, const std::string& stage_dir);

// `stage: node H: copied 3 files (1.2 GiB), reused 5 (4.0 GiB) in 2.1 s into DIR` and a line per
// note, each ending in a newline.
std::string format_stage_report(const StageReport& report, const std::string& host,
                                const std::string& stage_dir);

// The stage directory of a launch: `flag` (--stage-dir) when given, else data.stage_dir; "" =
// no staging.
std::string stage_dir_of(const std::string& flag, const config::Config& config);

// "<name_or_path>@<revision>": which model a staged copy is of.
std::string model_source_label(const config::ModelSection& model);

// Where the ranks cache tokenized datasets on shared storage: <logging.out_dir>/data_cache.
std::string shared_token_cache_dir(const config::Config& config);

// Rank side: the staged copy of `model` on this node, or "" (no copy, or a copy of another model).
std::string staged_model_dir(const config::ModelSection& model);

// Rank side: this node's staged token cache entries, or "".
std::string staged_data_cache_dir();

}  // namespace dstrain::launcher
