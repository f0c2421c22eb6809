#include <gtest/gtest.h>

#include "core/fs.h"
#include "data/source.h"
#include "data/text_source.h"
#include "data/token_file.h"
#include "data/tokenize_file.h"
#include "test_util.h"

namespace dstrain::data {
namespace {

using testing::BytesTokenizer;
using testing::expect_error;
using testing::ids;
using testing::TempDir;

std::vector<int32_t> doc(const Corpus& c, int64_t i) {
  return {c.document_data(i), c.document_data(i) + c.document_length(i)};
}

TEST(TextSource, WholeFileIsOneDocument) {
  TempDir dir;
  const auto path = dir.write("a.txt", "line one\nline two\n");
  Corpus c = load_corpus(path, {}, BytesTokenizer());
  ASSERT_EQ(c.num_documents(), 1);
  EXPECT_EQ(doc(c, 0), ids("line one\nline two\n"));
}

TEST(TextSource, LineModeSkipsEmptyLinesAndStripsCrLf) {
  TempDir dir;
  const auto path = dir.write("a.txt", "first\r\n\nsecond\nthird");
  SourceOptions o;
  o.document = "line";
  Corpus c = load_corpus(path, o, BytesTokenizer());
  ASSERT_EQ(c.num_documents(), 3);
  EXPECT_EQ(doc(c, 0), ids("first"));
  EXPECT_EQ(doc(c, 1), ids("second"));
  EXPECT_EQ(doc(c, 2), ids("third"));
}

TEST(TextSource, DirectoryIsReadRecursivelyInSortedOrderSkippingHidden) {
  TempDir dir;
  dir.write("b.txt", "B");
  dir.write("a/z.txt", "AZ");
  dir.write("a/b.txt", "AB");
  dir.write(".hidden.txt", "H");
  dir.write(".git/x.txt", "G");
  Corpus c = load_corpus(dir.path(), {}, BytesTokenizer());
  ASSERT_EQ(c.num_documents(), 3);
  EXPECT_EQ(doc(c, 0), ids("AB"));
  EXPECT_EQ(doc(c, 1), ids("AZ"));
  EXPECT_EQ(doc(c, 2), ids("B"));
}

TEST(TextSource, DirectorySkipsUnderscoreNamesOfParquetWriters) {
  TempDir dir;
  dir.write("part-0.txt", "P");
  dir.write("_SUCCESS", "");
  dir.write("_metadata", "M");
  dir.write("_tmp/x.txt", "T");
  Corpus c = load_corpus(dir.path(), {}, BytesTokenizer());
  ASSERT_EQ(c.num_documents(), 1);
  EXPECT_EQ(doc(c, 0), ids("P"));
}

TEST(TextSource, GlobPatternMatchesInSortedOrder) {
  TempDir dir;
  dir.write("d/b.txt", "B");
  dir.write("d/a.txt", "A");
  dir.write("d/c.md", "C");
  dir.write("d/sub/z.txt", "Z");
  EXPECT_EQ(list_source_files(dir.path("d/*.txt")),
            (std::vector<std::string>{dir.path("d/a.txt"), dir.path("d/b.txt")}));
  EXPECT_EQ(list_source_files(dir.path("d/s*")),
            (std::vector<std::string>{dir.path("d/sub/z.txt")}));
  expect_error([&] { list_source_files(dir.path("d/*.parquet")); }, ErrorKind::kInput,
               {dir.path("d/*.parquet"), "no file matches"});
}

TEST(TextSource, GlobPatternInAMissingDirectoryMatchesNothing) {
  TempDir dir;
  dir.write("d/a.txt", "A");
  for (const std::string pattern : {"absent/*.txt", "absent/sub/*.txt", "d/a.txt/*.txt"}) {
    expect_error([&] { list_source_files(dir.path(pattern)); }, ErrorKind::kInput,
                 {dir.path(pattern), "no file matches"});
  }
}

TEST(TextSource, ManyDocumentsKeepOrderWithSeveralThreads) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 1000; ++i) text += "doc " + std::to_string(i) + "\n";
  SourceOptions o;
  o.document = "line";
  o.threads = 4;
  Corpus c = load_corpus(dir.write("many.txt", text), o, BytesTokenizer());
  ASSERT_EQ(c.num_documents(), 1000);
  EXPECT_EQ(doc(c, 0), ids("doc 0"));
  EXPECT_EQ(doc(c, 999), ids("doc 999"));
  EXPECT_EQ(c.offsets.back(), c.num_tokens());
}

TEST(JsonlSource, ReadsTextFieldAndSkipsBlankLines) {
  TempDir dir;
  const auto path =
      dir.write("d.jsonl", "{\"text\": \"hello\", \"id\": 1}\n\n{\"text\": \"w\\u00e9\"}\n");
  Corpus c = load_corpus(path, {}, BytesTokenizer());
  ASSERT_EQ(c.num_documents(), 2);
  EXPECT_EQ(doc(c, 0), ids("hello"));
  EXPECT_EQ(doc(c, 1), ids("w\xC3\xA9"));
}

