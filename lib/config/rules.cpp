// The RuleSet container and our own YAML's rules: each Field under its canonical path, plus the
// aliases people write (PEFT's lora_alpha, model.use_flash_attn, data.num_workers...).

#include "config/rules.h"

#include <initializer_list>
#include <utility>

#include "config/text_util.h"
#include "core/error.h"

namespace dstrain::config::detail {

void RuleSet::add(const std::string& path, KeyRule rule) {
  leaves[path] = std::move(rule);
  for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', dot + 1)) {
    sections.insert(path.substr(0, dot));
  }
}

void RuleSet::add_field(const std::string& path, const std::string& field_path) {
  KeyRule rule;
  rule.field = find_field(field_path);
  if (rule.field == nullptr) fail(ErrorKind::kInternal, "config rule {} names no field", path);
  add(path, std::move(rule));
}

void RuleSet::add_ignored(const std::string& path, const std::string& note) {
  KeyRule rule;
  rule.ignored = true;
  rule.note = note;
  add(path, std::move(rule));
}

const KeyRule* RuleSet::leaf(const std::string& path) const {
  auto it = leaves.find(path);
  return it == leaves.end() ? nullptr : &it->second;
}

std::vector<std::string> RuleSet::children(const std::string& section, bool used_only) const {
  const std::string prefix = section.empty() ? "" : section + ".";
  std::set<std::string> names;
  for (const auto& [path, rule] : leaves) {
    if (path.compare(0, prefix.size(), prefix) != 0 || (used_only && rule.ignored)) continue;
    const std::string rest = path.substr(prefix.size());
    names.insert(rest.substr(0, rest.find('.')));
  }
  return {names.begin(), names.end()};
}

void add_zero_rules(RuleSet& rules, const std::string& prefix) {
  for (const char* key :
       {"stage", "offload_optimizer.device", "offload_optimizer.pin_memory", "offload_param.device",
        "offload_param.pin_memory", "overlap_comm", "contiguous_gradients", "reduce_bucket_size",
        "allgather_bucket_size", "stage3_prefetch_bucket_size",
        "stage3_param_persistence_threshold", "stage3_max_live_parameters",
        "stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save"}) {
    rules.add_field(prefix + key, std::string("zero.") + key);
  }
  // DeepSpeed's older name for the same switch.
  rules.add_field(prefix + "stage3_gather_fp16_weights_on_model_save",
                  "zero.stage3_gather_16bit_weights_on_model_save");
  // Settings DeepSpeed files carry that have no counterpart in dstrain's engine: stored, warned.
  for (const auto& [key, why] : std::initializer_list<std::pair<const char*, const char*>>{
           {"allgather_bucket_size",
            "stages 1-2 all-gather the updated parameters per reduce bucket (reduce_bucket_size)"},
           {"stage3_max_live_parameters",
            "stage 3 holds the units of the current segment and its prefetch window "
            "(stage3_prefetch_bucket_size)"},
           {"stage3_max_reuse_distance",
            "stage 3 releases a unit as soon as the next segment does not read it"},
           {"stage3_gather_16bit_weights_on_model_save",
            "checkpoints hold fp32 pieces; `dstrain export` writes the consolidated model"},
           {"offload_optimizer.pin_memory",
            "offloaded state is pinned whenever the parameters are on a GPU"},
           {"offload_param.pin_memory",
            "offloaded state is pinned whenever the parameters are on a GPU"}}) {
    rules.leaves.at(prefix + key).no_effect = why;
  }
  rules.leaves.at(prefix + "stage3_gather_fp16_weights_on_model_save").no_effect =
      "checkpoints hold fp32 pieces; `dstrain export` writes the consolidated model";
  // Real DeepSpeed ZeRO keys that tune machinery dstrain does not have (NVMe, quantized ZeRO,
  // MiCS, hierarchical partitioning...). Accepted so existing configs load; each one warns.
  for (const char* key : {"offload_optimizer.nvme_path",
                          "offload_optimizer.buffer_count",
                          "offload_optimizer.fast_init",
                          "offload_optimizer.ratio",
                          "offload_optimizer.pipeline",
                          "offload_optimizer.pipeline_read",
                          "offload_optimizer.pipeline_write",
                          "offload_param.nvme_path",
                          "offload_param.buffer_count",
                          "offload_param.buffer_size",
                          "offload_param.max_in_cpu",
                          "offload_param.pipeline_read",
                          "offload_param.pipeline_write",
                          "sub_group_size",
                          "round_robin_gradients",
                          "reduce_scatter",
                          "allgather_partitions",
                          "elastic_checkpoint",
                          "load_from_fp32_weights",
                          "ignore_unused_parameters",
                          "cpu_offload",
                          "cpu_offload_params",
                          "cpu_offload_use_pin_memory",
                          "legacy_stage1",
                          "zero_hpz_partition_size",
                          "zero_quantized_weights",
                          "zero_quantized_nontrainable_weights",
                          "zero_quantized_gradients",
                          "mics_shard_size",
                          "mics_hierarchical_params_gather",
                          "memory_efficient_linear",
                          "use_multi_rank_bucket_allreduce",
                          "stage3_module_granularity_threshold",
                          "pipeline_loading_checkpoint",
                          "override_module_apply",
                          "log_trace_cache_warnings",
                          "use_all_reduce_for_fetch_params",
                          "stage3_use_all_reduce_for_fetch_params",
                          "module_granularity_threshold"}) {
    rules.add_ignored(prefix + key);
  }
}

