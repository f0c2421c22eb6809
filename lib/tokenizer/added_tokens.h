#pragma once
// Added tokens (special tokens such as "<|endoftext|>" and any tokens added after training) are
// found in the raw text before normalization and pre-tokenization and are never split: wherever
// several start at the same position, the longest wins; scanning goes left to right.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dstrain::tokenizer {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;  // a control token (eos, im_start, ...) rather than ordinary text
  // Matched in the normalized text rather than the raw text (tokenizer.json "normalized"; only the
  // SentencePiece-style tokenizer honours it, see sentencepiece_bpe_tokenizer.h).
  bool normalized = false;
};

// A piece of the input: either ordinary text (id < 0) or one added token (text is its content).
struct Segment {
  std::string_view text;
  int32_t id = -1;
};

class AddedTokenMatcher {
 public:
  // Tokens with empty content are ignored; for duplicate contents the last one wins.
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);

  // Appends the segments of `text` in order; they concatenate back to `text`.
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  // Index into tokens_ of the longest token starting at text[pos], or -1.
  int longest_at(std::string_view text, size_t pos) const;

  std::vector<AddedToken> tokens_;
  // For each first byte, the indices of tokens starting with it, longest first.
  std::array<std::vector<int>, 256> by_first_byte_;
};

// The content of every added token indexed by id ("" elsewhere), and the vocabulary size grown to
// cover every added id: what a BPE tokenizer decodes added ids with. Error(kInput) for a negative
// id.
std::vector<std::string> added_contents(const std::vector<AddedToken>& tokens, int64_t& vocab_size);

// The text a tokenizer encodes must be UTF-8: Error(kInput) naming the first bad byte otherwise.
void check_text_is_utf8(std::string_view text);

}  // namespace dstrain::tokenizer
