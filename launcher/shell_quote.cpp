#include "launcher/shell_quote.h"

namespace dstrain::launcher {
namespace {

bool is_safe(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '_':
    case '-':
    case '.':
    case '/':
    case ':':
    case ',':
    case '+':
    case '=':
    case '@':
    case '%':
      return true;
    default:
      return false;
  }
}

}  // namespace

std::string shell_quote(std::string_view word) {
  bool safe = !word.empty();
  for (char c : word) safe = safe && is_safe(c);
  if (safe) return std::string(word);
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  out += '\'';
  return out;
}

std::string shell_join(const std::vector<std::string>& words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > 0) out += ' ';
    out += shell_quote(words[i]);
  }
  return out;
}

}  // namespace dstrain::launcher
