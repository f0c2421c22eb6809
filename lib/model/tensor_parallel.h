#pragma once
// Tensor parallelism (Megatron-LM's) inside the model. A model built for rank r of a group of T
// ranks holds slice r of every large matrix, and its forward runs the group's collectives where the
// slices meet:
//
//   embedding      vocabulary-parallel: rows [r·V/T, (r+1)·V/T) of model.embed_tokens.weight; each
//                  rank looks up the ids it holds (zeros elsewhere) and the ranks' lookups are
//                  summed (leave)
//   attention      q/k/v column-parallel by heads (query heads H/T, key/value heads KV/T each);
//                  o_proj row-parallel (its input features by heads), its partial products summed
//                  (leave), its bias added once after that
//   MLP            gate/up column-parallel (I/T of the width), down row-parallel, summed (leave)
//   head           the final norm on every rank, then lm_head (or the tied embedding) vocabulary-
//                  parallel: logits [.., V/T]; the loss is computed across the vocabulary slices
//                  (the maximum and the sums reduced over the group, never the whole logits),
//                  and logits, when asked for, are gathered along the vocabulary
//
// Between the regions the hidden states are whole on every rank (enter before the column-parallel
// matmuls: identity forward, gradients summed over the group in backward). With sequence
// parallelism in the region (Megatron's "sequence parallelism", TensorParallel::sequence_parallel)
// they are split instead: rank r holds rows [r·n, (r+1)·n) of the [B·T, C] token rows (n = B·T/T),
// the norms and residual adds run on those rows, enter is an all-gather of the rows and leave a
// reduce-scatter (the same bytes as the all-reduce, a T-th of the activations outside the region).
//
// Replicated parameters (the norms, row-parallel biases, Qwen3's q/k norms) are whole on every
// rank. Where a rank's gradient of one is only its part (q_norm/k_norm over its heads; every one of
// them with sequence parallelism, over its rows) its placement says so (a partial gradient,
// placement.h), and the engine sums it over the group once per step, after the micro-steps and
// the data-parallel reduction (zero/engine.h: EngineOptions::model_parallel), so every rank's
// replicated copy takes the whole gradient and stays equal to the others.
//
// The model holds its parameters under their Hugging Face names with these local shapes
// (each parameter's placement, placement.h, says how it is split); building the initial values,
// checkpoints and exports from whole tensors is the caller's (lib/train).

#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "model/model_config.h"

namespace dstrain::model {

// The group's collectives as autograd functions (lib/train implements them over a communicator).
// Every rank of the group calls each in the same order with the same shapes.
class TensorParallel {
 public:
  virtual ~TensorParallel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Megatron's sequence parallelism in the region (above).
  virtual bool sequence_parallel() const = 0;

  // Identity forward; backward the sum of the ranks' gradients (Megatron's f).
  virtual torch::Tensor enter(const torch::Tensor& x) = 0;
  // The sum over the ranks forward; backward the identity (g).
  virtual torch::Tensor leave(const torch::Tensor& x) = 0;
  // x [n, ...] → [T·n, ...], rank r's rows at r·n; backward the reduce-scatter of the gradient.
  virtual torch::Tensor gather_rows(const torch::Tensor& x) = 0;
  // x [T·n, ...] → rows r·n.. summed over the ranks; backward the all-gather of the gradient.
  virtual torch::Tensor reduce_scatter_rows(const torch::Tensor& x) = 0;
  // x [..., k] → [..., T·k], rank r's slice at r·k; backward this rank's slice of the gradient.
  virtual torch::Tensor gather_last(const torch::Tensor& x) = 0;
  // In place and outside autograd: the sum (or the maximum) over the ranks.
  virtual void all_reduce_(torch::Tensor& x, bool max) = 0;
};

// Error(kConfig) naming `model`, the counts that do not divide and `key` unless `size` divides
// the query heads, the key/value heads, the MLP width and the vocabulary; for a Mixture-of-Experts
// model unless `size` is 1.
void check_tensor_parallel(const ModelConfig& config, int64_t size, const std::string& model,
                           const std::string& key);

// The shapes rank `rank` of `size` builds its modules with: heads, key/value heads, MLP width
// and vocabulary divided by `size` (pad_token_id in the rank's vocabulary slice, or none).
ModelConfig tensor_parallel_config(const ModelConfig& config, int64_t rank, int64_t size);

// Into the parallel region: x whole → x (enter), or this rank's token rows [n, C] → all rows
// [T·n, C] (sequence parallel). tp null: x.
torch::Tensor enter_region(TensorParallel* tp, const torch::Tensor& x);
// Out of it: the partial results y [..., C] summed over the ranks (leave), or summed and cut to
// this rank's token rows [n, C] (sequence parallel). tp null: y.
torch::Tensor leave_region(TensorParallel* tp, const torch::Tensor& y);

}  // namespace dstrain::model
