#include "data/source.h"

#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "data/parquet_reader.h"
#include "data/progress.h"
#include "data/text_source.h"
#include "data/token_file.h"
#include "data/tokenize.h"

namespace dstrain::data {
namespace {

namespace stdfs = std::filesystem;

// Texts of a Parquet file handed to the tokenizer at a time: enough for every core to be busy,
// little enough to keep memory flat.
constexpr int64_t kParquetChunkBytes = int64_t{32} << 20;

bool is_skipped_name(const stdfs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && (name[0] == '.' || name[0] == '_');
}

bool is_pattern(const std::string& path) {
  return path.find_first_of("*?[") != std::string::npos;
}

void add_directory_files(const std::string& dir, std::vector<std::string>& files) {
  std::error_code ec;
  std::vector<std::string> found;
  for (auto it = stdfs::recursive_directory_iterator(dir, ec);
       !ec && it != stdfs::recursive_directory_iterator(); it.increment(ec)) {
    if (is_skipped_name(it->path())) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec)) found.push_back(it->path().string());
  }
  if (ec) fail(ErrorKind::kIo, "cannot list directory {}: {}", dir, ec.message());
  std::sort(found.begin(), found.end());
  files.insert(files.end(), found.begin(), found.end());
}

// The directory glob(3) could not read and why, for the message; thread_local, as glob_matches may
// run on several threads at once.
thread_local std::string glob_failed_dir;
thread_local int glob_failed_errno = 0;

// glob(3)'s error callback. A directory that does not exist (or is a file) matches nothing: the
// data path is wrong, which "no file matches" says. Any other failure (no permission) stops the
// expansion: a partial file list would silently train on less data.
int on_glob_error(const char* dir, int err) {
  if (err == ENOENT || err == ENOTDIR) return 0;
  glob_failed_dir = dir;
  glob_failed_errno = err;
  return 1;
}

std::vector<std::string> glob_matches(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, on_glob_error, &g);
  std::vector<std::string> matches(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
  ::globfree(&g);
  if (rc == GLOB_NOMATCH) fail(ErrorKind::kInput, "{}: no file matches this data path", pattern);
  if (rc != 0) {
    fail(ErrorKind::kIo, "{}: cannot expand the pattern: cannot read directory {}: {}", pattern,
         glob_failed_dir, std::strerror(glob_failed_errno));
  }
  return matches;  // glob(3) sorts them
}

