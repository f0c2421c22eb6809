#pragma once
// The schema of our own YAML: one Field per setting, named by its canonical key path
// ("training.lr"), with its type, its allowed range and how to read/write it in a Config.
// Everything else (parsing, conflict detection, to_yaml, the DeepSpeed mapping, did-you-mean)
// is driven by this one table, so a setting is declared exactly once.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "config/config.h"

namespace dstrain::config::detail {

// A parsed setting. Integers of every width are int64_t; betas are a vector<double> of two.
using Value =
    std::variant<bool, int64_t, double, std::string, std::vector<std::string>, std::vector<double>>;

// Where a value was written, for messages: `where` is "train.yaml:12:7" or "--set training.lr=x";
// `key` is the key path as written there ("deepspeed.optimizer.params.lr").
struct Origin {
  std::string where;
  std::string key;
  bool is_override = false;
};

enum class Kind { kBool, kInt, kNumber, kString, kStringList, kBetas };

enum class Range {
  kAny,
  kPositive,            // > 0
  kNonNegative,         // >= 0
  kFractionOpen,        // [0, 1)
  kFraction,            // [0, 1]
  kPositiveOrUnset,     // > 0, or -1 / "auto" meaning "derived"
  kNonNegativeOrUnset,  // >= 0, or -1 / "auto"
  kStage,               // integer 0..3
};

struct Field {
  std::string path;  // canonical key path in our YAML
  Kind kind = Kind::kString;
  Range range = Range::kAny;
  std::vector<std::string> choices;  // kString: allowed values, matched case-insensitively
  // A setting that mixes spellings (a bool or a word, a word or a number) parses with its own
  // function (nullopt: not accepted) and says what it expects in its own words; its Value may
  // then hold more than one alternative (see fields.cpp).
  std::function<std::optional<Value>(const YAML::Node&)> parse;
  std::string expected;
  std::function<Value(const Config&)> get;
  std::function<void(Config&, const Value&)> set;
  // Optional: a note to_yaml writes after the value (a choice made at run time); "" for none.
  std::function<std::string(const Config&)> comment;
};

// Every field, in the order to_yaml writes them (fields of one mapping are contiguous).
const std::vector<Field>& fields();
const Field* find_field(std::string_view path);

// Parses `node` as `field`'s type and range. Throws Error(kConfig)
// "<where>: <key>: expected <what>, got <node>".
Value parse_value(const Field& field, const YAML::Node& node, const Origin& origin);

// A YAML scalar read as a bool (true/yes/on, false/no/off) or a whole integer, strictly.
std::optional<bool> scalar_bool(const YAML::Node& node);

// The comment to_yaml starts its output with; a config that starts with it is a record of a run
// (a checkpoint's config.yaml), written by the dstrain version of that run.
inline constexpr const char* kResolvedConfigComment = "dstrain configuration, fully resolved";
std::optional<int64_t> scalar_integer(const YAML::Node& node);

// "a positive number", "one of adamw, sgd", ...
std::string expected_text(const Field& field);
// How a YAML value is shown in messages: "fast" quoted, or "a list", "a mapping", "nothing".
std::string describe(const YAML::Node& node);
// How a parsed value is shown in messages: 2e-05, true, "adamw", [0.9, 0.95].
std::string format_value(const Value& value);
// True for the "-1 means auto/derived" ranges.
bool is_unset_sentinel(const Field& field, const Value& value);

[[noreturn]] void fail_at(const Origin& origin, const std::string& message);

}  // namespace dstrain::config::detail
