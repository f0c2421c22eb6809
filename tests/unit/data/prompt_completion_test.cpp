// data.format: prompt_completion: pairs from JSON Lines and Parquet become documents whose prompt
// tokens no label targets, in every packing mode; the token file (version 2) and the token cache
// keep the prompt lengths; bad pairs are errors naming the file, row or line and the column; chat
// `messages` data is refused with the sentence that says what to do.
#include <gtest/gtest.h>

#include <memory>

#include "data/samples.h"
#include "data/source.h"
#include "data/text_source.h"
#include "data/token_cache.h"
#include "data/token_file.h"
#include "parquet_fixture.h"
#include "test_util.h"

namespace dstrain::data {
namespace {

using testing::BytesTokenizer;
using testing::expect_error;
using testing::TempDir;

constexpr int64_t kEos = BytesTokenizer::kEos;

SourceOptions pairs() {
  SourceOptions o;
  o.format = "prompt_completion";
  o.threads = 1;
  return o;
}

TEST(PromptCompletion, JsonlPairsAreDocumentsWithTheirPromptLengths) {
  TempDir dir;
  const std::string path =
      dir.write("sft.jsonl",
                "{\"prompt\": \"Q: 1+1?\\nA:\", \"completion\": \" 2\"}\n\n"
                "{\"prompt\": \"\", \"completion\": \"all of it\", \"id\": 7}\n");
  const Corpus c = load_corpus(path, pairs(), BytesTokenizer());
  ASSERT_EQ(c.num_documents(), 2);
  EXPECT_EQ(c.document_length(0), 12);
  EXPECT_EQ(c.prompt_length(0), 10);
  EXPECT_EQ(c.prompt_length(1), 0);
  // Other keys name the columns.
  SourceOptions o = pairs();
  o.prompt_field = "question";
  o.completion_field = "answer";
  const std::string renamed =
      dir.write("qa.jsonl", "{\"question\": \"why\", \"answer\": \" because\"}\n");
  EXPECT_EQ(load_corpus(renamed, o, BytesTokenizer()).prompt_length(0), 3);
}

TEST(PromptCompletion, ParquetPairsAreDocumentsWithTheirPromptLengths) {
  TempDir dir;
  const std::string path = dir.path("sft.parquet");
  for (const std::string type : {"string", "large_string", "dictionary"}) {
    testing::ParquetWriteOptions w;
    w.string_type = type;
    w.row_group_rows = 2;
    testing::write_parquet_columns(
        path, {{"completion", {" 2", " yes", " no"}}, {"prompt", {"1+1=", "ok?", ""}}}, w);
    const Corpus c = load_corpus(path, pairs(), BytesTokenizer());
    ASSERT_EQ(c.num_documents(), 3) << type;
    EXPECT_EQ(c.prompt_lengths, (std::vector<int64_t>{4, 3, 0})) << type;
    EXPECT_EQ(c.document_length(1), 7) << type;
  }
}

TEST(PromptCompletion, BadPairsNameTheFileRowAndColumn) {
  TempDir dir;
  const BytesTokenizer tok;
  const auto jsonl = [&](const std::string& line) { return dir.write("bad.jsonl", line + "\n"); };
  expect_error([&] { load_corpus(jsonl("{\"prompt\": \"a\"}"), pairs(), tok); }, ErrorKind::kInput,
               {"bad.jsonl:1", "no field \"completion\"", "data.completion_field"});
  expect_error(
      [&] { load_corpus(jsonl("{\"prompt\": \"a\", \"completion\": \"\"}"), pairs(), tok); },
      ErrorKind::kInput, {"bad.jsonl:1", "\"completion\" is empty"});
  expect_error([&] { load_corpus(jsonl("{\"prompt\": 3, \"completion\": \"b\"}"), pairs(), tok); },
               ErrorKind::kInput, {"bad.jsonl:1", "\"prompt\" is a number, expected a string"});
  expect_error(
      [&] { load_corpus(jsonl("{\"prompt\": null, \"completion\": \"b\"}"), pairs(), tok); },
      ErrorKind::kInput, {"bad.jsonl:1", "\"prompt\" is null"});
  expect_error(
      [&] {
        load_corpus(jsonl("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}"), pairs(),
                    tok);
      },
      ErrorKind::kInput, {"bad.jsonl:1", "\"messages\"", kChatDataSentence});
  expect_error([&] { load_corpus(dir.write("pairs.txt", "a b\n"), pairs(), tok); },
               ErrorKind::kInput, {"pairs.txt", "JSON Lines", "Parquet"});

  const std::string pq = dir.path("bad.parquet");
  testing::write_parquet_columns(pq, {{"prompt", {"a", "b"}}, {"completion", {"x", std::nullopt}}});
  expect_error([&] { load_corpus(pq, pairs(), tok); }, ErrorKind::kInput,
               {"bad.parquet", "row 1", "\"completion\" is NULL"});
  testing::write_parquet_columns(pq, {{"prompt", {"a", "b"}}, {"completion", {"x", ""}}});
  expect_error([&] { load_corpus(pq, pairs(), tok); }, ErrorKind::kInput,
               {"bad.parquet", "row 1", "\"completion\" is empty"});
  testing::write_parquet_columns(pq, {{"prompt", {"a"}}});
  expect_error([&] { load_corpus(pq, pairs(), tok); }, ErrorKind::kInput,
               {"bad.parquet", "no column \"completion\"", "data.completion_field"});
  testing::write_parquet_columns(pq, {{"messages", {"[]"}}});
  expect_error([&] { load_corpus(pq, pairs(), tok); }, ErrorKind::kInput,
               {"bad.parquet", "\"messages\" column", kChatDataSentence});
  // Chat data given as plain text documents is told the same.
  SourceOptions text;
  text.format = "jsonl";
  expect_error([&] { load_corpus(jsonl("{\"messages\": []}"), text, tok); }, ErrorKind::kInput,
               {kChatDataSentence});
}

// Documents "ab" + "cd" (prompt 2) and "x" + "yz" (prompt 1), each followed by eos: a label is
// -100 where its token is a prompt token, in every packing mode.
std::shared_ptr<Corpus> two_pairs() {
  auto c = std::make_shared<Corpus>();
  const std::vector<int32_t> a = {'a', 'b', 'c', 'd'}, b = {'x', 'y', 'z'};
  c->add_document(a.data(), 4, 2);
  c->add_document(b.data(), 3, 1);
  return c;
}

SampleOptions options(Packing packing, int64_t t) {
  SampleOptions o;
  o.max_length = t;
  o.packing = packing;
  o.eos_id = static_cast<int32_t>(kEos);
  o.pad_id = BytesTokenizer::kPad;
  return o;
}

std::vector<int64_t> labels(const SampleSet& s, int64_t index) {
  std::vector<int64_t> in(static_cast<size_t>(s.max_length())), lab(in.size());
  s.fill(index, in.data(), lab.data());
  return lab;
}

TEST(PromptCompletion, LabelsOfPromptTokensAreIgnoredInEveryMode) {
  // documents: [a b c d | x y z] sequences a b c d E (4 positions), x y z E (3).
  const SampleSet documents(two_pairs(), {0, 1}, options(Packing::kDocuments, 7), "mem");
  ASSERT_EQ(documents.size(), 1);
  EXPECT_EQ(labels(documents, 0), (std::vector<int64_t>{-100, 'c', 'd', kEos, 'y', 'z', kEos}));
  // pad: one pair per sample.
  const SampleSet pad(two_pairs(), {0, 1}, options(Packing::kPad, 5), "mem");
  EXPECT_EQ(labels(pad, 0), (std::vector<int64_t>{-100, 'c', 'd', kEos, -100}));
  EXPECT_EQ(labels(pad, 1), (std::vector<int64_t>{'y', 'z', kEos, -100, -100}));
  // stream: a b c d E x y z E cut into windows of 4 (+1): the prompt's labels across windows.
  const SampleSet stream(two_pairs(), {0, 1}, options(Packing::kStream, 4), "mem");
  ASSERT_EQ(stream.size(), 2);
  EXPECT_EQ(labels(stream, 0), (std::vector<int64_t>{-100, 'c', 'd', kEos}));
  EXPECT_EQ(labels(stream, 1), (std::vector<int64_t>{-100, 'y', 'z', kEos}));
}

TEST(PromptCompletion, TokenFilesAndTheCacheKeepThePromptLengths) {
  TempDir dir;
  const Corpus c = *two_pairs();
  const std::string path = dir.path("pairs.tokens");
  write_token_file(path, c, 258);
  TokenFileHeader header;
  const Corpus back = read_token_file(path, &header);
  EXPECT_EQ(header.version, kTokenFileVersionPrompts);
  EXPECT_EQ(back.prompt_lengths, c.prompt_lengths);
  EXPECT_EQ(back.tokens, c.tokens);
  // Without prompts: version 1, as before.
  Corpus plain;
  plain.add_document(c.document_data(0), 4);
  write_token_file(path, plain, 258);
  EXPECT_TRUE(read_token_file(path, &header).prompt_lengths.empty());
  EXPECT_EQ(header.version, kTokenFileVersion);
  // A prompt longer than its document is a bad file.
  Corpus bad = c;
  bad.prompt_lengths[1] = 9;
  write_token_file(path, bad, 258);
  expect_error([&] { read_token_file(path); }, ErrorKind::kInput,
               {"pairs.tokens", "document 1 has a prompt of 9 tokens"});
  // Through the cache: the second read is the cache's, prompts included; the fields are in the key.
  const std::string jsonl =
      dir.write("sft.jsonl", "{\"prompt\": \"ab\", \"completion\": \"cd\", \"q\": \"abc\"}\n");
  const CacheOptions cache{dir.path("cache"), 16, ""};
  const Corpus first = load_corpus_cached(jsonl, pairs(), cache, BytesTokenizer());
  const Corpus second = load_corpus_cached(jsonl, pairs(), cache, BytesTokenizer());
  EXPECT_EQ(second.prompt_lengths, (std::vector<int64_t>{2}));
  EXPECT_EQ(first.prompt_lengths, second.prompt_lengths);
  SourceOptions other = pairs();
  other.prompt_field = "q";
  EXPECT_EQ(load_corpus_cached(jsonl, other, cache, BytesTokenizer()).prompt_lengths,
            (std::vector<int64_t>{3}));
}

}  // namespace
}  // namespace dstrain::data
