#pragma once
// Reading raw documents from text and JSONL files. Both check UTF-8 validity of the whole file
// first, so a bad byte is reported as "<file>: invalid UTF-8 at byte offset N (line L)". Empty
// documents (an empty file, an empty line) are skipped: they hold no token to train on.

#include <string>
#include <vector>

namespace dstrain::data {

enum class DocumentUnit { kFile, kLine };

// "file" | "line"; Error(kConfig) naming the value otherwise.
DocumentUnit parse_document_unit(const std::string& value);

// Plain text: the whole file is one document (kFile), or each non-empty line is one (kLine; the
// line ending, "\n" or "\r\n", is not part of the document). Error(kInput) for a missing file or
// bad UTF-8.
std::vector<std::string> read_text_documents(const std::string& path, DocumentUnit unit);

// JSON Lines: each non-blank line is a JSON object whose string field `text_field` is one document.
// Error(kInput) "<file>:<line>: ..." for a line that is not JSON, not an object, or lacks the
// field.
std::vector<std::string> read_jsonl_documents(const std::string& path,
                                              const std::string& text_field);

}  // namespace dstrain::data
