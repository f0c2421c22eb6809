#pragma once
// Parquet files, read with Apache Arrow's own Parquet reader (parquet::arrow::FileReader from the
// pyarrow wheel; cmake/DstrainArrow.cmake). This header is plain C++17 and names no Arrow type:
// Arrow's headers need C++20, so parquet_reader.cpp alone includes them, in a library of its own.
//
// Memory stays bounded whatever the file: only the text column is read, row group by row group,
// through a record batch reader that decodes about a thousand rows at a time from a buffered
// stream (a column chunk is never read whole), and the texts go to the caller in chunks of about
// `chunk_bytes` that are released before the next one is read.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace dstrain::data {

// Consecutive rows' texts. The views point into Arrow's buffers and are valid only during the
// callback that receives the chunk.
struct ParquetTextChunk {
  std::vector<std::string_view> texts;  // the non-NULL, non-empty texts, in row order
  std::vector<int64_t> rows;            // row index in the file of each text (0-based)
  int64_t rows_read = 0;                // rows of the file read so far, this chunk included
  int64_t total_rows = 0;               // rows in the file
};

struct ParquetScan {
  int64_t rows = 0;        // rows in the file
  int64_t null_rows = 0;   // rows whose text is NULL (skipped)
  int64_t empty_rows = 0;  // rows whose text is "" (skipped, like any empty document)
};

using ParquetChunkFn = std::function<void(const ParquetTextChunk&)>;

// Calls `on_chunk` with the texts of the string column `text_field` (a top-level column of type
// string, large_string, string_view, or a dictionary of strings), in row order; other columns are
// not read. A file with 0 rows calls it never. Errors from `on_chunk` propagate unchanged.
// Errors, all naming the file: Error(kIo) when it cannot be opened; Error(kInput) when it is not
// a Parquet file (no "PAR1" magic), is truncated, has a footer length that does not fit the file,
// unreadable metadata or pages, no column `text_field`, or a column that is not a string.
ParquetScan read_parquet_texts(const std::string& path, const std::string& text_field,
                               int64_t chunk_bytes, const ParquetChunkFn& on_chunk);

// Consecutive rows' prompt and completion texts (data.format: prompt_completion); views as above.
struct ParquetPairChunk {
  std::vector<std::string_view> prompts;
  std::vector<std::string_view> completions;
  std::vector<int64_t> rows;  // row index in the file of each pair (0-based)
  int64_t rows_read = 0;
  int64_t total_rows = 0;
};

using ParquetPairFn = std::function<void(const ParquetPairChunk&)>;

// The same for the string columns `prompt_field` and `completion_field`: every row is a pair.
// Errors as read_parquet_texts (a missing column beside a `messages` column says
// kChatDataSentence, text_source.h), and Error(kInput) naming the file, row and column for a NULL
// cell and an empty completion.
ParquetScan read_parquet_pairs(const std::string& path, const std::string& prompt_field,
                               const std::string& completion_field, int64_t chunk_bytes,
                               const ParquetPairFn& on_chunk);

}  // namespace dstrain::data
