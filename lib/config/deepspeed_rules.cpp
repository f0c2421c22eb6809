// DeepSpeed's JSON keys and the setting each one lands on. A DeepSpeed config is accepted as it
// is: keys we implement map onto our Fields; real DeepSpeed keys for features dstrain does not have
// are accepted with a warning; anything else is an error (a typo should not be silently dropped).

#include <fmt/format.h>

#include "config/rules.h"
#include "config/text_util.h"

namespace dstrain::config::detail {
namespace {

// DeepSpeed optimizer names -> ours. DeepSpeed's "Adam" is AdamW unless adam_w_mode is false.
std::optional<YAML::Node> convert_optimizer_type(const YAML::Node& node, const Origin& origin) {
  const std::string name = node.IsScalar() ? lower(node.Scalar()) : "";
  if (name == "adamw" || name == "adam") return YAML::Node("adamw");
  if (name == "sgd") return YAML::Node("sgd");
  fail_at(origin, fmt::format("expected AdamW, Adam or SGD, got {}", describe(node)));
}

std::optional<YAML::Node> convert_scheduler_type(const YAML::Node& node, const Origin& origin) {
  const std::string name = node.IsScalar() ? lower(node.Scalar()) : "";
  for (const char* known : {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}) {
    if (name == lower(known)) return YAML::Node(known);
  }
  fail_at(origin, fmt::format("expected WarmupLR, WarmupDecayLR or WarmupCosineLR, got {}",
                              describe(node)));
}

// dstrain's AdamW always decouples weight decay; Adam with L2 regularisation is not available.
std::optional<YAML::Node> check_adam_w_mode(const YAML::Node& node, const Origin& origin) {
  if (node.IsScalar() && lower(node.Scalar()) == "true") return std::nullopt;
  fail_at(origin,
          fmt::format("expected true (dstrain implements Adam as AdamW), got {}", describe(node)));
}

KeyRule converted(
    const std::string& field_path,
    std::function<std::optional<YAML::Node>(const YAML::Node&, const Origin&)> convert) {
  KeyRule rule;
  rule.field = field_path.empty() ? nullptr : find_field(field_path);
  rule.convert = std::move(convert);
  return rule;
}

void add_batch_and_optimizer(RuleSet& r) {
  r.add_field("train_micro_batch_size_per_gpu", "training.per_device_train_batch_size");
  r.add_field("gradient_accumulation_steps", "training.gradient_accumulation_steps");
  r.add_field("train_batch_size", "training.train_batch_size");
  r.add_field("gradient_clipping", "training.gradient_clipping");
  r.add_field("steps_per_print", "training.log_interval");
  r.add_field("wall_clock_breakdown", "logging.wall_clock_breakdown");
  r.add_field("sequence_parallel_size", "parallel.sequence_parallel_size");
  // DeepSpeed's automatic tensor parallelism (AutoTP) degree.
  r.add_field("tensor_parallel.autotp_size", "parallel.tensor_parallel_size");
  r.add("optimizer.type", converted("training.optimizer", convert_optimizer_type));
  r.add_field("optimizer.params.lr", "training.lr");
  r.add_field("optimizer.params.betas", "training.betas");
  r.add_field("optimizer.params.eps", "training.eps");
  r.add_field("optimizer.params.weight_decay", "training.weight_decay");
  r.add_field("optimizer.params.momentum", "training.momentum");
  r.add("optimizer.params.adam_w_mode", converted("", check_adam_w_mode));
  for (const char* key : {"torch_adam", "fused", "bias_correction", "amsgrad", "nesterov",
                          "dampening", "cuda_aware", "comm_backend_name", "freeze_step"}) {
    r.add_ignored(std::string("optimizer.params.") + key);
  }
}

void add_scheduler(RuleSet& r) {
  r.add("scheduler.type", converted("training.lr_scheduler", convert_scheduler_type));
  const std::string p = "scheduler.params.";
  r.add_field(p + "warmup_min_lr", "training.warmup_min_lr");
  r.add_field(p + "warmup_max_lr", "training.warmup_max_lr");
  r.add_field(p + "warmup_num_steps", "training.warmup_steps");
  r.add_field(p + "warmup_type", "training.warmup_type");
  r.add_field(p + "total_num_steps", "training.total_num_steps");
  r.add_field(p + "warmup_min_ratio", "training.warmup_min_ratio");
  r.add_field(p + "cos_min_ratio", "training.cos_min_ratio");
  // Spelling found in circulating configs; DeepSpeed's own name is cos_min_ratio.
  r.add_field(p + "cosine_min_ratio", "training.cos_min_ratio");
  r.add_ignored(p + "last_batch_iteration");
}

void add_precision(RuleSet& r) {
  for (const char* section : {"bf16", "bfloat16"}) {
    const std::string s = section;
    r.add_field(s + ".enabled", "training.bf16");
    r.add_ignored(s + ".immediate_grad_update");
    r.add_ignored(s + ".check_grad_overflow");
  }
  r.add_field("fp16.enabled", "training.fp16");
  r.add_field("fp16.loss_scale", "training.fp16_loss_scale");
  r.add_field("fp16.initial_scale_power", "training.fp16_initial_scale_power");
  r.add_field("fp16.loss_scale_window", "training.fp16_loss_scale_window");
  r.add_field("fp16.hysteresis", "training.fp16_hysteresis");
  r.add_field("fp16.min_loss_scale", "training.fp16_min_loss_scale");
  r.add_ignored("fp16.auto_cast");
  r.add_ignored("fp16.consecutive_hysteresis");
  r.add_ignored("fp16.fp16_master_weights_and_grads");
}

// DeepSpeed's activation_checkpointing section tunes deepspeed.checkpointing, which a model calls
// itself; with HF models the switch is TrainingArguments.gradient_checkpointing, not this section.
// dstrain likewise recomputes every decoder layer when model.gradient_checkpointing is true and
// keeps the saved layer inputs whole, on the compute device or (`offload`, DeepSpeed's
// cpu_checkpointing) in host memory, so these keys are accepted and noted.
void add_activation_checkpointing(RuleSet& r) {
  const std::string note =
      "activation checkpointing is switched by model.gradient_checkpointing (alias "
      "training.gradient_checkpointing), which recomputes every decoder layer in backward; saved "
      "layer inputs are kept whole, not partitioned; to keep them in host memory (DeepSpeed's "
      "cpu_checkpointing) write model.gradient_checkpointing: offload";
  for (const char* key :
       {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
        "number_checkpoints", "synchronize_checkpoint_boundary", "profile"}) {
    r.add_ignored(std::string("activation_checkpointing.") + key, note);
  }
}

// DeepSpeed's pipeline section: the stage count (PipelineModule's num_stages, which DeepSpeed's
// launcher scripts also write here); the rest tunes DeepSpeed's own pipeline engine.
void add_pipeline(RuleSet& r) {
  r.add_field("pipeline.stages", "parallel.pipeline_parallel_size");
  r.add_ignored("pipeline.partition",
                "stages are balanced by each layer's estimated cost; parallel.pipeline_split "
                "sets the layers of each stage by hand");
  r.add_ignored("pipeline.seed_layers");
  r.add_ignored("pipeline.activation_checkpoint_interval",
                "activation checkpointing is switched by model.gradient_checkpointing");
  for (const char* key : {"pipe_partitioned", "grad_partitioned", "use_reentrant"}) {
    r.add_ignored(std::string("pipeline.") + key,
                  "activations and their gradients cross between stages whole");
  }
}

// Whole DeepSpeed sections and switches for features dstrain does not have.
void add_ignored_top_level(RuleSet& r) {
  for (const char* key : {"flops_profiler",
                          "comms_logger",
                          "zero_allow_untested_optimizer",
                          "zero_force_ds_cpu_optimizer",
                          "tensorboard",
                          "wandb",
                          "csv_monitor",
                          "comet",
                          "aio",
                          "autotuning",
                          "elasticity",
                          "data_efficiency",
                          "curriculum_learning",
                          "compression_training",
                          "sparse_attention",
                          "amp",
                          "prescale_gradients",
                          "gradient_predivide_factor",
                          "sparse_gradients",
                          "dump_state",
                          "communication_data_type",
                          "seq_parallel_communication_data_type",
                          "disable_allgather",
                          "memory_breakdown",
                          "checkpoint",
                          "data_types",
                          "nebula",
                          "eigenvalue",
                          "progressive_layer_drop",
                          "dataloader_drop_last",
                          "hybrid_engine",
                          "compile",
                          "timers",
                          "graph_harvesting",
                          "use_data_before_expert_parallelism",
                          "quantize_training",
                          "weight_quantization",
                          "torch_autocast",
                          "use_node_local_storage"}) {
    r.add_ignored(key);
  }
}

RuleSet build_deepspeed_rules() {
  RuleSet rules;
  rules.deepspeed = true;
  add_batch_and_optimizer(rules);
  add_scheduler(rules);
  add_precision(rules);
  add_zero_rules(rules, "zero_optimization.");
  add_activation_checkpointing(rules);
  add_pipeline(rules);
  add_ignored_top_level(rules);
  return rules;
}

}  // namespace

const RuleSet& deepspeed_rules() {
  static const RuleSet rules = build_deepspeed_rules();
  return rules;
}

}  // namespace dstrain::config::detail
