#pragma once
// The resolved run configuration: one typed struct per YAML section, defaults filled in, validated.
//
// Sources, applied in this order (later wins, conflicts between the two DeepSpeed-style sources and
// our own sections are reported, see docs/config.md):
//   1. defaults below
//   2. the YAML file's own sections (model, data, training, lora, zero, logging, checkpoint)
//   3. DeepSpeed keys: a `deepspeed:` section, or `zero: {config: ds.json}` naming a DeepSpeed JSON
//   file
//   4. `--set key.path=value` overrides (values parsed as YAML)
// Every error is Error(kConfig) whose message starts "<file>:<line>:<col>: <key.path>: ".
//
// Components do not read this struct directly; lib/train maps it onto each component's own options.

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace dstrain::config {

struct ModelSection {
  std::string name_or_path;  // local dir with config.json, or a hub id (downloaded if not cached)
  std::string revision = "main";    // hub id only: branch, tag or commit
  std::string init = "pretrained";  // pretrained | random
  std::string dtype =
      "auto";             // auto | float32 | bfloat16 | float16 (storage dtype of loaded weights)
  std::string tokenizer;  // "" = same as name_or_path; "byte" = built-in byte tokenizer; or a dir
  bool use_flash_attn = false;  // accepted for compatibility; SDPA picks the kernel
  // Activation checkpointing of the decoder layers, the word as written (lower case): "false",
  // "true", "offload" (the checkpointed layers' inputs wait for backward in host memory,
  // model/activation_offload.h), "selective" (attention's output and softmax statistics are kept,
  // not recomputed, model/selective_attention.h) or "auto" (chosen when training starts, the
  // fastest setting whose predicted peak memory fits: train/run_plan.h). The run plan reads it as
  // model::Checkpointing (model/checkpointing.h).
  std::string gradient_checkpointing = "false";
  // Tiled MLP (model/tiled_mlp.h): kTiledMlpOff 0, kTiledMlpAuto -1, or tokens per tile.
  int64_t tiled_mlp = 0;
  // LM head and loss fused in token chunks, never holding the [tokens, vocab] logits
  // (model/fused_linear_cross_entropy.h); false: logits, then the loss.
  bool fused_loss = true;
  // Float32 logits per chunk of the fused loss, MiB (model/fused_linear_cross_entropy.h); -1
  // (auto): the device's default, 256 MiB on the CPU, 1 GiB on a GPU.
  int64_t fused_loss_chunk_mb = -1;
  // A Mixture-of-Experts model's router losses (model/moe.h): the load-balancing loss "auto"
  // (where config.json's output_router_logits is true), "true" or "false"; its weight (-1, auto:
  // config.json's router_aux_loss_coef); the router z-loss's weight (0: off).
  std::string router_aux_loss = "auto";
  double router_aux_loss_coef = -1;
  double router_z_loss_coef = 0;
  // The router's logits: "auto" in the activations' dtype (as transformers computes them), or
  // "float32" (Megatron-LM's --moe-router-dtype fp32: the bf16/fp16 input and weight cast up).
  std::string router_dtype = "auto";
};

struct DataSection {
  std::string train_path;
  std::string eval_path;
  std::string format = "auto";  // auto | text | jsonl | tokens | parquet | prompt_completion
  std::string text_field = "text";
  // format prompt_completion: the key or column of the prompt and of the completion.
  std::string prompt_field = "prompt";
  std::string completion_field = "completion";
  std::string document = "file";  // for text: one document per `file` or per `line`
  int64_t max_length = 1024;
  // How documents become samples of max_length tokens (data/samples.h, docs/data.md): "documents"
  // (whole documents packed into samples, each attending to itself), "stream" (documents and eos
  // as one stream cut into windows; `true` reads as this, its meaning before the word existed) or
  // "pad" (one document per sample, padded or truncated; `false` reads as this).
  std::string packing = "documents";
  // documents: a document longer than max_length is "split" into pieces or "truncate"d.
  std::string long_documents = "split";
  // Ids put before each document (tokenizer/document_prefix.h): "auto" (what the tokenizer's
  // post-processor puts, e.g. Llama's bos), "true" (the bos), "false". A config recorded before the
  // key existed (a checkpoint's config.yaml) reads as "false", its behaviour then.
  std::string add_bos = "auto";
  double eval_split = 0.0;  // fraction carved from train when eval_path is empty
  bool shuffle = true;
  bool drop_last = true;
  int num_workers = 1;  // accepted from seed configs; the loader uses one prefetch thread
  int num_workers_eval = 1;
  // Node-local directory into which `dstrain launch` copies the model and the tokenized dataset
  // cache on every node before the ranks start (launcher/stage_inputs.h); "" = no staging.
  std::string stage_dir;
};

struct OptimizerSection {
  std::string type = "adamw";  // adamw | sgd  (DeepSpeed "AdamW"/"Adam" map here)
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;  // sgd only
};

struct SchedulerSection {
  // constant | linear | cosine (warmup by ratio/steps, then decay over the run) |
  // WarmupLR | WarmupDecayLR | WarmupCosineLR (DeepSpeed semantics and parameter names)
  std::string type = "cosine";
  double warmup_ratio = 0.0;
  int64_t warmup_steps = -1;  // -1: derived from warmup_ratio
  double min_lr_ratio = 0.0;  // cosine/linear floor as a fraction of lr
  // DeepSpeed parameters (used by the Warmup* types); -1 means "auto"/unset.
  double warmup_min_lr = 0.0;
  double warmup_max_lr = -1.0;
  std::string warmup_type = "log";  // log | linear (WarmupLR/WarmupDecayLR)
  int64_t total_num_steps = -1;
  double warmup_min_ratio = 0.0;  // WarmupCosineLR
  double cos_min_ratio = 0.0001;  // WarmupCosineLR
};

struct TrainingSection {
  int64_t epochs = 1;
  int64_t max_steps = -1;  // > 0 overrides epochs
  int64_t per_device_train_batch_size = 1;
  // `per_device_train_batch_size: auto`: the trainer picks the micro-batch
  // (train/micro_batch_auto.h) among the divisors of the samples each rank takes per step, which
  // the loaded config holds as micro-batch 1 × gradient_accumulation_steps; it then sets both terms
  // to its choice and micro_batch_chosen. A config written out keeps `auto` with the samples per
  // rank as the accumulation (the global batch), the choice as a comment.
  bool micro_batch_auto = false;
  bool micro_batch_chosen = false;
  int64_t per_device_eval_batch_size = -1;  // -1: same as train
  int64_t gradient_accumulation_steps = 1;
  int64_t train_batch_size = -1;  // DeepSpeed's global batch; checked = micro * accum * world
  OptimizerSection optimizer;
  SchedulerSection scheduler;
  uint64_t seed = 42;
  bool bf16 = false;
  bool fp16 = false;
  double fp16_loss_scale = 0.0;  // 0 = dynamic loss scaling; > 0 = this static scale
  double fp16_initial_scale_power = 16;
  int64_t fp16_loss_scale_window = 1000;
  double fp16_min_loss_scale = 1.0;
  int64_t fp16_hysteresis = 2;
  double gradient_clipping = 0.0;  // 0 = off; max global L2 norm
  // What a step's loss is the mean of (docs/training.md, "Loss normalisation"): "tokens" (the
  // labelled tokens of the whole global batch) or "micro_steps" (each micro-batch's token mean,
  // averaged over the micro-steps and ranks). A config recorded before the key existed reads as
  // "micro_steps", its behaviour then.
  std::string loss_normalization = "tokens";
  int64_t eval_interval = 0;      // steps; 0 = only at each epoch end
  int64_t eval_max_batches = -1;  // -1 = whole eval set
  int64_t log_interval = 1;       // steps between metric lines
  // CUDA graphs per layer (train/graphs_choice.h): auto | on | off.
  std::string cuda_graphs = "auto";
};

struct LoraSection {
  bool enabled = false;  // true when the file has a `lora:` section (unless enabled: false)
  int64_t r = 8;
  double alpha = 16;
  double dropout = 0.0;
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};
  std::vector<std::string> target_parameters;  // expert stacks (PEFT's target_parameters)
  std::vector<std::string> modules_to_save;    // routers trained whole (PEFT's modules_to_save)
  std::string bias = "none";
  bool use_rslora = false;
  std::string init = "default";  // default (A random as PEFT, B zero) | gaussian
  std::string init_from;         // a PEFT adapter dir to continue from
};