namespace {

RuleSet build_our_rules() {
  RuleSet rules;
  for (const Field& f : fields()) {
    if (f.path.compare(0, 5, "zero.") != 0) rules.add_field(f.path, f.path);
  }
  add_zero_rules(rules, "zero.");
  rules.add_field("model.use_flash_attn", "training.use_flash_attn");
  rules.add_field("training.gradient_checkpointing", "model.gradient_checkpointing");
  rules.add_field("training.activation_checkpointing", "model.gradient_checkpointing");
  rules.add_field("data.num_workers", "training.num_workers");
  rules.add_field("data.num_workers_eval", "training.num_workers_eval");
  rules.add_field("lora.lora_alpha", "lora.alpha");
  rules.add_field("lora.lora_dropout", "lora.dropout");
  // Megatron-LM's names.
  rules.add_field("parallel.tensor_model_parallel_size", "parallel.tensor_parallel_size");
  rules.add_field("parallel.sequence_parallel", "parallel.tensor_sequence_parallel");
  rules.add_field("parallel.pipeline_model_parallel_size", "parallel.pipeline_parallel_size");
  rules.add_field("parallel.virtual_pipeline_model_parallel_size",
                  "parallel.pipeline_virtual_stages");
  rules.add_field("parallel.expert_model_parallel_size", "parallel.expert_parallel_size");
  rules.add_field("training.global_batch_size", "training.train_batch_size");
  rules.add_field("training.micro_batch_size", "training.per_device_train_batch_size");
  // --recompute-granularity: `full` is every layer recomputed from its input; Megatron-LM's
  // `selective` (core attention alone) is not dstrain's `selective` (the rest of the layer).
  KeyRule recompute;
  recompute.field = find_field("model.gradient_checkpointing");
  recompute.convert = [](const YAML::Node& node,
                         const Origin& origin) -> std::optional<YAML::Node> {
    const std::string word = node.IsScalar() ? lower(node.Scalar()) : "";
    if (word == "full") return YAML::Node(true);
    if (word == "selective") {
      fail_at(origin,
              "Megatron-LM's selective recomputation (the core attention alone) has no "
              "equivalent: dstrain's `selective` keeps the attention's output and recomputes the "
              "rest of the layer; set model.gradient_checkpointing (true, selective, offload or "
              "auto)");
    }
    fail_at(origin, fmt::format("expected full or selective, got {}", describe(node)));
  };
  rules.add("training.recompute_granularity", std::move(recompute));
  // TRL's SFTConfig switch for packed documents without padding.
  KeyRule padding_free;
  padding_free.field = find_field("data.packing");
  padding_free.convert = [](const YAML::Node& node,
                            const Origin& origin) -> std::optional<YAML::Node> {
    const std::optional<bool> on = scalar_bool(node);
    if (!on) fail_at(origin, fmt::format("expected true or false, got {}", describe(node)));
    return YAML::Node(*on ? "documents" : "pad");
  };
  rules.add("data.padding_free", std::move(padding_free));
  KeyRule ds;
  ds.deepspeed_config = true;
  rules.add("zero.config", ds);
  rules.add("deepspeed", ds);
  return rules;
}

}  // namespace

const RuleSet& our_rules() {
  static const RuleSet rules = build_our_rules();
  return rules;
}

}  // namespace dstrain::config::detail
