// Turning one YAML value into a typed setting, and the words used when it does not fit.
// Numbers are read strictly (the whole scalar must parse, finite); an integer may be written in
// float notation when it is integral, because DeepSpeed configs write sizes as 5.0e7.

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "config/schema.h"
#include "config/text_util.h"
#include "core/error.h"

namespace dstrain::config::detail {
namespace {

std::optional<double> as_number(const YAML::Node& node) {
  if (!node.IsScalar() || node.Scalar().empty()) return std::nullopt;
  const std::string& s = node.Scalar();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (*end != '\0' || errno != 0 || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<int64_t> as_integer(const YAML::Node& node) {
  if (!node.IsScalar() || node.Scalar().empty()) return std::nullopt;
  const std::string& s = node.Scalar();
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (*end == '\0' && errno == 0) return static_cast<int64_t>(v);
  const auto d = as_number(node);
  if (!d || std::floor(*d) != *d || std::fabs(*d) > 9.0e18) return std::nullopt;
  return static_cast<int64_t>(*d);
}

std::optional<bool> as_bool(const YAML::Node& node) {
  if (!node.IsScalar()) return std::nullopt;
  const std::string s = lower(node.Scalar());
  if (s == "true" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "no" || s == "off") return false;
  return std::nullopt;
}

bool is_auto(const YAML::Node& node) {
  return node.IsScalar() && lower(node.Scalar()) == "auto";
}

bool allows_unset(Range r) {
  return r == Range::kPositiveOrUnset || r == Range::kNonNegativeOrUnset;
}

bool in_range(Range r, double v) {
  switch (r) {
    case Range::kAny:
      return true;
    case Range::kPositive:
      return v > 0;
    case Range::kNonNegative:
      return v >= 0;
    case Range::kFractionOpen:
      return v >= 0 && v < 1;
    case Range::kFraction:
      return v >= 0 && v <= 1;
    case Range::kPositiveOrUnset:
      return v > 0 || v == -1;
    case Range::kNonNegativeOrUnset:
      return v >= 0 || v == -1;
    case Range::kStage:
      return v >= 0 && v <= 3;
  }
  return false;
}

std::optional<std::string> as_choice(const Field& f, const YAML::Node& node) {
  if (!node.IsScalar()) return std::nullopt;
  if (f.choices.empty()) return node.Scalar();
  for (const auto& c : f.choices) {
    if (lower(c) == lower(node.Scalar())) return c;
  }
  return std::nullopt;
}

std::optional<Value> try_parse(const Field& f, const YAML::Node& node) {
  if (f.parse) return f.parse(node);
  if (allows_unset(f.range) && is_auto(node)) {
    return f.kind == Kind::kInt ? Value(int64_t{-1}) : Value(-1.0);
  }
  switch (f.kind) {
    case Kind::kBool:
      if (auto b = as_bool(node)) return Value(*b);
      return std::nullopt;
    case Kind::kInt:
      if (auto i = as_integer(node); i && in_range(f.range, static_cast<double>(*i))) return *i;
      return std::nullopt;
    case Kind::kNumber:
      if (auto d = as_number(node); d && in_range(f.range, *d)) return *d;
      return std::nullopt;
    case Kind::kString:
      if (node.IsNull()) return Value(std::string());
      if (auto s = as_choice(f, node)) return Value(*s);
      return std::nullopt;
    case Kind::kStringList: {
      // A single string is a one-element list, as PEFT accepts for target_modules.
      if (node.IsScalar()) return Value(std::vector<std::string>{node.Scalar()});
      const bool empty_ok = f.range == Range::kNonNegative;
      if (empty_ok && node.IsNull()) return Value(std::vector<std::string>{});
      if (!node.IsSequence() || (node.size() == 0 && !empty_ok)) return std::nullopt;
      std::vector<std::string> out;
      for (const auto& item : node) {
        if (!item.IsScalar()) return std::nullopt;
        out.push_back(item.Scalar());
      }
      return Value(out);
    }
    case Kind::kBetas: {
      if (!node.IsSequence() || node.size() != 2) return std::nullopt;
      std::vector<double> out;
      for (const auto& item : node) {
        auto d = as_number(item);
        if (!d || !in_range(f.range, *d)) return std::nullopt;
        out.push_back(*d);
      }
      return Value(out);
    }
  }
  return std::nullopt;
}

std::string range_words(Range r, const char* noun) {
  switch (r) {
    case Range::kAny:
      return fmt::format("a {}", noun);
    case Range::kPositive:
      return fmt::format("a positive {}", noun);
    case Range::kNonNegative:
      return fmt::format("a non-negative {}", noun);
    case Range::kFractionOpen:
      return fmt::format("a {} in [0, 1)", noun);
    case Range::kFraction:
      return fmt::format("a {} in [0, 1]", noun);
    case Range::kPositiveOrUnset:
      return fmt::format("a positive {} or auto", noun);
    case Range::kNonNegativeOrUnset:
      return fmt::format("a non-negative {} or auto", noun);
    case Range::kStage:
      return "an integer in 0..3";
  }
  return noun;
}

}  // namespace

void fail_at(const Origin& origin, const std::string& message) {
  fail(ErrorKind::kConfig, "{}: {}: {}", origin.where, origin.key, message);
}

Value parse_value(const Field& field, const YAML::Node& node, const Origin& origin) {
  if (auto v = try_parse(field, node)) return *v;
  fail_at(origin, fmt::format("expected {}, got {}", expected_text(field), describe(node)));
}

std::optional<bool> scalar_bool(const YAML::Node& node) {
  return as_bool(node);
}

std::optional<int64_t> scalar_integer(const YAML::Node& node) {
  return as_integer(node);
}

std::string expected_text(const Field& f) {
  if (!f.expected.empty()) return f.expected;
  switch (f.kind) {
    case Kind::kBool:
      return "true or false";
    case Kind::kInt:
      return range_words(f.range, "integer");
    case Kind::kNumber:
      return range_words(f.range, "number");
    case Kind::kString:
      return f.choices.empty() ? "a string" : fmt::format("one of {}", fmt::join(f.choices, ", "));
    case Kind::kStringList:
      return f.range == Range::kNonNegative ? "a list of strings" : "a non-empty list of strings";
    case Kind::kBetas:
      return "a list of two numbers in [0, 1)";
  }
  return "a value";
}

std::string describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return fmt::format("\"{}\"", node.Scalar());
}

std::string format_value(const Value& value) {
  struct Visitor {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return fmt::format("{}", i); }
    std::string operator()(double d) const { return fmt::format("{}", d); }
    std::string operator()(const std::string& s) const { return fmt::format("\"{}\"", s); }
    std::string operator()(const std::vector<std::string>& v) const {
      return fmt::format("[{}]", fmt::join(v, ", "));
    }
    std::string operator()(const std::vector<double>& v) const {
      return fmt::format("[{}]", fmt::join(v, ", "));
    }
  };
  return std::visit(Visitor{}, value);
}

bool is_unset_sentinel(const Field& field, const Value& value) {
  if (!allows_unset(field.range)) return false;
  if (const auto* i = std::get_if<int64_t>(&value)) return *i == -1;
  if (const auto* d = std::get_if<double>(&value)) return *d == -1.0;
  return false;
}

}  // namespace dstrain::config::detail
