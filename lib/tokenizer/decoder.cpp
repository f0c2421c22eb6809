#include "tokenizer/decoder.h"

#include <optional>

#include "core/utf8.h"
#include "tokenizer/normalizer.h"

namespace dstrain::tokenizer {
namespace {

using Tokens = std::vector<std::string>;

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The byte of a "<0xXX>" token. The two characters are read as the reference reads them (an
// unsigned base-16 number, either case, a leading '+' allowed), so "<0x+A>" is byte 0x0A too.
std::optional<unsigned char> byte_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return std::nullopt;
  const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
  if (lo < 0) return std::nullopt;
  if (t[3] == '+') return static_cast<unsigned char>(lo);
  if (hi < 0) return std::nullopt;
  return static_cast<unsigned char>(hi * 16 + lo);
}

void flush_bytes(std::string& bytes, Tokens& out) {
  if (bytes.empty()) return;
  if (!find_invalid_utf8(bytes)) {
    out.push_back(bytes);
  } else {
    for (size_t i = 0; i < bytes.size(); ++i) out.emplace_back("\xEF\xBF\xBD");  // U+FFFD
  }
  bytes.clear();
}

Tokens byte_fallback(Tokens tokens) {
  Tokens out;
  std::string bytes;
  for (std::string& t : tokens) {
    if (const std::optional<unsigned char> b = byte_token(t)) {
      bytes.push_back(static_cast<char>(*b));
      continue;
    }
    flush_bytes(bytes, out);
    out.push_back(std::move(t));
  }
  flush_bytes(bytes, out);
  return out;
}

// Cuts up to `start` leading and `stop` trailing copies of the character `c` (UTF-8) off `t`.
std::string strip(const std::string& t, const std::string& c, size_t start, size_t stop) {
  size_t begin = 0, end = t.size();
  for (size_t i = 0; i < start && t.compare(begin, c.size(), c) == 0; ++i) begin += c.size();
  for (size_t i = 0;
       i < stop && end >= begin + c.size() && t.compare(end - c.size(), c.size(), c) == 0; ++i) {
    end -= c.size();
  }
  return t.substr(begin, end - begin);
}

Tokens metaspace(Tokens tokens, const MetaspaceSpec& spec) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    const bool drop = i == 0 && spec.prepend_scheme != PrependScheme::kNever;
    tokens[i] = replace_all(tokens[i], spec.replacement, drop ? "" : " ");
  }
  return tokens;
}

Tokens apply(const DecoderStep& step, Tokens tokens) {
  switch (step.kind) {
    case DecoderStep::Kind::kReplace:
      for (std::string& t : tokens) t = replace_all(t, step.pattern, step.content);
      return tokens;
    case DecoderStep::Kind::kByteFallback:
      return byte_fallback(std::move(tokens));
    case DecoderStep::Kind::kFuse: {
      std::string all;
      for (const std::string& t : tokens) all += t;
      return Tokens{std::move(all)};
    }
    case DecoderStep::Kind::kStrip:
      for (std::string& t : tokens) t = strip(t, step.content, step.start, step.stop);
      return tokens;
    case DecoderStep::Kind::kMetaspace:
      return metaspace(std::move(tokens), step.metaspace);
  }
  return tokens;
}

}  // namespace

std::string Decoder::decode(std::vector<std::string> tokens) const {
  std::string out;
  if (!steps_) {
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const DecoderStep& step : *steps_) tokens = apply(step, std::move(tokens));
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace dstrain::tokenizer
