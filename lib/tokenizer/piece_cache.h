#pragma once
// Cache of pre-token → token ids. Text repeats its words, so most pre-tokens are looked up rather
// than merged. Shared by all threads: the key space is split over shards, each behind its own
// mutex, so concurrent encoders rarely wait on each other. Bounded: a full shard is simply emptied
// (cheap, and good enough for word-frequency distributions).

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dstrain::tokenizer {

class PieceCache {
 public:
  static constexpr size_t kShards = 16;
  static constexpr size_t kMaxPerShard = 16384;
  static constexpr size_t kMaxPieceBytes = 64;  // longer pieces are rare; not worth the memory

  // Appends the cached ids of `piece` to `out` and returns true, or returns false on a miss.
  bool lookup(std::string_view piece, std::vector<int32_t>& out) const;
  void insert(std::string_view piece, const int32_t* ids, size_t n) const;

 private:
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>> map;
  };
  Shard& shard_of(std::string_view piece) const;

  mutable Shard shards_[kShards];
};

}  // namespace dstrain::tokenizer