TEST(JsonlSource, CustomTextField) {
  TempDir dir;
  const auto path = dir.write("d.jsonl", "{\"content\": \"abc\"}\n");
  SourceOptions o;
  o.text_field = "content";
  Corpus c = load_corpus(path, o, BytesTokenizer());
  ASSERT_EQ(c.num_documents(), 1);
  EXPECT_EQ(doc(c, 0), ids("abc"));
}

TEST(AutoFormat, PicksByExtensionAndMagic) {
  TempDir dir;
  const auto txt = dir.write("a.txt", "x");
  const auto jsonl = dir.write("a.jsonl", "{}");
  const auto pq = dir.write("a.parquet", "PAR1");
  Corpus c;
  c.add_document(ids("x").data(), 1);
  const auto tok = dir.path("a.bin");
  write_token_file(tok, c, 258);
  EXPECT_EQ(resolve_format(txt, Format::kAuto), Format::kText);
  EXPECT_EQ(resolve_format(jsonl, Format::kAuto), Format::kJsonl);
  EXPECT_EQ(resolve_format(pq, Format::kAuto), Format::kParquet);
  EXPECT_EQ(resolve_format(tok, Format::kAuto), Format::kTokens);
  EXPECT_EQ(resolve_format(jsonl, Format::kText), Format::kText);
}

TEST(TokenFile, TokenizeCommandRoundTrip) {
  TempDir dir;
  dir.write("in/a.txt", "alpha\nbeta\n");
  dir.write("in/b.txt", "gamma\n");
  TokenizeOptions o;
  o.input = dir.path("in");
  o.output = dir.path("out/corpus.tok");
  o.document = "line";
  BytesTokenizer tok;
  const TokenizeSummary s = tokenize_to_file(o, tok);
  EXPECT_EQ(s.documents, 3);
  EXPECT_EQ(s.tokens, 14);
  EXPECT_EQ(s.token_bytes, 2);
  TokenFileHeader h;
  Corpus c = read_token_file(o.output, &h);
  EXPECT_EQ(h.version, 1u);
  EXPECT_EQ(h.vocab_size, 258u);
  EXPECT_EQ(h.document_count, 3u);
  EXPECT_EQ(std::filesystem::file_size(o.output), 40u + 8 * 4 + 2 * 14);
  Corpus direct = load_corpus(o.input, SourceOptions{"auto", "text", "line", 1}, tok);
  EXPECT_EQ(c.tokens, direct.tokens);
  EXPECT_EQ(c.offsets, direct.offsets);
  // And as a training source through format auto.
  Corpus again = load_corpus(o.output, {}, tok);
  EXPECT_EQ(again.tokens, direct.tokens);
}

TEST(TokenFile, CommandPathLoadsTheNamedTokenizer) {
  TempDir dir;
  TokenizeOptions o;
  o.tokenizer = "byte";
  o.input = dir.write("a.jsonl", "{\"text\": \"hi\"}\n{\"text\": \"there\"}\n");
  o.output = dir.path("a.tok");
  const TokenizeSummary s = tokenize_to_file(o);
  EXPECT_EQ(s.documents, 2);
  EXPECT_EQ(s.tokens, 7);
  Corpus c = read_token_file(o.output);
  EXPECT_EQ(c.offsets, (std::vector<int64_t>{0, 2, 7}));
  EXPECT_EQ(doc(c, 1), ids("there"));
}

TEST(TokenFile, LargeVocabularyUsesUint32) {
  TempDir dir;
  Corpus c;
  const std::vector<int32_t> big = {70000, 5, 99999};
  c.add_document(big.data(), 3);
  write_token_file(dir.path("t.tok"), c, 100000);
  TokenFileHeader h;
  Corpus back = read_token_file(dir.path("t.tok"), &h);
  EXPECT_EQ(h.token_bytes, 4u);
  EXPECT_EQ(back.tokens, big);
}

// ---- errors ----

TEST(SourceErrors, MissingFileIsInputErrorNamingIt) {
  expect_error([] { load_corpus("/nonexistent/dstrain/data.txt", {}, BytesTokenizer()); },
               ErrorKind::kInput, {"/nonexistent/dstrain/data.txt", "not found"});
}

TEST(SourceErrors, JsonlLineThatIsNotJsonNamesFileAndLine) {
  TempDir dir;
  const auto path = dir.write("d.jsonl", "{\"text\": \"ok\"}\n{\"text\": oops}\n");
  expect_error([&] { load_corpus(path, {}, BytesTokenizer()); }, ErrorKind::kInput,
               {path + ":2:", "not valid JSON"});
}

