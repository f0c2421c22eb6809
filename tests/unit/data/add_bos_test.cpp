// data.add_bos in the data pipeline: the bos the tokenizer's post-processor puts first (auto) or
// its bos token (true) starts every tokenized document, and is part of the token cache's key; with
// no bos added the key is the one a cache made before data.add_bos existed has.

#include <filesystem>

#include <gtest/gtest.h>

#include "data/datasets.h"
#include "data/token_cache.h"
#include "data/token_file.h"
#include "test_util.h"
#include "tokenizer/document_prefix.h"

namespace dstrain::data {
namespace {

namespace stdfs = std::filesystem;
using testing::BytesTokenizer;
using testing::TempDir;

// Bytes, eos 256, pad 257, and a bos 258 that the post-processor (like Llama's) puts first.
class BosTokenizer : public BytesTokenizer {
 public:
  static constexpr int32_t kBos = 258;
  int64_t vocab_size() const override { return 259; }
  std::optional<int32_t> bos_id() const override { return kBos; }
  std::vector<int32_t> post_processor_prefix() const override { return {kBos}; }
};

class AddBos : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.train_path = dir_.write("data/a.jsonl", "{\"text\": \"one\"}\n{\"text\": \"two\"}\n");
    options_.max_length = 4;
    options_.packing = Packing::kStream;  // sample 0: "one", its eos
    options_.cache_dir = dir_.path("cache");
  }
  // The first sample's input ids and the documents of the (single) cache entry.
  std::pair<std::vector<int64_t>, std::vector<std::vector<int32_t>>> run(
      const tokenizer::Tokenizer& tok, const std::string& add_bos) {
    stdfs::remove_all(options_.cache_dir);
    options_.add_bos = add_bos;
    const Datasets d = build_datasets(options_, tok);
    std::vector<int64_t> input(4), labels(4);
    d.train->fill(0, input.data(), labels.data());
    std::vector<std::vector<int32_t>> docs;
    for (const auto& e : stdfs::directory_iterator(options_.cache_dir)) {
      if (e.path().extension() != ".tokens") continue;
      const Corpus c = read_token_file(e.path().string());
      for (int64_t i = 0; i < c.num_documents(); ++i) {
        docs.emplace_back(c.document_data(i), c.document_data(i) + c.document_length(i));
      }
    }
    return {input, docs};
  }
  TempDir dir_;
  DataOptions options_;
};

TEST_F(AddBos, AutoPutsThePostProcessorsBosFirst) {
  const BosTokenizer tok;
  const auto [input, docs] = run(tok, "auto");
  EXPECT_EQ(input, (std::vector<int64_t>{258, 'o', 'n', 'e'}));
  EXPECT_EQ(docs, (std::vector<std::vector<int32_t>>{{258, 'o', 'n', 'e'}, {258, 't', 'w', 'o'}}));
  EXPECT_EQ(run(tok, "true").second, docs);
}

TEST_F(AddBos, FalseAndATokenizerWithoutPostProcessorAddNothing) {
  const auto want = std::vector<std::vector<int32_t>>{{'o', 'n', 'e'}, {'t', 'w', 'o'}};
  EXPECT_EQ(run(BosTokenizer(), "false").second, want);
  EXPECT_EQ(run(BytesTokenizer(), "auto").second, want);
  EXPECT_EQ(run(BosTokenizer(), "false").first, (std::vector<int64_t>{'o', 'n', 'e', 256}));
}

TEST_F(AddBos, TrueWithoutABosTokenIsAConfigError) {
  options_.add_bos = "true";
  testing::expect_error([&] { build_datasets(options_, BytesTokenizer()); }, ErrorKind::kConfig,
                        {"data.add_bos", "no bos token"});
}

TEST_F(AddBos, TheBosIsPartOfTheCacheKeyAndNoBosKeepsTheOldKey) {
  const BosTokenizer tok;
  const std::vector<std::string> files = {options_.train_path};
  const SourceOptions so;
  const std::string plain = cache_key_text(files, so, 4, tok);
  const tokenizer::PrefixedTokenizer none(tok, tokenizer::document_prefix(tok, "false"));
  const tokenizer::PrefixedTokenizer bos(tok, tokenizer::document_prefix(tok, "auto"));
  EXPECT_EQ(cache_key_text(files, so, 4, none), plain);
  EXPECT_NE(cache_key_text(files, so, 4, bos), plain);
}

}  // namespace
}  // namespace dstrain::data
