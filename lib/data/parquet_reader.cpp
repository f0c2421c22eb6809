// Compiled as C++20 (Arrow's headers need it); see parquet_reader.h and cmake/DstrainArrow.cmake.
#include "data/parquet_reader.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>

#include <arrow/array.h>
#include <arrow/memory_pool.h>
#include <arrow/record_batch.h>
#include <arrow/type.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>
#include <parquet/properties.h>

#include "core/error.h"
#include "data/text_source.h"

// The wheel's libraries use the new std::string ABI; a translation unit built with the old one
// would hand them strings they misread.
static_assert(_GLIBCXX_USE_CXX11_ABI == 1, "Arrow C++ from pyarrow needs _GLIBCXX_USE_CXX11_ABI=1");

namespace dstrain::data {
namespace {

constexpr char kMagic[4] = {'P', 'A', 'R', '1'};
constexpr char kEncryptedMagic[4] = {'P', 'A', 'R', 'E'};
constexpr int64_t kBatchRows = 1024;
constexpr int64_t kStreamBufferBytes = int64_t{1} << 20;
constexpr size_t kColumnsNamed = 20;  // columns listed in a "no such column" message

std::string hex_bytes(const char* p, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += fmt::format("{}{:02x}", i ? " " : "", static_cast<unsigned char>(p[i]));
  }
  return out;
}

// Parquet's framing around pages and footer:
//   "PAR1" | column chunks | footer (thrift FileMetaData) | u32 footer length | "PAR1"
// Checked here first so that a damaged file is reported by the part that is wrong.
void check_framing(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail(ErrorKind::kIo, "cannot read {}: {}", path, std::strerror(errno));
  const int64_t size = static_cast<int64_t>(in.tellg());
  if (size < 12) {
    fail(ErrorKind::kInput,
         "{}: not a Parquet file: it has {} bytes, fewer than the 12 of its framing (\"PAR1\", "
         "footer length, \"PAR1\")",
         path, size);
  }
  char head[4], tail[8];
  in.seekg(0);
  in.read(head, 4);
  in.seekg(size - 8);
  in.read(tail, 8);
  if (!in) fail(ErrorKind::kIo, "cannot read {}", path);
  if (std::memcmp(head, kMagic, 4) != 0) {
    fail(ErrorKind::kInput, "{}: not a Parquet file: no \"PAR1\" magic at byte 0 (found {})", path,
         hex_bytes(head, 4));
  }
  if (std::memcmp(tail + 4, kEncryptedMagic, 4) == 0) {
    fail(ErrorKind::kInput,
         "{}: the Parquet footer is encrypted; encrypted files are not supported", path);
  }
  if (std::memcmp(tail + 4, kMagic, 4) != 0) {
    fail(ErrorKind::kInput,
         "{}: the Parquet file is truncated or its footer is damaged: it starts with \"PAR1\" but "
         "does not end with \"PAR1\" (its {} bytes end in {})",
         path, size, hex_bytes(tail + 4, 4));
  }
  uint32_t footer = 0;
  for (int i = 3; i >= 0; --i) footer = (footer << 8) | static_cast<unsigned char>(tail[i]);
  if (footer == 0 || footer > size - 12) {
    fail(ErrorKind::kInput,
         "{}: bad Parquet footer length {} (the u32 at byte {}): the file has {} bytes, so the "
         "footer can have at most {}",
         path, footer, size - 8, size, size - 12);
  }
}

void check(const arrow::Status& status, const std::string& path, const std::string& what) {
  if (!status.ok()) fail(ErrorKind::kInput, "{}: {}: {}", path, what, status.message());
}

std::unique_ptr<parquet::arrow::FileReader> open_reader(const std::string& path) {
  parquet::ReaderProperties props(arrow::default_memory_pool());
  props.enable_buffered_stream();  // read column chunks piecewise, never whole
  props.set_buffer_size(kStreamBufferBytes);
  parquet::ArrowReaderProperties arrow_props(/*use_threads=*/false);
  arrow_props.set_batch_size(kBatchRows);
  arrow_props.set_pre_buffer(false);
  parquet::arrow::FileReaderBuilder builder;
  check(builder.OpenFile(path, /*memory_map=*/false, props), path,
        "cannot read the Parquet footer (file metadata)");
  builder.properties(arrow_props);
  auto reader = builder.Build();
  check(reader.status(), path, "cannot read the Parquet schema");
  return std::move(reader).ValueOrDie();
}

bool is_text_type(const arrow::DataType& type) {
  switch (type.id()) {
    case arrow::Type::STRING:
    case arrow::Type::LARGE_STRING:
    case arrow::Type::STRING_VIEW:
      return true;
    case arrow::Type::DICTIONARY: {
      const auto id = static_cast<const arrow::DictionaryType&>(type).value_type()->id();
      return id == arrow::Type::STRING || id == arrow::Type::LARGE_STRING;
    }
    default:
      return false;
  }
}

// The leaf column index of the top-level string column `field`; `key` names the setting that
// chooses it.
int text_column(const parquet::arrow::FileReader& reader, const std::string& path,
                const std::string& field, const std::string& key = "data.text_field") {
  std::vector<const parquet::arrow::SchemaField*> found;
  std::string names;
  const auto& fields = reader.manifest().schema_fields;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (fields[i].field->name() == field) found.push_back(&fields[i]);
    if (i < kColumnsNamed) names += fmt::format("{}\"{}\"", i ? ", " : "", fields[i].field->name());
  }
  if (fields.size() > kColumnsNamed)
    names += fmt::format(" and {} more", fields.size() - kColumnsNamed);
  const bool chat = std::any_of(fields.begin(), fields.end(),
                                [](const auto& f) { return f.field->name() == "messages"; });
  if (found.empty() && chat) {
    fail(ErrorKind::kInput, "{}: no column \"{}\" but a \"messages\" column: {}", path, field,
         kChatDataSentence);
  }
  if (found.empty()) {
    fail(ErrorKind::kInput,
         "{}: no column \"{}\" (its columns: {}); set {} to the column that holds it", path, field,
         fields.empty() ? "none" : names, key);
  }
  if (found.size() > 1) {
    fail(ErrorKind::kInput, "{}: {} columns are named \"{}\"; the text column must be unique", path,
         found.size(), field);
  }
  const auto& f = *found[0];
  if (!f.is_leaf() || !is_text_type(*f.field->type())) {
    fail(ErrorKind::kInput,
         "{}: column \"{}\" has type {}, expected a string column (string, large_string, "
         "string_view or a dictionary of strings)",
         path, field, f.field->type()->ToString());
  }
  return f.column_index;
}

