#pragma once
// training.loss_normalization (docs/training.md, "Loss normalisation"): what a step's loss, and so
// its gradient, is the mean of.
//  - kTokens: the labelled tokens of the whole global batch (what HF calls num_items_in_batch).
//    Before its first backward a step counts the labels its micro-batches hold on every rank; each
//    micro-step then backpropagates its loss sum × micro-steps × data-parallel ranks / that count,
//    which the engine's division by the micro-steps and average over the ranks turn into the
//    global batch's token mean. A step's loss and gradient then do not depend on how its samples
//    fall into micro-batches or ranks.
//  - kMicroSteps: each micro-batch's token mean, averaged over the micro-steps and ranks (the
//    normalisation of configs recorded before the key existed, and DeepSpeed's).

#include <cstdint>
#include <string>

#include <torch/types.h>

#include "model/model.h"

namespace dstrain::train {

enum class LossNormalization { kTokens, kMicroSteps };

// tokens | micro_steps; Error(kConfig) naming training.loss_normalization otherwise.
LossNormalization loss_normalization_from_word(const std::string& word);

// kTokens: the factor on a micro-step's loss sum, micro_steps × data_parallel / labelled, where
// `labelled` (a float scalar tensor, on the loss's device) counts the step's labels over every
// rank (at least one is assumed).
torch::Tensor tokens_scale(const torch::Tensor& labelled, int64_t micro_steps,
                           int64_t data_parallel);

// The loss a micro-step backpropagates: loss.sum × scale (kTokens, `scale` from tokens_scale) or
// loss.mean() (kMicroSteps, `scale` unused).
torch::Tensor micro_step_loss(const model::LossSum& loss, LossNormalization how,
                              const torch::Tensor& scale);

}  // namespace dstrain::train
