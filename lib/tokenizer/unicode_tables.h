#pragma once
// Unicode data of the reference tokenizer (Hugging Face `tokenizers` 0.23.3), generated into
// unicode_tables.cpp by scripts/gen-unicode-tables.py. The reference mixes two Unicode versions and
// so do these tables, on purpose: its split regex (Oniguruma 6.9.10) classifies characters by
// Unicode 16.0, while its NFC (the unicode-normalization-alignments crate) has Unicode 9.0 data, so
// marks added since 9.0 are starters there and are neither reordered nor composed. Matching the
// reference id for id means keeping both; the libraries on the system (PCRE2 10.42: Unicode 14,
// ICU 72: Unicode 15) agree with neither.
//
// Every array is sorted by its first field; ranges are inclusive and never hold a surrogate.

#include <cstddef>
#include <cstdint>

namespace dstrain::tokenizer::unicode {

struct Range {
  char32_t first, last;
};
inline bool operator==(const Range& a, const Range& b) {
  return a.first == b.first && a.last == b.last;
}

struct RangeList {
  const Range* data;
  size_t size;
};

// Unicode 16.0, for the split regex.
struct NamedRanges {
  const char* name;  // two-letter General_Category value: "Lu", "Nd", ... ("Cs" is left out)
  RangeList ranges;
};
extern const NamedRanges kGeneralCategories[];
extern const size_t kGeneralCategoriesCount;
extern const Range kWhiteSpace[];  // the White_Space property: what Oniguruma's \s matches
extern const size_t kWhiteSpaceCount;

// Unicode 9.0, for NFC.
struct CombiningClass {
  char32_t cp;
  uint8_t ccc;  // never 0 (absent code points have class 0)
};
struct Decomposition {
  char32_t cp;
  char32_t first;
  char32_t second;  // 0 for a singleton mapping
};
struct Composition {
  char32_t first, second, composite;  // sorted by (first, second); Hangul is algorithmic
};
extern const CombiningClass kCombiningClasses[];
extern const size_t kCombiningClassesCount;
extern const Decomposition kDecompositions[];  // canonical mappings, one level (apply recursively)
extern const size_t kDecompositionsCount;
extern const Composition kCompositions[];  // primary composites only (no exclusions)
extern const size_t kCompositionsCount;
// Code points whose NFC_Quick_Check is No or Maybe (including Hangul vowel and trailing jamo).
extern const Range kNfcQuickCheckNotYes[];
extern const size_t kNfcQuickCheckNotYesCount;

}  // namespace dstrain::tokenizer::unicode