int64_t file_bytes(const std::string& file) {
  std::error_code ec;
  const auto size = stdfs::file_size(file, ec);
  return ec ? 0 : static_cast<int64_t>(size);
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

// The progress of a Parquet file tokenized chunk by chunk: each chunk credits the file's bytes in
// proportion to the rows read so far, finish() the rest.
class ParquetProgress {
 public:
  ParquetProgress(const std::string& file, Progress& progress)
      : bytes_(file_bytes(file)), progress_(progress) {}
  // The settings that tokenize (checking UTF-8) the chunk ending at `rows_read` of `total_rows`.
  TokenizeSettings chunk(const SourceOptions& o, int64_t rows_read, int64_t total_rows) {
    const auto upto =
        static_cast<int64_t>(static_cast<double>(bytes_) * static_cast<double>(rows_read) /
                             static_cast<double>(total_rows));
    const TokenizeSettings settings{o.threads, /*check_utf8=*/true, &progress_, upto - credited_};
    credited_ = upto;
    return settings;
  }
  void finish() { progress_.advance(bytes_ - credited_); }

 private:
  int64_t bytes_;
  Progress& progress_;
  int64_t credited_ = 0;
};

// Streams the text column chunk by chunk into the tokenizer; progress advances with the rows read.
Corpus load_parquet(const std::string& file, const SourceOptions& o,
                    const tokenizer::Tokenizer& tokenizer, Progress& progress, SourceStats& stats) {
  ParquetProgress credit(file, progress);
  Corpus corpus;
  const auto on_chunk = [&](const ParquetTextChunk& chunk) {
    corpus.append(
        tokenize_texts(chunk.texts, tokenizer, credit.chunk(o, chunk.rows_read, chunk.total_rows),
                       [&](size_t i) { return fmt::format("{}: row {}", file, chunk.rows[i]); }));
  };
  const ParquetScan scan = read_parquet_texts(file, o.text_field, kParquetChunkBytes, on_chunk);
  credit.finish();
  stats.null_rows += scan.null_rows;
  log::debug("data: {}: {} rows, {} NULL, {} empty", file, scan.rows, scan.null_rows,
             scan.empty_rows);
  return corpus;
}

// A pair's document: prompt and completion tokenized as one text; its prompt length: how many of
// its first tokens are the prompt's tokenized alone (TRL's completion mask: the common prefix).
// Where a token spans the end of the prompt, the completion's labels start where the two diverge,
// as TRL's do; one warning says in how many pairs.
Corpus tokenize_pairs(const std::vector<std::string_view>& prompts,
                      const std::vector<std::string_view>& completions,
                      const tokenizer::Tokenizer& tokenizer, const TokenizeSettings& settings,
                      const std::string& file, const TextOrigin& origin) {
  std::vector<std::string> joined(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    joined[i].reserve(prompts[i].size() + completions[i].size());
    joined[i].append(prompts[i]).append(completions[i]);
  }
  Corpus corpus = tokenize_texts(std::vector<std::string_view>(joined.begin(), joined.end()),
                                 tokenizer, settings, origin);
  TokenizeSettings quiet = settings;
  quiet.progress = nullptr;
  quiet.progress_bytes = 0;
  const Corpus alone = tokenize_texts(prompts, tokenizer, quiet, origin);
  corpus.prompt_lengths.resize(prompts.size());
  int64_t spanning = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto d = static_cast<int64_t>(i);
    const int32_t* prompt = alone.document_data(d);
    const int64_t n = std::min(alone.document_length(d), corpus.document_length(d));
    const int64_t common =
        std::mismatch(prompt, prompt + n, corpus.document_data(d)).first - prompt;
    corpus.prompt_lengths[i] = common;
    if (common < alone.document_length(d)) ++spanning;
  }
  if (spanning > 0) {
    log::warn(
        "data: {}: in {} of {} pairs the prompt's tokens are not the start of the pair's (a token "
        "spans prompt and completion); the completion's labels start where they diverge, as TRL's "
        "do",
        file, spanning, prompts.size());
  }
  return corpus;
}

Corpus load_pairs(const std::string& file, const SourceOptions& o,
                  const tokenizer::Tokenizer& tokenizer, Progress& progress) {
  const std::string ext = stdfs::path(file).extension().string();
  if (ext == ".parquet") {
    ParquetProgress credit(file, progress);
    Corpus corpus;
    const auto on_chunk = [&](const ParquetPairChunk& chunk) {
      corpus.append(
          tokenize_pairs(chunk.prompts, chunk.completions, tokenizer,
                         credit.chunk(o, chunk.rows_read, chunk.total_rows), file,
                         [&](size_t i) { return fmt::format("{}: row {}", file, chunk.rows[i]); }));
    };
    read_parquet_pairs(file, o.prompt_field, o.completion_field, kParquetChunkBytes, on_chunk);
    credit.finish();
    return corpus;
  }
  if (ext != ".jsonl" && ext != ".ndjson" && ext != ".json") {
    fail(ErrorKind::kInput,
         "{}: data.format: prompt_completion reads JSON Lines (.jsonl, .ndjson, .json) and Parquet "
         "(.parquet) files; this file is neither",
         file);
  }
  const std::vector<PromptCompletion> pairs =
      read_jsonl_pairs(file, o.prompt_field, o.completion_field);
  std::vector<std::string_view> prompts, completions;
  for (const PromptCompletion& p : pairs) {
    prompts.push_back(p.prompt);
    completions.push_back(p.completion);
  }
  const TokenizeSettings settings{o.threads, /*check_utf8=*/false, &progress, file_bytes(file)};
  return tokenize_pairs(prompts, completions, tokenizer, settings, file,
                        [&](size_t i) { return fmt::format("{}: pair {}", file, i); });
}