struct OffloadSection {
  std::string device = "none";  // none | cpu
  bool pin_memory = false;
};

struct ZeroSection {
  int stage = 0;
  OffloadSection offload_optimizer;
  OffloadSection offload_param;
  bool overlap_comm = true;
  bool contiguous_gradients = true;
  int64_t reduce_bucket_size = 50'000'000;     // elements
  int64_t allgather_bucket_size = 50'000'000;  // elements
  int64_t stage3_prefetch_bucket_size = 50'000'000;
  int64_t stage3_param_persistence_threshold = 100'000;
  int64_t stage3_max_live_parameters = 1'000'000'000;
  int64_t stage3_max_reuse_distance = 1'000'000'000;
  bool stage3_gather_16bit_weights_on_model_save = false;
  std::string config;  // path of a DeepSpeed JSON file whose keys were merged in ("" if none)
};

// How the ranks divide the work beyond data parallelism (docs/training.md, "Sequence
// parallelism", "Tensor parallelism"): world = data-parallel degree × sequence_parallel_size ×
// tensor_parallel_size, tensor parallelism innermost (train/tensor_parallel.h).
struct ParallelSection {
  int64_t sequence_parallel_size = 1;  // P: ranks sharing each sequence (DeepSpeed-Ulysses)
  int64_t tensor_parallel_size = 1;    // T: ranks sharing each layer (Megatron-LM)
  // Megatron's sequence parallelism inside tensor parallelism: norms and residuals on the token
  // rows split over the T ranks.
  bool tensor_sequence_parallel = true;
  // A tensor-parallel group's ranks may be on different nodes (the launchers refuse that
  // otherwise: its collectives run at every layer).
  bool tensor_parallel_across_nodes = false;
  // Pipeline parallelism (train/pipeline.h): the layers cut into this many stages, each on its
  // own ranks (the outermost split of the world).
  int64_t pipeline_parallel_size = 1;
  std::string pipeline_schedule = "1f1b";  // 1f1b | interleaved_1f1b | gpipe
  int64_t pipeline_virtual_stages = 1;     // stages per rank (> 1: interleaved 1F1B)
  // Decoder layers per (virtual) stage in order, the embedding on the first and the head on the
  // last; empty: balanced by the blocks' estimated cost.
  std::vector<std::string> pipeline_split;
  // Expert parallelism (train/expert_parallel.h): each MoE layer's experts spread over this many
  // ranks of a stage (its second factorisation, layout/parallel_layout.h), tokens sent to them.
  int64_t expert_parallel_size = 1;
  // The ranks each stage's copy of the model is split over (sequence x tensor x data parallel).
  int64_t ranks_per_stage(int64_t world) const { return world / pipeline_parallel_size; }
  // The data-parallel degree of `world` ranks.
  int64_t data_parallel(int64_t world) const {
    return world / (sequence_parallel_size * tensor_parallel_size * pipeline_parallel_size);
  }
};

