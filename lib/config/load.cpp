// load_config: read the YAML, walk it against our rules (DeepSpeed parts against DeepSpeed's),
// apply --set overrides in order, then resolve and validate. See docs/config.md.

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "config/config.h"
#include "config/merge.h"
#include "config/validate.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"

namespace dstrain::config {
namespace {

using detail::Assigned;
using detail::Merger;
using detail::Source;

// "a.b.c=value" -> {a: {b: {c: value}}}, read with the same rules as a file.
void apply_override(Merger& merger, const std::string& arg) {
  const size_t eq = arg.find('=');
  if (eq == std::string::npos || eq == 0) {
    fail(ErrorKind::kConfig, "--set {}: expected key.path=value", arg);
  }
  const std::string key = arg.substr(0, eq);
  YAML::Node value;
  try {
    value = YAML::Load(arg.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    fail(ErrorKind::kConfig, "--set {}: the value is not valid YAML: {}", arg, e.msg);
  }
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (parts.back().empty()) fail(ErrorKind::kConfig, "--set {}: empty key name in {}", arg, key);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  YAML::Node tree = value;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    YAML::Node parent(YAML::NodeType::Map);
    parent[*it] = tree;
    tree = parent;
  }
  Source source;
  source.override_text = arg;
  source.is_override = true;
  source.base_dir = std::filesystem::current_path();
  merger.walk(detail::our_rules(), tree, "", source);
}

// Keys added after a run recorded its config: absent from such a record, they take the value that
// keeps that run's behaviour, so that resuming it gives the same data (new configs get the
// schema's default). data.add_bos: no bos was added before the key existed;
// training.loss_normalization: each micro-step's mean was averaged. A record is a text whose
// leading comment lines include the header to_yaml writes.
bool is_recorded_config(const std::string& text) {
  const std::string header = std::string("# ") + detail::kResolvedConfigComment;
  for (size_t at = 0; at < text.size() && text[at] == '#';) {
    const size_t end = std::min(text.find('\n', at), text.size());
    if (text.compare(at, end - at, header) == 0) return true;
    at = end + 1;
  }
  return false;
}

void keep_recorded_behaviour(const std::string& text, const Merger& merger, Config& config) {
  if (!is_recorded_config(text)) return;
  if (merger.find("data.add_bos") == nullptr) config.data.add_bos = "false";
  if (merger.find("training.loss_normalization") == nullptr) {
    config.training.loss_normalization = "micro_steps";
  }
}

// A DeepSpeed micro-batch of 1 with accumulation, which users bring from stacks where memory was
// tight: one line naming `auto` and where docs/training.md describes it. The
// DeepSpeed key is told apart by its name (Origin records where and under which key a value was
// written, not its dialect); ours is per_device_train_batch_size.
void hint_auto_micro_batch(const Config& config, const Merger& merger,
                           std::vector<std::string>* notes) {
  const Assigned* micro = merger.find("training.per_device_train_batch_size");
  const TrainingSection& t = config.training;
  if (micro == nullptr || t.micro_batch_auto || t.per_device_train_batch_size != 1 ||
      t.gradient_accumulation_steps < 2 ||
      micro->origin.key.find("train_micro_batch_size_per_gpu") == std::string::npos) {
    return;
  }
  const std::string line = fmt::format(
      "{}: {}: hint: micro-batch 1 with gradient accumulation {} runs one sample at a time; "
      "training.per_device_train_batch_size: auto keeps the global batch and picks the largest "
      "micro-batch that fits (see docs/training.md, Micro-batch auto)",
      micro->origin.where, micro->origin.key, t.gradient_accumulation_steps);
  log::info("{}", line);
  if (notes != nullptr) notes->push_back(line);
}

Config load_text(const std::string& text, const std::string& file,
                 const std::filesystem::path& base_dir, const LoadOptions& options) {
  Merger merger(options.warnings);
  const YAML::Node doc = detail::parse_document(text, file);
  if (doc.IsDefined() && !doc.IsNull()) {
    if (!doc.IsMap()) {
      fail(ErrorKind::kConfig,
           "{}: expected a mapping of sections (model, data, training, ...), "
           "got {}",
           file, detail::describe(doc));
    }
    Source source;
    source.file = file;
    source.base_dir = base_dir;
    merger.walk(detail::our_rules(), doc, "", source);
  }
  for (const std::string& arg : options.overrides) apply_override(merger, arg);
  Config config = merger.build();
  keep_recorded_behaviour(text, merger, config);
  detail::resolve_and_validate(config, merger, file, options.world_size);
  hint_auto_micro_batch(config, merger, options.warnings);
  return config;
}

}  // namespace

Config load_config(const std::string& path, const LoadOptions& options) {
  std::string text;
  try {
    text = fs::read_file(path);
  } catch (const Error& e) {
    // The path came from the user: report it as bad input (exit code 2), not an OS failure.
    throw Error(ErrorKind::kConfig, e.what());
  }
  std::filesystem::path base_dir = std::filesystem::path(path).parent_path();
  if (base_dir.empty()) base_dir = ".";
  Config config = load_text(text, path, base_dir, options);
  config.source_path = path;
  return config;
}

Config load_config_from_string(const std::string& yaml_text, const std::string& display_name,
                               const LoadOptions& options) {
  return load_text(yaml_text, display_name, std::filesystem::current_path(), options);
}

}  // namespace dstrain::config
