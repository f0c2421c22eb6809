#pragma once
// The BPE model of vocabularies converted from SentencePiece (Llama 2, Mistral, TinyLlama): tokens
// are UTF-8 text ('▁' standing for a space), not byte-level symbols. Each character of a pre-token
// starts as its own token, then the ranked merges (merge_table.h) apply. A character missing from
// the vocabulary becomes, as in the reference:
//   - with byte_fallback, the "<0xXX>" tokens of its UTF-8 bytes, when all of them exist;
//   - otherwise the unk token, consecutive ones fused into one with fuse_unk. As in the reference,
//     an unk waits for the next character found in the vocabulary (or the end) before it is
//     written, so byte tokens met meanwhile come first and fuse_unk joins unks across them;
//   - without an unk token, nothing (the character is dropped).

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe_spec.h"
#include "tokenizer/merge_table.h"
#include "tokenizer/piece_cache.h"

namespace dstrain::tokenizer {

class CharBpeModel {
 public:
  // Error(kInput) naming the file for a negative id or a merge whose parts or result are missing.
  explicit CharBpeModel(const BpeSpec& spec);

  // Appends the ids of `piece` (well-formed UTF-8). Thread-safe. Error(kInput) when a character
  // needs the unk token and the vocabulary does not have it.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  // Text of vocabulary token `id`, or nullptr when no vocabulary token has that id.
  const std::string* token_text(int32_t id) const;

  int64_t size() const { return static_cast<int64_t>(id_text_.size()); }  // highest id + 1

 private:
  void first_symbols(std::string_view piece, std::vector<int32_t>& symbols) const;
  int32_t unk_id() const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<char32_t, int32_t> char_ids_;  // one-character tokens
  std::vector<std::string> id_text_;
  std::vector<bool> has_id_;
  std::array<int32_t, 256> byte_ids_{};  // "<0xXX>" tokens; -1 where missing
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  std::optional<std::string> unk_token_;
  bool ignore_merges_ = false;
  MergeTable merges_;
  PieceCache cache_;
};

}  // namespace dstrain::tokenizer
