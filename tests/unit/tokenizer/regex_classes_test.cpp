// The split regex's Unicode classes: the rewrite of \p{..}, \s, ... into the reference's Unicode
// 16.0 classes, and the classes PCRE2 then really matches, checked over every scalar value.

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/utf8.h"
#include "tokenizer/regex_classes.h"
#include "tokenizer/split_regex.h"

namespace dstrain::tokenizer {
namespace {

using unicode::Range;

bool contains(const std::vector<Range>& ranges, char32_t cp) {
  for (const Range& r : ranges) {
    if (cp >= r.first && cp <= r.last) return true;
  }
  return false;
}

std::string every_scalar_value() {
  std::string text;
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp < 0xD800 || cp > 0xDFFF) append_utf8(text, cp);
  }
  return text;
}

// The code points at which each piece of `pattern`'s split of every scalar value starts.
std::vector<char32_t> piece_starts(const std::string& pattern) {
  static const std::string text = every_scalar_value();
  SplitRegex regex(pattern, false, "test");
  std::vector<std::string_view> pieces;
  regex.split(text, pieces);
  std::vector<char32_t> starts;
  for (std::string_view piece : pieces) {
    size_t pos = 0;
    starts.push_back(next_code_point(piece, pos));
  }
  return starts;
}

// Where membership in `ranges` changes along the scalar values, i.e. where the maximal runs of
// members and of non-members start.
std::vector<char32_t> run_starts(const std::vector<Range>& ranges) {
  std::vector<bool> member(0x110000, false);
  for (const Range& r : ranges) {
    for (char32_t cp = r.first; cp <= r.last; ++cp) member[cp] = true;
  }
  std::vector<char32_t> starts{0};
  char32_t previous = 0;
  for (char32_t cp = 1; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    if (member[cp] != member[previous]) starts.push_back(cp);
    previous = cp;
  }
  return starts;
}

TEST(UnicodeClassRanges, FollowUnicode16AndWhiteSpace) {
  const std::vector<Range> letters = unicode_class_ranges("p{L}");
  EXPECT_TRUE(contains(letters, U'a'));
  EXPECT_TRUE(contains(letters, 0x1C89));   // CYRILLIC CAPITAL LETTER TJE, Unicode 16.0
  EXPECT_TRUE(contains(letters, 0x10D50));  // GARAY CAPITAL LETTER A, Unicode 16.0
  EXPECT_FALSE(contains(letters, U'1'));
  EXPECT_TRUE(contains(unicode_class_ranges("p{N}"), 0x10D40));  // GARAY DIGIT ZERO
  EXPECT_TRUE(contains(unicode_class_ranges("pN"), U'7'));

  const std::vector<Range> space = unicode_class_ranges("s");
  EXPECT_TRUE(contains(space, U'\t') && contains(space, 0x85) && contains(space, 0x3000));
  EXPECT_FALSE(contains(space, 0x180E));  // MONGOLIAN VOWEL SEPARATOR left White_Space in 6.3
  EXPECT_FALSE(contains(space, 0x200B));  // ZERO WIDTH SPACE never was
  size_t count = 0;
  for (const Range& r : space) count += r.last - r.first + 1;
  EXPECT_EQ(count, 25u);
}

TEST(UnicodeClassRanges, NegationsAreComplementsWithoutSurrogates) {
  EXPECT_EQ(unicode_class_ranges("P{L}").size(), unicode_class_ranges("p{^L}").size());
  const std::vector<Range> not_space = unicode_class_ranges("S");
  EXPECT_FALSE(contains(not_space, U' '));
  EXPECT_FALSE(contains(not_space, 0xD800));
  EXPECT_TRUE(contains(not_space, 0xD7FF) && contains(not_space, 0xE000));
  EXPECT_TRUE(contains(not_space, 0x10FFFF));
  EXPECT_EQ(unicode_class_ranges("h"), (std::vector<Range>{{'0', '9'}, {'A', 'F'}, {'a', 'f'}}));
}

