#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace dstrain::tokenizer {
namespace {

TEST(ByteTokenizer, IdsAreBytesPlusEosAndPad) {
  auto tok = load_tokenizer("byte");
  EXPECT_EQ(tok->vocab_size(), 258);
  EXPECT_EQ(tok->eos_id(), 256);
  EXPECT_EQ(tok->pad_id(), 257);
  EXPECT_FALSE(tok->bos_id().has_value());
  EXPECT_EQ(tok->encode("Hi\n\xFF"), (std::vector<int32_t>{72, 105, 10, 255}));
}

TEST(ByteTokenizer, RoundTripsAnyBytesAndDropsEosPad) {
  auto tok = load_tokenizer("byte");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(tok->decode(tok->encode(all)), all);
  EXPECT_EQ(tok->decode({104, 256, 105, 257}), "hi");
}

TEST(ByteTokenizer, DecodingOutOfRangeIdIsInputError) {
  auto tok = load_tokenizer("byte");
  for (int32_t bad : {258, -1}) {
    try {
      tok->decode({65, bad});
      FAIL() << "expected an error for id " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace dstrain::tokenizer
