#pragma once
// How the trainer hands a decoder model to the ZeRO engine: parameters grouped into units (used by
// stage 3: one per decoder block, the embedding, and the final norm with an untied lm_head) and
// the forward pass cut into segments bracketed by the engine (embed → layer 0..L-1 → head). The
// brackets are no-ops at stages 0-2, so the same forward serves every stage; the model itself
// knows nothing of them.

#include <vector>

#include <torch/types.h>

#include "model/model.h"
#include "zero/engine.h"

namespace dstrain::train {

// named_parameters() in order, each with its unit: embed_tokens 0, model.layers.i.* 1 + i,
// model.norm and lm_head L + 1.
std::vector<zero::NamedParameter> engine_parameters(model::DecoderModelImpl& model);

// The unit of a parameter (or LoRA adapter) name, numbered as above.
int unit_of(const std::string& name, int64_t num_layers);

// Units read by each forward segment: {0}, {1}, ..., {L}, {L + 1} — plus the embedding unit for
// the head when the embeddings are tied (lm_head is embed_tokens).
std::vector<std::vector<int>> forward_segments(const model::DecoderModelImpl& model);

// model.forward(input_ids) with every segment bracketed by engine.pre_forward/post_forward.
// input_ids [B, T] int64 → logits [B, T, V].
// `positions`: where input_ids lie in their sequences (model.h), for a sequence-parallel slice.
torch::Tensor forward_with_engine(model::DecoderModelImpl& model, zero::Engine& engine,
                                  const torch::Tensor& input_ids,
                                  const model::Positions& positions = {});

// The loss of input_ids [B, T] against labels [B, T] (aligned, as model::causal_lm_loss_sum
// takes them), every segment bracketed as above. fused (model.fused_loss): the head segment is
// DecoderModelImpl::head_loss_sum, which never holds the [B, T, V] logits; otherwise the logits
// and then model::causal_lm_loss_sum. Same loss and gradients either way, up to float rounding.
model::LossSum loss_sum_with_engine(model::DecoderModelImpl& model, zero::Engine& engine,
                                    const torch::Tensor& input_ids, const torch::Tensor& labels,
                                    bool fused, const model::Positions& positions = {});

}  // namespace dstrain::train
