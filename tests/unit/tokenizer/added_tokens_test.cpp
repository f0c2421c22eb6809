#include "tokenizer/added_tokens.h"

#include <gtest/gtest.h>

namespace dstrain::tokenizer {
namespace {

std::vector<std::pair<std::string, int32_t>> split(const AddedTokenMatcher& m, std::string_view t) {
  std::vector<Segment> segs;
  m.split(t, segs);
  std::vector<std::pair<std::string, int32_t>> out;
  for (const Segment& s : segs) out.emplace_back(std::string(s.text), s.id);
  return out;
}

TEST(AddedTokens, LongestMatchWinsAtTheSamePosition) {
  AddedTokenMatcher m({{"<|a|>", 1, true}, {"<|a|>x", 2, false}});
  using V = std::vector<std::pair<std::string, int32_t>>;
  EXPECT_EQ(split(m, "q<|a|>xy<|a|>"), (V{{"q", -1}, {"<|a|>x", 2}, {"y", -1}, {"<|a|>", 1}}));
}

TEST(AddedTokens, TextWithoutTokensIsOneSegment) {
  AddedTokenMatcher m({{"<|eot|>", 5, true}});
  using V = std::vector<std::pair<std::string, int32_t>>;
  EXPECT_EQ(split(m, "no <|eot tokens|> here"), (V{{"no <|eot tokens|> here", -1}}));
  EXPECT_EQ(split(m, "<|eot|><|eot|>"), (V{{"<|eot|>", 5}, {"<|eot|>", 5}}));
  EXPECT_TRUE(split(m, "").empty());
}

}  // namespace
}  // namespace dstrain::tokenizer
