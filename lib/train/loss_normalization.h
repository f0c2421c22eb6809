#pragma once
// training.loss_normalization (docs/training.md, "Loss normalisation"): what a step's loss, and so
// its gradient, is the mean of.
//  - kTokens: the labelled tokens of the whole global batch (what HF calls num_items_in_batch).
//    Before its first backward a step counts the labels its micro-batches hold on every rank; each
//    micro-batch then backpropagates its loss sum × the engine's micro-steps × data-parallel ranks
//    / that count, which the engine's division by its micro-steps and average over the ranks turn
//    into the global batch's token mean. A step's loss and gradient then do not depend on how its
//    samples fall into micro-batches or ranks.
//  - kMicroSteps: each micro-batch's token mean, averaged over the micro-batches and ranks (the
//    normalisation of configs recorded before the key existed, and DeepSpeed's).
// The engine's micro-steps are the micro-batches times the virtual pipeline stages each rank
// holds (every one a backward of the engine's; pipeline.h), so this is the one place that knows.

#include <cstdint>
#include <string>

#include <torch/types.h>

#include "model/model.h"

namespace dstrain::train {

enum class LossNormalization { kTokens, kMicroSteps };

// tokens | micro_steps; Error(kConfig) naming training.loss_normalization otherwise.
LossNormalization loss_normalization_from_word(const std::string& word);

// The factor on a micro-batch's loss of a step of `micro_batches`, each a backward of the engine
// in each of the rank's `chunks` virtual stages: kTokens, micro_batches × chunks × data_parallel /
// labelled, where `labelled` (a float scalar tensor, on the loss's device) counts the step's labels
// over every rank (at least one is assumed); kMicroSteps, `chunks`. A float scalar tensor on
// `labelled`'s device.
torch::Tensor micro_step_scale(LossNormalization how, const torch::Tensor& labelled,
                               int64_t micro_batches, int64_t chunks, int64_t data_parallel);

// The loss a micro-batch backpropagates: loss.sum × scale (kTokens) or loss.mean() × scale
// (kMicroSteps), `scale` from micro_step_scale; with a MoE model's router statistics
// (loss.router), plus its router losses weighted as `moe` says, each micro-batch's own (as
// transformers adds them to each forward's loss), times `chunks` (the rank's virtual stages, as
// in micro_step_scale: a micro-batch's loss is made once but the engine counts a micro-step per
// chunk): the engine's division by the micro-steps and average over the ranks make the step's the
// mean of its micro-batches'.
torch::Tensor micro_step_loss(const model::LossSum& loss, LossNormalization how,
                              const torch::Tensor& scale, const model::MoeConfig& moe = {},
                              int64_t chunks = 1);

}  // namespace dstrain::train
