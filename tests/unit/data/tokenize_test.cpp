#include <gtest/gtest.h>

#include "data/content_hash.h"
#include "data/progress.h"
#include "data/tokenize.h"
#include "test_util.h"

namespace dstrain::data {
namespace {

using testing::BytesTokenizer;
using testing::expect_error;
using testing::TempDir;

// Texts of very different lengths, so that pieces (about 256 kB) hold from one text to hundreds.
std::vector<std::string> mixed_texts() {
  std::vector<std::string> texts;
  for (int i = 0; i < 3000; ++i) {
    const size_t len = (i % 97 == 0) ? 300000 : static_cast<size_t>(1 + (i * 7919) % 2000);
    texts.emplace_back(len, static_cast<char>('a' + i % 26));
  }
  return texts;
}

TEST(TokenizeTexts, ResultDoesNotDependOnTheThreadCount) {
  const std::vector<std::string> docs = mixed_texts();
  const std::vector<std::string_view> texts(docs.begin(), docs.end());
  const auto origin = [](size_t i) { return std::to_string(i); };
  TokenizeSettings one;
  one.threads = 1;
  const Corpus want = tokenize_texts(texts, BytesTokenizer(), one, origin);
  ASSERT_EQ(want.num_documents(), 3000);
  for (int threads : {2, 5, 16}) {
    TokenizeSettings s;
    s.threads = threads;
    const Corpus got = tokenize_texts(texts, BytesTokenizer(), s, origin);
    EXPECT_EQ(got.tokens, want.tokens) << threads;
    EXPECT_EQ(got.offsets, want.offsets) << threads;
  }
}

TEST(TokenizeTexts, ProgressIsCreditedExactlyTheGivenBytes) {
  const std::vector<std::string> docs = mixed_texts();
  const std::vector<std::string_view> texts(docs.begin(), docs.end());
  Progress progress("test", 123456789);
  TokenizeSettings s;
  s.threads = 4;
  s.progress = &progress;
  s.progress_bytes = 123456789;
  tokenize_texts(texts, BytesTokenizer(), s, [](size_t) { return std::string(); });
  EXPECT_EQ(progress.done(), 123456789);
}

class FailsOnBad : public BytesTokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    if (text.find("BAD") != std::string_view::npos) fail(ErrorKind::kInput, "bad text here");
    return BytesTokenizer::encode(text);
  }
};

TEST(TokenizeTexts, FirstBadTextIsReportedWithItsOrigin) {
  std::vector<std::string> docs = mixed_texts();
  docs[1500] = "BAD one";
  docs[2900] = "BAD two";
  const std::vector<std::string_view> texts(docs.begin(), docs.end());
  TokenizeSettings s;
  s.threads = 8;
  expect_error(
      [&] {
        tokenize_texts(texts, FailsOnBad(), s, [](size_t i) { return "row " + std::to_string(i); });
      },
      ErrorKind::kInput, {"row 1500: bad text here"});
}

TEST(TokenizeTexts, Utf8CheckNamesTheOriginAndOffset) {
  const std::vector<std::string_view> texts = {"fine", "ab\xC3"};
  TokenizeSettings s;
  s.check_utf8 = true;
  expect_error(
      [&] {
        tokenize_texts(texts, BytesTokenizer(), s,
                       [](size_t i) { return "row " + std::to_string(i); });
      },
      ErrorKind::kInput, {"row 1: invalid UTF-8 at byte offset 2"});
}

TEST(Progress, LineShowsBarPercentSizesRateAndTimeLeft) {
  EXPECT_EQ(Progress::format_line("d.parquet", 500000000, 2000000000, 10.0),
            "tokenizing d.parquet [#####...............]  25% 500.0 MB/2.00 GB 50.0 MB/s 30s left");
  EXPECT_EQ(Progress::format_line("x", 1500, 1500, 0.0),
            "tokenizing x [####################] 100% 1.5 kB/1.5 kB");
}

TEST(ContentHash, KnownDigestAndFilesHashLikeTheirBytes) {
  EXPECT_EQ(hash_bytes(""), "99aa06d3014798d86001c324468d497f");  // XXH3-128 of no bytes
  TempDir dir;
  std::string bytes;
  for (int i = 0; i < (9 << 20) + 17; ++i) bytes.push_back(static_cast<char>(i * 131 % 251));
  const std::string path = dir.write("f.bin", bytes);
  EXPECT_EQ(hash_file(path), hash_bytes(bytes));  // across several 4 MiB reads
  ContentHash parts;
  parts.update(std::string_view(bytes).substr(0, 1000));
  parts.update(std::string_view(bytes).substr(1000));
  EXPECT_EQ(parts.hex(), hash_bytes(bytes));
  bytes[5 << 20] ^= 1;
  EXPECT_NE(hash_bytes(bytes), hash_file(path));
  expect_error([&] { hash_file(dir.path("missing")); }, ErrorKind::kIo, {dir.path("missing")});
}

}  // namespace
}  // namespace dstrain::data
