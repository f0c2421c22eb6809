#pragma once
// Reading the JSON files of a tokenizer directory, with errors that name the file and the key.

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace dstrain::tokenizer {

// Parsed content of `path`; Error(kInput) naming the file and the parser's message when it is not
// valid JSON, Error(kIo) when it cannot be read.
nlohmann::json read_json_file(const std::filesystem::path& path);

// `value` as an object / array / string / integer id; otherwise Error(kInput) "<origin>: expected
// <what>, got <type>".
const nlohmann::json& expect_object(const nlohmann::json& value, const std::string& origin);
const nlohmann::json& expect_array(const nlohmann::json& value, const std::string& origin);
const std::string& expect_string(const nlohmann::json& value, const std::string& origin);
int32_t expect_id(const nlohmann::json& value, const std::string& origin);

}  // namespace dstrain::tokenizer
