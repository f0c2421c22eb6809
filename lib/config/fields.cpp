// The table of every setting in our YAML. Canonical key names follow the configs people already
// have (HF Trainer style, flat under `training:`); the nested structs of config.h are where the
// values land. A field's position here is its position in to_yaml's output.

#include <algorithm>

#include "config/schema.h"
#include "config/text_util.h"

namespace dstrain::config::detail {
namespace {

// Accessor for a member of Config; a generic lambda so the same expression serves the const getter
// and the mutable setter.
#define DSTRAIN_MEMBER(expr) \
  [](auto& c) -> auto& {     \
    return c.expr;           \
  }

Field make(std::string path, Kind kind, Range range = Range::kAny,
           std::vector<std::string> choices = {}) {
  Field f;
  f.path = std::move(path);
  f.kind = kind;
  f.range = range;
  f.choices = std::move(choices);
  return f;
}

template <typename Ref>
Field boolean(std::string path, Ref ref) {
  Field f = make(std::move(path), Kind::kBool);
  f.get = [ref](const Config& c) { return Value(static_cast<bool>(ref(c))); };
  f.set = [ref](Config& c, const Value& v) { ref(c) = std::get<bool>(v); };
  return f;
}

template <typename Ref>
Field integer(std::string path, Range range, Ref ref) {
  Field f = make(std::move(path), Kind::kInt, range);
  f.get = [ref](const Config& c) { return Value(static_cast<int64_t>(ref(c))); };
  f.set = [ref](Config& c, const Value& v) {
    using T = std::decay_t<decltype(ref(c))>;
    ref(c) = static_cast<T>(std::get<int64_t>(v));
  };
  return f;
}

template <typename Ref>
Field number(std::string path, Range range, Ref ref) {
  Field f = make(std::move(path), Kind::kNumber, range);
  f.get = [ref](const Config& c) { return Value(static_cast<double>(ref(c))); };
  f.set = [ref](Config& c, const Value& v) { ref(c) = std::get<double>(v); };
  return f;
}

template <typename Ref>
Field text(std::string path, Ref ref, std::vector<std::string> choices = {}) {
  Field f = make(std::move(path), Kind::kString, Range::kAny, std::move(choices));
  f.get = [ref](const Config& c) { return Value(ref(c)); };
  f.set = [ref](Config& c, const Value& v) { ref(c) = std::get<std::string>(v); };
  return f;
}

// `range`: kPositive, a non-empty list; kNonNegative, the empty list (or null) too.
template <typename Ref>
Field text_list(std::string path, Ref ref, Range range = Range::kPositive) {
  Field f = make(std::move(path), Kind::kStringList, range);
  f.get = [ref](const Config& c) { return Value(ref(c)); };
  f.set = [ref](Config& c, const Value& v) { ref(c) = std::get<std::vector<std::string>>(v); };
  return f;
}

Field betas() {
  Field f = make("training.betas", Kind::kBetas, Range::kFractionOpen);
  f.get = [](const Config& c) {
    const auto& o = c.training.optimizer;
    return Value(std::vector<double>{o.beta1, o.beta2});
  };
  f.set = [](Config& c, const Value& v) {
    const auto& b = std::get<std::vector<double>>(v);
    c.training.optimizer.beta1 = b[0];
    c.training.optimizer.beta2 = b[1];
  };
  return f;
}

// model.gradient_checkpointing: true | false | offload | selective | auto. The Value is a bool, or
// the string "offload", "selective" or "auto" (chosen at the start of training), so configs
// written before those existed read and write as they did. A config records "auto" as written,
// not the choice: a resumed run chooses again for the memory it finds.
Field gradient_checkpointing() {
  Field f = make("model.gradient_checkpointing", Kind::kBool);
  f.expected = "true, false, offload, selective or auto";
  f.parse = [](const YAML::Node& node) -> std::optional<Value> {
    if (auto b = scalar_bool(node)) return Value(*b);
    if (!node.IsScalar()) return std::nullopt;
    const std::string word = lower(node.Scalar());
    if (word == "offload" || word == "selective" || word == "auto") return Value(word);
    return std::nullopt;
  };
  f.get = [](const Config& c) {
    const std::string& w = c.model.gradient_checkpointing;
    return w == "true" || w == "false" ? Value(w == "true") : Value(w);
  };
  f.set = [](Config& c, const Value& v) {
    const auto* word = std::get_if<std::string>(&v);
    c.model.gradient_checkpointing = word ? *word : (std::get<bool>(v) ? "true" : "false");
  };
  return f;
}

// model.tiled_mlp: off | auto | tokens per tile (> 0). The Value is the word, or the number.
Field tiled_mlp() {
  Field f = make("model.tiled_mlp", Kind::kString);
  f.expected = "off, auto or a positive number of tokens per tile";
  f.parse = [](const YAML::Node& node) -> std::optional<Value> {
    if (!node.IsScalar()) return std::nullopt;
    const std::string word = lower(node.Scalar());
    if (word == "off" || word == "false") return Value(std::string("off"));
    if (word == "auto") return Value(std::string("auto"));
    if (auto n = scalar_integer(node); n && *n > 0) return Value(*n);
    return std::nullopt;
  };
  f.get = [](const Config& c) {
    if (c.model.tiled_mlp == 0) return Value(std::string("off"));
    if (c.model.tiled_mlp < 0) return Value(std::string("auto"));
    return Value(c.model.tiled_mlp);
  };
  f.set = [](Config& c, const Value& v) {
    if (const auto* n = std::get_if<int64_t>(&v)) {
      c.model.tiled_mlp = *n;
    } else {
      c.model.tiled_mlp = std::get<std::string>(v) == "auto" ? -1 : 0;
    }
  };
  return f;
}

// training.per_device_train_batch_size: a positive number, or auto (config.h, micro_batch_auto).
// With auto the config holds micro-batch 1 and the samples per rank as the accumulation, which is
// what to_yaml writes (gradient_accumulation_steps' getter), so that a record reloads with the
// same global batch whatever the trainer chose; the choice is written as a comment.
Field per_device_train_batch_size() {
  Field f = make("training.per_device_train_batch_size", Kind::kInt, Range::kPositive);
  f.expected = "a positive integer or auto";
  f.parse = [](const YAML::Node& node) -> std::optional<Value> {
    if (node.IsScalar() && lower(node.Scalar()) == "auto") return Value(std::string("auto"));
    if (auto n = scalar_integer(node); n && *n > 0) return Value(*n);
    return std::nullopt;
  };
  f.get = [](const Config& c) {
    if (c.training.micro_batch_auto) return Value(std::string("auto"));
    return Value(c.training.per_device_train_batch_size);
  };
  f.set = [](Config& c, const Value& v) {
    const auto* n = std::get_if<int64_t>(&v);
    c.training.micro_batch_auto = n == nullptr;
    c.training.per_device_train_batch_size = n == nullptr ? 1 : *n;
  };
  f.comment = [](const Config& c) {
    const TrainingSection& t = c.training;
    if (!t.micro_batch_auto || !t.micro_batch_chosen) return std::string();
    return "chosen: micro-batch " + std::to_string(t.per_device_train_batch_size) +
           " x accumulation " + std::to_string(t.gradient_accumulation_steps);
  };
  return f;
}

// training.gradient_accumulation_steps; with per_device_train_batch_size: auto it reads as the
// samples per rank of a step (micro-batch 1's accumulation), whatever micro-batch was chosen.
Field gradient_accumulation_steps() {
  Field f = integer("training.gradient_accumulation_steps", Range::kPositive,
                    DSTRAIN_MEMBER(training.gradient_accumulation_steps));
  f.get = [](const Config& c) {
    const TrainingSection& t = c.training;
    const int64_t micro = t.micro_batch_auto ? t.per_device_train_batch_size : 1;
    return Value(micro * t.gradient_accumulation_steps);
  };
  return f;
}

// data.add_bos: auto | true | false, kept as that word (tokenizer/document_prefix.h reads it).
Field add_bos() {
  Field f = make("data.add_bos", Kind::kString, Range::kAny, {"auto", "true", "false"});
  f.expected = "auto, true or false";
  f.parse = [](const YAML::Node& node) -> std::optional<Value> {
    if (auto b = scalar_bool(node)) return Value(std::string(*b ? "true" : "false"));
    if (node.IsScalar() && lower(node.Scalar()) == "auto") return Value(std::string("auto"));
    return std::nullopt;
  };
  f.get = [](const Config& c) { return Value(c.data.add_bos); };
  f.set = [](Config& c, const Value& v) { c.data.add_bos = std::get<std::string>(v); };
  return f;
}

// data.packing: documents | stream | pad, kept as that word; `true` and `false`, its values before
// the words existed, read as stream and pad (what they meant then).
Field packing() {
  Field f = make("data.packing", Kind::kString, Range::kAny, {"documents", "stream", "pad"});
  f.expected = "documents, stream or pad (true: stream, false: pad)";
  f.parse = [](const YAML::Node& node) -> std::optional<Value> {
    if (auto b = scalar_bool(node)) return Value(std::string(*b ? "stream" : "pad"));
    if (!node.IsScalar()) return std::nullopt;
    const std::string word = lower(node.Scalar());
    if (word == "documents" || word == "stream" || word == "pad") return Value(word);
    return std::nullopt;
  };
  f.get = [](const Config& c) { return Value(c.data.packing); };
  f.set = [](Config& c, const Value& v) { c.data.packing = std::get<std::string>(v); };
  return f;
}

void add_model_and_data(std::vector<Field>& t) {
  t.push_back(text("model.name_or_path", DSTRAIN_MEMBER(model.name_or_path)));
  t.push_back(text("model.revision", DSTRAIN_MEMBER(model.revision)));
  t.push_back(text("model.init", DSTRAIN_MEMBER(model.init), {"pretrained", "random"}));
  t.push_back(
      text("model.dtype", DSTRAIN_MEMBER(model.dtype), {"auto", "float32", "bfloat16", "float16"}));
  t.push_back(text("model.tokenizer", DSTRAIN_MEMBER(model.tokenizer)));
  t.push_back(gradient_checkpointing());
  t.push_back(tiled_mlp());
  t.push_back(boolean("model.fused_loss", DSTRAIN_MEMBER(model.fused_loss)));
  t.push_back(integer("model.fused_loss_chunk_mb", Range::kPositiveOrUnset,
                      DSTRAIN_MEMBER(model.fused_loss_chunk_mb)));
  t.push_back(text("model.router_aux_loss", DSTRAIN_MEMBER(model.router_aux_loss),
                   {"auto", "true", "false"}));
  t.push_back(number("model.router_aux_loss_coef", Range::kNonNegativeOrUnset,
                     DSTRAIN_MEMBER(model.router_aux_loss_coef)));
  t.push_back(number("model.router_z_loss_coef", Range::kNonNegative,
                     DSTRAIN_MEMBER(model.router_z_loss_coef)));
  t.push_back(text("model.router_dtype", DSTRAIN_MEMBER(model.router_dtype), {"auto", "float32"}));
  t.push_back(text("data.train_path", DSTRAIN_MEMBER(data.train_path)));
  t.push_back(text("data.eval_path", DSTRAIN_MEMBER(data.eval_path)));
  t.push_back(text("data.format", DSTRAIN_MEMBER(data.format),
                   {"auto", "text", "jsonl", "tokens", "parquet", "prompt_completion"}));
  t.push_back(text("data.text_field", DSTRAIN_MEMBER(data.text_field)));
  t.push_back(text("data.prompt_field", DSTRAIN_MEMBER(data.prompt_field)));
  t.push_back(text("data.completion_field", DSTRAIN_MEMBER(data.completion_field)));
  t.push_back(text("data.document", DSTRAIN_MEMBER(data.document), {"file", "line"}));
  t.push_back(integer("data.max_length", Range::kPositive, DSTRAIN_MEMBER(data.max_length)));
  t.push_back(packing());
  t.push_back(
      text("data.long_documents", DSTRAIN_MEMBER(data.long_documents), {"split", "truncate"}));
  t.push_back(add_bos());
  t.push_back(number("data.eval_split", Range::kFractionOpen, DSTRAIN_MEMBER(data.eval_split)));
  t.push_back(boolean("data.shuffle", DSTRAIN_MEMBER(data.shuffle)));
  t.push_back(boolean("data.drop_last", DSTRAIN_MEMBER(data.drop_last)));
  t.push_back(text("data.stage_dir", DSTRAIN_MEMBER(data.stage_dir)));
}

void add_training_loop(std::vector<Field>& t) {
  t.push_back(integer("training.epochs", Range::kPositive, DSTRAIN_MEMBER(training.epochs)));
  t.push_back(
      integer("training.max_steps", Range::kPositiveOrUnset, DSTRAIN_MEMBER(training.max_steps)));
  t.push_back(per_device_train_batch_size());
  t.push_back(integer("training.per_device_eval_batch_size", Range::kPositiveOrUnset,
                      DSTRAIN_MEMBER(training.per_device_eval_batch_size)));
  t.push_back(gradient_accumulation_steps());
  t.push_back(integer("training.train_batch_size", Range::kPositiveOrUnset,
                      DSTRAIN_MEMBER(training.train_batch_size)));
  t.push_back(integer("training.seed", Range::kNonNegative, DSTRAIN_MEMBER(training.seed)));
  t.push_back(integer("training.eval_interval", Range::kNonNegative,
                      DSTRAIN_MEMBER(training.eval_interval)));
  t.push_back(integer("training.eval_max_batches", Range::kPositiveOrUnset,
                      DSTRAIN_MEMBER(training.eval_max_batches)));
  t.push_back(
      integer("training.log_interval", Range::kPositive, DSTRAIN_MEMBER(training.log_interval)));
  t.push_back(boolean("training.use_flash_attn", DSTRAIN_MEMBER(model.use_flash_attn)));
  t.push_back(
      text("training.cuda_graphs", DSTRAIN_MEMBER(training.cuda_graphs), {"auto", "on", "off"}));
  t.push_back(
      integer("training.num_workers", Range::kNonNegative, DSTRAIN_MEMBER(data.num_workers)));
  t.push_back(integer("training.num_workers_eval", Range::kNonNegative,
                      DSTRAIN_MEMBER(data.num_workers_eval)));
}

void add_training_optimizer(std::vector<Field>& t) {
  t.push_back(
      text("training.optimizer", DSTRAIN_MEMBER(training.optimizer.type), {"adamw", "sgd"}));
  t.push_back(number("training.lr", Range::kPositive, DSTRAIN_MEMBER(training.optimizer.lr)));
  t.push_back(betas());
  t.push_back(number("training.eps", Range::kPositive, DSTRAIN_MEMBER(training.optimizer.eps)));
  t.push_back(number("training.weight_decay", Range::kNonNegative,
                     DSTRAIN_MEMBER(training.optimizer.weight_decay)));
  t.push_back(number("training.momentum", Range::kNonNegative,
                     DSTRAIN_MEMBER(training.optimizer.momentum)));
  t.push_back(number("training.gradient_clipping", Range::kNonNegative,
                     DSTRAIN_MEMBER(training.gradient_clipping)));
  t.push_back(text("training.loss_normalization", DSTRAIN_MEMBER(training.loss_normalization),
                   {"tokens", "micro_steps"}));
}

void add_training_scheduler(std::vector<Field>& t) {
  t.push_back(text("training.lr_scheduler", DSTRAIN_MEMBER(training.scheduler.type),
                   {"constant", "constant_with_warmup", "linear", "cosine", "WarmupLR",
                    "WarmupDecayLR", "WarmupCosineLR"}));
  t.push_back(number("training.warmup_ratio", Range::kFractionOpen,
                     DSTRAIN_MEMBER(training.scheduler.warmup_ratio)));
  t.push_back(integer("training.warmup_steps", Range::kNonNegativeOrUnset,
                      DSTRAIN_MEMBER(training.scheduler.warmup_steps)));
  t.push_back(number("training.min_lr_ratio", Range::kFraction,
                     DSTRAIN_MEMBER(training.scheduler.min_lr_ratio)));
  t.push_back(number("training.warmup_min_lr", Range::kNonNegative,
                     DSTRAIN_MEMBER(training.scheduler.warmup_min_lr)));
  t.push_back(number("training.warmup_max_lr", Range::kPositiveOrUnset,
                     DSTRAIN_MEMBER(training.scheduler.warmup_max_lr)));
  t.push_back(text("training.warmup_type", DSTRAIN_MEMBER(training.scheduler.warmup_type),
                   {"log", "linear"}));
  t.push_back(integer("training.total_num_steps", Range::kPositiveOrUnset,
                      DSTRAIN_MEMBER(training.scheduler.total_num_steps)));
  t.push_back(number("training.warmup_min_ratio", Range::kFraction,
                     DSTRAIN_MEMBER(training.scheduler.warmup_min_ratio)));
  t.push_back(number("training.cos_min_ratio", Range::kFraction,
                     DSTRAIN_MEMBER(training.scheduler.cos_min_ratio)));
}

void add_training_precision(std::vector<Field>& t) {
  t.push_back(boolean("training.bf16", DSTRAIN_MEMBER(training.bf16)));
  t.push_back(boolean("training.fp16", DSTRAIN_MEMBER(training.fp16)));
  t.push_back(number("training.fp16_loss_scale", Range::kNonNegative,
                     DSTRAIN_MEMBER(training.fp16_loss_scale)));
  t.push_back(number("training.fp16_initial_scale_power", Range::kNonNegative,
                     DSTRAIN_MEMBER(training.fp16_initial_scale_power)));
  t.push_back(integer("training.fp16_loss_scale_window", Range::kPositive,
                      DSTRAIN_MEMBER(training.fp16_loss_scale_window)));
  t.push_back(integer("training.fp16_hysteresis", Range::kPositive,
                      DSTRAIN_MEMBER(training.fp16_hysteresis)));
  t.push_back(number("training.fp16_min_loss_scale", Range::kPositive,
                     DSTRAIN_MEMBER(training.fp16_min_loss_scale)));
}

void add_lora(std::vector<Field>& t) {
  t.push_back(boolean("lora.enabled", DSTRAIN_MEMBER(lora.enabled)));
  t.push_back(integer("lora.r", Range::kPositive, DSTRAIN_MEMBER(lora.r)));
  t.push_back(number("lora.alpha", Range::kPositive, DSTRAIN_MEMBER(lora.alpha)));
  t.push_back(number("lora.dropout", Range::kFractionOpen, DSTRAIN_MEMBER(lora.dropout)));
  // Empty only where target_parameters chooses the adapters (lora::LoraModel says so).
  t.push_back(
      text_list("lora.target_modules", DSTRAIN_MEMBER(lora.target_modules), Range::kNonNegative));
  t.push_back(text_list("lora.target_parameters", DSTRAIN_MEMBER(lora.target_parameters),
                        Range::kNonNegative));
  t.push_back(
      text_list("lora.modules_to_save", DSTRAIN_MEMBER(lora.modules_to_save), Range::kNonNegative));
  t.push_back(text("lora.bias", DSTRAIN_MEMBER(lora.bias), {"none", "all", "lora_only"}));
  t.push_back(boolean("lora.use_rslora", DSTRAIN_MEMBER(lora.use_rslora)));
  t.push_back(text("lora.init", DSTRAIN_MEMBER(lora.init), {"default", "gaussian"}));
  t.push_back(text("lora.init_from", DSTRAIN_MEMBER(lora.init_from)));
}

void add_zero(std::vector<Field>& t) {
  const std::vector<std::string> devices = {"none", "cpu"};
  t.push_back(integer("zero.stage", Range::kStage, DSTRAIN_MEMBER(zero.stage)));
  t.push_back(text("zero.offload_optimizer.device", DSTRAIN_MEMBER(zero.offload_optimizer.device),
                   devices));
  t.push_back(boolean("zero.offload_optimizer.pin_memory",
                      DSTRAIN_MEMBER(zero.offload_optimizer.pin_memory)));
  t.push_back(
      text("zero.offload_param.device", DSTRAIN_MEMBER(zero.offload_param.device), devices));
  t.push_back(
      boolean("zero.offload_param.pin_memory", DSTRAIN_MEMBER(zero.offload_param.pin_memory)));
  t.push_back(boolean("zero.overlap_comm", DSTRAIN_MEMBER(zero.overlap_comm)));
  t.push_back(boolean("zero.contiguous_gradients", DSTRAIN_MEMBER(zero.contiguous_gradients)));
  t.push_back(integer("zero.reduce_bucket_size", Range::kPositive,
                      DSTRAIN_MEMBER(zero.reduce_bucket_size)));
  t.push_back(integer("zero.allgather_bucket_size", Range::kPositive,
                      DSTRAIN_MEMBER(zero.allgather_bucket_size)));
  t.push_back(integer("zero.stage3_prefetch_bucket_size", Range::kNonNegative,
                      DSTRAIN_MEMBER(zero.stage3_prefetch_bucket_size)));
  t.push_back(integer("zero.stage3_param_persistence_threshold", Range::kNonNegative,
                      DSTRAIN_MEMBER(zero.stage3_param_persistence_threshold)));
  t.push_back(integer("zero.stage3_max_live_parameters", Range::kPositive,
                      DSTRAIN_MEMBER(zero.stage3_max_live_parameters)));
  t.push_back(integer("zero.stage3_max_reuse_distance", Range::kNonNegative,
                      DSTRAIN_MEMBER(zero.stage3_max_reuse_distance)));
  t.push_back(boolean("zero.stage3_gather_16bit_weights_on_model_save",
                      DSTRAIN_MEMBER(zero.stage3_gather_16bit_weights_on_model_save)));
}

void add_parallel(std::vector<Field>& t) {
  t.push_back(integer("parallel.sequence_parallel_size", Range::kPositive,
                      DSTRAIN_MEMBER(parallel.sequence_parallel_size)));
  t.push_back(integer("parallel.tensor_parallel_size", Range::kPositive,
                      DSTRAIN_MEMBER(parallel.tensor_parallel_size)));
  t.push_back(boolean("parallel.tensor_sequence_parallel",
                      DSTRAIN_MEMBER(parallel.tensor_sequence_parallel)));
  t.push_back(boolean("parallel.tensor_parallel_across_nodes",
                      DSTRAIN_MEMBER(parallel.tensor_parallel_across_nodes)));
  t.push_back(integer("parallel.pipeline_parallel_size", Range::kPositive,
                      DSTRAIN_MEMBER(parallel.pipeline_parallel_size)));
  t.push_back(integer("parallel.expert_parallel_size", Range::kPositive,
                      DSTRAIN_MEMBER(parallel.expert_parallel_size)));
  t.push_back(text("parallel.pipeline_schedule", DSTRAIN_MEMBER(parallel.pipeline_schedule),
                   {"1f1b", "interleaved_1f1b", "gpipe"}));
  t.push_back(integer("parallel.pipeline_virtual_stages", Range::kPositive,
                      DSTRAIN_MEMBER(parallel.pipeline_virtual_stages)));
  // Layer counts, kept as written; [] (the default) balances the stages.
  Field split = text_list("parallel.pipeline_split", DSTRAIN_MEMBER(parallel.pipeline_split));
  split.expected = "a list of layer counts of 1 or more, one per stage ([]: balanced stages)";
  split.parse = [](const YAML::Node& node) -> std::optional<Value> {
    if (!node.IsSequence()) return std::nullopt;
    std::vector<std::string> out;
    for (const auto& item : node) {
      if (!item.IsScalar()) return std::nullopt;
      const std::string& n = item.Scalar();
      if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos ||
          n.find_first_not_of('0') == std::string::npos) {
        return std::nullopt;
      }
      out.push_back(n);
    }
    return Value(out);
  };
  t.push_back(std::move(split));
}

void add_logging_and_checkpoint(std::vector<Field>& t) {
  t.push_back(text("logging.out_dir", DSTRAIN_MEMBER(logging.out_dir)));
  t.push_back(text("logging.metrics_path", DSTRAIN_MEMBER(logging.metrics_path)));
  t.push_back(boolean("logging.progress", DSTRAIN_MEMBER(logging.progress)));
  t.push_back(
      boolean("logging.wall_clock_breakdown", DSTRAIN_MEMBER(logging.wall_clock_breakdown)));
  t.push_back(boolean("logging.trace", DSTRAIN_MEMBER(logging.trace)));
  t.push_back(
      integer("logging.profile_steps", Range::kNonNegative, DSTRAIN_MEMBER(logging.profile_steps)));
  t.push_back(boolean("logging.tensorboard", DSTRAIN_MEMBER(logging.tensorboard)));
  t.push_back(text("logging.tensorboard_dir", DSTRAIN_MEMBER(logging.tensorboard_dir)));
  t.push_back(text("logging.mlflow_experiment", DSTRAIN_MEMBER(logging.mlflow_experiment)));
  t.push_back(text("logging.mlflow.tracking_uri", DSTRAIN_MEMBER(logging.mlflow.tracking_uri)));
  t.push_back(text("logging.mlflow.parent_run_id", DSTRAIN_MEMBER(logging.mlflow.parent_run_id)));
  t.push_back(text("checkpoint.dir", DSTRAIN_MEMBER(checkpoint.dir)));
  t.push_back(
      integer("checkpoint.interval", Range::kNonNegative, DSTRAIN_MEMBER(checkpoint.interval)));
  t.push_back(
      integer("checkpoint.keep_last", Range::kNonNegative, DSTRAIN_MEMBER(checkpoint.keep_last)));
  t.push_back(boolean("checkpoint.save_final", DSTRAIN_MEMBER(checkpoint.save_final)));
  t.push_back(boolean("checkpoint.async", DSTRAIN_MEMBER(checkpoint.async)));
  t.push_back(
      text("checkpoint.on_error", DSTRAIN_MEMBER(checkpoint.on_error), {"stop", "continue"}));
  t.push_back(integer("checkpoint.max_writers_per_node", Range::kNonNegative,
                      DSTRAIN_MEMBER(checkpoint.max_writers_per_node)));
}

#undef DSTRAIN_MEMBER

std::vector<Field> build_fields() {
  std::vector<Field> t;
  add_model_and_data(t);
  add_training_loop(t);
  add_training_optimizer(t);
  add_training_scheduler(t);
  add_training_precision(t);
  add_lora(t);
  add_zero(t);
  add_parallel(t);
  add_logging_and_checkpoint(t);
  return t;
}

}  // namespace

const std::vector<Field>& fields() {
  static const std::vector<Field> table = build_fields();
  return table;
}

const Field* find_field(std::string_view path) {
  const auto& t = fields();
  auto it = std::find_if(t.begin(), t.end(), [&](const Field& f) { return f.path == path; });
  return it == t.end() ? nullptr : &*it;
}

}  // namespace dstrain::config::detail
