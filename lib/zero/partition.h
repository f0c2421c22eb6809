#pragma once
// Partition arithmetic of the ZeRO engine: where each trainable parameter sits in the flat buffer,
// how the flat buffer is cut into communication buckets, and which elements each rank owns.
//
// Why ownership is per bucket, not one contiguous range per rank: the communicator's reduce-scatter
// splits a buffer into world_size equal chunks, rank r receiving chunk r. If a rank owned one long
// contiguous range, a bucket of consecutive parameters (what backward produces) would belong to one
// or two ranks, and a reduce-scatter of it would need padding to N× its size, breaking ZeRO's 2Ψ
// communication budget. So every bucket is itself split into world_size equal chunks and rank r
// owns chunk r of every bucket (the layout FSDP uses per flat parameter). A bucket is then one
// exact reduce-scatter (gradients) and one exact all-gather (parameters), buckets are contiguous
// ranges of the flat buffer and become ready one after another during backward, and a rank's shard
// is the concatenation of its chunks, in bucket order.
//
// Layout: parameters are packed back to back in the given order from offset 0 (no gaps); the flat
// buffer is padded at the end to a multiple of world_size. Buckets are [k·B, (k+1)·B) with
// B = reduce_bucket_size rounded down to a multiple of world_size (at least world_size); the last
// bucket is shorter. A parameter may straddle buckets. Everything here is pure arithmetic.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/bytes.h"
#include "optim/optimizer.h"

namespace dstrain::zero {

using optim::Range;  // half-open [begin, end) element range

// A part of one parameter: elements [elements.begin, elements.end) of the flattened parameter
// `param`, found at `offset` in the coordinates of the query (a flat range, or a rank's shard).
struct ParamPiece {
  size_t param = 0;
  Range elements;
  int64_t offset = 0;
};

class Partition {
 public:
  // `param_numels`: element count of each parameter, in flat-buffer order (each >= 0).
  // `world_size` >= 1; `bucket_numel` >= 1 (reduce_bucket_size, in elements).
  Partition(std::vector<int64_t> param_numels, int world_size, int64_t bucket_numel);

  int world_size() const { return world_size_; }
  size_t num_params() const { return numels_.size(); }
  int64_t param_offset(size_t param) const { return offsets_[param]; }
  int64_t param_numel(size_t param) const { return numels_[param]; }
  int64_t numel() const { return numel_; }                // Σ parameter numels
  int64_t padded_numel() const { return padded_numel_; }  // numel rounded up to world_size
  int64_t shard_numel() const { return padded_numel_ / world_size_; }  // elements per rank

  // Flat ranges of the buckets, in order; each numel is a multiple of world_size.
  const std::vector<Range>& buckets() const { return buckets_; }
  // Flat range rank `rank` owns inside bucket `bucket` (chunk `rank` of the bucket).
  Range owned(size_t bucket, int rank) const;
  // Where bucket `bucket`'s chunk starts inside every rank's shard.
  int64_t shard_offset(size_t bucket) const { return buckets_[bucket].begin / world_size_; }
  // Buckets that parameter `param` overlaps, as [first, last] inclusive (empty params: none,
  // {1,0}).
  std::pair<size_t, size_t> buckets_of(size_t param) const;

  // Parameters overlapping flat range `flat`, in order; offsets relative to flat.begin. Padding and
  // empty parameters produce no piece.
  std::vector<ParamPiece> pieces(Range flat) const;
  // Every parameter part rank `rank` owns, in shard order; offsets are positions in the rank's
  // shard.
  std::vector<ParamPiece> owned_pieces(int rank) const;

 private:
  std::vector<int64_t> numels_;
  std::vector<int64_t> offsets_;
  int world_size_;
  int64_t numel_ = 0;
  int64_t padded_numel_ = 0;
  std::vector<Range> buckets_;
};

}  // namespace dstrain::zero
