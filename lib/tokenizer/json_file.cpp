#include "tokenizer/json_file.h"

#include <limits>

#include "core/error.h"
#include "core/fs.h"

namespace dstrain::tokenizer {
namespace {

[[noreturn]] void wrong_type(const nlohmann::json& value, const std::string& origin,
                             const char* expected) {
  fail(ErrorKind::kInput, "{}: expected {}, got {}", origin, expected, value.type_name());
}

}  // namespace

nlohmann::json read_json_file(const std::filesystem::path& path) {
  const std::string text = fs::read_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(ErrorKind::kInput, "{}: not valid JSON: {}", path.string(), e.what());
  }
}

const nlohmann::json& expect_object(const nlohmann::json& value, const std::string& origin) {
  if (!value.is_object()) wrong_type(value, origin, "a JSON object");
  return value;
}

const nlohmann::json& expect_array(const nlohmann::json& value, const std::string& origin) {
  if (!value.is_array()) wrong_type(value, origin, "a JSON array");
  return value;
}

const std::string& expect_string(const nlohmann::json& value, const std::string& origin) {
  if (!value.is_string()) wrong_type(value, origin, "a string");
  return value.get_ref<const std::string&>();
}

int32_t expect_id(const nlohmann::json& value, const std::string& origin) {
  if (!value.is_number_integer()) wrong_type(value, origin, "an integer token id");
  const auto id = value.get<int64_t>();
  if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
    fail(ErrorKind::kInput, "{}: token id {} is out of range (expected 0..2^31-1)", origin, id);
  }
  return static_cast<int32_t>(id);
}

}  // namespace dstrain::tokenizer
