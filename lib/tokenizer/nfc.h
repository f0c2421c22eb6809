#pragma once
// Unicode NFC normalization (the normalizer of Qwen2 and others), as the reference does it: with
// Unicode 9.0 data, the version of the unicode-normalization-alignments crate inside Hugging Face
// `tokenizers`. Characters added since 9.0 have combining class 0 and no decomposition or
// composition there, so e.g. a mark added in Unicode 14 is not moved before a U+0345 that
// precedes it, and U+11935 U+11930 (a Unicode 13 composition) stays two characters. The tables are
// generated (unicode_tables.h); no system library is consulted, so the result does not depend on
// the ICU or glibc installed.

#include <string>
#include <string_view>

namespace dstrain::tokenizer {

// NFC form of well-formed UTF-8 `text`. Text that passes the quick check (ASCII, and most text in
// any script) comes back unchanged without a full normalization pass.
std::string nfc(std::string_view text);

// True when `text` (well-formed UTF-8) is certainly in NFC: every code point's NFC_Quick_Check is
// Yes and combining classes never decrease between marks. False means "normalize to find out".
bool nfc_quick_check(std::string_view text);

// The canonical combining class of `cp` (Unicode 9.0; 0 for any character added later).
int combining_class(char32_t cp);

}  // namespace dstrain::tokenizer
