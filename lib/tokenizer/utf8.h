#pragma once
// UTF-8 helpers for the tokenizer. The BPE encoder validates its whole input once, up front, so
// that the regex engine can skip its own checks and so that the error names the exact byte offset.

#include <cstddef>
#include <string>
#include <string_view>

namespace dstrain::tokenizer {

inline constexpr size_t kValidUtf8 = std::string_view::npos;

// Byte offset of the first byte that does not belong to a well-formed UTF-8 sequence (overlong
// forms, surrogates, code points above U+10FFFF and truncated sequences are ill-formed), or
// kValidUtf8 when the whole text is well-formed.
size_t find_invalid_utf8(std::string_view text);

// Appends the UTF-8 encoding of `cp` (which must be a Unicode scalar value).
void append_utf8(std::string& out, char32_t cp);

// Decodes the code point starting at text[pos] and advances pos past it. Precondition: the text is
// well-formed UTF-8 (checked by find_invalid_utf8).
char32_t next_code_point(std::string_view text, size_t& pos);

// True when every byte is < 0x80 (ASCII text is already in every Unicode normal form).
bool is_ascii(std::string_view text);

}  // namespace dstrain::tokenizer