// Gathers the texts of record batches into chunks of about `chunk_bytes` and hands them on; the
// batches stay alive until their chunk has been handed on.
class ChunkBuilder {
 public:
  ChunkBuilder(int64_t chunk_bytes, int64_t total_rows, const ParquetChunkFn& on_chunk,
               ParquetScan& scan)
      : chunk_bytes_(chunk_bytes), on_chunk_(on_chunk), scan_(scan) {
    chunk_.total_rows = total_rows;
  }

  void add(const std::shared_ptr<arrow::Array>& column, int64_t first_row) {
    alive_.push_back(column);
    switch (column->type_id()) {
      case arrow::Type::STRING:
        collect(static_cast<const arrow::StringArray&>(*column), first_row);
        break;
      case arrow::Type::LARGE_STRING:
        collect(static_cast<const arrow::LargeStringArray&>(*column), first_row);
        break;
      case arrow::Type::STRING_VIEW:
        collect(static_cast<const arrow::StringViewArray&>(*column), first_row);
        break;
      default:
        collect_dictionary(static_cast<const arrow::DictionaryArray&>(*column), first_row);
        break;
    }
    chunk_.rows_read = first_row + column->length();
    if (bytes_ >= chunk_bytes_) flush();
  }

  void flush() {
    if (!chunk_.texts.empty()) on_chunk_(chunk_);
    chunk_.texts.clear();
    chunk_.rows.clear();
    alive_.clear();
    bytes_ = 0;
  }

 private:
  void take(bool is_null, std::string_view text, int64_t row) {
    if (is_null) {
      ++scan_.null_rows;
    } else if (text.empty()) {
      ++scan_.empty_rows;
    } else {
      chunk_.texts.push_back(text);
      chunk_.rows.push_back(row);
      bytes_ += static_cast<int64_t>(text.size());
    }
  }

  template <typename ArrayT>
  void collect(const ArrayT& a, int64_t first_row) {
    for (int64_t i = 0; i < a.length(); ++i) {
      take(a.IsNull(i), a.IsNull(i) ? std::string_view() : a.GetView(i), first_row + i);
    }
  }

  void collect_dictionary(const arrow::DictionaryArray& a, int64_t first_row) {
    const arrow::Array& dict = *a.dictionary();
    for (int64_t i = 0; i < a.length(); ++i) {
      const bool null = a.IsNull(i) || dict.IsNull(a.GetValueIndex(i));
      std::string_view text;
      if (!null) {
        const int64_t k = a.GetValueIndex(i);
        text = dict.type_id() == arrow::Type::LARGE_STRING
                   ? static_cast<const arrow::LargeStringArray&>(dict).GetView(k)
                   : static_cast<const arrow::StringArray&>(dict).GetView(k);
      }
      take(null, text, first_row + i);
    }
  }

  int64_t chunk_bytes_;
  const ParquetChunkFn& on_chunk_;
  ParquetScan& scan_;
  ParquetTextChunk chunk_;
  std::vector<std::shared_ptr<arrow::Array>> alive_;
  int64_t bytes_ = 0;
};

void read_row_group(parquet::arrow::FileReader& reader, int group, int column,
                    const std::string& path, const std::string& field, int64_t& row,
                    ChunkBuilder& chunks) {
  const std::string where = fmt::format("cannot read column \"{}\" of row group {}", field, group);
  auto batches = reader.GetRecordBatchReader({group}, {column});
  check(batches.status(), path, where);
  while (true) {
    std::shared_ptr<arrow::RecordBatch> batch;
    check((*batches)->ReadNext(&batch), path, fmt::format("{} (rows from {})", where, row));
    if (!batch) break;
    chunks.add(batch->column(0), row);
    row += batch->num_rows();
  }
}

