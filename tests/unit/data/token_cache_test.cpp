#include <atomic>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "core/fs.h"
#include "data/token_cache.h"
#include "data/token_file.h"
#include "parquet_fixture.h"
#include "test_util.h"

namespace dstrain::data {
namespace {

namespace stdfs = std::filesystem;
using testing::BytesTokenizer;
using testing::TempDir;

// Counts the encodes of data texts (they start with "DOC"; the fingerprint's texts never do).
class CountingTokenizer : public BytesTokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    if (text.substr(0, 3) == "DOC") ++data_encodes;
    return BytesTokenizer::encode(text);
  }
  mutable std::atomic<int> data_encodes{0};
};

// The same ids except one byte: another tokenizer as far as the cache is concerned.
class OtherTokenizer : public BytesTokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    auto ids = BytesTokenizer::encode(text);
    for (auto& id : ids) id = id == 'z' ? 'Z' : id;
    return ids;
  }
};

size_t entries(const std::string& dir) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : stdfs::directory_iterator(dir, ec)) n += e.path().extension() == ".tokens";
  return n;
}

class TokenCache : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = dir_.write("data/a.jsonl", "{\"text\": \"DOC one\"}\n{\"text\": \"DOC two\"}\n");
    options_.document = "line";
  }
  Corpus load(const tokenizer::Tokenizer& tok, int64_t max_length = 64,
              SourceStats* stats = nullptr) {
    return load_corpus_cached(dir_.path("data"), options_, {cache_, max_length, ""}, tok, stats);
  }
  TempDir dir_;
  std::string data_;
  std::string cache_ = dir_.path("run/data_cache");
  SourceOptions options_;
};

TEST_F(TokenCache, SecondLoadReadsTheEntryWithoutTokenizing) {
  CountingTokenizer tok;
  const Corpus first = load(tok);
  EXPECT_EQ(tok.data_encodes, 2);
  EXPECT_EQ(entries(cache_), 1u);
  const Corpus second = load(tok);
  EXPECT_EQ(tok.data_encodes, 2);
  EXPECT_EQ(second.tokens, first.tokens);
  EXPECT_EQ(second.offsets, first.offsets);
  EXPECT_EQ(first.tokens, load_corpus(dir_.path("data"), options_, tok).tokens);
}

TEST_F(TokenCache, KeyFollowsContentNotNames) {
  CountingTokenizer tok;
  load(tok);
  stdfs::rename(data_, dir_.path("data/renamed.jsonl"));
  load(tok);
  EXPECT_EQ(tok.data_encodes, 2);  // same bytes under another name: a hit
  dir_.write("data/renamed.jsonl", "{\"text\": \"DOC one\"}\n{\"text\": \"DOC twO\"}\n");
  const Corpus changed = load(tok);
  EXPECT_EQ(tok.data_encodes, 4);  // one byte changed: a miss
  EXPECT_EQ(changed.tokens.back(), 'O');
  EXPECT_EQ(entries(cache_), 2u);
}

TEST_F(TokenCache, KeyHoldsMaxLengthTokenizerAndOptions) {
  CountingTokenizer tok;
  load(tok, 64);
  load(tok, 128);
  EXPECT_EQ(tok.data_encodes, 4);
  EXPECT_NE(tokenizer_fingerprint(BytesTokenizer(), 1), tokenizer_fingerprint(OtherTokenizer(), 1));
  EXPECT_EQ(tokenizer_fingerprint(BytesTokenizer(), 1), tokenizer_fingerprint(BytesTokenizer(), 7));
  const std::vector<std::string> files = {data_};
  SourceOptions other = options_;
  other.text_field = "body";
  EXPECT_NE(cache_key_text(files, options_, 64, tok), cache_key_text(files, other, 64, tok));
  EXPECT_NE(cache_key_text(files, options_, 64, tok),
            cache_key_text(files, options_, 64, OtherTokenizer()));
}

TEST_F(TokenCache, DamagedEntryIsMadeAgain) {
  CountingTokenizer tok;
  const Corpus want = load(tok);
  for (const auto& e : stdfs::directory_iterator(cache_)) {
    if (e.path().extension() == ".tokens") {
      const std::string bytes = fs::read_file(e.path());
      fs::write_file_atomic(e.path(), bytes.substr(0, bytes.size() - 1));
    }
  }
  EXPECT_EQ(load(tok).tokens, want.tokens);
  EXPECT_EQ(tok.data_encodes, 4);
  EXPECT_EQ(load(tok).tokens, want.tokens);  // and the remade entry is good
  EXPECT_EQ(tok.data_encodes, 4);
}

TEST_F(TokenCache, ConcurrentLoadsTokenizeOnce) {
  CountingTokenizer tok;
  std::vector<Corpus> got(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) threads.emplace_back([&, i] { got[i] = load(tok); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(tok.data_encodes, 2);
  for (const Corpus& c : got) EXPECT_EQ(c.tokens, got[0].tokens);
}

TEST_F(TokenCache, NullRowCountComesBackFromTheEntry) {
  testing::write_parquet_texts(dir_.path("pq/d.parquet"), "text",
                               {std::string("DOC a"), std::nullopt, std::nullopt});
  CountingTokenizer tok;
  SourceStats first, second;
  load_corpus_cached(dir_.path("pq"), {}, {cache_, 64, ""}, tok, &first);
  load_corpus_cached(dir_.path("pq"), {}, {cache_, 64, ""}, tok, &second);
  EXPECT_EQ(tok.data_encodes, 1);
  EXPECT_EQ(first.null_rows, 2);
  EXPECT_EQ(second.null_rows, 2);
}

TEST_F(TokenCache, TokenFilesAndAnUnusableDirectoryBypassTheCache) {
  Corpus c;
  c.add_document(testing::ids("DOC").data(), 3);
  write_token_file(dir_.path("tok/a.tok"), c, 258);
  CountingTokenizer tok;
  EXPECT_EQ(load_corpus_cached(dir_.path("tok"), {}, {cache_, 64, ""}, tok).tokens, c.tokens);
  EXPECT_FALSE(stdfs::exists(cache_));
  const std::string not_a_dir = dir_.write("file", "x");
  EXPECT_EQ(load_corpus_cached(dir_.path("data"), options_, {not_a_dir + "/cache", 64, ""}, tok)
                .num_documents(),
            2);
}

}  // namespace
}  // namespace dstrain::data