TEST(SourceErrors, JsonlLineWithoutTextFieldNamesFileLineAndField) {
  TempDir dir;
  const auto path = dir.write("d.jsonl", "{\"text\": \"ok\"}\n\n{\"body\": \"x\"}\n");
  expect_error([&] { load_corpus(path, {}, BytesTokenizer()); }, ErrorKind::kInput,
               {path + ":3:", "\"text\""});
}

TEST(SourceErrors, InvalidUtf8NamesFileAndByteOffset) {
  TempDir dir;
  const auto path = dir.write("bad.txt", "good line\nbad \xFF byte\n");
  expect_error([&] { load_corpus(path, {}, BytesTokenizer()); }, ErrorKind::kInput,
               {path, "invalid UTF-8 at byte offset 14", "line 2"});
  const auto jpath = dir.write("bad.jsonl", "{\"text\": \"\xC3\"}\n");
  expect_error([&] { load_corpus(jpath, {}, BytesTokenizer()); }, ErrorKind::kInput,
               {jpath, "byte offset 10"});
}

TEST(SourceErrors, ParquetExtensionOnAFileThatIsNotParquetNamesIt) {
  TempDir dir;
  const auto path = dir.write("d.parquet", "PAR1");
  expect_error([&] { load_corpus(path, {}, BytesTokenizer()); }, ErrorKind::kInput,
               {path, "not a Parquet file", "4 bytes"});
}

TEST(SourceErrors, EmptyDirectoryIsInputError) {
  TempDir dir;
  std::filesystem::create_directories(dir.path("empty"));
  expect_error([&] { load_corpus(dir.path("empty"), {}, BytesTokenizer()); }, ErrorKind::kInput,
               {dir.path("empty"), "no data files"});
}

TEST(SourceErrors, BadFormatAndDocumentValuesAreConfigErrors) {
  TempDir dir;
  const auto path = dir.write("a.txt", "x");
  expect_error([&] { load_corpus(path, SourceOptions{"csv"}, BytesTokenizer()); },
               ErrorKind::kConfig, {"data.format", "csv"});
  expect_error(
      [&] {
        load_corpus(path, SourceOptions{"auto", "text", "para"}, BytesTokenizer());
      },
      ErrorKind::kConfig, {"data.document", "para"});
}

class TokenFileErrors : public ::testing::Test {
 protected:
  std::string good_file_bytes() {
    Corpus c;
    c.add_document(ids("abc").data(), 3);
    c.add_document(ids("de").data(), 2);
    write_token_file(dir_.path("good.tok"), c, 258);
    return fs::read_file(dir_.path("good.tok"));
  }
  TempDir dir_;
};

TEST_F(TokenFileErrors, BadMagic) {
  std::string b = good_file_bytes();
  b[0] = 'X';
  const auto path = dir_.write("bad.tok", b);
  expect_error([&] { read_token_file(path); }, ErrorKind::kInput, {path, "bad magic"});
}

TEST_F(TokenFileErrors, UnsupportedVersion) {
  std::string b = good_file_bytes();
  b[8] = 7;
  const auto path = dir_.write("bad.tok", b);
  expect_error([&] { read_token_file(path); }, ErrorKind::kInput, {path, "version 7"});
}

TEST_F(TokenFileErrors, TruncatedBody) {
  std::string b = good_file_bytes();
  b.pop_back();
  const auto path = dir_.write("bad.tok", b);
  expect_error([&] { read_token_file(path); }, ErrorKind::kInput,
               {path, "truncated", std::to_string(b.size()) + " bytes"});
}

TEST_F(TokenFileErrors, TruncatedHeader) {
  const auto path = dir_.write("bad.tok", good_file_bytes().substr(0, 20));
  expect_error([&] { read_token_file(path); }, ErrorKind::kInput, {path, "truncated"});
}

TEST_F(TokenFileErrors, BadDocumentOffsets) {
  std::string b = good_file_bytes();
  b[48] = 9;  // offsets[1] = 9 > token_count 5
  const auto path = dir_.write("bad.tok", b);
  expect_error([&] { read_token_file(path); }, ErrorKind::kInput, {path, "bad document offset"});
}

TEST_F(TokenFileErrors, TokenOutsideTokenizerVocabulary) {
  Corpus c;
  const std::vector<int32_t> t = {1, 300};
  c.add_document(t.data(), 2);
  write_token_file(dir_.path("big.tok"), c, 1000);
  expect_error([&] { load_corpus(dir_.path("big.tok"), {}, BytesTokenizer()); }, ErrorKind::kInput,
               {dir_.path("big.tok"), "300", "vocab_size 258"});
}

TEST(TokenizeCommand, EmptyInputWritesNothing) {
  TempDir dir;
  TokenizeOptions o;
  o.input = dir.write("empty.txt", "");
  o.output = dir.path("out.tok");
  expect_error([&] { tokenize_to_file(o, BytesTokenizer()); }, ErrorKind::kInput,
               {o.input, "empty"});
  EXPECT_FALSE(std::filesystem::exists(o.output));
}

}  // namespace
}  // namespace dstrain::data
