#include "zero/partition.h"

#include <algorithm>

#include "core/error.h"

namespace dstrain::zero {

Partition::Partition(std::vector<int64_t> param_numels, int world_size, int64_t bucket_numel)
    : numels_(std::move(param_numels)), world_size_(world_size) {
  if (world_size < 1) fail(ErrorKind::kInternal, "partition: world_size {} < 1", world_size);
  if (bucket_numel < 1) {
    fail(ErrorKind::kConfig, "reduce_bucket_size is {}; expected a positive element count",
         bucket_numel);
  }
  offsets_.reserve(numels_.size());
  for (int64_t n : numels_) {
    if (n < 0) fail(ErrorKind::kInternal, "partition: negative parameter numel {}", n);
    offsets_.push_back(numel_);
    numel_ += n;
  }
  padded_numel_ = round_up(numel_, world_size_);
  const int64_t step = std::max<int64_t>(world_size_, bucket_numel / world_size_ * world_size_);
  for (int64_t begin = 0; begin < padded_numel_; begin += step) {
    buckets_.push_back({begin, std::min(begin + step, padded_numel_)});
  }
}

Range Partition::owned(size_t bucket, int rank) const {
  const Range& b = buckets_[bucket];
  const int64_t chunk = (b.end - b.begin) / world_size_;
  return {b.begin + rank * chunk, b.begin + (rank + 1) * chunk};
}

std::pair<size_t, size_t> Partition::buckets_of(size_t param) const {
  if (numels_[param] == 0) return {1, 0};
  const int64_t step = buckets_[0].end - buckets_[0].begin;
  const int64_t first = offsets_[param] / step;
  const int64_t last = (offsets_[param] + numels_[param] - 1) / step;
  return {static_cast<size_t>(first), static_cast<size_t>(last)};
}

std::vector<ParamPiece> Partition::pieces(Range flat) const {
  std::vector<ParamPiece> out;
  // First parameter whose end lies beyond flat.begin.
  auto it = std::upper_bound(offsets_.begin(), offsets_.end(), flat.begin);
  size_t i = it == offsets_.begin() ? 0 : static_cast<size_t>(it - offsets_.begin()) - 1;
  for (; i < numels_.size() && offsets_[i] < flat.end; ++i) {
    const int64_t begin = std::max(flat.begin, offsets_[i]);
    const int64_t end = std::min(flat.end, offsets_[i] + numels_[i]);
    if (begin >= end) continue;
    out.push_back({i, {begin - offsets_[i], end - offsets_[i]}, begin - flat.begin});
  }
  return out;
}

std::vector<ParamPiece> Partition::owned_pieces(int rank) const {
  std::vector<ParamPiece> out;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Range mine = owned(b, rank);
    for (ParamPiece piece : pieces(mine)) {
      piece.offset += shard_offset(b);
      out.push_back(piece);
    }
  }
  return out;
}

}  // namespace dstrain::zero
