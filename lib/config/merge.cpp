#include "config/merge.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "config/text_util.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"

namespace dstrain::config::detail {
namespace {

bool is_auto(const YAML::Node& node) {
  return node.IsScalar() && lower(node.Scalar()) == "auto";
}

// A key whose last segment names a setting elsewhere (training.max_length -> data.max_length).
std::string same_name_elsewhere(const RuleSet& rules, const std::string& name) {
  for (const auto& [path, rule] : rules.leaves) {
    const size_t dot = path.rfind('.');
    if (dot != std::string::npos && path.substr(dot + 1) == name) return path;
  }
  return "";
}

}  // namespace

const std::map<std::string, std::string>& trainer_argument_keys() {
  // TrainingArguments' names as users bring them from the Hugging Face Trainer, and what dstrain
  // calls the setting (docs/migrating.md). Names that are already dstrain's (max_steps, bf16,
  // warmup_ratio, ...) are not here: they are keys of their own.
  static const std::map<std::string, std::string> keys = {
      {"adam_beta1", "training.betas: [beta1, beta2]"},
      {"adam_beta2", "training.betas: [beta1, beta2]"},
      {"adam_epsilon", "training.eps"},
      {"auto_find_batch_size", "training.per_device_train_batch_size: auto"},
      {"dataloader_drop_last", "data.drop_last"},
      {"dataloader_num_workers", "training.num_workers"},
      {"eval_steps", "training.eval_interval"},
      {"eval_strategy", "training.eval_interval"},
      {"evaluation_strategy", "training.eval_interval"},
      {"learning_rate", "training.lr"},
      {"logging_dir", "logging.tensorboard_dir"},
      {"logging_steps", "training.log_interval"},
      {"lr_scheduler_type", "training.lr_scheduler"},
      {"max_grad_norm", "training.gradient_clipping"},
      {"num_train_epochs", "training.epochs"},
      {"optim", "training.optimizer"},
      {"output_dir", "logging.out_dir (and checkpoint.dir for checkpoints)"},
      {"resume_from_checkpoint",
       "`dstrain resume CHECKPOINT` (or `dstrain launch --resume-latest`)"},
      {"save_steps", "checkpoint.interval"},
      {"save_strategy", "checkpoint.interval"},
      {"save_total_limit", "checkpoint.keep_last"},
  };
  return keys;
}

Origin Source::origin(const YAML::Node& node, const std::string& key) const {
  Origin o;
  o.key = key;
  o.is_override = is_override;
  if (!override_text.empty()) {
    o.where = "--set " + override_text;
  } else if (node.Mark().line >= 0) {
    o.where = fmt::format("{}:{}:{}", file, node.Mark().line + 1, node.Mark().column + 1);
  } else {
    o.where = file;
  }
  return o;
}

YAML::Node parse_document(const std::string& text, const std::string& file) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail(ErrorKind::kConfig, "{}:{}:{}: invalid YAML: {}", file, e.mark.line + 1, e.mark.column + 1,
         e.msg);
  }
}

void Merger::walk(const RuleSet& rules, const YAML::Node& map, const std::string& section,
                  const Source& source) {
  for (const auto& entry : map) {
    const YAML::Node& key = entry.first;
    if (!key.IsScalar()) {
      fail_at(source.origin(key, source.key_prefix + section),
              fmt::format("expected a key name, got {}", describe(key)));
    }
    const std::string path = section.empty() ? key.Scalar() : section + "." + key.Scalar();
    read_key(rules, path, key, entry.second, source);
  }
}

void Merger::read_key(const RuleSet& rules, const std::string& path, const YAML::Node& key,
                      const YAML::Node& value, const Source& source) {
  const std::string written = source.key_prefix + path;
  if (const KeyRule* rule = rules.leaf(path)) {
    read_leaf(rules, *rule, value, source.origin(value, written), source);
    return;
  }
  if (!rules.is_section(path)) fail_unknown(rules, path, source.origin(key, written));
  if (!value.IsNull() && !value.IsMap()) {
    fail_at(source.origin(value, written),
            fmt::format("expected a mapping of settings, got {}", describe(value)));
  }
  // A `lora:` section in a file turns LoRA on unless it says `enabled: false` itself.
  if (!rules.deepspeed && path == "lora" && !source.is_override &&
      !(value.IsMap() && value["enabled"])) {
    assign(*find_field("lora.enabled"), Value(true), source.origin(key, written));
  }
  if (value.IsMap()) walk(rules, value, path, source);
}

void Merger::read_leaf(const RuleSet& rules, const KeyRule& rule, const YAML::Node& value,
                       const Origin& origin, const Source& source) {
  if (rule.ignored) {
    warn(fmt::format(
        "{}: {}: ignored ({})", origin.where, origin.key,
        rule.note.empty() ? "a DeepSpeed setting that dstrain does not use" : rule.note));
    return;
  }
  if (rule.deepspeed_config) {
    read_deepspeed(value, origin, source);
    return;
  }
  // HF Trainer semantics: DeepSpeed "auto" takes the value from our own sections or defaults.
  if (rules.deepspeed && is_auto(value)) return;
  if (!rule.no_effect.empty()) {
    warn(fmt::format("{}: {}: accepted, no effect in dstrain ({})", origin.where, origin.key,
                     rule.no_effect));
  }
  std::optional<YAML::Node> node = value;
  if (rule.convert) node = rule.convert(value, origin);
  if (rule.field == nullptr || !node) return;
  assign(*rule.field, parse_value(*rule.field, *node, origin), origin);
}

