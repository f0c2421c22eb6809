#pragma once
// GPT-2's reversible map between bytes and printable characters ("bytes_to_unicode"). Byte-level
// BPE vocabularies store tokens as strings of these characters: the 188 printable bytes map to the
// character with the same code, the other 68 (controls, space, 0x7F-0xA0, 0xAD) map in byte order
// to U+0100, U+0101, ... (so a space is "Ġ" = U+0120 and a newline "Ċ" = U+010A).

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace dstrain::tokenizer {

// UTF-8 encoding of the character that stands for each byte.
const std::array<std::string, 256>& byte_symbols();

// The byte-level string of raw bytes (each byte replaced by its character).
std::string bytes_to_symbols(std::string_view bytes);

// The raw bytes of a byte-level token string, or nullopt when the string is not well-formed UTF-8
// or contains a character outside the map.
std::optional<std::string> symbols_to_bytes(std::string_view symbols);

}  // namespace dstrain::tokenizer
