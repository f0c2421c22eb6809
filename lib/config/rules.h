#pragma once
// Which keys may be written where, and what each one sets. Two rule sets: our YAML (every Field
// under its canonical path, plus aliases) and DeepSpeed's JSON keys (mapped onto our Fields).
// Keys are dotted paths from the root of the document the rules apply to.

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "config/schema.h"

namespace dstrain::config::detail {

struct KeyRule {
  // The setting this key writes; nullptr for ignored keys and for pure checks.
  const Field* field = nullptr;
  // Accepted, not used: a one-line warning (a DeepSpeed key with no meaning for dstrain).
  bool ignored = false;
  // For an ignored key: what dstrain does instead, shown in the warning in place of the generic
  // "a DeepSpeed setting that dstrain does not use".
  std::string note;
  // A setting that is stored (it shows in --print-config and round-trips) but does nothing in
  // dstrain: reading it warns "accepted, no effect (<no_effect>)".
  std::string no_effect;
  // The key names a DeepSpeed config: an inline mapping or a path to a JSON/YAML file.
  bool deepspeed_config = false;
  // Rewrites the written value before the field parses it (DeepSpeed spellings such as "AdamW").
  // May throw via fail_at; std::nullopt means "nothing to set" (a pure check).
  std::function<std::optional<YAML::Node>(const YAML::Node&, const Origin&)> convert;
};

struct RuleSet {
  bool deepspeed = false;                 // DeepSpeed semantics: "auto" leaves a setting alone
  std::map<std::string, KeyRule> leaves;  // full dotted path -> rule
  std::set<std::string> sections;         // every proper prefix of a leaf path

  void add(const std::string& path, KeyRule rule);
  void add_field(const std::string& path, const std::string& field_path);
  void add_ignored(const std::string& path, const std::string& note = "");
  const KeyRule* leaf(const std::string& path) const;
  bool is_section(const std::string& path) const { return sections.count(path) > 0; }
  // Names of the keys directly under `section` ("" for the root); with `used_only`, only those
  // leading to a setting dstrain uses (not ignored keys).
  std::vector<std::string> children(const std::string& section, bool used_only = false) const;
};

const RuleSet& our_rules();
const RuleSet& deepspeed_rules();

// zero_optimization's keys (ours under `zero.`, DeepSpeed's under `zero_optimization.`).
void add_zero_rules(RuleSet& rules, const std::string& prefix);

}  // namespace dstrain::config::detail
