// Byte-level BPE on the real GPT-2 files under their original names (encoder.json + vocab.bpe).

#include <gtest/gtest.h>

#include "test_files.h"
#include "tokenizer/tokenizer.h"

namespace dstrain::tokenizer {
namespace {

using testing::shared_data;

class Gpt2Bpe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (std::filesystem::exists(dir())) tok_ = load_tokenizer(dir().string()).release();
  }
  static void TearDownTestSuite() { delete tok_; }
  void SetUp() override {
    if (tok_ == nullptr) GTEST_SKIP() << "shared test data not found: " << dir().string();
  }
  static std::filesystem::path dir() { return shared_data("tokenizers/gpt2"); }
  static Tokenizer* tok_;
};
Tokenizer* Gpt2Bpe::tok_ = nullptr;

TEST_F(Gpt2Bpe, KnownIds) {
  EXPECT_EQ(tok_->encode("Hello"), std::vector<int32_t>{15496});
  EXPECT_EQ(tok_->encode(" world"), std::vector<int32_t>{995});
  EXPECT_EQ(tok_->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(tok_->encode("<|endoftext|>"), std::vector<int32_t>{50256});
  EXPECT_EQ(tok_->vocab_size(), 50257);
}

TEST_F(Gpt2Bpe, EndOfTextIsEosAndBosWithoutConfigFiles) {
  EXPECT_EQ(tok_->eos_id(), 50256);
  EXPECT_EQ(tok_->bos_id(), 50256);
  EXPECT_FALSE(tok_->pad_id().has_value());
}

TEST_F(Gpt2Bpe, DigitRunsStayTogetherUnlikeQwen2) {
  // GPT-2's regex keeps " 2024" as one pre-token; the merges make fewer than 5 tokens of it.
  EXPECT_LT(tok_->encode(" 2024").size(), 5u);
}

TEST_F(Gpt2Bpe, HardStringsAndDecomposedTextRoundTrip) {
  for (const std::string& s : testing::hard_strings()) {
    EXPECT_EQ(tok_->decode(tok_->encode(s)), s) << s;
  }
  // No normalizer: decomposed text is kept as it is.
  EXPECT_EQ(tok_->decode(tok_->encode("e\u0301")), "e\u0301");
}

TEST_F(Gpt2Bpe, TinyShakespeareRoundTrips) {
  const auto corpus = shared_data("corpus/tinyshakespeare.txt");
  DSTRAIN_SKIP_IF_MISSING(corpus);
  const std::string text = testing::read_text(corpus);
  EXPECT_EQ(tok_->decode(tok_->encode(text)), text);
}

}  // namespace
}  // namespace dstrain::tokenizer
