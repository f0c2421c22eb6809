// Missing or malformed tokenizer files are Error(kInput) naming the file and what was expected.

#include <tuple>

#include <gtest/gtest.h>

#include "core/error.h"
#include "test_files.h"
#include "tokenizer/tokenizer.h"

namespace dstrain::tokenizer {
namespace {

using testing::TempDir;

// Loads `dir` and expects Error(kInput) whose message contains every one of `parts`.
void expect_input_error(const std::string& dir, const std::vector<std::string>& parts) {
  try {
    load_tokenizer(dir);
    ADD_FAILURE() << "expected an error loading " << dir;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << e.what();
    for (const std::string& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "'" << p << "' not in: " << e.what();
    }
  }
}

// A valid tiny vocabulary: 256 bytes + "ab" (256).
void write_tiny(const TempDir& dir) {
  dir.write("vocab.json", testing::byte_vocab({"ab"}).dump());
  dir.write("merges.txt", "#version: 0.2\na b\n");
}

TEST(LoadErrors, MissingDirectoryNamesIt) {
  expect_input_error("/nonexistent/tokdir", {"/nonexistent/tokdir", "byte"});
}

TEST(LoadErrors, DirectoryWithoutFilesListsWhatWasExpected) {
  TempDir dir;
  dir.write("vocab.json", "{}");  // merges.txt missing
  expect_input_error(dir.path().string(), {"tokenizer.json", "vocab.json + merges.txt"});
}

TEST(LoadErrors, TinyValidFilesLoad) {
  TempDir dir;
  write_tiny(dir);
  auto tok = load_tokenizer(dir.path().string());
  EXPECT_EQ(tok->encode("abc"), (std::vector<int32_t>{256, 'c'}));
  EXPECT_EQ(tok->vocab_size(), 257);
  EXPECT_FALSE(tok->eos_id().has_value());
}

TEST(LoadErrors, VocabNotJsonNamesTheFile) {
  TempDir dir;
  write_tiny(dir);
  dir.write("vocab.json", "{\"a\": 1,");
  expect_input_error(dir.path().string(), {"vocab.json", "not valid JSON"});
}

TEST(LoadErrors, VocabWithNonIntegerIdNamesTheToken) {
  TempDir dir;
  write_tiny(dir);
  auto vocab = testing::byte_vocab();
  vocab["xy"] = "seven";
  dir.write("vocab.json", vocab.dump());
  expect_input_error(dir.path().string(), {"vocab.json", "\"xy\"", "integer token id"});
}

TEST(LoadErrors, VocabWithoutByteSymbolsIsRejected) {
  TempDir dir;
  dir.write("vocab.json", R"({"a": 0, "b": 1})");
  dir.write("merges.txt", "a b\n");
  expect_input_error(dir.path().string(), {"vocab.json", "byte 0x"});
}

TEST(LoadErrors, BadMergeLineNamesFileAndLine) {
  TempDir dir;
  write_tiny(dir);
  dir.write("merges.txt", "#version: 0.2\na b\nabc\n");
  expect_input_error(dir.path().string(), {"merges.txt line 3", "two tokens"});
}

TEST(LoadErrors, MergeOfUnknownTokenNamesFileAndLine) {
  TempDir dir;
  write_tiny(dir);
  dir.write("merges.txt", "#version: 0.2\na b\nab c\n");  // "abc" is not in the vocabulary
  expect_input_error(dir.path().string(), {"merges.txt line 3", "'abc'"});
}

TEST(LoadErrors, EosTokenWithoutIdNamesConfigKey) {
  TempDir dir;
  write_tiny(dir);
  dir.write("tokenizer_config.json", R"({"eos_token": {"content": "<|nope|>"}})");
  expect_input_error(dir.path().string(), {"tokenizer_config.json", "eos_token", "<|nope|>"});
}

TEST(LoadErrors, ConfigRolesResolveThroughAddedTokensJson) {
  TempDir dir;
  write_tiny(dir);
  dir.write("added_tokens.json", R"({"<eos>": 300, "<pad>": 301})");
  dir.write("special_tokens_map.json",
            R"({"eos_token": "<eos>", "pad_token": {"content": "<pad>"}})");
  auto tok = load_tokenizer(dir.path().string());
  EXPECT_EQ(tok->eos_id(), 300);
  EXPECT_EQ(tok->pad_id(), 301);
  EXPECT_EQ(tok->vocab_size(), 302);
  EXPECT_EQ(tok->encode("ab<eos>"), (std::vector<int32_t>{256, 300}));
  EXPECT_EQ(tok->decode({'x', 300, 301}), "x<eos><pad>");
  EXPECT_THROW(tok->decode({280}), Error);  // inside the id range but no token has it
}

TEST(LoadErrors, UnsupportedTokenizerJsonModelIsRejected) {
  TempDir dir;
  dir.write("tokenizer.json", R"({"model": {"type": "WordPiece", "vocab": {}}})");
  expect_input_error(dir.path().string(), {"tokenizer.json", "WordPiece", "not supported"});
}

TEST(LoadErrors, BadSplitRegexNamesTheKey) {
  TempDir dir;
  nlohmann::json doc = {
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
          {{"type", "ByteLevel"}, {"use_regex", false}}}}}},
      {"model",
       {{"type", "BPE"}, {"vocab", testing::byte_vocab()}, {"merges", nlohmann::json::array()}}}};
  dir.write("tokenizer.json", doc.dump());
  expect_input_error(dir.path().string(),
                     {"tokenizer.json", "pretokenizers[0]", "does not compile"});
}