// The text of row `i` of a string column (any of is_text_type's); nullopt for NULL.
std::optional<std::string_view> text_at(const arrow::Array& a, int64_t i) {
  if (a.IsNull(i)) return std::nullopt;
  switch (a.type_id()) {
    case arrow::Type::STRING:
      return static_cast<const arrow::StringArray&>(a).GetView(i);
    case arrow::Type::LARGE_STRING:
      return static_cast<const arrow::LargeStringArray&>(a).GetView(i);
    case arrow::Type::STRING_VIEW:
      return static_cast<const arrow::StringViewArray&>(a).GetView(i);
    default: {
      const auto& d = static_cast<const arrow::DictionaryArray&>(a);
      const int64_t k = d.GetValueIndex(i);
      if (d.dictionary()->IsNull(k)) return std::nullopt;
      return text_at(*d.dictionary(), k);
    }
  }
}

// Opens `path` (its framing checked first) and runs `read(reader, scan)` with scan.rows the
// footer's count; `read` returns the rows it read, which must be that count. The Parquet reader's
// exceptions become input errors naming the file (most of Arrow reports a Status; a few paths of
// the Parquet reader throw instead).
template <typename Read>
ParquetScan scan_file(const std::string& path, Read&& read) {
  check_framing(path);
  ParquetScan scan;
  try {
    auto reader = open_reader(path);
    scan.rows = reader->parquet_reader()->metadata()->num_rows();
    const int64_t rows = read(*reader, scan);
    if (rows != scan.rows) {
      fail(ErrorKind::kInput, "{}: the footer counts {} rows but the row groups hold {}", path,
           scan.rows, rows);
    }
  } catch (const parquet::ParquetException& e) {
    fail(ErrorKind::kInput, "{}: cannot read the Parquet file: {}", path, e.what());
  }
  return scan;
}

}  // namespace

ParquetScan read_parquet_pairs(const std::string& path, const std::string& prompt_field,
                               const std::string& completion_field, int64_t chunk_bytes,
                               const ParquetPairFn& on_chunk) {
  return scan_file(path, [&](parquet::arrow::FileReader& reader, ParquetScan& scan) {
    const int prompt = text_column(reader, path, prompt_field, "data.prompt_field");
    const int completion = text_column(reader, path, completion_field, "data.completion_field");
    ParquetPairChunk chunk;
    chunk.total_rows = scan.rows;
    std::vector<std::shared_ptr<arrow::RecordBatch>> alive;
    int64_t bytes = 0, row = 0;
    const auto flush = [&] {
      if (!chunk.rows.empty()) on_chunk(chunk);
      chunk.prompts.clear();
      chunk.completions.clear();
      chunk.rows.clear();
      alive.clear();
      bytes = 0;
    };
    for (int g = 0; g < reader.num_row_groups(); ++g) {
      const std::string where = fmt::format("cannot read columns \"{}\" and \"{}\" of row group {}",
                                            prompt_field, completion_field, g);
      auto batches = reader.GetRecordBatchReader({g}, {prompt, completion});
      check(batches.status(), path, where);
      while (true) {
        std::shared_ptr<arrow::RecordBatch> batch;
        check((*batches)->ReadNext(&batch), path, fmt::format("{} (rows from {})", where, row));
        if (!batch) break;
        alive.push_back(batch);
        for (int64_t i = 0; i < batch->num_rows(); ++i, ++row) {
          const std::optional<std::string_view> p = text_at(*batch->column(0), i);
          const std::optional<std::string_view> c = text_at(*batch->column(1), i);
          if (!p || !c) {
            fail(ErrorKind::kInput, "{}: row {}: column \"{}\" is NULL, expected a string", path,
                 row, p ? completion_field : prompt_field);
          }
          if (c->empty()) {
            fail(ErrorKind::kInput,
                 "{}: row {}: column \"{}\" is empty: a completion is what trains", path, row,
                 completion_field);
          }
          chunk.prompts.push_back(*p);
          chunk.completions.push_back(*c);
          chunk.rows.push_back(row);
          bytes += static_cast<int64_t>(p->size() + c->size());
        }
        chunk.rows_read = row;
        if (bytes >= chunk_bytes) flush();
      }
    }
    flush();
    return row;
  });
}

ParquetScan read_parquet_texts(const std::string& path, const std::string& text_field,
                               int64_t chunk_bytes, const ParquetChunkFn& on_chunk) {
  return scan_file(path, [&](parquet::arrow::FileReader& reader, ParquetScan& scan) {
    const int column = text_column(reader, path, text_field);
    ChunkBuilder chunks(chunk_bytes, scan.rows, on_chunk, scan);
    int64_t row = 0;
    for (int g = 0; g < reader.num_row_groups(); ++g) {
      read_row_group(reader, g, column, path, text_field, row, chunks);
    }
    chunks.flush();
    return row;
  });
}

}  // namespace dstrain::data
