#pragma once
// The random-number state a recomputed block must replay: the CPU default generator's state and,
// when the block's tensors live on an accelerator, that device's default generator's state.
// Activation checkpointing and the tiled MLP both run a block twice (forward, then again in
// backward) and need the second run to draw the masks of the first, without shifting the random
// stream seen by the rest of the backward.
//
// Uses only the device-generic Generator API, so it builds against a CPU-only LibTorch; a device
// generator is looked up only when a tensor lives on a CUDA device.

#include <cstdint>
#include <initializer_list>
#include <optional>

#include <ATen/core/TensorBody.h>
#include <c10/core/Device.h>

namespace dstrain::model {

struct RngState {
  at::Tensor cpu;                     // the CPU default generator's state
  std::optional<c10::Device> device;  // the tensors' accelerator, if any
  at::Tensor device_state;            // its default generator's state
};

// The current state of the CPU generator and of the first CUDA tensor's device generator.
RngState capture_rng(at::TensorList tensors);

// Puts the generators back to `state`.
void restore_rng(const RngState& state);

// Keyed draws: what a block draws depends on where it is in the run, not on what ran before it on
// this rank. seed_rng() reseeds the CPU default generator and, when a tensor lives on a CUDA
// device, that device's default generator (its offset back to 0) with `seed`; draw_key() mixes the
// parts of a key (splitmix64's finaliser over each part in turn), so nearby keys seed unrelated
// streams. A CUDA graph replay reads the generator's seed and offset at its start, so a replayed
// layer seeded this way before it runs draws what the eager layer draws.
void seed_rng(uint64_t seed, at::TensorList tensors);
uint64_t draw_key(std::initializer_list<uint64_t> parts);

// Runs fn() with the generators set to `state`, then puts them back as they were before (also
// when fn throws).
template <typename Fn>
auto replay_rng(const RngState& state, at::TensorList tensors, Fn&& fn) {
  const RngState now = capture_rng(tensors);
  restore_rng(state);
  try {
    auto out = fn();
    restore_rng(now);
    return out;
  } catch (...) {
    restore_rng(now);
    throw;
  }
}

}  // namespace dstrain::model
