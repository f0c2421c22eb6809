#pragma once
// A data source is a file, a directory or a glob pattern, read into a tokenized Corpus.
//  - a directory contributes all its regular files, recursively, in sorted path order, skipping
//    names that start with '.' or '_' (hidden files, and the _SUCCESS / _metadata files that
//    Spark, Hive and Arrow write beside Parquet parts);
//  - a path that does not exist but holds '*', '?' or '[' is a glob pattern (POSIX glob(3), in
//    any path component; no '**'): its matches in sorted order, a matched directory expanded as
//    above.
// With format "auto" each file's format is chosen on its own:
//   starts with the token-file magic → tokens;  .jsonl .ndjson .json → jsonl;  .parquet → parquet;
//   anything else → text.
// Format prompt_completion (data.format: prompt_completion) reads JSON Lines (.jsonl .ndjson
// .json) and Parquet files of prompt/completion pairs (text_source.h, parquet_reader.h): a pair's
// document is its prompt and completion tokenized as one text, its prompt length how many of its
// first tokens are those of the prompt tokenized alone, as TRL's completion mask counts them
// (corpus.h; the labels of those tokens are -100, samples.h).
// Files are tokenized on all cores (tokenize.h) with a progress display (progress.h); Parquet files
// are streamed a chunk of rows at a time (parquet_reader.h), never read whole.

#include <cstdint>
#include <string>
#include <vector>

#include "data/corpus.h"
#include "tokenizer/tokenizer.h"

namespace dstrain::data {

enum class Format { kAuto, kText, kJsonl, kTokens, kParquet, kPromptCompletion };

// "auto" | "text" | "jsonl" | "tokens" | "parquet" | "prompt_completion"; Error(kConfig) naming
// the value otherwise.
Format parse_format(const std::string& value);

struct SourceOptions {
  std::string format = "auto";
  std::string text_field = "text";      // jsonl: key of the document text; parquet: its column
  std::string document = "file";        // text: one document per "file" or per "line"
  int threads = 0;                      // tokenizer threads; 0 = every core
  std::string prompt_field = "prompt";  // prompt_completion: the prompt's key or column
  std::string completion_field = "completion";  // ... and the completion's
};

// The source options of a run's or a command's options (DataOptions, TokenizeOptions: the same
// member names).
template <typename Options>
SourceOptions source_options(const Options& o) {
  SourceOptions s;
  s.format = o.format;
  s.text_field = o.text_field;
  s.document = o.document;
  s.threads = o.threads;
  s.prompt_field = o.prompt_field;
  s.completion_field = o.completion_field;
  return s;
}

// What a load saw besides the documents.
struct SourceStats {
  int64_t null_rows = 0;  // Parquet rows whose text is NULL (skipped)
};

// The files a path stands for. Error(kInput) for a missing path, a directory without data files
// and a pattern that matches none.
std::vector<std::string> list_source_files(const std::string& path);

// The format of one file given the requested one (resolves kAuto as described above).
Format resolve_format(const std::string& file, Format requested);

// Reads, checks and tokenizes every file of `path`, concatenating documents in file order (rows in
// row order). Token files must hold ids below tokenizer.vocab_size(). Errors: Error(kInput) naming
// the file (and line, row or byte offset) for missing files, bad UTF-8, bad JSONL lines, bad token
// files and bad Parquet files (parquet_reader.h); Error(kConfig) for a bad format or document.
Corpus load_corpus(const std::string& path, const SourceOptions& options,
                   const tokenizer::Tokenizer& tokenizer, SourceStats* stats = nullptr);

}  // namespace dstrain::data
