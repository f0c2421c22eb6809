#pragma once
// The one interface between what training holds and what a checkpoint stores. Every component
// with state that must survive a restart (the ZeRO engine, its loss scaler, the data loader, the
// training progress and RNG, the LoRA base reference) implements Stateful; the Checkpointer
// (checkpointer.h) saves and restores components by name and knows nothing else about them.
//
// A component's state has three parts, each stored where it fits the sharded layout:
//   json          small state, identical on every rank (rank 0's copy goes into the manifest)
//   pieces        element ranges of named tensors, spread over the ranks so that together they
//                 cover each tensor once; a checkpoint loads at any world size because a reader
//                 assembles any range from whichever shards hold it (shards.h)
//   rank_tensors  tensors that belong to one rank (an RNG state); a rank that did not exist when
//                 the checkpoint was written finds none
// Each component states a version of its layout; restore refuses a version newer than it knows.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>
#include <nlohmann/json.hpp>

namespace dstrain::ckpt {

// Columns [offset, offset + length) of a 2-D tensor: a tensor-parallel rank's slice of a
// row-parallel weight (train/tensor_parallel.h).
struct Columns {
  int64_t offset = 0;
  int64_t length = 0;
};

// Elements [begin, end) of the flattened tensor `param` (full shape `shape`) for state `kind`
// ("master", "exp_avg", ...); with `columns`, of those columns of the 2-D tensor flattened row by
// row. `data`: 1-D, numel = end - begin, any float dtype (stored as fp32).
struct Piece {
  std::string kind;
  std::string param;
  std::vector<int64_t> shape;
  int64_t begin = 0;
  int64_t end = 0;
  torch::Tensor data;
  std::optional<Columns> columns = std::nullopt;
};

// Named tensors of one rank, any dtype.
using ExtraTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// How snapshot_state() hands over its tensors.
enum class Snapshot {
  kCopy,  // host copies it owns: valid while training continues, writable from another thread
          // (asynchronous saves)
  kView,  // tensors already in host memory may be views of the live state, valid until the
          // component next changes (a synchronous save writes them before training continues):
          // no copy of the state; device tensors are still copied to the host
};

// One component's state on this rank: a snapshot as Snapshot says.
struct State {
  nlohmann::json json = nlohmann::json::object();
  std::vector<Piece> pieces;
  ExtraTensors rank_tensors;  // names unique across the components of a checkpoint
};

// A saved component's state as a restore sees it.
class StateIn {
 public:
  virtual ~StateIn() = default;
  virtual int version() const = 0;
  virtual const nlohmann::json& json() const = 0;
  // Elements [begin, end) of `param` for `kind` as fp32; Error(kInput) when not covered.
  virtual torch::Tensor read(const std::string& kind, const std::string& param, int64_t begin,
                             int64_t end) const = 0;
  // Tensors stored for `kind` with their full shapes.
  virtual std::vector<std::pair<std::string, std::vector<int64_t>>> params(
      const std::string& kind) const = 0;
  // This rank's tensor `name`, or an undefined tensor when the checkpoint has none for this rank.
  virtual torch::Tensor rank_tensor(const std::string& name) const = 0;
  // Where the state comes from, for error messages: "<tag dir>: state \"loader\"".
  virtual const std::string& origin() const = 0;
};

class Stateful {
 public:
  virtual ~Stateful() = default;
  // The layout version snapshot_state() writes.
  virtual int state_version() const = 0;
  // Called at a step boundary, on every rank.
  virtual State snapshot_state(Snapshot how) const = 0;
  // Called on every rank in the same order (an implementation may communicate). Error(kInput)
  // naming in.origin() for state that does not fit this run.
  virtual void restore_state(const StateIn& in) = 0;
};

// A host copy of `t` that shares no memory with it (pinned when `t` is on a GPU, so the copy is a
// fast DMA); the snapshot_state() building block.
torch::Tensor host_copy(const torch::Tensor& t);

// `t` itself when `how` is kView and `t` is in host memory, else host_copy(t).
torch::Tensor snapshot_tensor(const torch::Tensor& t, Snapshot how);

}  // namespace dstrain::ckpt
