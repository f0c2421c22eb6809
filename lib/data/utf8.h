#pragma once
// UTF-8 validation. Text sources are checked before tokenizing so that a bad byte is reported with
// its file and byte offset instead of surfacing later as a tokenizer error without a location.

#include <cstddef>
#include <optional>
#include <string_view>

namespace dstrain::data {

// Offset of the first byte that does not start or continue a well-formed UTF-8 sequence (RFC 3629:
// no overlong forms, no surrogates, nothing above U+10FFFF), or nullopt when `text` is valid.
std::optional<size_t> find_invalid_utf8(std::string_view text);

}  // namespace dstrain::data
