#pragma once
// Activation checkpointing: run a block's forward without recording its graph, keep only its
// inputs, and rebuild the graph in backward by running the block again with grad enabled.
//
// Why this shape ("reentrant" checkpointing): the recomputed graph is back-propagated with an
// ordinary autograd backward from inside the checkpoint's own backward, so every parameter the
// block reads gets its gradient through its own AccumulateGrad node exactly as without
// checkpointing. Post-accumulate hooks on those nodes (the ZeRO engine's gradient hooks, every
// stage) therefore fire unchanged, once per parameter per backward, during the checkpoint's
// backward. Hooks on the checkpoint's output fire before the recompute (ZeRO-3 gathers the
// block's parameters there), hooks on its inputs after the block's backward.
//
// Offload: inputs marked in CheckpointOffload are kept in an ActivationOffload store (host memory,
// activation_offload.h) instead of the autograd graph, and loaded back just before the recompute.
// An entry is released by the backward that used it: one backward per forward.
//
// Randomness: the RNG state (CPU default generator, plus the default generator of the inputs' CUDA
// device when they are on one) is captured before the forward and restored for the recompute, so
// dropout draws the same masks both times; the generators are put back afterwards, so the
// recompute does not shift the random stream seen by the rest of the backward.
//
// Cost: one extra forward of the block per backward. Saved: the block's intermediate activations;
// only its inputs are kept (for a decoder layer, [B, T, C] per layer instead of every
// intermediate, attention scores included).

#include <functional>
#include <memory>
#include <vector>

#include <torch/types.h>

namespace dstrain::model {

class ActivationOffload;

// The block: inputs → output. Must be a pure function of its inputs, the parameters it reads and
// the RNG state (it is called twice: once under no-grad, once in backward with grad enabled).
using CheckpointedFn = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

// fn(inputs), with fn's activations recomputed in backward instead of saved. Inputs that require
// grad get their gradient; the others (RoPE tables, masks) are passed through and get none. The
// output requires grad whenever grad mode is on, even if no input does (the block's own parameters
// may: frozen embeddings under LoRA), so the block's backward always runs. With grad mode off this
// is just fn(inputs).
torch::Tensor checkpoint(CheckpointedFn fn, const std::vector<torch::Tensor>& inputs);

// Which inputs of a checkpointed block go to an offload store rather than the autograd graph.
struct CheckpointOffload {
  std::shared_ptr<ActivationOffload> store;  // null: every input is saved in the graph
  std::vector<bool> inputs;                  // per input; missing entries count as false
};

// checkpoint() with the inputs marked in `offload` kept in its store between forward and backward.
torch::Tensor checkpoint(CheckpointedFn fn, const std::vector<torch::Tensor>& inputs,
                         const CheckpointOffload& offload);

}  // namespace dstrain::model
