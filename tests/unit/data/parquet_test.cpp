// The Parquet source against files written by Arrow's own writer (parquet_fixture.h): every codec,
// both encodings and page versions, several row groups, NULLs, the Arrow string types, and damaged
// files. tests/reference/test_parquet.py does the same with files from pyarrow and DuckDB.
#include <filesystem>

#include <gtest/gtest.h>

#include "core/fs.h"
#include "data/parquet_reader.h"
#include "data/source.h"
#include "data/token_file.h"
#include "data/tokenize_file.h"
#include "parquet_fixture.h"
#include "test_util.h"

namespace dstrain::data {
namespace {

using testing::BytesTokenizer;
using testing::expect_error;
using testing::ids;
using testing::ParquetWriteOptions;
using testing::TempDir;
using testing::write_parquet_ints;
using testing::write_parquet_texts;
using Texts = std::vector<std::optional<std::string>>;

// 50 rows: NULLs, empty strings, several scripts, and two long texts.
Texts sample_texts() {
  Texts t;
  for (int i = 0; i < 50; ++i) {
    if (i % 7 == 3) {
      t.push_back(std::nullopt);
    } else if (i % 11 == 5) {
      t.push_back("");
    } else if (i == 20 || i == 41) {
      std::string long_text;
      for (int k = 0; k < 20000; ++k) long_text += "lorem ipsum Ωμέγα 中文 ";
      t.push_back(long_text + std::to_string(i));
    } else {
      t.push_back("row " + std::to_string(i) + ": naïve café Привет 日本語 😀 " +
                  std::string(static_cast<size_t>(i % 5), 'x'));
    }
  }
  return t;
}

struct Read {
  std::vector<std::string> texts;
  std::vector<int64_t> rows;
  ParquetScan scan;
  int chunks = 0;
  size_t largest_chunk = 0;
};

Read read_all(const std::string& path, const std::string& field = "text",
              int64_t chunk_bytes = 1 << 20) {
  Read r;
  r.scan = read_parquet_texts(path, field, chunk_bytes, [&](const ParquetTextChunk& c) {
    ++r.chunks;
    r.largest_chunk = std::max(r.largest_chunk, c.texts.size());
    EXPECT_EQ(c.texts.size(), c.rows.size());
    EXPECT_LE(c.rows_read, c.total_rows);
    for (size_t i = 0; i < c.texts.size(); ++i) {
      r.texts.emplace_back(c.texts[i]);
      r.rows.push_back(c.rows[i]);
    }
  });
  return r;
}

void expect_texts(const Read& r, const Texts& written) {
  std::vector<std::string> texts;
  std::vector<int64_t> rows;
  int64_t nulls = 0, empties = 0;
  for (size_t i = 0; i < written.size(); ++i) {
    if (!written[i]) {
      ++nulls;
    } else if (written[i]->empty()) {
      ++empties;
    } else {
      texts.push_back(*written[i]);
      rows.push_back(static_cast<int64_t>(i));
    }
  }
  EXPECT_EQ(r.texts, texts);
  EXPECT_EQ(r.rows, rows);
  EXPECT_EQ(r.scan.rows, static_cast<int64_t>(written.size()));
  EXPECT_EQ(r.scan.null_rows, nulls);
  EXPECT_EQ(r.scan.empty_rows, empties);
}

TEST(ParquetReader, ReadsEveryCodecEncodingPageVersionAndStringType) {
  TempDir dir;
  const Texts written = sample_texts();
  int n = 0;
  for (const char* codec : {"snappy", "zstd", "gzip", "uncompressed"}) {
    for (bool dictionary : {true, false}) {
      for (bool v2 : {false, true}) {
        for (const char* type : {"string", "large_string", "dictionary"}) {
          ParquetWriteOptions o;
          o.compression = codec;
          o.dictionary = dictionary;
          o.data_page_v2 = v2;
          o.string_type = type;
          o.row_group_rows = 7;  // 8 row groups
          const std::string path = dir.path("f" + std::to_string(n++) + ".parquet");
          write_parquet_texts(path, "text", written, o);
          SCOPED_TRACE(fmt::format("{} dictionary={} v2={} {}", codec, dictionary, v2, type));
          expect_texts(read_all(path), written);
        }
      }
    }
  }
}

TEST(ParquetReader, StreamsInChunksOfAboutTheChunkSize) {
  TempDir dir;
  Texts written;
  for (int i = 0; i < 5000; ++i) written.push_back(std::string(100, 'a' + i % 26));
  ParquetWriteOptions o;
  o.row_group_rows = 3000;
  const std::string path = dir.path("many.parquet");
  write_parquet_texts(path, "text", written, o);
  // 100-byte texts, chunks of 10 kB: every record batch (at most 1024 rows) fills a chunk.
  const Read r = read_all(path, "text", 10000);
  expect_texts(r, written);
  EXPECT_GE(r.chunks, 5);
  EXPECT_LE(r.largest_chunk, 1024u);
}

TEST(ParquetReader, ZeroRowsGiveNoChunk) {
  TempDir dir;
  const std::string path = dir.path("empty.parquet");
  write_parquet_texts(path, "text", {});
  const Read r = read_all(path);
  EXPECT_EQ(r.chunks, 0);
  EXPECT_EQ(r.scan.rows, 0);
}

TEST(ParquetReader, TextFieldPicksTheColumnAndAMissingOneListsTheColumns) {
  TempDir dir;
  const std::string path = dir.path("c.parquet");
  write_parquet_texts(path, "content", {std::string("hello"), std::nullopt});
  EXPECT_EQ(read_all(path, "content").texts, std::vector<std::string>{"hello"});
  expect_error([&] { read_all(path, "text"); }, ErrorKind::kInput,
               {path, "no column \"text\"", "\"id\", \"content\"", "data.text_field"});
}

TEST(ParquetReader, ColumnThatIsNotAStringIsNamedWithItsType) {
  TempDir dir;
  const std::string path = dir.path("i.parquet");
  write_parquet_ints(path, "text", {1, 2, 3});
  expect_error([&] { read_all(path); }, ErrorKind::kInput,
               {path, "column \"text\" has type int64", "expected a string column"});
}

class DamagedParquet : public ::testing::Test {
 protected:
  std::string good_bytes() {
    Texts t;
    for (int i = 0; i < 200; ++i) t.push_back("text number " + std::to_string(i));
    ParquetWriteOptions o;
    o.compression = "zstd";
    o.dictionary = false;
    write_parquet_texts(dir_.path("good.parquet"), "text", t, o);
    return fs::read_file(dir_.path("good.parquet"));
  }
  TempDir dir_;
};

TEST_F(DamagedParquet, BadMagic) {
  std::string b = good_bytes();
  b.replace(0, 4, "PK\x03\x04");
  const auto path = dir_.write("bad.parquet", b);
  expect_error([&] { read_all(path); }, ErrorKind::kInput,
               {path, "not a Parquet file", "no \"PAR1\" magic at byte 0", "50 4b 03 04"});
}

TEST_F(DamagedParquet, TruncatedFile) {
  const std::string b = good_bytes();
  const auto path = dir_.write("cut.parquet", b.substr(0, b.size() / 2));
  expect_error([&] { read_all(path); }, ErrorKind::kInput,
               {path, "truncated", std::to_string(b.size() / 2) + " bytes"});
}

TEST_F(DamagedParquet, FooterLengthLargerThanTheFile) {
  std::string b = good_bytes();
  const size_t at = b.size() - 8;
  b[at] = '\xff';
  b[at + 1] = '\xff';
  b[at + 2] = '\xff';
  const auto path = dir_.write("footer.parquet", b);
  expect_error([&] { read_all(path); }, ErrorKind::kInput,
               {path, "bad Parquet footer length", "byte " + std::to_string(at)});
}

TEST_F(DamagedParquet, FooterLengthTooSmallIsAnUnreadableFooter) {
  std::string b = good_bytes();
  const size_t at = b.size() - 8;
  b[at] = static_cast<char>(static_cast<unsigned char>(b[at]) - 5);
  const auto path = dir_.write("footer.parquet", b);
  expect_error([&] { read_all(path); }, ErrorKind::kInput, {path, "Parquet footer"});
}

TEST_F(DamagedParquet, TinyFile) {
  const auto path = dir_.write("tiny.parquet", "PAR1PAR1");
  expect_error([&] { read_all(path); }, ErrorKind::kInput, {path, "8 bytes", "not a Parquet file"});
}

TEST_F(DamagedParquet, CorruptPagesNameTheColumnAndRowGroup) {
  std::string b = good_bytes();
  for (size_t i = 40; i < 400 && i < b.size() / 2; ++i) b[i] = static_cast<char>(i * 37);
  const auto path = dir_.write("pages.parquet", b);
  expect_error([&] { read_all(path); }, ErrorKind::kInput,
               {path, "cannot read column \"text\" of row group 0"});
}

TEST(ParquetSource, DirectoryOfPartsIsReadInOrderCountingNulls) {
  TempDir dir;
  write_parquet_texts(dir.path("ds/part-1.parquet"), "text", {std::string("c"), std::nullopt});
  write_parquet_texts(dir.path("ds/part-0.parquet"), "text",
                      {std::string("a"), std::nullopt, std::string("b")});
  dir.write("ds/_SUCCESS", "");
  SourceStats stats;
  const Corpus c = load_corpus(dir.path("ds"), {}, BytesTokenizer(), &stats);
  ASSERT_EQ(c.num_documents(), 3);
  EXPECT_EQ(c.tokens, (std::vector<int32_t>{'a', 'b', 'c'}));
  EXPECT_EQ(stats.null_rows, 2);
  const Corpus globbed = load_corpus(dir.path("ds/*.parquet"), {}, BytesTokenizer());
  EXPECT_EQ(globbed.tokens, c.tokens);
}

TEST(ParquetSource, InvalidUtf8NamesTheRow) {
  TempDir dir;
  const std::string path = dir.path("u.parquet");
  write_parquet_texts(path, "text", {std::string("ok"), std::string("b\xff")});
  expect_error([&] { load_corpus(path, {}, BytesTokenizer()); }, ErrorKind::kInput,
               {path + ": row 1: invalid UTF-8 at byte offset 1"});
}

TEST(ParquetSource, TokenizeCommandCountsNullsAndWritesNothingOnABadFile) {
  TempDir dir;
  write_parquet_texts(dir.path("in/a.parquet"), "body",
                      {std::string("alpha"), std::nullopt, std::string("beta")});
  TokenizeOptions o;
  o.input = dir.path("in");
  o.output = dir.path("out.tok");
  o.text_field = "body";
  const TokenizeSummary s = tokenize_to_file(o, BytesTokenizer());
  EXPECT_EQ(s.documents, 2);
  EXPECT_EQ(s.tokens, 9);
  EXPECT_EQ(s.null_rows, 1);
  EXPECT_EQ(read_token_file(o.output).tokens, [] {
    auto t = ids("alpha");
    for (int32_t id : ids("beta")) t.push_back(id);
    return t;
  }());
  dir.write("in/b.parquet", "PAR1 not really");
  o.output = dir.path("out2.tok");
  expect_error([&] { tokenize_to_file(o, BytesTokenizer()); }, ErrorKind::kInput,
               {dir.path("in/b.parquet")});
  EXPECT_FALSE(std::filesystem::exists(o.output));
}

}  // namespace
}  // namespace dstrain::data
