#pragma once
// Parquet files for the data tests, written by Arrow's own Parquet writer (the pyarrow wheel's
// libparquet, like the reader under test). Plain C++17: parquet_fixture.cpp, the only file that
// includes Arrow, is compiled as C++20 (see tests/unit/data/CMakeLists.txt).

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dstrain::data::testing {

struct ParquetWriteOptions {
  std::string compression = "snappy";  // snappy | zstd | gzip | uncompressed
  bool dictionary = true;              // dictionary pages (else plain encoding)
  bool data_page_v2 = false;
  int64_t row_group_rows = 1 << 20;
  std::string string_type = "string";  // string | large_string | dictionary (the Arrow type)
};

// A file with an int64 column "id" (the row number) and the string column `column` (nullopt =
// NULL), in that order.
void write_parquet_texts(const std::string& path, const std::string& column,
                         const std::vector<std::optional<std::string>>& texts,
                         const ParquetWriteOptions& options = {});

// A file with the string columns `columns` (name, values; nullopt = NULL), in that order, of
// equal length.
using TextColumn = std::pair<std::string, std::vector<std::optional<std::string>>>;
void write_parquet_columns(const std::string& path, const std::vector<TextColumn>& columns,
                           const ParquetWriteOptions& options = {});

// A file with one int64 column `column`.
void write_parquet_ints(const std::string& path, const std::string& column,
                        const std::vector<int64_t>& values);

}  // namespace dstrain::data::testing
