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

// What a source with a chat `messages` field or column but not the one asked for is told.
inline constexpr const char* kChatDataSentence =
    "chat data must be rendered to prompt/completion text first: dstrain applies no chat template "
    "(docs/data.md, \"Prompt and completion\")";

struct PromptCompletion {
  std::string prompt;
  std::string completion;
};

// JSON Lines of prompt/completion pairs (data.format: prompt_completion): each non-blank line a
// JSON object whose string fields `prompt_field` and `completion_field` are a pair. Error(kInput)
// "<file>:<line>: ..." naming the field for a missing field (kChatDataSentence when the object has
// `messages`), a field that is not a string and an empty completion.
std::vector<PromptCompletion> read_jsonl_pairs(const std::string& path,
                                               const std::string& prompt_field,
                                               const std::string& completion_field);

}  // namespace dstrain::data
