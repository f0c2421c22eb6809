#include "parquet_fixture.h"

#include <filesystem>
#include <stdexcept>

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/writer.h>
#include <parquet/properties.h>

namespace dstrain::data::testing {
namespace {

void ok(const arrow::Status& s) {
  if (!s.ok()) throw std::runtime_error("arrow: " + s.ToString());
}

template <typename Builder>
std::shared_ptr<arrow::Array> build(const std::vector<std::optional<std::string>>& texts) {
  Builder b;
  for (const auto& t : texts) ok(t ? b.Append(*t) : b.AppendNull());
  std::shared_ptr<arrow::Array> out;
  ok(b.Finish(&out));
  return out;
}

std::shared_ptr<arrow::Array> text_array(const std::vector<std::optional<std::string>>& texts,
                                         const std::string& type) {
  if (type == "large_string") return build<arrow::LargeStringBuilder>(texts);
  if (type == "dictionary") return build<arrow::StringDictionaryBuilder>(texts);
  return build<arrow::StringBuilder>(texts);
}

parquet::Compression::type codec(const std::string& name) {
  if (name == "zstd") return parquet::Compression::ZSTD;
  if (name == "gzip") return parquet::Compression::GZIP;
  if (name == "uncompressed") return parquet::Compression::UNCOMPRESSED;
  return parquet::Compression::SNAPPY;
}

void write(const std::string& path, const std::shared_ptr<arrow::Table>& table,
           const ParquetWriteOptions& o) {
  parquet::WriterProperties::Builder props;
  props.compression(codec(o.compression));
  if (o.dictionary) {
    props.enable_dictionary();
  } else {
    props.disable_dictionary();
  }
  props.data_page_version(o.data_page_v2 ? parquet::ParquetDataPageVersion::V2
                                         : parquet::ParquetDataPageVersion::V1);
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  auto sink = arrow::io::FileOutputStream::Open(path);
  ok(sink.status());
  ok(parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), *sink, o.row_group_rows,
                                props.build(),
                                parquet::ArrowWriterProperties::Builder().store_schema()->build()));
  ok((*sink)->Close());
}

}  // namespace

void write_parquet_texts(const std::string& path, const std::string& column,
                         const std::vector<std::optional<std::string>>& texts,
                         const ParquetWriteOptions& options) {
  arrow::Int64Builder ids;
  for (size_t i = 0; i < texts.size(); ++i) ok(ids.Append(static_cast<int64_t>(i)));
  std::shared_ptr<arrow::Array> id_array;
  ok(ids.Finish(&id_array));
  auto text = text_array(texts, options.string_type);
  auto schema =
      arrow::schema({arrow::field("id", arrow::int64()), arrow::field(column, text->type())});
  write(path, arrow::Table::Make(schema, {id_array, text}), options);
}

void write_parquet_columns(const std::string& path, const std::vector<TextColumn>& columns,
                           const ParquetWriteOptions& options) {
  std::vector<std::shared_ptr<arrow::Field>> fields;
  std::vector<std::shared_ptr<arrow::Array>> arrays;
  for (const auto& [name, values] : columns) {
    arrays.push_back(text_array(values, options.string_type));
    fields.push_back(arrow::field(name, arrays.back()->type()));
  }
  write(path, arrow::Table::Make(arrow::schema(fields), arrays), options);
}

void write_parquet_ints(const std::string& path, const std::string& column,
                        const std::vector<int64_t>& values) {
  arrow::Int64Builder b;
  ok(b.AppendValues(values));
  std::shared_ptr<arrow::Array> a;
  ok(b.Finish(&a));
  write(path, arrow::Table::Make(arrow::schema({arrow::field(column, arrow::int64())}), {a}), {});
}

}  // namespace dstrain::data::testing
