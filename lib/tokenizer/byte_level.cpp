#include "tokenizer/byte_level.h"

#include "core/utf8.h"

namespace dstrain::tokenizer {
namespace {

// Code point of each byte's character.
std::array<char32_t, 256> make_byte_code_points() {
  std::array<char32_t, 256> cps{};
  auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  char32_t next_extra = 0x100;
  for (int b = 0; b < 256; ++b) cps[b] = printable(b) ? static_cast<char32_t>(b) : next_extra++;
  return cps;
}

const std::array<char32_t, 256>& byte_code_points() {
  static const std::array<char32_t, 256> cps = make_byte_code_points();
  return cps;
}

}  // namespace

const std::array<std::string, 256>& byte_symbols() {
  static const std::array<std::string, 256> symbols = [] {
    std::array<std::string, 256> s;
    for (int b = 0; b < 256; ++b) append_utf8(s[b], byte_code_points()[b]);
    return s;
  }();
  return symbols;
}

std::string bytes_to_symbols(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += byte_symbols()[b];
  return out;
}

std::optional<std::string> symbols_to_bytes(std::string_view symbols) {
  // Inverse table over the code points used (all below U+0144).
  static const std::array<int, 0x144> inverse = [] {
    std::array<int, 0x144> inv;
    inv.fill(-1);
    for (int b = 0; b < 256; ++b) inv[byte_code_points()[b]] = b;
    return inv;
  }();
  if (find_invalid_utf8(symbols)) return std::nullopt;
  std::string out;
  out.reserve(symbols.size());
  size_t pos = 0;
  while (pos < symbols.size()) {
    const char32_t cp = next_code_point(symbols, pos);
    if (cp >= inverse.size() || inverse[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(inverse[cp]));
  }
  return out;
}

}  // namespace dstrain::tokenizer
