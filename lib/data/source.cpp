#include "data/source.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "data/text_source.h"
#include "data/token_file.h"
#include "data/tokenize.h"

namespace dstrain::data {
namespace {

namespace stdfs = std::filesystem;

bool is_hidden(const stdfs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

[[noreturn]] void parquet_unsupported(const std::string& file) {
  fail(ErrorKind::kInput,
       "{}: Parquet is not supported in this build (Apache Arrow/Parquet is not packaged for this "
       "system); convert it to JSON Lines first, e.g. python3 -c \"import pandas as pd; "
       "pd.read_parquet('{}').to_json('data.jsonl', orient='records', lines=True, "
       "force_ascii=False)\", and set data.train_path to data.jsonl",
       file, file);
}

void check_vocab(const Corpus& corpus, const std::string& file, int64_t vocab_size) {
  for (size_t i = 0; i < corpus.tokens.size(); ++i) {
    if (corpus.tokens[i] >= vocab_size) {
      fail(
          ErrorKind::kInput,
          "{}: token {} at token index {} is not below the tokenizer's vocab_size {} (was the file "
          "written with another tokenizer?)",
          file, corpus.tokens[i], i, vocab_size);
    }
  }
}

Corpus load_file(const std::string& file, Format format, const SourceOptions& options,
                 const tokenizer::Tokenizer& tokenizer) {
  switch (format) {
    case Format::kTokens: {
      Corpus c = read_token_file(file);
      check_vocab(c, file, tokenizer.vocab_size());
      return c;
    }
    case Format::kParquet:
      parquet_unsupported(file);
    case Format::kJsonl:
      return tokenize_documents(read_jsonl_documents(file, options.text_field), tokenizer,
                                options.threads, file);
    case Format::kText:
    case Format::kAuto:
      break;
  }
  const DocumentUnit unit = parse_document_unit(options.document);
  return tokenize_documents(read_text_documents(file, unit), tokenizer, options.threads, file);
}

}  // namespace

Format parse_format(const std::string& value) {
  if (value == "auto") return Format::kAuto;
  if (value == "text") return Format::kText;
  if (value == "jsonl") return Format::kJsonl;
  if (value == "tokens") return Format::kTokens;
  if (value == "parquet") return Format::kParquet;
  fail(ErrorKind::kConfig,
       "data.format: expected one of auto, text, jsonl, tokens, parquet; got \"{}\"", value);
}

std::vector<std::string> list_source_files(const std::string& path) {
  std::error_code ec;
  if (path.empty()) fail(ErrorKind::kInput, "no data path given (set data.train_path)");
  if (!stdfs::exists(path, ec)) fail(ErrorKind::kInput, "{}: data path not found", path);
  if (!stdfs::is_directory(path, ec)) return {path};
  std::vector<std::string> files;
  for (auto it = stdfs::recursive_directory_iterator(path, ec);
       !ec && it != stdfs::recursive_directory_iterator(); it.increment(ec)) {
    if (is_hidden(it->path())) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec)) files.push_back(it->path().string());
  }
  if (ec) fail(ErrorKind::kIo, "cannot list directory {}: {}", path, ec.message());
  if (files.empty()) fail(ErrorKind::kInput, "{}: directory holds no data files", path);
  std::sort(files.begin(), files.end());
  return files;
}

Format resolve_format(const std::string& file, Format requested) {
  if (requested != Format::kAuto) return requested;
  if (has_token_file_magic(file)) return Format::kTokens;
  const std::string ext = stdfs::path(file).extension().string();
  if (ext == ".jsonl" || ext == ".ndjson" || ext == ".json") return Format::kJsonl;
  if (ext == ".parquet") return Format::kParquet;
  return Format::kText;
}

Corpus load_corpus(const std::string& path, const SourceOptions& options,
                   const tokenizer::Tokenizer& tokenizer) {
  const Format requested = parse_format(options.format);
  parse_document_unit(options.document);  // reject a bad value even when no text file is read
  Corpus corpus;
  for (const std::string& file : list_source_files(path)) {
    Corpus part = load_file(file, resolve_format(file, requested), options, tokenizer);
    log::debug("data: {}: {} documents, {} tokens", file, part.num_documents(), part.num_tokens());
    if (corpus.num_documents() == 0) {
      corpus = std::move(part);
    } else {
      corpus.append(part);
    }
  }
  return corpus;
}

}  // namespace dstrain::data
