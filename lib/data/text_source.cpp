#include "data/text_source.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/utf8.h"

namespace dstrain::data {
namespace {

// The file's bytes, checked to be UTF-8. A missing path is bad user input (kInput), not an OS
// failure.
std::string read_utf8_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    fail(ErrorKind::kInput, "{}: data file not found", path);
  }
  std::string bytes = fs::read_file(path);
  if (auto bad = find_invalid_utf8(bytes)) {
    const auto line = 1 + std::count(bytes.begin(), bytes.begin() + static_cast<long>(*bad), '\n');
    fail(ErrorKind::kInput, "{}: invalid UTF-8 at byte offset {} (line {})", path, *bad, line);
  }
  return bytes;
}

// Calls fn(line_number, line) for each line without its "\n" or "\r\n".
template <typename Fn>
void for_each_line(const std::string& bytes, Fn&& fn) {
  size_t start = 0;
  int64_t number = 1;
  while (start < bytes.size()) {
    size_t end = bytes.find('\n', start);
    if (end == std::string::npos) end = bytes.size();
    size_t stop = end;
    if (stop > start && bytes[stop - 1] == '\r') --stop;
    fn(number, std::string_view(bytes).substr(start, stop - start));
    start = end + 1;
    ++number;
  }
}

bool is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

nlohmann::json jsonl_object(const std::string& path, int64_t number, std::string_view line,
                            const std::string& field) {
  nlohmann::json obj;
  try {
    obj = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    fail(ErrorKind::kInput, "{}:{}: not valid JSON: {}", path, number, e.what());
  }
  if (!obj.is_object()) {
    fail(ErrorKind::kInput, "{}:{}: expected a JSON object with a \"{}\" field, got a {}", path,
         number, field, obj.type_name());
  }
  return obj;
}

// The string field `field` of `obj`; `key` names the setting that chooses it.
std::string jsonl_string(const nlohmann::json& obj, const std::string& path, int64_t number,
                         const std::string& field, const std::string& key) {
  auto it = obj.find(field);
  if (it == obj.end()) {
    if (obj.contains("messages")) {
      fail(ErrorKind::kInput, "{}:{}: no field \"{}\" but a \"messages\" field: {}", path, number,
           field, kChatDataSentence);
    }
    fail(ErrorKind::kInput, "{}:{}: no field \"{}\" (set {} to the key that holds it)", path,
         number, field, key);
  }
  if (!it->is_string()) {
    fail(ErrorKind::kInput, "{}:{}: field \"{}\" is {}, expected a string", path, number, field,
         it->is_null() ? std::string("null") : std::string("a ") + it->type_name());
  }
  return it->get<std::string>();
}

}  // namespace

DocumentUnit parse_document_unit(const std::string& value) {
  if (value == "file") return DocumentUnit::kFile;
  if (value == "line") return DocumentUnit::kLine;
  fail(ErrorKind::kConfig, "data.document: expected \"file\" or \"line\", got \"{}\"", value);
}

std::vector<std::string> read_text_documents(const std::string& path, DocumentUnit unit) {
  std::string bytes = read_utf8_file(path);
  std::vector<std::string> docs;
  if (unit == DocumentUnit::kFile) {
    if (!bytes.empty()) docs.push_back(std::move(bytes));
    return docs;
  }
  for_each_line(bytes, [&](int64_t, std::string_view line) {
    if (!line.empty()) docs.emplace_back(line);
  });
  return docs;
}

std::vector<std::string> read_jsonl_documents(const std::string& path,
                                              const std::string& text_field) {
  const std::string bytes = read_utf8_file(path);
  std::vector<std::string> docs;
  for_each_line(bytes, [&](int64_t number, std::string_view line) {
    if (is_blank(line)) return;
    std::string text = jsonl_string(jsonl_object(path, number, line, text_field), path, number,
                                    text_field, "data.text_field");
    if (!text.empty()) docs.push_back(std::move(text));
  });
  return docs;
}

std::vector<PromptCompletion> read_jsonl_pairs(const std::string& path,
                                               const std::string& prompt_field,
                                               const std::string& completion_field) {
  const std::string bytes = read_utf8_file(path);
  std::vector<PromptCompletion> pairs;
  for_each_line(bytes, [&](int64_t number, std::string_view line) {
    if (is_blank(line)) return;
    const nlohmann::json obj = jsonl_object(path, number, line, prompt_field);
    PromptCompletion p{jsonl_string(obj, path, number, prompt_field, "data.prompt_field"),
                       jsonl_string(obj, path, number, completion_field, "data.completion_field")};
    if (p.completion.empty()) {
      fail(ErrorKind::kInput, "{}:{}: field \"{}\" is empty: a completion is what trains", path,
           number, completion_field);
    }
    pairs.push_back(std::move(p));
  });
  return pairs;
}

}  // namespace dstrain::data
