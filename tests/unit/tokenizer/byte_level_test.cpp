#include "tokenizer/byte_level.h"

#include <set>

#include <gtest/gtest.h>

namespace dstrain::tokenizer {
namespace {

TEST(ByteLevel, KnownSymbolsOfGpt2Map) {
  EXPECT_EQ(byte_symbols()['A'], "A");
  EXPECT_EQ(byte_symbols()[' '], "\u0120");   // Ġ
  EXPECT_EQ(byte_symbols()['\n'], "\u010A");  // Ċ
  EXPECT_EQ(byte_symbols()[0], "\u0100");
  EXPECT_EQ(byte_symbols()[0xAD], "\u0143");  // the last of the 68 remapped bytes
}

TEST(ByteLevel, MapIsABijectionAndRoundTrips) {
  std::set<std::string> distinct(byte_symbols().begin(), byte_symbols().end());
  EXPECT_EQ(distinct.size(), 256u);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(symbols_to_bytes(bytes_to_symbols(all)), all);
}

TEST(ByteLevel, CharacterOutsideMapIsRejected) {
  EXPECT_FALSE(symbols_to_bytes("日").has_value());
  EXPECT_FALSE(symbols_to_bytes("\xFF").has_value());
}

}  // namespace
}  // namespace dstrain::tokenizer
