#pragma once
// Checkpoint contents: per-rank shard files of training-state pieces, a manifest, and a reader that
// serves any (kind, parameter, element range) from whichever shards hold it.
//
// A piece is elements [begin, end) of the flattened parameter `param` for one state kind
// ("master", "exp_avg", ...). Pieces are stored in the rank's safetensors shard as float32 tensors
// named "<kind>|<param>|<begin>|<end>"; the full parameter shape is in the shard's JSON. A piece of
// a column slice (stateful.h, Columns: a tensor-parallel rank's part of a row-parallel weight) is
// "<kind>|<param>|<begin>|<end>|c<offset>+<length>", its range over those columns flattened.
// Because pieces are addressed by parameter and range, a checkpoint written at one world size /
// ZeRO stage loads at any other: the reader assembles a requested range from every piece that
// overlaps it.
//
// The save protocol that uses these (checkpointer.h): every rank write_shard(), then rank 0, once
// every rank's done record exists, finalize(): it reads each rank's record (size + crc32 of its
// shard), writes manifest.json atomically, then `latest`, then prunes old checkpoints.
//
// Integrity: every shard's crc32 is recorded in the manifest and checked the first time the
// reader opens that shard (only shards a read needs are opened); a mismatch or a missing file is
// Error(kInput) naming the file.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "ckpt/manifest.h"
#include "ckpt/stateful.h"

namespace dstrain::model {
class SafetensorsFile;
}

namespace dstrain::ckpt {

// Writes this rank's shard and its JSON (`rank_state` is kept verbatim under "state").
void write_shard(const std::string& tag_dir, int rank, const std::vector<Piece>& pieces,
                 const ExtraTensors& extras, const nlohmann::json& rank_state);

// Rank 0, after every rank's write_shard and after writing any other files of the tag directory
// <dir>/<manifest.tag>: fills manifest.files (the shards first, in rank order, then every other
// file), writes manifest.json, then `<dir>/latest`, then prunes to `keep_last` (0 = keep all).
// Error(kIo) when a rank's done record is missing (that rank did not finish).
void finalize(const std::string& dir, Manifest manifest, int64_t keep_last);

// crc32 of a whole file, as 8 lowercase hex digits.
std::string file_crc32(const std::string& path);

class CheckpointReader {
 public:
  // `tag_dir` must be complete (see layout.h resolve_checkpoint). Error(kInput) for a malformed
  // manifest.
  explicit CheckpointReader(std::string tag_dir);
  ~CheckpointReader();

  const std::string& dir() const { return dir_; }
  const Manifest& manifest() const { return manifest_; }
  int world_size() const { return world_size_; }
  // "state" of rank `rank`'s shard JSON.
  nlohmann::json rank_state(int rank) const;

  // Elements [begin, end) of `param` for `kind`, as float32; Error(kInput) when the checkpoint does
  // not cover the range.
  torch::Tensor read(const std::string& kind, const std::string& param, int64_t begin,
                     int64_t end) const;
  // The whole parameter in its full shape.
  torch::Tensor read_full(const std::string& kind, const std::string& param) const;
  // Parameters stored for `kind`, with their full shapes, sorted by name.
  std::vector<std::pair<std::string, std::vector<int64_t>>> params(const std::string& kind) const;
  // A rank's extra tensor, or an undefined tensor when absent.
  torch::Tensor read_extra(int rank, const std::string& name) const;

 private:
  struct Entry {
    int rank;
    std::string tensor;
    int64_t begin;
    int64_t end;
    std::optional<Columns> columns;
  };
  const model::SafetensorsFile& shard(int rank) const;
  // Copies what column piece `e` of `param` holds of the whole tensor's elements [begin, end)
  // into `out` (those elements); returns how many.
  int64_t read_columns(const Entry& e, const std::string& param, int64_t begin, int64_t end,
                       torch::Tensor& out) const;
  void index_rank(int rank);

  std::string dir_;
  Manifest manifest_;
  int world_size_ = 0;
  std::vector<nlohmann::json> rank_json_;
  std::map<std::pair<std::string, std::string>, std::vector<Entry>> index_;
  std::map<std::string, std::vector<int64_t>> shapes_;
  mutable std::mutex mutex_;
  mutable std::vector<std::unique_ptr<model::SafetensorsFile>> files_;
};

}  // namespace dstrain::ckpt
