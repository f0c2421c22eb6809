#pragma once
// Everything a byte-level BPE tokenizer is built from, independent of the file format it was read
// from (tokenizer.json, or vocab.json + merges.txt + config files). The readers fill it; the
// tokenizer validates it.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/added_tokens.h"

namespace dstrain::tokenizer {

struct BpeSpec {
  std::string vocab_origin;                        // file (and key) the vocabulary came from
  std::unordered_map<std::string, int32_t> vocab;  // byte-level token string → id
  std::vector<std::pair<std::string, std::string>> merges;  // highest priority first
  std::function<std::string(size_t)> merge_origin;          // "merges.txt line 7" for merge index i
  bool ignore_merges = false;  // a piece that is itself in the vocab is one token (Llama 3)

  std::vector<AddedToken> added;  // matched on raw text, never split
  std::string split_pattern;      // pre-tokenizer regex
  bool split_literal = false;     // split_pattern is a plain string, not a regex
  std::string split_origin;       // where the pattern came from, for errors
  bool nfc = false;               // NFC-normalize text between added tokens

  std::optional<int32_t> eos, bos, pad;
};

}  // namespace dstrain::tokenizer
