#pragma once
// Everything a BPE tokenizer is built from, independent of the file format it was read from
// (tokenizer.json, or vocab.json + merges.txt + config files). The readers fill it; the tokenizer
// validates it. Two kinds: byte-level (GPT-2, Qwen2, Llama 3: tokens are byte-level symbols, a
// split regex pre-tokenizes) and SentencePiece-style (Llama 2, Mistral, TinyLlama: tokens are
// UTF-8 text with '▁' for spaces, byte fallback, decoded by a decoder).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/decoder.h"
#include "tokenizer/metaspace.h"
#include "tokenizer/normalizer.h"

namespace dstrain::tokenizer {

struct BpeSpec {
  bool byte_level = true;  // false: SentencePiece-style (the fields marked SP below apply)

  std::string vocab_origin;                        // file (and key) the vocabulary came from
  std::unordered_map<std::string, int32_t> vocab;  // token string → id
  std::vector<std::pair<std::string, std::string>> merges;  // highest priority first
  std::function<std::string(size_t)> merge_origin;          // "merges.txt line 7" for merge index i
  bool ignore_merges = false;  // a piece that is itself in the vocab is one token (Llama 3)

  bool byte_fallback = false;            // SP: unknown characters as "<0xXX>" byte tokens
  std::optional<std::string> unk_token;  // SP: the token for other unknown characters
  bool fuse_unk = false;                 // SP: consecutive unknown characters give one unk

  std::vector<AddedToken> added;               // never split (see added_tokens.h)
  std::vector<NormalizerStep> normalizer;      // applied to the text between added tokens
  std::string split_pattern;                   // byte-level: pre-tokenizer regex
  bool split_literal = false;                  // split_pattern is a plain string, not a regex
  std::string split_origin;                    // where the pattern came from, for errors
  std::optional<MetaspaceSpec> metaspace;      // SP: the Metaspace pre-tokenizer, if any
  Decoder decoder;                             // SP: how ids become text again
  std::vector<int32_t> post_processor_prefix;  // ids put before a single sequence (bos)

  std::optional<int32_t> eos, bos, pad;
};

}  // namespace dstrain::tokenizer
