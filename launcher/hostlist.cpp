#include "launcher/hostlist.h"

#include <fmt/format.h>

#include "core/error.h"
#include "launcher/text_util.h"

namespace dstrain::launcher {
namespace {

constexpr size_t kMaxHosts = 1 << 20;  // a typo like [1-999999999] must not exhaust memory

[[noreturn]] void bad(const std::string& expr, const std::string& why) {
  fail(ErrorKind::kInput, "bad Slurm hostlist '{}': {}", expr, why);
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// "01-04,07" → {"01","02","03","04","07"}.
std::vector<std::string> expand_ranges(const std::string& body, const std::string& expr) {
  std::vector<std::string> out;
  for (const std::string& piece : split(body, ',')) {
    size_t dash = piece.find('-');
    std::string lo = piece.substr(0, dash);
    std::string hi = dash == std::string::npos ? lo : piece.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi) || lo.size() > 9 || hi.size() > 9) {
      bad(expr, fmt::format("'{}' is not a number or a range a-b", piece));
    }
    long first = std::stol(lo);
    long last = std::stol(hi);
    if (last < first) bad(expr, fmt::format("range '{}' goes backwards", piece));
    if (static_cast<size_t>(last - first) > kMaxHosts) bad(expr, "range too large");
    for (long i = first; i <= last; ++i) {
      out.push_back(fmt::format("{:0{}}", i, static_cast<int>(lo.size())));
    }
  }
  return out;
}

// One name with zero or more bracket groups → its hosts.
std::vector<std::string> expand_name(const std::string& name, const std::string& expr) {
  std::vector<std::string> prefixes = {""};
  size_t pos = 0;
  while (pos < name.size()) {
    size_t open = name.find('[', pos);
    std::string literal =
        name.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    if (literal.find(']') != std::string::npos) bad(expr, "']' without '['");
    for (std::string& p : prefixes) p += literal;
    if (open == std::string::npos) break;
    size_t close = name.find(']', open);
    if (close == std::string::npos) bad(expr, "'[' without ']'");
    std::vector<std::string> numbers = expand_ranges(name.substr(open + 1, close - open - 1), expr);
    std::vector<std::string> next;
    for (const std::string& p : prefixes) {
      for (const std::string& n : numbers) next.push_back(p + n);
    }
    if (next.size() > kMaxHosts) bad(expr, "too many hosts");
    prefixes = std::move(next);
    pos = close + 1;
  }
  return prefixes;
}

// Splits at commas outside brackets.
std::vector<std::string> top_level_names(const std::string& expr) {
  std::vector<std::string> names;
  std::string current;
  int depth = 0;
  for (char c : expr) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) bad(expr, "unbalanced or nested brackets");
    if (c == ',' && depth == 0) {
      names.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (depth != 0) bad(expr, "'[' without ']'");
  names.push_back(current);
  return names;
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& expression) {
  std::string expr = strip_comment(expression);
  if (expr.empty()) bad(expression, "empty");
  std::vector<std::string> hosts;
  for (const std::string& name : top_level_names(expr)) {
    if (name.empty()) bad(expr, "empty host name");
    for (std::string& h : expand_name(name, expr)) {
      if (h.empty()) bad(expr, "empty host name");
      hosts.push_back(std::move(h));
    }
  }
  return hosts;
}

}  // namespace dstrain::launcher
