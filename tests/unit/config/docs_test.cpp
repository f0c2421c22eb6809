// docs/config.md's key tables against the schema (lib/config/fields.cpp, rules.cpp,
// deepspeed_rules.cpp): every documented key exists and every setting is documented, with its
// default, its aliases, the DeepSpeed keys that set it and whether it has an effect. A setting
// added, renamed or changed on one side only fails here, naming the key.

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "config/rules.h"
#include "config/schema.h"

namespace dstrain::config::detail {
namespace {

// One row of a key table: | `key` | type | default | meaning [| DS] |
struct DocRow {
  int line = 0;
  std::string key;
  std::string type;
  std::string default_value;
  std::string meaning;
  std::string deepspeed;  // "" in tables without a DS column
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// Cells of a Markdown table row; `\|` inside a cell is a literal bar, not a separator.
std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 1; i < line.size(); ++i) {  // line[0] is the leading '|'
    if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '|') {
      cur += '|';
      ++i;
    } else if (line[i] == '|') {
      out.push_back(trim(cur));
      cur.clear();
    } else {
      cur += line[i];
    }
  }
  return out;
}

// Every backticked span of `text`, in order.
std::vector<std::string> code_spans(const std::string& text) {
  std::vector<std::string> out;
  static const std::regex span("`([^`]*)`");
  for (std::sregex_iterator it(text.begin(), text.end(), span), end; it != end; ++it) {
    out.push_back((*it)[1]);
  }
  return out;
}

// The rows of the tables under "## Keys" (up to the next "## " heading).
std::vector<DocRow> documented_rows() {
  const std::string path = DSTRAIN_SOURCE_DIR "/docs/config.md";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::vector<DocRow> rows;
  bool in_keys = false;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.rfind("## ", 0) == 0) in_keys = line == "## Keys";
    if (!in_keys || line.rfind("| `", 0) != 0) continue;
    const std::vector<std::string> c = cells(line);
    EXPECT_GE(c.size(), 4u) << "docs/config.md:" << n << ": a key row needs 4 or 5 cells";
    if (c.size() < 4) continue;
    const std::vector<std::string> key = code_spans(c[0]);
    EXPECT_EQ(key.size(), 1u) << "docs/config.md:" << n << ": the first cell is one `key`";
    if (key.size() != 1) continue;
    rows.push_back({n, key[0], c[1], c[2], c[3], c.size() > 4 ? c[4] : ""});
  }
  return rows;
}

std::string where(const DocRow& row) {
  return "docs/config.md:" + std::to_string(row.line) + " (" + row.key + ")";
}

// `name` as a key path: a name without a dot is a sibling of `key` (same section).
std::string sibling_path(const std::string& key, const std::string& name) {
  if (name.find('.') != std::string::npos) return name;
  const size_t dot = key.rfind('.');
  return dot == std::string::npos ? name : key.substr(0, dot + 1) + name;
}

// Alternative spellings a cell names: "(alias `a.b`)", "(also `c`)".
std::vector<std::string> alternatives(const std::string& key, const std::string& cell) {
  std::vector<std::string> out;
  static const std::regex alt("(?:alias|also) `([^`]+)`");
  for (std::sregex_iterator it(cell.begin(), cell.end(), alt), end; it != end; ++it) {
    out.push_back(sibling_path(key, (*it)[1]));
  }
  return out;
}

TEST(ConfigDocs, EveryDocumentedKeyIsASettingAndEverySettingIsDocumented) {
  const std::vector<DocRow> rows = documented_rows();
  ASSERT_GT(rows.size(), 50u) << "docs/config.md's key tables were not found";
  const RuleSet& rules = our_rules();
  std::set<std::string> seen;
  for (const DocRow& row : rows) {
    EXPECT_TRUE(seen.insert(row.key).second) << where(row) << ": documented twice";
    const KeyRule* rule = rules.leaf(row.key);
    EXPECT_NE(rule, nullptr) << where(row) << ": not a key of the config schema";
    if (rule != nullptr) {
      EXPECT_FALSE(rule->ignored) << where(row) << ": an ignored key";
    }
  }
  for (const Field& f : fields()) {
    EXPECT_EQ(seen.count(f.path), 1u) << f.path << ": a setting missing from docs/config.md";
  }
  // Keys that are not settings but are written in our YAML: a DeepSpeed file to merge.
  EXPECT_EQ(seen.count("zero.config"), 1u) << "zero.config: missing from docs/config.md";
}

TEST(ConfigDocs, AliasesAreDocumentedBesideTheirSetting) {
  std::map<std::string, std::string> documented;  // alias -> the row's key
  for (const DocRow& row : documented_rows()) {
    for (const std::string& alias : alternatives(row.key, row.meaning)) {
      documented[alias] = row.key;
      const KeyRule* rule = our_rules().leaf(alias);
      ASSERT_NE(rule, nullptr) << where(row) << ": alias " << alias << " is not accepted";
      ASSERT_NE(rule->field, nullptr) << where(row) << ": alias " << alias << " sets nothing";
      EXPECT_EQ(rule->field->path, row.key) << where(row) << ": alias " << alias;
    }
  }
  size_t aliases = 0;
  for (const auto& [path, rule] : our_rules().leaves) {
    if (rule.field == nullptr || rule.field->path == path) continue;
    ++aliases;
    EXPECT_EQ(documented.count(path), 1u)
        << path << " (alias of " << rule.field->path << ") is not named in docs/config.md";
  }
  EXPECT_GT(aliases, 0u);
}

