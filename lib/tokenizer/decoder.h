#pragma once
// The decoder of a SentencePiece-style tokenizer.json: turns the tokens of the ids back into text,
// step by step as the reference does, each step taking the list of token strings left by the one
// before:
//   Replace       every occurrence of the literal `pattern` in each token becomes `content`
//   ByteFallback  runs of "<0xXX>" tokens become the text of their bytes, or one U+FFFD per byte
//                 when those bytes are not valid UTF-8
//   Fuse          all tokens joined into one
//   Strip         up to `start` leading and `stop` trailing `content` characters cut off each token
//   Metaspace     the replacement character becomes a space; in the first token it is dropped
//                 (every one of them) unless prepend_scheme is "never"
// Llama 2 / Mistral: Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0). Without a decoder the
// tokens are joined with spaces.

#include <optional>
#include <string>
#include <vector>

#include "tokenizer/metaspace.h"

namespace dstrain::tokenizer {

struct DecoderStep {
  enum class Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  Kind kind = Kind::kFuse;
  std::string pattern;         // kReplace: the non-empty literal replaced
  std::string content;         // kReplace: the replacement; kStrip: the one character stripped
  size_t start = 0, stop = 0;  // kStrip
  MetaspaceSpec metaspace;     // kMetaspace
};

class Decoder {
 public:
  Decoder() = default;  // no decoder: tokens joined with spaces
  explicit Decoder(std::vector<DecoderStep> steps) : steps_(std::move(steps)) {}

  std::string decode(std::vector<std::string> tokens) const;

 private:
  std::optional<std::vector<DecoderStep>> steps_;
};

}  // namespace dstrain::tokenizer