TEST(UnicodeClassRanges, OtherEscapesAreNotRewritten) {
  for (const char* escape : {"w", "b", "p{Han}", "p{Cs}", "p{Lx}", "x{41}", "p{}"}) {
    EXPECT_TRUE(unicode_class_ranges(escape).empty()) << escape;
  }
}

TEST(RewriteUnicodeClasses, LeavesEscapedBackslashesQuotesAndPosixClassesAlone) {
  for (const char* pattern :
       {R"(\\p{L})", R"(\Q\p{L}\s\E)", "[[:alpha:]]", R"(\p{Han}\w\b)", R"('s|\r\n)"}) {
    EXPECT_EQ(rewrite_unicode_classes(pattern, "test"), pattern);
  }
  EXPECT_EQ(rewrite_unicode_classes(R"(\h)", "test"),
            R"([\x{30}-\x{39}\x{41}-\x{46}\x{61}-\x{66}])");
}

TEST(RewriteUnicodeClasses, KeepsTheEngineClassOnlyWhenItIsASubset) {
  const std::vector<Range> letters = unicode_class_ranges("p{L}");
  const std::vector<Range> fewer(letters.begin(), letters.end() - 1);
  std::vector<Range> more = letters;
  more.push_back({0x10FFFE, 0x10FFFE});
  auto engine_with = [](const std::vector<Range>& own) {
    return [own](const std::string& name) { return name == "L" ? &own : nullptr; };
  };
  const std::string kept = rewrite_unicode_classes(R"(\p{L}+)", "test", engine_with(fewer));
  EXPECT_EQ(kept.rfind(R"([\p{L})", 0), 0u) << kept;
  EXPECT_NE(kept.find(R"(\x{)"), std::string::npos) << kept;  // the ranges the engine lacks
  EXPECT_EQ(rewrite_unicode_classes(R"(\p{L})", "test", engine_with(letters)), R"([\p{L}])");
  EXPECT_EQ(rewrite_unicode_classes(R"(\P{L})", "test", engine_with(letters)), R"([^\p{L}])");
  EXPECT_EQ(rewrite_unicode_classes(R"(\p{L})", "test", engine_with(more)).find(R"(\p{L})"),
            std::string::npos);
}

TEST(RewriteUnicodeClasses, RangeEndingInAClassEscapeIsAnInputError) {
  try {
    rewrite_unicode_classes(R"([a-\s])", "tokenizer.json: pre_tokenizer.pattern");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("tokenizer.json: pre_tokenizer.pattern"),
              std::string::npos);
  }
}

TEST(SplitRegex, HyphenAfterAClassEscapeStaysLiteral) {
  SplitRegex regex(R"([\s-x]+)", false, "test");
  std::vector<std::string_view> pieces;
  regex.split("ab- x-y", pieces);
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"ab", "- x-", "y"}));
}

TEST(SplitRegex, Mongolian180EIsNotWhiteSpace) {
  SplitRegex regex(R"(\s+)", false, "test");
  std::vector<std::string_view> pieces;
  regex.split("a \u180E b", pieces);
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"a", " ", "\u180E", " ", "b"}));
}

// Every scalar value through PCRE2: the classes it matches are exactly the tables', both where
// the rewrite keeps PCRE2's own \p{X} plus ranges and where it writes explicit ranges only (a
// negated escape inside a bracket).
TEST(SplitRegex, ClassesMatchTheTablesForEveryScalarValue) {
  for (const char* category : {"L", "N", "Lu", "Nd", "M", "P", "S", "Z", "C", "Cn"}) {
    const std::string name = category;
    const std::vector<char32_t> want = run_starts(unicode_class_ranges("p{" + name + "}"));
    EXPECT_EQ(piece_starts("\\p{" + name + "}+"), want) << "\\p{" << name << "}";
    EXPECT_EQ(piece_starts("[^\\P{" + name + "}]+"), want) << "[^\\P{" << name << "}]";
  }
  EXPECT_EQ(piece_starts(R"(\s+)"), run_starts(unicode_class_ranges("s")));
}

}  // namespace
}  // namespace dstrain::tokenizer
