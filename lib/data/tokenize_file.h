#pragma once
// `dstrain data tokenize`: tokenizes a text, JSONL or Parquet source once, on all cores, and writes
// a token file (token_file.h) atomically, so training start-up only reads tokens.

#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace dstrain::data {

struct TokenizeOptions {
  std::string tokenizer;  // "byte" or a tokenizer directory (used by the overload without one)
  std::string input;      // file, directory or glob pattern (see source.h)
  std::string output;     // token file to write
  std::string format = "auto";
  std::string text_field = "text";              // JSONL key or Parquet column
  std::string prompt_field = "prompt";          // format prompt_completion (source.h)
  std::string completion_field = "completion";  // ...
  std::string document = "file";
  std::string add_bos = "auto";  // as data.add_bos (tokenizer/document_prefix.h)
  int threads = 0;               // 0 = every core
};

struct TokenizeSummary {
  int64_t documents = 0;
  int64_t tokens = 0;
  int token_bytes = 0;    // 2 or 4
  int64_t null_rows = 0;  // Parquet rows whose text is NULL (skipped)
};

// Error(kInput) for bad input (see source.h) or an input without tokens (nothing is written then).
TokenizeSummary tokenize_to_file(const TokenizeOptions& options,
                                 const tokenizer::Tokenizer& tokenizer);

// Same, loading options.tokenizer with tokenizer::load_tokenizer.
TokenizeSummary tokenize_to_file(const TokenizeOptions& options);

// `dstrain debug decode`: the text of every document of a token file, written atomically as JSON
// Lines ({"text": ...} per document), so a checking tool can compare decoding with a reference.
// Bytes that are not UTF-8 (a byte-level tokenizer's ids cut inside a character) become U+FFFD.
// Returns the number of documents. Errors as read_token_file and Tokenizer::decode.
struct DecodeOptions {
  std::string tokenizer;  // "byte" or a tokenizer directory
  std::string input;      // token file
  std::string output;     // JSON Lines file to write
};
int64_t decode_to_jsonl(const DecodeOptions& options);

}  // namespace dstrain::data