// A default cell as written: `x`, true, 1e-4, auto (-1), [a, b], "" ...; the first word counts
// ("false; true when ..." is false).
std::string first_word(std::string cell) {
  if (cell.rfind("auto (-1)", 0) == 0) return "-1";
  if (!cell.empty() && cell.front() == '[') return cell.substr(0, cell.find(']') + 1);
  cell = cell.substr(0, cell.find_first_of(" ;"));
  if (cell.size() >= 2 && cell.front() == '`' && cell.back() == '`') {
    cell = cell.substr(1, cell.size() - 2);
  }
  return cell == "\"\"" ? "" : cell;
}

// The default a Config starts with, written as the docs write it.
bool default_matches(const Field& field, const Value& value, const std::string& doc) {
  switch (field.kind) {
    case Kind::kBool:
      return doc == (std::get<bool>(value) ? "true" : "false");
    case Kind::kInt:
      return doc == std::to_string(std::get<int64_t>(value));
    case Kind::kNumber:
      try {
        return std::stod(doc) == std::get<double>(value);
      } catch (const std::exception&) {
        return false;
      }
    case Kind::kString:
      return doc == std::get<std::string>(value);
    case Kind::kStringList:
    case Kind::kBetas:
      return doc == format_value(value);
  }
  return false;
}

TEST(ConfigDocs, DocumentedDefaultsAreTheSchemaDefaults) {
  const Config defaults;
  size_t checked = 0;
  for (const DocRow& row : documented_rows()) {
    const Field* field = find_field(row.key);
    // "— (required)" and "—" (no value) document no default.
    if (field == nullptr || row.default_value.rfind("—", 0) == 0) continue;
    const Value value = field->get(defaults);
    const std::string doc = first_word(row.default_value);
    EXPECT_TRUE(default_matches(*field, value, doc))
        << where(row) << ": documented default '" << row.default_value << "', the schema's is "
        << format_value(value);
    ++checked;
  }
  EXPECT_GT(checked, 90u);
}

TEST(ConfigDocs, DeepSpeedColumnNamesEveryDeepSpeedKeyOfTheSetting) {
  std::set<std::string> documented;
  for (const DocRow& row : documented_rows()) {
    if (row.deepspeed.empty()) continue;
    std::vector<std::string> keys = {code_spans(row.deepspeed).at(0)};
    for (const std::string& alt : alternatives(keys[0], row.deepspeed)) keys.push_back(alt);
    for (const std::string& key : keys) {
      documented.insert(key);
      const KeyRule* rule = deepspeed_rules().leaf(key);
      ASSERT_NE(rule, nullptr) << where(row) << ": " << key << " is not a DeepSpeed key we read";
      ASSERT_NE(rule->field, nullptr) << where(row) << ": " << key << " sets nothing";
      EXPECT_EQ(rule->field->path, row.key) << where(row) << ": " << key;
    }
  }
  EXPECT_GT(documented.size(), 20u);
  // zero_optimization.* are documented once, as "the same keys as zero.*".
  for (const auto& [path, rule] : deepspeed_rules().leaves) {
    if (rule.field == nullptr || path.rfind("zero_optimization.", 0) == 0) continue;
    EXPECT_EQ(documented.count(path), 1u)
        << path << " (sets " << rule.field->path << ") is not in docs/config.md's DS column";
  }
}

TEST(ConfigDocs, KeysWithoutEffectAreTheOnesDocumentedSo) {
  size_t without_effect = 0;
  for (const DocRow& row : documented_rows()) {
    const KeyRule* rule = our_rules().leaf(row.key);
    if (rule == nullptr) continue;
    const bool documented = row.meaning.find("no effect") != std::string::npos;
    EXPECT_EQ(documented, !rule->no_effect.empty())
        << where(row) << ": " << (documented ? "documented" : "not documented")
        << " as having no effect";
    without_effect += documented ? 1 : 0;
  }
  EXPECT_GT(without_effect, 0u);
}

std::string read_source(const std::string& relative) {
  std::ifstream in(DSTRAIN_SOURCE_DIR "/" + relative);
  EXPECT_TRUE(in.good()) << "cannot read " << relative;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// The `code` spans between the first `start` in `relative` and the next `end` after it.
std::set<std::string> listed_sections(const std::string& relative, const std::string& start,
                                      const std::string& end) {
  const std::string text = read_source(relative);
  const size_t b = text.find(start);
  EXPECT_NE(b, std::string::npos) << relative << " has no '" << start << "'";
  if (b == std::string::npos) return {};
  const size_t e = text.find(end, b + start.size());
  const std::vector<std::string> spans = code_spans(text.substr(b, e - b));
  return std::set<std::string>(spans.begin(), spans.end());
}

std::string join(const std::set<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

TEST(ConfigDocs, SectionListsNameEverySectionOfTheSchema) {
  std::set<std::string> sections;
  for (const Field& f : fields()) sections.insert(f.path.substr(0, f.path.find('.')));
  ASSERT_GE(sections.size(), 7u) << join(sections);
  const std::set<std::string> config_md =
      listed_sections("docs/config.md", "one YAML file with the sections", ".");
  EXPECT_EQ(config_md, sections) << "docs/config.md names the sections " << join(config_md)
                                 << "; the schema's are " << join(sections);
  const std::set<std::string> readme =
      listed_sections("README.md", "One YAML config with sections", ";");
  EXPECT_EQ(readme, sections) << "README.md names the sections " << join(readme)
                              << "; the schema's are " << join(sections);
  // Each section has its own heading in the key reference.
  const std::string config = read_source("docs/config.md");
  for (const std::string& name : sections) {
    EXPECT_NE(config.find("\n### " + name), std::string::npos)
        << "docs/config.md has no '### " << name << "' heading";
  }
}

}  // namespace
}  // namespace dstrain::config::detail
