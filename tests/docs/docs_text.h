#pragma once
// Reading the documentation for the docs tests: files of the source tree, a section under a
// heading, the rows of a Markdown table, and the `code` spans of a text.

#include <string>
#include <vector>

namespace dstrain::testing {

// The text of `relative` (a path under the source tree); a test failure when it cannot be read.
std::string source_file(const std::string& relative);

// README.md and every docs/*.md, concatenated.
std::string all_docs();

// The lines after the heading line `heading` (e.g. "## Exit codes") up to the next heading of the
// same or a higher level; "" (and a test failure naming `where`) when there is no such heading.
std::string section(const std::string& text, const std::string& heading, const std::string& where);

// The cells of each Markdown table row in `text` ("| a | b |" lines, header and separator rows
// left out), trimmed.
std::vector<std::vector<std::string>> table_rows(const std::string& text);

// Every `code` span of `text`, in order.
std::vector<std::string> code_spans(const std::string& text);

// The text between the first `start` and the next `end` after it ("" when either is missing).
std::string between(const std::string& text, const std::string& start, const std::string& end);

}  // namespace dstrain::testing
