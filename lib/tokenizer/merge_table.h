#pragma once
// The ranked merges of a BPE model, over token ids: an adjacent pair (a, b) maps to its rank and
// the id of the merged token. `apply` runs the merge loop shared by the byte-level and the
// SentencePiece-style models; only the first symbols differ (bytes there, characters here).

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe_spec.h"

namespace dstrain::tokenizer {

class MergeTable {
 public:
  MergeTable() = default;  // no merges
  // Error(kInput) naming the merge (spec.merge_origin) whose parts or result are not in the
  // vocabulary. A repeated pair keeps its first (highest-priority) rank.
  explicit MergeTable(const BpeSpec& spec);

  // Merges `symbols` (ids, in text order) and appends the result to `out`. Thread-safe.
  void apply(const std::vector<int32_t>& symbols, std::vector<int32_t>& out) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::unordered_map<uint64_t, Merge> merges_;
};

}  // namespace dstrain::tokenizer
