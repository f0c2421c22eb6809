#include "tokenizer/piece_cache.h"

#include <functional>

namespace dstrain::tokenizer {

PieceCache::Shard& PieceCache::shard_of(std::string_view piece) const {
  return shards_[std::hash<std::string_view>{}(piece) % kShards];
}

bool PieceCache::lookup(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() > kMaxPieceBytes) return false;
  Shard& s = shard_of(piece);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.map.find(std::string(piece));
  if (it == s.map.end()) return false;
  out.insert(out.end(), it->second.begin(), it->second.end());
  return true;
}

void PieceCache::insert(std::string_view piece, const int32_t* ids, size_t n) const {
  if (piece.size() > kMaxPieceBytes) return;
  Shard& s = shard_of(piece);
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.map.size() >= kMaxPerShard) s.map.clear();
  s.map.emplace(std::string(piece), std::vector<int32_t>(ids, ids + n));
}

}  // namespace dstrain::tokenizer