TEST(LoadErrors, WrongJsonTypeInsideTokenizerJsonIsInputError) {
  TempDir dir;
  nlohmann::json doc = {
      {"added_tokens", {{{"id", 5}, {"content", "<x>"}, {"special", "yes"}}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"vocab", testing::byte_vocab()}, {"merges", nlohmann::json::array()}}}};
  dir.write("tokenizer.json", doc.dump());
  expect_input_error(dir.path().string(), {dir.path().string(), "malformed"});
}

// A SentencePiece-style tokenizer.json (no ByteLevel) with `key` set to `component`.
void write_sentencepiece_with(const TempDir& dir, const std::string& key,
                              const nlohmann::json& component) {
  nlohmann::json doc = {
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", nlohmann::json::array()}}}};
  doc[key] = component;
  dir.write("tokenizer.json", doc.dump());
}

TEST(LoadErrors, UnsupportedComponentsNameTheFileKeyAndComponent) {
  const nlohmann::json replace_regex = {
      {"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "\u2581"}};
  const std::vector<std::tuple<std::string, nlohmann::json, std::vector<std::string>>> cases = {
      {"normalizer",
       {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}},
       {"normalizer.normalizers[1]", "normalizer 'Lowercase'"}},
      {"normalizer", replace_regex, {"normalizer.pattern", "Regex"}},
      {"pre_tokenizer", {{"type", "Whitespace"}}, {"pre_tokenizer", "pre-tokenizer 'Whitespace'"}},
      {"pre_tokenizer",
       {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Isolated"}},
       {"pre_tokenizer", "a Split without ByteLevel"}},
      {"decoder",
       {{"type", "Sequence"}, {"decoders", {{{"type", "Fuse"}}, {{"type", "WordPiece"}}}}},
       {"decoder.decoders[1]", "decoder 'WordPiece'"}},
      {"decoder", replace_regex, {"decoder.pattern", "Regex"}},
      {"post_processor",
       {{"type", "Frobnicate"}},
       {"post_processor", "post-processor 'Frobnicate'"}},
  };
  for (const auto& [key, component, parts] : cases) {
    TempDir dir;
    write_sentencepiece_with(dir, key, component);
    std::vector<std::string> want = parts;
    want.push_back("tokenizer.json");
    want.push_back("not supported");
    expect_input_error(dir.path().string(), want);
  }
}

TEST(LoadErrors, MetaspaceContradictionsAreRefusedAsTheReferenceRefusesThem) {
  TempDir dir;
  write_sentencepiece_with(
      dir, "pre_tokenizer",
      {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"add_prefix_space", false}});
  expect_input_error(dir.path().string(), {"pre_tokenizer", "add_prefix_space false"});
  write_sentencepiece_with(dir, "pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "ab"}});
  expect_input_error(dir.path().string(), {"pre_tokenizer.replacement", "one character"});
  write_sentencepiece_with(
      dir, "decoder",
      {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "sometimes"}});
  expect_input_error(dir.path().string(), {"decoder.prepend_scheme", "always, first or never"});
}

TEST(LoadErrors, TemplateNamingAnUnknownSpecialTokenNamesIt) {
  TempDir dir;
  write_sentencepiece_with(dir, "post_processor",
                           {{"type", "TemplateProcessing"},
                            {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}}},
                            {"special_tokens", nlohmann::json::object()}});
  expect_input_error(dir.path().string(), {"post_processor.special_tokens[\"<s>\"]"});
}

TEST(LoadErrors, BpeDropoutIsRefused) {
  TempDir dir;
  dir.write("tokenizer.json",
            R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "dropout": 0.1}})");
  expect_input_error(dir.path().string(), {"model.dropout", "not supported"});
}

}  // namespace
}  // namespace dstrain::tokenizer
