#pragma once
// The pre-tokenizer's split regex, run by PCRE2 (UTF + UCP, JIT-compiled when the platform
// supports it) after its Unicode class escapes (\p{L}, \p{N}, \s, ...) have been replaced by the
// reference's Unicode 16.0 classes (regex_classes.h), so that it splits as Hugging Face
// `tokenizers` (Oniguruma) does.

#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;

namespace dstrain::tokenizer {

// GPT-2's pattern (also the ByteLevel pre-tokenizer's default when use_regex is true).
inline constexpr const char* kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Qwen2's pattern: case-insensitive contractions, single digits, newlines kept with punctuation.
inline constexpr const char* kQwen2SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

class SplitRegex {
 public:
  // `literal` matches the pattern as a plain string. Error(kInput) naming `origin` (the file and
  // key it came from) and PCRE2's message when the pattern does not compile.
  SplitRegex(const std::string& pattern, bool literal, const std::string& origin);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Appends to `pieces` every match and every non-empty gap between matches, in order, so the
  // pieces concatenate back to `text` (the "Isolated" split behaviour). `text` must be well-formed
  // UTF-8 (not re-checked). Thread-safe.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

 private:
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
};

}  // namespace dstrain::tokenizer
