#pragma once
// UTF-8 validation and coding, shared by the tokenizer and the data sources. Text is validated
// once, up front, so that a bad byte is reported with its exact offset (and, by the data sources,
// its file) instead of surfacing later as an error without a location, and so that the decoding
// helpers below may assume well-formed input.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace dstrain {

// Byte offset of the first byte that does not belong to a well-formed UTF-8 sequence (RFC 3629 /
// Unicode section 3.9: overlong forms, surrogates, code points above U+10FFFF and truncated
// sequences are ill-formed), or nullopt when the whole text is well-formed.
std::optional<size_t> find_invalid_utf8(std::string_view text);

// Appends the UTF-8 encoding of `cp` (which must be a Unicode scalar value).
void append_utf8(std::string& out, char32_t cp);

// Decodes the code point starting at text[pos] and advances pos past it. Precondition: the text is
// well-formed UTF-8 (checked by find_invalid_utf8).
char32_t next_code_point(std::string_view text, size_t& pos);

// True when every byte is < 0x80 (ASCII text is already in every Unicode normal form).
bool is_ascii(std::string_view text);

}  // namespace dstrain
