// tokenizer.json: written here from the real vocab/merges files, so both loaders read the same
// model.

#include <gtest/gtest.h>

#include "test_files.h"
#include "tokenizer/split_regex.h"
#include "tokenizer/tokenizer.h"

namespace dstrain::tokenizer {
namespace {

using nlohmann::json;
using testing::shared_data;
using testing::TempDir;

// merges.txt lines as alternating "a b" strings and ["a", "b"] pairs (both forms in one file).
json merges_both_forms(const std::string& merges_txt) {
  json merges = json::array();
  size_t pos = 0;
  for (int line = 0; pos < merges_txt.size(); ++line) {
    size_t end = merges_txt.find('\n', pos);
    if (end == std::string::npos) end = merges_txt.size();
    const std::string l = merges_txt.substr(pos, end - pos);
    pos = end + 1;
    if (l.empty() || l.rfind("#version", 0) == 0) continue;
    const size_t sp = l.find(' ');
    if (merges.size() % 2 == 0) {
      merges.push_back(l);
    } else {
      merges.push_back(json::array({l.substr(0, sp), l.substr(sp + 1)}));
    }
  }
  return merges;
}

json qwen2_tokenizer_json(const std::filesystem::path& src) {
  json added = json::array();
  const json added_tokens = json::parse(testing::read_text(src / "added_tokens.json"));
  for (const auto& [content, id] : added_tokens.items()) {
    added.push_back({{"id", id}, {"content", content}, {"special", true}, {"normalized", false}});
  }
  json split = {{"type", "Split"},
                {"pattern", {{"Regex", kQwen2SplitPattern}}},
                {"behavior", "Isolated"},
                {"invert", false}};
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"},
            {"vocab", json::parse(testing::read_text(src / "vocab.json"))},
            {"merges", merges_both_forms(testing::read_text(src / "merges.txt"))}}}};
}

TEST(TokenizerJson, Qwen2EncodesLikeVocabAndMergesFiles) {
  const auto src = shared_data("tokenizers/qwen2");
  DSTRAIN_SKIP_IF_MISSING(src);
  TempDir dir;
  dir.write("tokenizer.json", qwen2_tokenizer_json(src).dump());
  dir.write("tokenizer_config.json", testing::read_text(src / "tokenizer_config.json"));
  auto from_json = load_tokenizer(dir.path().string());
  auto from_files = load_tokenizer(src.string());

  std::vector<std::string> texts = testing::hard_strings();
  texts.push_back(
      "caf"
      "e\u0301 2024");
  const auto corpus = shared_data("corpus/tinyshakespeare.txt");
  if (std::filesystem::exists(corpus))
    texts.push_back(testing::read_text(corpus).substr(0, 200000));
  for (const std::string& t : texts) {
    EXPECT_EQ(from_json->encode(t), from_files->encode(t)) << t.substr(0, 80);
  }
  EXPECT_EQ(from_json->vocab_size(), from_files->vocab_size());
  EXPECT_EQ(from_json->eos_id(), from_files->eos_id());
  EXPECT_EQ(from_json->pad_id(), from_files->pad_id());
}

TEST(TokenizerJson, ByteLevelWithUseRegexUsesGpt2Split) {
  const auto src = shared_data("tokenizers/gpt2");
  DSTRAIN_SKIP_IF_MISSING(src);
  TempDir dir;
  json doc = {
      {"added_tokens",
       json::array({{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", json::parse(testing::read_text(src / "encoder.json"))},
        {"merges", merges_both_forms(testing::read_text(src / "vocab.bpe"))}}}};
  dir.write("tokenizer.json", doc.dump());
  auto tok = load_tokenizer(dir.path().string());
  EXPECT_EQ(tok->encode("Hello world<|endoftext|>"), (std::vector<int32_t>{15496, 995, 50256}));
  auto reference = load_tokenizer(src.string());
  for (const std::string& t : testing::hard_strings())
    EXPECT_EQ(tok->encode(t), reference->encode(t)) << t;
}

TEST(TokenizerJson, IgnoreMergesTakesWholeVocabPieces) {
  // "abc" is in the vocabulary but no merge builds it.
  json doc = {
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"vocab", testing::byte_vocab({"ab", "abc"})}, {"merges", {"a b"}}}}};
  TempDir plain, ignoring;
  plain.write("tokenizer.json", doc.dump());
  doc["model"]["ignore_merges"] = true;
  ignoring.write("tokenizer.json", doc.dump());
  EXPECT_EQ(load_tokenizer(plain.path().string())->encode("abc"), (std::vector<int32_t>{256, 'c'}));
  EXPECT_EQ(load_tokenizer(ignoring.path().string())->encode("abc"), std::vector<int32_t>{257});
}

}  // namespace
}  // namespace dstrain::tokenizer
