#include "tokenizer/regex_classes.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"

namespace dstrain::tokenizer {
namespace {

using unicode::Range;

constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr Range kSurrogates{0xD800, 0xDFFF};

void sort_and_merge(std::vector<Range>& ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.first < b.first; });
  size_t out = 0;
  for (const Range& r : ranges) {
    if (out > 0 && r.first <= ranges[out - 1].last + 1) {
      ranges[out - 1].last = std::max(ranges[out - 1].last, r.last);
    } else {
      ranges[out++] = r;
    }
  }
  ranges.resize(out);
}

// The scalar values outside `ranges` (sorted and merged): surrogates are never listed, since PCRE2
// refuses them in a UTF pattern and well-formed UTF-8 cannot hold them.
std::vector<Range> complement(const std::vector<Range>& ranges) {
  std::vector<Range> gaps;
  char32_t next = 0;
  auto add_gap = [&](char32_t first, char32_t last) {
    if (first > last) return;
    if (last < kSurrogates.first || first > kSurrogates.last) {
      gaps.push_back({first, last});
      return;
    }
    if (first < kSurrogates.first) gaps.push_back({first, kSurrogates.first - 1});
    if (last > kSurrogates.last) gaps.push_back({kSurrogates.last + 1, last});
  };
  for (const Range& r : ranges) {
    if (r.first > next) add_gap(next, r.first - 1);
    next = r.last + 1;
  }
  if (next <= kMaxCodePoint) add_gap(next, kMaxCodePoint);
  return gaps;
}

// The code points in both sorted, merged lists.
std::vector<Range> intersect(const std::vector<Range>& a, const std::vector<Range>& b) {
  std::vector<Range> out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const char32_t first = std::max(a[i].first, b[j].first);
    const char32_t last = std::min(a[i].last, b[j].last);
    if (first <= last) out.push_back({first, last});
    (a[i].last < b[j].last ? i : j)++;
  }
  return out;
}

// The code points of `a` that are not in `b` (both sorted and merged, without surrogates).
std::vector<Range> subtract(const std::vector<Range>& a, const std::vector<Range>& b) {
  return intersect(a, complement(b));
}

void append_list(std::vector<Range>& out, const unicode::RangeList& list) {
  out.insert(out.end(), list.data, list.data + list.size);
}

// Ranges of a General_Category value of one letter (every value it starts) or two; false if
// unknown.
bool category_ranges(const std::string& name, std::vector<Range>& out) {
  if (name.empty() || name.size() > 2) return false;
  bool found = false;
  for (size_t i = 0; i < unicode::kGeneralCategoriesCount; ++i) {
    const unicode::NamedRanges& category = unicode::kGeneralCategories[i];
    const bool match = name.size() == 1 ? category.name[0] == name[0] : name == category.name;
    if (match) {
      append_list(out, category.ranges);
      found = true;
    }
  }
  return found;
}

// The ranges of a non-negated escape letter (s, d, h) or property name; false if not rewritten.
bool positive_ranges(char letter, const std::string& property, std::vector<Range>& out) {
  switch (letter) {
    case 's':
      append_list(out, {unicode::kWhiteSpace, unicode::kWhiteSpaceCount});
      return true;
    case 'd':
      return category_ranges("Nd", out);
    case 'h':
      out.insert(out.end(), {{'0', '9'}, {'A', 'F'}, {'a', 'f'}});
      return true;
    case 'p':
      return category_ranges(property, out);
    default:
      return false;
  }
}

// Length of the escape starting at pattern[pos] (a backslash) if it is one of ours, else 0.
size_t class_escape_length(const std::string& pattern, size_t pos) {
  if (pos + 1 >= pattern.size()) return 0;
  const char e = pattern[pos + 1];
  if (std::strchr("sSdDhH", e) != nullptr) return 2;
  if (e != 'p' && e != 'P') return 0;
  if (pos + 2 >= pattern.size()) return 0;
  if (pattern[pos + 2] != '{') return 3;
  const size_t close = pattern.find('}', pos + 3);
  return close == std::string::npos ? 0 : close - pos + 1;
}

std::string code_point(char32_t cp) {
  return fmt::format("\\x{{{:X}}}", static_cast<uint32_t>(cp));
}

std::string class_body(const std::vector<Range>& ranges) {
  std::string out;
  for (const Range& r : ranges) {
    out += code_point(r.first);
    if (r.last != r.first) out += "-" + code_point(r.last);
  }
  return out;
}

// A class escape of the pattern, parsed.
struct ClassEscape {
  std::vector<Range> ranges;  // what it matches before negation, sorted and merged
  bool negated = false;
  std::string category;  // the General_Category value of \p and \P, empty for \s, \d, \h
};

std::optional<ClassEscape> parse_class_escape(const std::string& escape) {
  if (escape.empty()) return std::nullopt;
  const char letter = escape[0];
  ClassEscape e;
  e.negated = letter == 'S' || letter == 'D' || letter == 'H' || letter == 'P';
  if (letter == 'p' || letter == 'P') {
    e.category = escape.size() > 2 && escape[1] == '{' && escape.back() == '}'
                     ? escape.substr(2, escape.size() - 3)
                     : escape.substr(1);
    if (!e.category.empty() && e.category[0] == '^') {
      e.negated = !e.negated;
      e.category.erase(0, 1);
    }
  } else if (escape.size() != 1) {
    return std::nullopt;
  }
  const char lower = static_cast<char>(letter | 0x20);  // the ASCII letter in lower case
  if (!positive_ranges(lower, e.category, e.ranges)) return std::nullopt;
  sort_and_merge(e.ranges);
  return e;
}

