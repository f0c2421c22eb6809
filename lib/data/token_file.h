#pragma once
// Pre-tokenized corpus files, written by `dstrain data tokenize` so that a large corpus is
// tokenized once instead of at every start-up. Layout (all integers little-endian, see
// docs/data.md):
//
//   offset  size             field
//   0       8                magic "DSTOKENS"
//   8       4   u32          version (1)
//   12      4   u32          token_bytes: 2 (uint16 tokens) or 4 (uint32 tokens)
//   16      8   u64          vocab_size of the tokenizer that wrote the file
//   24      8   u64          token_count
//   32      8   u64          document_count
//   40      8*(docs+1) u64   document offsets in tokens: 0, ..., token_count (non-decreasing)
//   ...     token_bytes*token_count  tokens
//   ...     8*docs      u64      version 2 only: each document's prompt length in tokens (at most
//                                its length), for prompt/completion data (corpus.h)
//
// The file ends exactly there. uint16 is used whenever vocab_size <= 65536. Version 1 is written
// for a corpus without prompts, version 2 for one with; both are read.

#include <cstdint>
#include <string>

#include "data/corpus.h"

namespace dstrain::data {

inline constexpr char kTokenFileMagic[8] = {'D', 'S', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr uint32_t kTokenFileVersion = 1;
inline constexpr uint32_t kTokenFileVersionPrompts = 2;
inline constexpr int64_t kTokenFileHeaderBytes = 40;

struct TokenFileHeader {
  uint32_t version = kTokenFileVersion;
  uint32_t token_bytes = 2;
  uint64_t vocab_size = 0;
  uint64_t token_count = 0;
  uint64_t document_count = 0;
};

// Writes `corpus` atomically (temp + fsync + rename). Error(kInput) if a token is negative or not
// below `vocab_size`; Error(kIo) if the file cannot be written.
void write_token_file(const std::string& path, const Corpus& corpus, int64_t vocab_size);

// Reads and validates a token file. Error(kInput) naming the file for a missing file, bad magic,
// unsupported version or dtype, a size that does not match the header (truncated or trailing
// bytes), bad document offsets, or a token id not below the header's vocab_size.
Corpus read_token_file(const std::string& path, TokenFileHeader* header = nullptr);

// True when the file exists and starts with the token-file magic (used by format "auto").
bool has_token_file_magic(const std::string& path);

}  // namespace dstrain::data
