#pragma once
// The byte-level BPE model proper: turns one pre-token (raw bytes) into token ids by ranked merges,
// and maps ids back to bytes. Ids are used throughout the merge loop (no strings): each byte starts
// as the id of its byte-level character, and the merge table (merge_table.h) does the rest.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe_spec.h"
#include "tokenizer/merge_table.h"
#include "tokenizer/piece_cache.h"

namespace dstrain::tokenizer {

class BpeModel {
 public:
  // Error(kInput) naming the file when a byte's character or a merge's parts or result are missing
  // from the vocabulary, or an id is negative.
  explicit BpeModel(const BpeSpec& spec);

  // Appends the ids of `piece` (non-empty raw bytes). Thread-safe.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  // Raw bytes of vocabulary token `id`, or nullptr when no vocabulary token has that id.
  const std::string* token_bytes(int32_t id) const;

  int64_t size() const { return static_cast<int64_t>(id_bytes_.size()); }  // highest id + 1

 private:
  void build_ids(const BpeSpec& spec);
  void merge(std::string_view piece, std::vector<int32_t>& out) const;

  std::array<int32_t, 256> byte_ids_{};
  MergeTable merges_;
  std::vector<std::string> id_bytes_;
  std::vector<bool> has_id_;
  std::unordered_map<std::string, int32_t> vocab_;  // kept only when ignore_merges_
  bool ignore_merges_ = false;
  PieceCache cache_;
};

}  // namespace dstrain::tokenizer