// How one escape is written: PCRE2's own `native` property (kept for speed where PCRE2's class
// is a subset of the reference's) plus explicit `ranges`, the whole negated by the enclosing
// bracket when `negate`. Inside a bracket a negated escape is always written as explicit ranges
// (the complement of a union member cannot be expressed by adding items).
struct Spelling {
  std::string native;
  std::vector<Range> ranges;
  bool negate = false;
};

Spelling spell(const ClassEscape& e, bool in_bracket, const EngineCategories& engine) {
  if (!e.category.empty() && engine && !(e.negated && in_bracket)) {
    const std::vector<Range>* own = engine(e.category);
    if (own != nullptr && subtract(*own, e.ranges).empty()) {
      return {"\\p{" + e.category + "}", subtract(e.ranges, *own), e.negated};
    }
  }
  return {"", e.negated ? complement(e.ranges) : e.ranges, false};
}

// Copies a pattern, rewriting class escapes; one instance per pattern.
class Rewriter {
 public:
  Rewriter(const std::string& pattern, const std::string& origin, const EngineCategories& engine)
      : pattern_(pattern), origin_(origin), engine_(engine) {}

  std::string run() {
    out_.reserve(pattern_.size());
    while (i_ < pattern_.size()) step();
    return out_;
  }

 private:
  void step() {
    const char c = pattern_[i_];
    if (c == '\\') {
      escape();
    } else if (!in_bracket_ && c == '[') {
      open_bracket();
    } else if (in_bracket_ && c == '[' && pattern_.compare(i_, 2, "[:") == 0) {
      copy_until(":]", 2);  // a POSIX class such as [:alpha:]
    } else if (in_bracket_ && c == ']') {
      sort_and_merge(bracket_ranges_);
      out_ += class_body(bracket_ranges_) + "]";
      in_bracket_ = false;
      ++i_;
    } else {
      out_ += c;
      ++i_;
    }
  }

  void escape() {
    if (pattern_.compare(i_, 2, "\\Q") == 0) return copy_until("\\E", 2);
    const size_t len = class_escape_length(pattern_, i_);
    const std::optional<ClassEscape> e =
        len > 0 ? parse_class_escape(pattern_.substr(i_ + 1, len - 1)) : std::nullopt;
    if (!e) {
      out_.append(pattern_, i_, std::min<size_t>(2, pattern_.size() - i_));  // \n, \x, \\ ...
      i_ += 2;
      return;
    }
    const Spelling s = spell(*e, in_bracket_, engine_);
    if (!in_bracket_) {
      out_ += std::string(s.negate ? "[^" : "[") + s.native + class_body(s.ranges) + "]";
      i_ += len;
      return;
    }
    if (out_.size() > bracket_start_ + 1 && out_.back() == '-' && out_[out_.size() - 2] != '\\') {
      fail(ErrorKind::kInput, "{}: a character range may not end in the class escape {}", origin_,
           pattern_.substr(i_, len));
    }
    out_ += s.native;
    bracket_ranges_.insert(bracket_ranges_.end(), s.ranges.begin(), s.ranges.end());
    i_ += len;
    if (i_ < pattern_.size() && pattern_[i_] == '-') {
      out_ += "\\-";  // literal after a class escape, but the ranges written later would take it
      ++i_;
    }
  }

  void open_bracket() {
    in_bracket_ = true;
    out_ += pattern_[i_++];
    if (i_ < pattern_.size() && pattern_[i_] == '^') out_ += pattern_[i_++];
    bracket_start_ = out_.size();
    bracket_ranges_.clear();
    if (i_ < pattern_.size() && pattern_[i_] == ']') out_ += pattern_[i_++];  // a literal ']'
  }

  // Copies from i_ through the next `end` (searched from i_ + skip), or to the end of the pattern.
  void copy_until(const char* end, size_t skip) {
    const size_t at = pattern_.find(end, i_ + skip);
    const size_t stop = at == std::string::npos ? pattern_.size() : at + std::strlen(end);
    out_.append(pattern_, i_, stop - i_);
    i_ = stop;
  }

  const std::string& pattern_;
  const std::string& origin_;
  const EngineCategories& engine_;
  std::string out_;
  size_t i_ = 0;
  bool in_bracket_ = false;
  size_t bracket_start_ = 0;           // output offset just past "[" or "[^"
  std::vector<Range> bracket_ranges_;  // explicit ranges of the bracket, written before its ']'
};

}  // namespace

std::vector<Range> unicode_class_ranges(const std::string& escape) {
  const std::optional<ClassEscape> e = parse_class_escape(escape);
  if (!e) return {};
  return e->negated ? complement(e->ranges) : e->ranges;
}

std::string rewrite_unicode_classes(const std::string& pattern, const std::string& origin,
                                    const EngineCategories& engine) {
  return Rewriter(pattern, origin, engine).run();
}

}  // namespace dstrain::tokenizer
