// Byte-level BPE on the real Qwen2 files (vocab.json + merges.txt + config files).

#include <thread>

#include <gtest/gtest.h>

#include "core/error.h"
#include "test_files.h"
#include "tokenizer/tokenizer.h"

namespace dstrain::tokenizer {
namespace {

using testing::shared_data;

class Qwen2Bpe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(dir())) return;
    tok_ = load_tokenizer(dir().string()).release();
    vocab_ = new nlohmann::json(nlohmann::json::parse(testing::read_text(dir() / "vocab.json")));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete vocab_;
  }
  void SetUp() override {
    if (tok_ == nullptr) GTEST_SKIP() << "shared test data not found: " << dir().string();
  }
  static std::filesystem::path dir() { return shared_data("tokenizers/qwen2"); }
  static int32_t vocab_id(const std::string& token) { return vocab_->at(token).get<int32_t>(); }

  static Tokenizer* tok_;
  static nlohmann::json* vocab_;
};
Tokenizer* Qwen2Bpe::tok_ = nullptr;
nlohmann::json* Qwen2Bpe::vocab_ = nullptr;

TEST_F(Qwen2Bpe, SpecialTokenIdsAndConfigRoles) {
  EXPECT_EQ(tok_->encode("<|endoftext|>"), std::vector<int32_t>{151643});
  EXPECT_EQ(tok_->encode("<|im_start|>"), std::vector<int32_t>{151644});
  EXPECT_EQ(tok_->encode("<|im_end|>"), std::vector<int32_t>{151645});
  EXPECT_EQ(tok_->eos_id(), 151645);         // tokenizer_config.json eos_token "<|im_end|>"
  EXPECT_EQ(tok_->pad_id(), 151643);         // pad_token "<|endoftext|>"
  EXPECT_FALSE(tok_->bos_id().has_value());  // bos_token null
  EXPECT_EQ(tok_->vocab_size(), 151646);
}

TEST_F(Qwen2Bpe, OrdinaryWordsMapToTheirVocabIds) {
  EXPECT_EQ(tok_->encode("Hello"), std::vector<int32_t>{vocab_id("Hello")});
  EXPECT_EQ(tok_->encode(" world"), std::vector<int32_t>{vocab_id("\u0120world")});
  EXPECT_EQ(tok_->encode("Hello world"),
            (std::vector<int32_t>{vocab_id("Hello"), vocab_id("\u0120world")}));
  EXPECT_EQ(tok_->encode("\n"), std::vector<int32_t>{vocab_id("\u010A")});
}

TEST_F(Qwen2Bpe, DigitsAreSplitOneByOne) {
  std::vector<int32_t> want;
  for (char d : std::string("2024")) want.push_back(vocab_id(std::string(1, d)));
  EXPECT_EQ(tok_->encode("2024"), want);
}

TEST_F(Qwen2Bpe, SpecialTokensInsideTextAreNeverSplit) {
  const std::vector<int32_t> ids = tok_->encode("a<|im_start|>user\nhi<|im_end|>b");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 151644), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 151645), 1);
  EXPECT_EQ(ids.front(), vocab_id("a"));
  EXPECT_EQ(ids[1], 151644);
}

TEST_F(Qwen2Bpe, HardStringsRoundTrip) {
  for (const std::string& s : testing::hard_strings()) {
    EXPECT_EQ(tok_->decode(tok_->encode(s)), s) << s;
  }
}

TEST_F(Qwen2Bpe, DecomposedInputIsNfcNormalized) {
  // "e" + COMBINING ACUTE ACCENT encodes exactly like the precomposed "é".
  EXPECT_EQ(tok_->encode("caf"
                         "e\u0301"),
            tok_->encode("caf\u00E9"));
  EXPECT_EQ(tok_->decode(tok_->encode("e\u0301")), "\u00E9");
}

TEST_F(Qwen2Bpe, TinyShakespeareRoundTrips) {
  const auto corpus = shared_data("corpus/tinyshakespeare.txt");
  DSTRAIN_SKIP_IF_MISSING(corpus);
  const std::string text = testing::read_text(corpus);
  const std::vector<int32_t> ids = tok_->encode(text);
  EXPECT_GT(ids.size(), text.size() / 8);
  EXPECT_LT(ids.size(), text.size() / 2);
  EXPECT_EQ(tok_->decode(ids), text);
}

TEST_F(Qwen2Bpe, VeryLongPreTokensRoundTrip) {
  // One pre-token of 100k bytes each: exercises the regex engine's limits and the merge heap.
  for (const std::string& s : {std::string(100000, ' ') + "x", std::string(100000, 'a'),
                               std::string(50000, '\n') + std::string(50000, '!')}) {
    EXPECT_EQ(tok_->decode(tok_->encode(s)), s);
  }
}

TEST_F(Qwen2Bpe, ConcurrentEncodesAgreeWithSerial) {
  std::vector<std::string> texts;
  for (int i = 0; i < 8; ++i) {
    for (const std::string& s : testing::hard_strings()) texts.push_back(s + std::to_string(i));
  }
  std::vector<std::vector<int32_t>> serial;
  for (const auto& t : texts) serial.push_back(tok_->encode(t));
  std::vector<std::vector<std::vector<int32_t>>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep) {
        got[t].clear();
        for (const auto& s : texts) got[t].push_back(tok_->encode(s));
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(got[t], serial) << "thread " << t;
}

TEST_F(Qwen2Bpe, InvalidUtf8IsInputErrorNamingTheOffset) {
  try {
    tok_->encode("valid text \xC3(");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("byte offset 11"), std::string::npos) << e.what();
  }
}

TEST_F(Qwen2Bpe, DecodingUnknownIdIsInputError) {
  try {
    tok_->decode({vocab_id("Hello"), 151646});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("151646"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tok_->decode({-3}), Error);
}

}  // namespace
}  // namespace dstrain::tokenizer