// MLflow tracking (docs/training.md): on when a tracking URI is given here or in the environment.
struct MlflowSection {
  std::string tracking_uri;   // "" = MLFLOW_TRACKING_URI; both empty = MLflow off
  std::string parent_run_id;  // "" = MLFLOW_PARENT_RUN_ID; set = a nested run under that run
};

struct LoggingSection {
  std::string out_dir = "runs/default";
  std::string metrics_path;  // "" = <out_dir>/metrics.jsonl
  bool progress = true;      // live progress line when stdout is a terminal
  bool wall_clock_breakdown = false;
  bool trace = false;             // Chrome/Perfetto trace per rank under <out_dir>/trace
  int64_t profile_steps = 0;      // PyTorch profiler over this many steps: <out_dir>/profile
  bool tensorboard = true;        // TensorBoard event files (rank 0)
  std::string tensorboard_dir;    // "" = <out_dir>/tb
  std::string mlflow_experiment;  // "" = MLFLOW_EXPERIMENT_NAME, else MLflow's default experiment
  MlflowSection mlflow;
};

struct CheckpointSection {
  std::string dir = "checkpoints";
  int64_t interval = 0;   // steps; 0 = only at the end
  int64_t keep_last = 0;  // 0 = keep all
  bool save_final = true;
  bool async = true;                 // write on a background thread while training continues
  std::string on_error = "stop";     // a failed save: "stop" the run or "continue" (warn)
  int64_t max_writers_per_node = 0;  // ranks of a node writing at once; 0 = all
};

