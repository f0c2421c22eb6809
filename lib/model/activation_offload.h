#pragma once
// Where activation checkpointing keeps the inputs of checkpointed blocks when they are offloaded:
// in host memory instead of the accelerator's, brought back just before the block is recomputed.
//
// Why: with every decoder layer checkpointed, what stays on the device through a step is one
// [B, T, C] input per layer, L·B·T·C elements, the part of activation memory that grows with both
// the depth and the sequence. Offloaded, the device holds only the inputs of the layer being
// recomputed and of the next one (fetched ahead), whatever L.
//
// CUDA: store() copies the tensor into pinned host memory on a side stream that first waits for
// the compute stream (so the copy reads finished values), and tells the caching allocator the
// device tensor is in use on that stream (so its memory is not handed out again before the copy
// has read it); the host never blocks. load() makes the compute stream wait for the copy back,
// which was issued on the side stream, into memory allocated from the compute stream after an
// event on it (so the copy cannot overwrite memory that earlier compute-stream work still reads).
// Each load() starts fetching the entry stored just before the loaded one: a backward runs the
// layers in reverse, so that is the one asked for next, and its copy overlaps this layer's
// recompute and backward.
//
// CPU tensors are already in host memory: the entry keeps the tensor itself (no copy) and the same
// code path runs, which is what the CPU tests exercise. Other devices: blocking copies.
//
// Thread safety: store() and load() may be called from different threads (the forward's and the
// autograd engine's); one store serves one model.

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/types.h>

namespace dstrain::model {

class ActivationOffload {
 public:
  class Entry;
  struct State;

  ActivationOffload();
  ~ActivationOffload();
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;

  // Starts moving `t` to host memory and returns the entry that holds it. The entry's memory is
  // freed when the last reference to it goes (the autograd graph that saved it is freed).
  std::shared_ptr<Entry> store(const torch::Tensor& t);

  // The stored values, on the device `t` was on, ready for use on the current stream (the caller
  // never waits on the host). May be called more than once per entry (each call fetches again,
  // unless a fetch is already under way).
  torch::Tensor load(Entry& entry);

  // Live entries and the bytes they hold in host memory (a CPU tensor's own bytes), for tests and
  // the memory report.
  int64_t live_entries() const;
  int64_t live_host_bytes() const;
  // Entries stored since construction.
  int64_t total_stored() const;
  // The host tensors of the live entries, in store order (for tests: on CPU they are the stored
  // tensors themselves; on CUDA, pinned copies whose values are valid once the copy has run).
  std::vector<torch::Tensor> host_tensors() const;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace dstrain::model
