#include "tokenizer/nfc.h"

#include <algorithm>
#include <utility>

#include "core/utf8.h"
#include "tokenizer/unicode_tables.h"

namespace dstrain::tokenizer {
namespace {

// Hangul syllables decompose into and compose from jamo arithmetically (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// Every code point below U+0300 has combining class 0 and NFC quick check Yes.
constexpr char32_t kFirstNormalizing = 0x300;

bool in_ranges(const unicode::Range* ranges, size_t count, char32_t cp) {
  const unicode::Range* end = ranges + count;
  const unicode::Range* next = std::upper_bound(
      ranges, end, cp, [](char32_t c, const unicode::Range& r) { return c < r.first; });
  return next != ranges && cp <= (next - 1)->last;
}

const unicode::Decomposition* find_decomposition(char32_t cp) {
  const unicode::Decomposition* end = unicode::kDecompositions + unicode::kDecompositionsCount;
  const unicode::Decomposition* it =
      std::lower_bound(unicode::kDecompositions, end, cp,
                       [](const unicode::Decomposition& d, char32_t c) { return d.cp < c; });
  return it != end && it->cp == cp ? it : nullptr;
}

// Appends the full canonical decomposition of `cp`.
void decompose(char32_t cp, std::u32string& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out += kLBase + s / kNCount;
    out += kVBase + (s % kNCount) / kTCount;
    if (s % kTCount != 0) out += kTBase + s % kTCount;
  } else if (const unicode::Decomposition* d = find_decomposition(cp)) {
    decompose(d->first, out);
    if (d->second != 0) decompose(d->second, out);
  } else {
    out += cp;
  }
}

// Canonical ordering: each run of non-starters is stably sorted by combining class.
void reorder(std::u32string& s) {
  for (size_t i = 1; i < s.size(); ++i) {
    const int ccc = combining_class(s[i]);
    for (size_t j = i; ccc != 0 && j > 0 && combining_class(s[j - 1]) > ccc; --j) {
      std::swap(s[j - 1], s[j]);
    }
  }
}

// The primary composite of the pair, or 0 when there is none.
char32_t composite_of(char32_t first, char32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase &&
      second < kVBase + kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 &&
      second > kTBase && second < kTBase + kTCount) {
    return first + (second - kTBase);
  }
  const unicode::Composition* end = unicode::kCompositions + unicode::kCompositionsCount;
  const unicode::Composition* it =
      std::lower_bound(unicode::kCompositions, end, std::make_pair(first, second),
                       [](const unicode::Composition& c, const std::pair<char32_t, char32_t>& key) {
                         return std::make_pair(c.first, c.second) < key;
                       });
  return it != end && it->first == first && it->second == second ? it->composite : 0;
}

// Canonical composition of a decomposed, reordered string: each character joins the last starter
// when a primary composite exists and no character between them blocks it (a starter, or a mark of
// the same or a higher class).
void compose(std::u32string& s) {
  if (s.empty()) return;
  size_t starter = 0;
  int last_ccc = combining_class(s[0]) == 0 ? 0 : 256;  // a leading mark has no starter
  size_t out = 1;
  for (size_t i = 1; i < s.size(); ++i) {
    const char32_t c = s[i];
    const int ccc = combining_class(c);
    const char32_t composite = composite_of(s[starter], c);
    if (composite != 0 && (last_ccc == 0 || last_ccc < ccc)) {
      s[starter] = composite;
      continue;
    }
    if (ccc == 0) starter = out;
    last_ccc = ccc;
    s[out++] = c;
  }
  s.resize(out);
}

}  // namespace

int combining_class(char32_t cp) {
  if (cp < kFirstNormalizing) return 0;
  const unicode::CombiningClass* end = unicode::kCombiningClasses + unicode::kCombiningClassesCount;
  const unicode::CombiningClass* it =
      std::lower_bound(unicode::kCombiningClasses, end, cp,
                       [](const unicode::CombiningClass& e, char32_t c) { return e.cp < c; });
  return it != end && it->cp == cp ? it->ccc : 0;
}

bool nfc_quick_check(std::string_view text) {
  int last_ccc = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const char32_t cp = next_code_point(text, pos);
    if (cp < kFirstNormalizing) {
      last_ccc = 0;
      continue;
    }
    if (in_ranges(unicode::kNfcQuickCheckNotYes, unicode::kNfcQuickCheckNotYesCount, cp)) {
      return false;
    }
    const int ccc = combining_class(cp);
    if (ccc != 0 && last_ccc > ccc) return false;
    last_ccc = ccc;
  }
  return true;
}

std::string nfc(std::string_view text) {
  if (nfc_quick_check(text)) return std::string(text);
  std::u32string code_points;
  code_points.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) decompose(next_code_point(text, pos), code_points);
  reorder(code_points);
  compose(code_points);
  std::string out;
  out.reserve(text.size() + 8);
  for (char32_t cp : code_points) append_utf8(out, cp);
  return out;
}

}  // namespace dstrain::tokenizer