struct Config {
  ModelSection model;
  DataSection data;
  TrainingSection training;
  LoraSection lora;
  ZeroSection zero;
  ParallelSection parallel;
  LoggingSection logging;
  CheckpointSection checkpoint;
  std::string source_path;  // the YAML file this came from ("" if built in code)
};

struct LoadOptions {
  std::vector<std::string> overrides;  // "key.path=value" strings from --set, in order
  // The ranks of the job: train_batch_size is checked against world / sequence_parallel_size, and
  // the world must be divisible by sequence_parallel_size.
  int world_size = 1;
  // Non-fatal notices (e.g. a DeepSpeed key dstrain ignores) are logged with log::warn, hints
  // (a DeepSpeed micro-batch of 1 that `auto` could raise) with log::info; when this is set they
  // are also appended here, one line each.
  std::vector<std::string>* warnings = nullptr;
};

// Equality of settings. Provenance (Config::source_path, ZeroSection::config) is not compared, so a
// config equals the one loaded back from its to_yaml() output.
bool operator==(const ModelSection& a, const ModelSection& b);
bool operator==(const DataSection& a, const DataSection& b);
bool operator==(const OptimizerSection& a, const OptimizerSection& b);
bool operator==(const SchedulerSection& a, const SchedulerSection& b);
bool operator==(const TrainingSection& a, const TrainingSection& b);
bool operator==(const LoraSection& a, const LoraSection& b);
bool operator==(const OffloadSection& a, const OffloadSection& b);
bool operator==(const ZeroSection& a, const ZeroSection& b);
bool operator==(const ParallelSection& a, const ParallelSection& b);
bool operator==(const MlflowSection& a, const MlflowSection& b);
bool operator==(const LoggingSection& a, const LoggingSection& b);
bool operator==(const CheckpointSection& a, const CheckpointSection& b);
bool operator==(const Config& a, const Config& b);
inline bool operator!=(const Config& a, const Config& b) {
  return !(a == b);
}

// One setting of a resolved config, for experiment trackers (MLflow params, TensorBoard hparams):
// the key path and the value as to_yaml writes it, strings without quotes ("adamw", "2e-05",
// "auto", "[q_proj, v_proj]"), and typed: numbers as double, lists and "auto" as text.
struct FlatSetting {
  std::string key;
  std::string text;
  std::variant<bool, double, std::string> value;
};

// Every setting to_yaml writes, in its order.
std::vector<FlatSetting> flatten(const Config& config);

// Reads, merges, validates. Throws Error(kConfig); an unreadable file is kConfig too ("cannot
// read"), because the path came from the user.
Config load_config(const std::string& path, const LoadOptions& options = {});

// Same, from YAML text; `display_name` is used in error messages in place of a file name.
Config load_config_from_string(const std::string& yaml_text, const std::string& display_name,
                               const LoadOptions& options = {});

// The fully resolved config as YAML in our own key names (loadable again by load_config).
std::string to_yaml(const Config& config);

}  // namespace dstrain::config
