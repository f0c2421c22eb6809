#pragma once
// Small text helpers shared by the launcher's line-oriented file parsers (hostfile, .dstrain_env).

#include <string>
#include <vector>

namespace dstrain::launcher {

// The line without a `#` comment and without surrounding whitespace.
std::string strip_comment(const std::string& line);

// Whitespace-separated words.
std::vector<std::string> split_words(const std::string& text);

// Splits on `sep`, keeping empty pieces ("a,,b" → {"a", "", "b"}).
std::vector<std::string> split(const std::string& text, char sep);

// Strict base-10 int: digits only (optional leading '-'), no overflow. False otherwise.
bool parse_int(const std::string& text, int* out);

// The whole file; Error(kInput) naming `what` and the path when it cannot be read.
std::string read_text_file(const std::string& path, const char* what);

}  // namespace dstrain::launcher
