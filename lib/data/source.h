#pragma once
// A data source is a file or a directory, read into a tokenized Corpus. A directory contributes all
// its regular files, recursively, in sorted path order, skipping hidden names (starting with '.').
// With format "auto" each file's format is chosen on its own:
//   starts with the token-file magic → tokens;  .jsonl .ndjson .json → jsonl;  .parquet → parquet
//   (refused in this build);  anything else → text.

#include <string>
#include <vector>

#include "data/corpus.h"
#include "tokenizer/tokenizer.h"

namespace dstrain::data {

enum class Format { kAuto, kText, kJsonl, kTokens, kParquet };

// "auto" | "text" | "jsonl" | "tokens" | "parquet"; Error(kConfig) naming the value otherwise.
Format parse_format(const std::string& value);

struct SourceOptions {
  std::string format = "auto";
  std::string text_field = "text";  // jsonl: key of the document text
  std::string document = "file";    // text: one document per "file" or per "line"
  int threads = 0;                  // tokenizer threads; 0 = hardware concurrency (at most 16)
};

// The files a path stands for. Error(kInput) for a missing path or a directory without data files.
std::vector<std::string> list_source_files(const std::string& path);

// The format of one file given the requested one (resolves kAuto as described above).
Format resolve_format(const std::string& file, Format requested);

// Reads, checks and tokenizes every file of `path`, concatenating documents in file order.
// Token files must hold ids below tokenizer.vocab_size(). Errors: Error(kInput) naming the file
// (and line or byte offset) for missing files, bad UTF-8, bad JSONL lines, bad token files and
// Parquet.
Corpus load_corpus(const std::string& path, const SourceOptions& options,
                   const tokenizer::Tokenizer& tokenizer);

}  // namespace dstrain::data
