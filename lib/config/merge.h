#pragma once
// Collects settings from every source into one table (field -> value + where it was written),
// refusing contradictions: two file sources (our sections, a `deepspeed:` section, a DeepSpeed
// JSON) that set one field to different values are an error naming both places. `--set`
// overrides are applied last and simply replace.

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "config/rules.h"
#include "config/schema.h"

namespace dstrain::config::detail {

// One document being read: a YAML file, a DeepSpeed JSON file, or one `--set` argument.
// Hugging Face TrainingArguments names that are not dstrain keys → the dstrain setting that does
// the same, for the error of an unknown key (docs/migrating.md has the whole table).
const std::map<std::string, std::string>& trainer_argument_keys();

struct Source {
  std::string file;                // shown as "<file>:<line>:<col>"; unused for overrides
  std::string override_text;       // non-empty: the `--set` argument; shown instead of a position
  std::string key_prefix;          // prefix of written key paths ("deepspeed." inside that section)
  std::filesystem::path base_dir;  // relative DeepSpeed file paths are resolved against this
  bool is_override = false;

  Origin origin(const YAML::Node& node, const std::string& key) const;
};

struct Assigned {
  Value value;
  Origin origin;
};

class Merger {
 public:
  explicit Merger(std::vector<std::string>* warnings) : warnings_(warnings) {}

  // Reads the mapping `map` whose keys live under `section` ("" for the root) of `rules`.
  void walk(const RuleSet& rules, const YAML::Node& map, const std::string& section,
            const Source& source);

  void assign(const Field& field, const Value& value, const Origin& origin);

  // Defaults with every assignment applied (no validation).
  Config build() const;

  const Assigned* find(const std::string& field_path) const;
  // Logs `line` as a warning and keeps it in the warnings list given to the constructor.
  void warn(const std::string& line) const;
  const std::string& deepspeed_file() const { return deepspeed_file_; }
  // The number that `per_device_train_batch_size: auto` won over in another source (a DeepSpeed
  // section's train_micro_batch_size_per_gpu, a file's number under --set ...=auto): the
  // micro-batch of the user's own split. nullptr when there was none.
  const Assigned* micro_batch_under_auto() const {
    return micro_under_auto_ ? &*micro_under_auto_ : nullptr;
  }

 private:
  void read_key(const RuleSet& rules, const std::string& path, const YAML::Node& key,
                const YAML::Node& value, const Source& source);
  void read_leaf(const RuleSet& rules, const KeyRule& rule, const YAML::Node& value,
                 const Origin& origin, const Source& source);
  void read_deepspeed(const YAML::Node& value, const Origin& origin, const Source& source);
  void read_deepspeed_file(const std::filesystem::path& path, const Origin& origin,
                           const Source& source);
  [[noreturn]] void fail_unknown(const RuleSet& rules, const std::string& path,
                                 const Origin& origin) const;

  bool assign_over_auto(const Field& field, const Value& value, const Origin& origin);

  std::map<std::string, Assigned> assigned_;
  std::optional<Assigned> micro_under_auto_;
  std::string deepspeed_file_;
  std::vector<std::string>* warnings_;
};

// Parses YAML text; a syntax error is Error(kConfig) "<file>:<line>:<col>: invalid YAML: ...".
YAML::Node parse_document(const std::string& text, const std::string& file);

}  // namespace dstrain::config::detail