void Merger::read_deepspeed(const YAML::Node& value, const Origin& origin, const Source& source) {
  if (value.IsMap()) {
    Source inline_source = source;
    inline_source.key_prefix = origin.key + ".";
    walk(deepspeed_rules(), value, "", inline_source);
    return;
  }
  if (!value.IsScalar() || value.Scalar().empty()) {
    fail_at(origin,
            fmt::format("expected DeepSpeed settings (a mapping) or the path of a DeepSpeed "
                        "JSON file, got {}",
                        describe(value)));
  }
  std::filesystem::path path = value.Scalar();
  if (path.is_relative()) path = source.base_dir / path;
  read_deepspeed_file(path.lexically_normal(), origin, source);
}

void Merger::read_deepspeed_file(const std::filesystem::path& path, const Origin& origin,
                                 const Source& source) {
  std::string text;
  try {
    text = fs::read_file(path);
  } catch (const Error& e) {
    fail_at(origin, e.what());
  }
  const YAML::Node doc = parse_document(text, path.string());
  if (!doc.IsMap()) {
    fail(ErrorKind::kConfig, "{}: expected a JSON object of DeepSpeed settings, got {}",
         path.string(), describe(doc));
  }
  Source file_source;
  file_source.file = path.string();
  file_source.base_dir = path.parent_path();
  file_source.is_override = source.is_override;
  deepspeed_file_ = path.string();
  walk(deepspeed_rules(), doc, "", file_source);
}

// training.per_device_train_batch_size: `auto` in one source wins over a number in another, which
// is kept as the micro-batch of the user's split (with the accumulation it gives the global batch
// that auto keeps, validate.cpp). A --set number replaces auto as any override does.
bool Merger::assign_over_auto(const Field& field, const Value& value, const Origin& origin) {
  if (field.path != "training.per_device_train_batch_size") return false;
  auto it = assigned_.find(field.path);
  if (it == assigned_.end()) return false;
  const bool now_auto = std::holds_alternative<std::string>(value);
  if (now_auto == std::holds_alternative<std::string>(it->second.value)) return false;
  if (!now_auto && origin.is_override) return false;
  if (now_auto) {
    micro_under_auto_ = it->second;
    it->second = Assigned{value, origin};
  } else {
    micro_under_auto_ = Assigned{value, origin};
  }
  return true;
}

void Merger::assign(const Field& field, const Value& value, const Origin& origin) {
  if (assign_over_auto(field, value, origin)) return;
  auto it = assigned_.find(field.path);
  if (it == assigned_.end() || origin.is_override) {
    assigned_[field.path] = Assigned{value, origin};
    return;
  }
  const Assigned& before = it->second;
  if (before.origin.is_override || before.value == value) return;
  fail_at(origin, fmt::format("{} conflicts with {} = {} at {}", format_value(value),
                              before.origin.key, format_value(before.value), before.origin.where));
}

void Merger::fail_unknown(const RuleSet& rules, const std::string& path,
                          const Origin& origin) const {
  const std::string prefix = origin.key.substr(0, origin.key.size() - path.size());
  const size_t dot = path.rfind('.');
  const std::string section = dot == std::string::npos ? "" : path.substr(0, dot);
  const std::string name = dot == std::string::npos ? path : path.substr(dot + 1);
  if (!rules.deepspeed) {
    const auto& trainer = trainer_argument_keys();
    if (const auto it = trainer.find(name); it != trainer.end()) {
      fail_at(origin, fmt::format("unknown key; the Hugging Face Trainer's {} is {} in dstrain "
                                  "(docs/migrating.md)",
                                  name, it->second));
    }
  }
  const std::vector<std::string> siblings = rules.children(section);
  std::string suggestion;
  if (const std::string near = closest(name, siblings); !near.empty()) {
    suggestion = prefix + (section.empty() ? near : section + "." + near);
  } else if (const std::string other = same_name_elsewhere(rules, name); !other.empty()) {
    suggestion = prefix + other;
  } else if (!rules.deepspeed &&
             (deepspeed_rules().leaf(path) || deepspeed_rules().is_section(path))) {
    suggestion = "deepspeed." + path;
  }
  if (!suggestion.empty())
    fail_at(origin, fmt::format("unknown key; did you mean {}?", suggestion));
  fail_at(origin, fmt::format("unknown key; expected one of: {}",
                              fmt::join(rules.children(section, true), ", ")));
}

void Merger::warn(const std::string& line) const {
  log::warn("{}", line);
  if (warnings_ != nullptr) warnings_->push_back(line);
}

Config Merger::build() const {
  Config config;
  for (const Field& f : fields()) {
    if (const Assigned* a = find(f.path)) f.set(config, a->value);
  }
  config.zero.config = deepspeed_file_;
  return config;
}

const Assigned* Merger::find(const std::string& field_path) const {
  auto it = assigned_.find(field_path);
  return it == assigned_.end() ? nullptr : &it->second;
}

}  // namespace dstrain::config::detail
