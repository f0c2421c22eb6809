#include "core/utf8.h"

#include <gtest/gtest.h>

namespace dstrain {
namespace {

TEST(Utf8, WellFormedTextHasNoInvalidOffset) {
  EXPECT_EQ(find_invalid_utf8("plain ascii"), std::nullopt);
  EXPECT_EQ(find_invalid_utf8("日本 👩‍👧 é \xF4\x8F\xBF\xBF"),
            std::nullopt);  // includes U+10FFFF
  EXPECT_EQ(find_invalid_utf8(""), std::nullopt);
}

TEST(Utf8, ReportsOffsetOfFirstIllFormedByte) {
  EXPECT_EQ(find_invalid_utf8("ab\xFF"
                              "cd"),
            2u);                                         // never valid
  EXPECT_EQ(find_invalid_utf8("abc\xE6\x97"), 3u);       // truncated at end
  EXPECT_EQ(find_invalid_utf8("a\xC0\xAF"), 1u);         // overlong '/'
  EXPECT_EQ(find_invalid_utf8("xy\xED\xA0\x80"), 2u);    // UTF-16 surrogate
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("é\x80"), 2u);             // stray continuation byte
}

TEST(Utf8, AsciiIsOnlyBytesBelow0x80) {
  EXPECT_TRUE(is_ascii("plain ascii\x7F"));
  EXPECT_TRUE(is_ascii(""));
  EXPECT_FALSE(is_ascii("caf\xC3\xA9"));
}

TEST(Utf8, EncodeDecodeRoundTrip) {
  for (char32_t cp : {U'A', U'\u00E9', U'\u65E5', U'\U0001F469', U'\U0010FFFF'}) {
    std::string s;
    append_utf8(s, cp);
    size_t pos = 0;
    EXPECT_EQ(next_code_point(s, pos), cp);
    EXPECT_EQ(pos, s.size());
  }
}

}  // namespace
}  // namespace dstrain
