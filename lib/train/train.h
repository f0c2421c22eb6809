#pragma once
// Entry points of the rank worker and of the commands built on checkpoints. Each returns the
// process exit code or throws dstrain::Error; the CLI only fills the option structs.

#include <cstdint>
#include <string>
#include <vector>

#include "launcher/resume_plan.h"

namespace dstrain::train {

struct TrainOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set key.path=value, in order
  bool print_config = false;           // print the resolved config as YAML and exit
  std::string resume_from;             // a complete checkpoint tag directory, or ""
};

// `dstrain train`: one rank's whole lifetime, init → train → eval → save. World from the env
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; a single process when unset).
int run_train(const TrainOptions& options);

struct ResumeOptions {
  std::string checkpoint;           // <dir>/latest, <dir>, or a tag directory
  launcher::ResumeRequest request;  // how to launch; unset fields as the launch record says
};

// `dstrain resume`: relaunches the saved config with the state of the checkpoint, the way the job
// was launched (the launch record beside the checkpoint) unless the flags say otherwise
// (launcher/resume_plan.h). A different world size re-shards on load.
int run_resume(const ResumeOptions& options);

struct ExportOptions {
  std::string checkpoint;
  std::string out_dir;
  std::string dtype = "auto";  // auto (the run's compute dtype) | float32 | bfloat16 | float16
  // LoRA checkpoints (see docs/lora.md): exactly one of the two.
  bool adapter_only = false;  // a PEFT adapter directory (auto dtype: float32)
  bool merge_lora = false;    // the base model with B·A·scale added, in Hugging Face format
  uint64_t max_shard_bytes = 5'000'000'000;  // larger models: shards + index (HF's "5GB")
};

// `dstrain export`: consolidates a checkpoint into a Hugging Face model directory
// (config.json, model.safetensors or shards + index, tokenizer files when the run had them).
int run_export(const ExportOptions& options);

}  // namespace dstrain::train
