// NFC as the reference (unicode-normalization-alignments, Unicode 9.0 data) does it.

#include <gtest/gtest.h>

#include "core/utf8.h"
#include "tokenizer/nfc.h"

namespace dstrain::tokenizer {
namespace {

TEST(Nfc, ComposesDecomposesAndReorders) {
  EXPECT_EQ(nfc("e\u0301"), "\u00E9");
  EXPECT_EQ(nfc("a\u0301\u0323"), "\u1EA1\u0301");  // below (220) sorts before above (230)
  EXPECT_EQ(nfc("\u212B"), "\u00C5");               // ANGSTROM SIGN: a singleton
  EXPECT_EQ(nfc("\u0958"), "\u0915\u093C");         // excluded from composition
  EXPECT_EQ(nfc("\u1100\u1161\u11A8 \u1100\u1161"), "\uAC01 \uAC00");  // Hangul jamo
  EXPECT_EQ(nfc("\uAC00\u11A8"), "\uAC01");
  EXPECT_EQ(nfc("\u0301e"), "\u0301e");  // a leading mark has nothing to join
  EXPECT_EQ(nfc("a\u0308\u0301\u0308"), "\u00E4\u0301\u0308");  // blocked by the same class
}

TEST(Nfc, UsesUnicode9Data) {
  // U+0898 (Unicode 14) has class 230 today but 0 in Unicode 9: not moved before U+0345 (240).
  EXPECT_EQ(combining_class(0x0898), 0);
  EXPECT_EQ(combining_class(0x0301), 230);
  EXPECT_EQ(nfc("x\u0345\u0898"), "x\u0345\u0898");
  // DIVES AKURU VOWEL SIGN O is the composition of U+11935 U+11930 since Unicode 13.
  EXPECT_EQ(nfc("\U00011935\U00011930"), "\U00011935\U00011930");
  // U+1611E U+1611E composes to GURUNG KHEMA VOWEL SIGN U since Unicode 16.
  EXPECT_EQ(nfc("\U0001611E\U0001611E"), "\U0001611E\U0001611E");
}

TEST(Nfc, QuickCheckPassesNormalizedText) {
  for (const char* text : {"plain ascii", "日本語のテキスト", "한국어 문장", "é", "Ω", "مرحبا"}) {
    EXPECT_TRUE(nfc_quick_check(text)) << text;
    EXPECT_EQ(nfc(text), text);
  }
  EXPECT_FALSE(nfc_quick_check("e\u0301"));        // may compose
  EXPECT_FALSE(nfc_quick_check("a\u0301\u0323"));  // classes out of order
  EXPECT_FALSE(nfc_quick_check("\u212B"));         // never survives NFC
}

TEST(Nfc, IsIdempotentForEveryCodePointAfterALetterAndAMark) {
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string text = "a";
    append_utf8(text, cp);
    text += "\u0345";
    append_utf8(text, cp);
    const std::string once = nfc(text);
    ASSERT_EQ(nfc(once), once) << std::hex << static_cast<uint32_t>(cp);
  }
}

}  // namespace
}  // namespace dstrain::tokenizer
