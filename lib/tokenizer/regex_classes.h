#pragma once
// Makes a split regex classify characters as the reference does. Hugging Face `tokenizers` runs
// split patterns with Oniguruma, whose \p{L}, \p{N}, \s, ... follow Unicode 16.0; PCRE2 10.42 (our
// engine) follows Unicode 14.0 and counts U+180E as a space. Rather than trust any library's
// tables, the Unicode class escapes of the pattern are replaced by explicit code point classes
// built from the generated tables (unicode_tables.h), so the split does not depend on the PCRE2
// version installed. The rest of the pattern is left to PCRE2, whose backtracking and
// leftmost-first alternation agree with Oniguruma's.

#include <functional>
#include <string>
#include <vector>

#include "tokenizer/unicode_tables.h"

namespace dstrain::tokenizer {

// Code point ranges of a class escape as Oniguruma (Unicode 16.0) reads it, or an empty vector
// when `escape` is not one this module rewrites. `escape` is the text after the backslash:
// "s", "S" (White_Space), "d", "D" (Nd), "h", "H" (Oniguruma's hex digit, [0-9A-Fa-f]), and
// "p{X}", "P{X}", "p{^X}", "pX" for a General_Category value X: one letter (L, M, N, P, S, Z, C)
// or two (Lu, Nd, ...; not Cs). Sorted, merged, without surrogates.
std::vector<unicode::Range> unicode_class_ranges(const std::string& escape);

// The regex engine's own ranges for a General_Category value (\p{Lu}, \p{L}), or null when it is
// not known. Where the engine's class is a subset of the reference's, the rewrite keeps the
// engine's \p{X}, which it matches far faster than a long list of ranges, and adds only the missing
// ranges.
using EngineCategories = std::function<const std::vector<unicode::Range>*(const std::string&)>;

// `pattern` (PCRE2 syntax) with every rewritable class escape replaced: outside brackets by a
// bracketed class, inside brackets by the ranges themselves (merged per bracket), in either case
// with the engine's own \p{X} kept where `engine` allows (see above). Escaped characters,
// \Q...\E quotes and POSIX [:name:] items are copied unchanged, as are escapes that are not
// rewritten (\w, \b, \p{Han}: PCRE2's own tables, see docs/tokenizers.md). Error(kInput) naming
// `origin` when a class escape ends a character range ([a-\s]), which PCRE2 would refuse too.
std::string rewrite_unicode_classes(const std::string& pattern, const std::string& origin,
                                    const EngineCategories& engine = {});

}  // namespace dstrain::tokenizer
