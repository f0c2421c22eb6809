// to_yaml: the resolved config in our own key names, every setting written out (but the no-effect
// ones at their default), so that a run can record exactly what it used and that record loads
// back to the same Config.

#include <set>

#include <fmt/format.h>

#include "config/config.h"
#include "config/rules.h"
#include "config/schema.h"

namespace dstrain::config {
namespace {

using detail::Field;
using detail::Value;

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', start)) {
    parts.push_back(path.substr(start, dot - start));
    start = dot + 1;
  }
  parts.push_back(path.substr(start));
  return parts;
}

void emit_value(YAML::Emitter& out, const Field& field, const Value& value) {
  if (detail::is_unset_sentinel(field, value)) {
    out << "auto";
  } else if (const auto* b = std::get_if<bool>(&value)) {
    out << *b;
  } else if (const auto* i = std::get_if<int64_t>(&value)) {
    out << fmt::format("{}", *i);
  } else if (const auto* d = std::get_if<double>(&value)) {
    out << fmt::format("{}", *d);  // shortest text that reads back to the same double
  } else if (const auto* s = std::get_if<std::string>(&value)) {
    out << YAML::DoubleQuoted << *s;
  } else if (const auto* list = std::get_if<std::vector<std::string>>(&value)) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const auto& item : *list) out << YAML::DoubleQuoted << item;
    out << YAML::EndSeq;
  } else if (const auto* numbers = std::get_if<std::vector<double>>(&value)) {
    out << YAML::Flow << YAML::BeginSeq;
    for (double item : *numbers) out << fmt::format("{}", item);
    out << YAML::EndSeq;
  }
}

// Settings stored only for DeepSpeed files' sake (rules.h, KeyRule::no_effect) are written only
// when they were moved off their default: a resolved config loaded again (by `dstrain resume`, by
// every restart) must not warn about keys nobody wrote.
bool written(const Field& field, const Config& config) {
  static const std::set<const Field*> no_effect = [] {
    std::set<const Field*> out;
    for (const auto& [path, rule] : detail::our_rules().leaves)
      if (!rule.no_effect.empty() && rule.field != nullptr) out.insert(rule.field);
    return out;
  }();
  return no_effect.count(&field) == 0 || field.get(config) != field.get(Config{});
}

}  // namespace

std::string to_yaml(const Config& config) {
  YAML::Emitter out;
  out << YAML::Comment(detail::kResolvedConfigComment);
  if (!config.zero.config.empty()) {
    out << YAML::Newline << YAML::Comment("DeepSpeed settings merged from " + config.zero.config);
  }
  out << YAML::BeginMap;
  // Fields of one mapping are contiguous in the table, so a stack of open mappings suffices.
  std::vector<std::string> open;
  for (const Field& field : detail::fields()) {
    if (!written(field, config)) continue;
    std::vector<std::string> parts = split_path(field.path);
    const std::string leaf = parts.back();
    parts.pop_back();
    size_t common = 0;
    while (common < open.size() && common < parts.size() && open[common] == parts[common]) ++common;
    for (; open.size() > common; open.pop_back()) out << YAML::EndMap;
    for (size_t i = common; i < parts.size(); ++i, open.push_back(parts[i - 1])) {
      out << YAML::Key << parts[i] << YAML::Value << YAML::BeginMap;
    }
    out << YAML::Key << leaf << YAML::Value;
    emit_value(out, field, field.get(config));
    const std::string note = field.comment ? field.comment(config) : std::string();
    if (!note.empty()) out << YAML::Comment(note);
  }
  for (; !open.empty(); open.pop_back()) out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::vector<FlatSetting> flatten(const Config& config) {
  std::vector<FlatSetting> out;
  for (const Field& field : detail::fields()) {
    if (!written(field, config)) continue;  // as to_yaml: the same settings everywhere
    const Value value = field.get(config);
    FlatSetting f;
    f.key = field.path;
    if (detail::is_unset_sentinel(field, value)) {
      f.text = "auto";
      f.value = f.text;
    } else if (const auto* b = std::get_if<bool>(&value)) {
      f.text = *b ? "true" : "false";
      f.value = *b;
    } else if (const auto* i = std::get_if<int64_t>(&value)) {
      f.text = fmt::format("{}", *i);
      f.value = static_cast<double>(*i);
    } else if (const auto* d = std::get_if<double>(&value)) {
      f.text = fmt::format("{}", *d);
      f.value = *d;
    } else if (const auto* s = std::get_if<std::string>(&value)) {
      f.text = *s;
      f.value = *s;
    } else {
      YAML::Emitter list;
      emit_value(list, field, value);
      f.text = list.c_str();
      f.value = f.text;
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace dstrain::config