Corpus tokenize_file_documents(const std::vector<std::string>& documents, const std::string& file,
                               const SourceOptions& o, const tokenizer::Tokenizer& tokenizer,
                               Progress& progress) {
  const std::vector<std::string_view> texts(documents.begin(), documents.end());
  const TokenizeSettings settings{o.threads, /*check_utf8=*/false, &progress, file_bytes(file)};
  return tokenize_texts(texts, tokenizer, settings,
                        [&](size_t i) { return fmt::format("{}: document {}", file, i); });
}

Corpus load_file(const std::string& file, Format format, const SourceOptions& options,
                 const tokenizer::Tokenizer& tokenizer, Progress& progress, SourceStats& stats) {
  switch (format) {
    case Format::kTokens: {
      Corpus c = read_token_file(file);
      check_vocab(c, file, tokenizer.vocab_size());
      progress.advance(file_bytes(file));
      return c;
    }
    case Format::kParquet:
      return load_parquet(file, options, tokenizer, progress, stats);
    case Format::kPromptCompletion:
      return load_pairs(file, options, tokenizer, progress);
    case Format::kJsonl:
      return tokenize_file_documents(read_jsonl_documents(file, options.text_field), file, options,
                                     tokenizer, progress);
    case Format::kText:
    case Format::kAuto:
      break;
  }
  const DocumentUnit unit = parse_document_unit(options.document);
  return tokenize_file_documents(read_text_documents(file, unit), file, options, tokenizer,
                                 progress);
}

}  // namespace

Format parse_format(const std::string& value) {
  if (value == "auto") return Format::kAuto;
  if (value == "text") return Format::kText;
  if (value == "jsonl") return Format::kJsonl;
  if (value == "tokens") return Format::kTokens;
  if (value == "parquet") return Format::kParquet;
  if (value == "prompt_completion") return Format::kPromptCompletion;
  fail(ErrorKind::kConfig,
       "data.format: expected one of auto, text, jsonl, tokens, parquet, prompt_completion; got "
       "\"{}\"",
       value);
}

std::vector<std::string> list_source_files(const std::string& path) {
  std::error_code ec;
  if (path.empty()) fail(ErrorKind::kInput, "no data path given (set data.train_path)");
  std::vector<std::string> matches;
  if (stdfs::exists(path, ec)) {
    matches.push_back(path);
  } else if (is_pattern(path)) {
    matches = glob_matches(path);
  } else {
    fail(ErrorKind::kInput, "{}: data path not found", path);
  }
  std::vector<std::string> files;
  for (const std::string& m : matches) {
    if (stdfs::is_directory(m, ec)) {
      add_directory_files(m, files);
    } else {
      files.push_back(m);
    }
  }
  if (files.empty()) fail(ErrorKind::kInput, "{}: directory holds no data files", path);
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
                   const tokenizer::Tokenizer& tokenizer, SourceStats* stats) {
  const Format requested = parse_format(options.format);
  parse_document_unit(options.document);  // reject a bad value even when no text file is read
  const std::vector<std::string> files = list_source_files(path);
  int64_t total_bytes = 0;
  for (const std::string& file : files) total_bytes += file_bytes(file);
  Progress progress(path, total_bytes);
  SourceStats seen;
  Corpus corpus;
  for (const std::string& file : files) {
    Corpus part =
        load_file(file, resolve_format(file, requested), options, tokenizer, progress, seen);
    log::debug("data: {}: {} documents, {} tokens", file, part.num_documents(), part.num_tokens());
    if (corpus.num_documents() == 0) {
      corpus = std::move(part);
    } else {
      corpus.append(part);
    }
  }
  if (stats) *stats = seen;
  return corpus;
}

}  // namespace dstrain::data
