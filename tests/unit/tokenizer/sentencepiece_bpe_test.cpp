// SentencePiece-style BPE (Llama 2, Mistral, TinyLlama files) on a tiny vocabulary. The expected
// tokens were produced by Hugging Face `tokenizers` 0.23.3 from the same tokenizer.json; the
// reference suite (tests/reference/test_tokenizers.py) compares real converted vocabularies.

#include <gtest/gtest.h>

#include "core/error.h"
#include "test_files.h"
#include "tokenizer/tokenizer.h"

namespace dstrain::tokenizer {
namespace {

using nlohmann::json;
using testing::TempDir;
using Tokens = std::vector<std::string>;

// <unk> <s> </s> ▁ a b ▁a ab, then the 256 byte tokens <0x00>..<0xFF> (ids 8..263).
json tiny_vocab() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2},    {"\u2581", 3},
                {"a", 4},     {"b", 5},   {"\u2581a", 6}, {"ab", 7}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 8 + b;
  return vocab;
}

json llama_decoder() {
  return {{"type", "Sequence"},
          {"decoders",
           {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
            {{"type", "ByteFallback"}},
            {{"type", "Fuse"}},
            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
}

json legacy_normalizer() {
  return {{"type", "Sequence"},
          {"normalizers",
           {{{"type", "Prepend"}, {"prepend", "\u2581"}},
            {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}};
}

json metaspace(const std::string& scheme, bool split) {
  return {{"type", "Metaspace"},
          {"replacement", "\u2581"},
          {"prepend_scheme", scheme},
          {"split", split}};
}

// A tokenizer.json with the tiny vocabulary, merges "▁ a" and "a b", and "<s>" as added token.
json tiny_doc(json normalizer, json pre_tokenizer) {
  return {
      {"added_tokens", {{{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}}}},
      {"normalizer", std::move(normalizer)},
      {"pre_tokenizer", std::move(pre_tokenizer)},
      {"decoder", llama_decoder()},
      {"model",
       {{"type", "BPE"},
        {"vocab", tiny_vocab()},
        {"merges", {"\u2581 a", "a b"}},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true}}}};
}

class TinyTokenizer {
 public:
  explicit TinyTokenizer(const json& doc) {
    dir_.write("tokenizer.json", doc.dump());
    tok_ = load_tokenizer(dir_.path().string());
    for (const auto& [token, id] : doc["model"]["vocab"].items()) names_[id.get<int32_t>()] = token;
  }
  Tokens tokens(const std::string& text) const {
    Tokens out;
    for (int32_t id : tok_->encode(text)) out.push_back(names_.at(id));
    return out;
  }
  const Tokenizer& tok() const { return *tok_; }

 private:
  TempDir dir_;
  std::unique_ptr<Tokenizer> tok_;
  std::map<int32_t, std::string> names_;
};

TEST(SentencePieceBpe, LegacyNormalizerPrependsToEveryStretch) {
  TinyTokenizer t(tiny_doc(legacy_normalizer(), nullptr));
  EXPECT_EQ(t.tokens(""), Tokens{});
  EXPECT_EQ(t.tokens(" "), (Tokens{"\u2581", "\u2581"}));
  EXPECT_EQ(t.tokens("  a"), (Tokens{"\u2581", "\u2581", "\u2581a"}));
  EXPECT_EQ(t.tokens("a<s>b"), (Tokens{"\u2581a", "<s>", "\u2581", "b"}));
  EXPECT_EQ(t.tokens("<s>a"), (Tokens{"<s>", "\u2581a"}));
  EXPECT_EQ(t.tokens("ab \xC3\xA9"), (Tokens{"\u2581a", "b", "\u2581", "<0xC3>", "<0xA9>"}));
  EXPECT_EQ(t.tokens("a<s>"), (Tokens{"\u2581a", "<s>"}));
}

TEST(SentencePieceBpe, MetaspacePrependSchemes) {
  const Tokens first_after_special = {"\u2581a", "<s>", "b"};
  for (bool split : {false, true}) {
    TinyTokenizer first(tiny_doc(nullptr, metaspace("first", split)));
    TinyTokenizer always(tiny_doc(nullptr, metaspace("always", split)));
    TinyTokenizer never(tiny_doc(nullptr, metaspace("never", split)));
    EXPECT_EQ(first.tokens(" "), Tokens{"\u2581"});
    EXPECT_EQ(first.tokens("  a"), (Tokens{"\u2581", "\u2581a"}));
    EXPECT_EQ(first.tokens("a<s>b"), first_after_special);
    EXPECT_EQ(always.tokens("a<s>b"), (Tokens{"\u2581a", "<s>", "\u2581", "b"}));
    EXPECT_EQ(never.tokens("a<s>b"), (Tokens{"a", "<s>", "b"}));
    EXPECT_EQ(first.tokens("<s> a"), (Tokens{"<s>", "\u2581a"}));
    EXPECT_EQ(first.tokens("\u2581a"), Tokens{"\u2581a"});
    EXPECT_EQ(first.tokens("a\u2581\u2581b "),
              (Tokens{"\u2581a", "\u2581", "\u2581", "b", "\u2581"}));
    EXPECT_EQ(never.tokens("a\u2581\u2581b "), (Tokens{"a", "\u2581", "\u2581", "b", "\u2581"}));
  }
}

TEST(SentencePieceBpe, SplitKeepsMergesInsideWords) {
  // "▁ab": without split one piece, "▁a" + "b" by rank; with split the same here; "a▁b" is where
  // split matters: "▁ b" is no merge, but the pieces "a" and "▁b" could only merge inside.
  json doc = tiny_doc(nullptr, metaspace("never", true));
  doc["model"]["vocab"]["a\u2581"] = 264;
  doc["model"]["merges"].push_back("a \u2581");
  TinyTokenizer split(doc);
  doc["pre_tokenizer"] = metaspace("never", false);
  TinyTokenizer whole(doc);
  EXPECT_EQ(split.tokens("a b"), (Tokens{"a", "\u2581", "b"}));
  EXPECT_EQ(whole.tokens("a b"), (Tokens{"a\u2581", "b"}));
}

TEST(SentencePieceBpe, UnknownCharactersAsTheReferenceWritesThem) {
  // No byte tokens for 'x', 'y', 'z'; 'é' (C3 A9) has them.
  auto make = [](bool fuse, bool with_unk) {
    json doc = {{"model",
                 {{"type", "BPE"},
                  {"vocab", {{"<unk>", 0}, {"a", 1}, {"<0xC3>", 2}, {"<0xA9>", 3}}},
                  {"merges", json::array()},
                  {"fuse_unk", fuse},
                  {"byte_fallback", true}}}};
    if (with_unk) doc["model"]["unk_token"] = "<unk>";
    return doc;
  };
  TinyTokenizer plain(make(false, true)), fused(make(true, true)), dropping(make(true, false));
  const std::string xey = "x\xC3\xA9y";
  EXPECT_EQ(plain.tokens("axyza"), (Tokens{"a", "<unk>", "<unk>", "<unk>", "a"}));
  EXPECT_EQ(plain.tokens(xey), (Tokens{"<0xC3>", "<0xA9>", "<unk>", "<unk>"}));
  EXPECT_EQ(fused.tokens("axyza"), (Tokens{"a", "<unk>", "a"}));
  EXPECT_EQ(fused.tokens(xey), (Tokens{"<0xC3>", "<0xA9>", "<unk>"}));
  EXPECT_EQ(fused.tokens("\xC3\xA9x"), (Tokens{"<0xC3>", "<0xA9>", "<unk>"}));
  EXPECT_EQ(dropping.tokens("axyza"), (Tokens{"a", "a"}));
  EXPECT_EQ(dropping.tokens("xx"), Tokens{});
}

TEST(SentencePieceBpe, UnkTokenMissingFromTheVocabularyIsAnErrorWhenNeeded) {
  json doc = {{"model",
               {{"type", "BPE"},
                {"vocab", {{"a", 0}}},
                {"merges", json::array()},
                {"unk_token", "<unk>"}}}};
  TinyTokenizer t(doc);
  EXPECT_EQ(t.tokens("aa"), (Tokens{"a", "a"}));
  EXPECT_THROW(t.tokens("ab"), Error);
}

TEST(SentencePieceBpe, DecoderChainMatchesTheReference) {
  TinyTokenizer t(tiny_doc(legacy_normalizer(), nullptr));
  const Tokenizer& tok = t.tok();
  auto id = [](const std::string& byte) { return 8 + std::stoi(byte, nullptr, 16); };
  EXPECT_EQ(tok.decode({6, id("E3"), id("81"), id("82"), 5}),
            "a\xE3\x81\x82"
            "b");
  EXPECT_EQ(tok.decode({id("E3"), id("81")}), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode({id("E3"), id("81"), id("82"), id("E3")}),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode({3, 3, 4}), " a");  // "▁▁a": one leading space stripped
  EXPECT_EQ(tok.decode({1, 6}), "<s> a");  // added tokens go through the decoder too
  EXPECT_EQ(tok.decode({6, 1, 3, 5}), "a<s> b");
  EXPECT_EQ(tok.decode(tok.encode("ab  a\xC3\xA9")), "ab  a\xC3\xA9");
}

TEST(SentencePieceBpe, MetaspaceDecoderDropsTheReplacementInTheFirstToken) {
  json doc = tiny_doc(nullptr, metaspace("first", false));
  doc["model"]["vocab"]["\u2581b\u2581"] = 264;
  doc["model"]["vocab"]["\u2581\u2581a"] = 265;
  doc["model"]["vocab"]["a\u2581"] = 266;
  doc["model"]["vocab"]["\u2581b"] = 267;
  for (const std::string scheme : {"first", "always", "never"}) {
    doc["decoder"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", scheme}};
    TinyTokenizer t(doc);
    const bool never = scheme == "never";
    EXPECT_EQ(t.tok().decode({265, 264}), never ? "  a b " : "a b ") << scheme;
    EXPECT_EQ(t.tok().decode({266, 267}), never ? "a  b" : "a b") << scheme;
  }
}

TEST(SentencePieceBpe, NoDecoderJoinsTokensWithSpaces) {
  json doc = tiny_doc(nullptr, nullptr);
  doc["decoder"] = nullptr;
  TinyTokenizer t(doc);
  EXPECT_EQ(t.tok().decode({6, 5, 3}), "\u2581a b \u2581");
}

TEST(SentencePieceBpe, ByteTokensReadAsTheReferenceReadsThem) {
  // "<0x+F>" is byte 0x0F to the reference (a signed-looking hex number), "<0xff>" 0xFF, and
  // "<0xG0>" is not a byte token; 0x0F 0xFF is not UTF-8, so two U+FFFD.
  json doc = tiny_doc(nullptr, nullptr);
  doc["model"]["vocab"]["<0x+F>"] = 264;
  doc["model"]["vocab"]["<0xff>"] = 265;
  doc["model"]["vocab"]["<0xG0>"] = 266;
  TinyTokenizer t(doc);
  EXPECT_EQ(t.tok().decode({264, 265, 266}), "\xEF\xBF\xBD\xEF\xBF\xBD<0xG0>");
}

TEST(SentencePieceBpe, NormalizedAddedTokensAreMatchedAfterNormalization) {
  // The reference normalizes the content too: "<x>" is looked for as "▁<x>".
  json doc = tiny_doc(legacy_normalizer(), nullptr);
  doc["added_tokens"].push_back(
      {{"id", 264}, {"content", "<x>"}, {"special", false}, {"normalized", true}});
  TinyTokenizer t(doc);
  auto ids = [&](const std::string& s) { return t.tok().encode(s); };
  EXPECT_EQ(ids("<x>"), std::vector<int32_t>{264});
  EXPECT_EQ(ids("a <x> b"), (std::vector<int32_t>{6, 264, 3, 5}));
  EXPECT_EQ(ids("<s><x>"), (std::vector<int32_t>{1, 264}));
  EXPECT_EQ(ids("a<x>b"), (std::vector<int32_t>{6, 8 + 0x3C, 8 + 0x78, 8 + 0x3E, 5}));
}

TEST(SentencePieceBpe, PostProcessorPrefixIsTheTemplatesLeadingSpecialTokens) {
  json doc = tiny_doc(legacy_normalizer(), nullptr);
  doc["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single",
                            {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                             {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
                           {"pair", json::array()},
                           {"special_tokens",
                            {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}},
                             {"</s>", {{"id", "</s>"}, {"ids", {2}}, {"tokens", {"</s>"}}}}}}};
  TinyTokenizer t(doc);
  EXPECT_EQ(t.tok().post_processor_prefix(), std::vector<int32_t>{1});
  EXPECT_EQ(t.tok().encode("a"), std::vector<int32_t>{6});  // encode never adds it
  doc["post_processor"] = {{"type", "Sequence"},
                           {"processors", {{{"type", "ByteLevel"}}, doc["post_processor"]}}};
  EXPECT_EQ(TinyTokenizer(doc).tok().post_processor_prefix(), std::vector<int32_t>{1});
  doc["post_processor"] = nullptr;
  EXPECT_TRUE(TinyTokenizer(doc).tok().post_processor_prefix().empty());
}

}  // namespace
}  // namespace dstrain::tokenizer
