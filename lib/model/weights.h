#pragma once
// Hugging Face weights in and out of a DecoderModel: a copy by parameter name between the model and
// model.safetensors (or a sharded model.safetensors.index.json set).

#include <cstdint>
#include <filesystem>

#include <torch/torch.h>

#include "model/model.h"

namespace dstrain::model {

// HF's default shard limit ("5GB").
constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000ULL;

// Copies every parameter of `model` from the safetensors weights in `dir`, converting each tensor
// to the parameter's dtype and device. Error(kInput) naming the tensors when any parameter is
// missing from the files, a file tensor matches no parameter, or a shape differs. Tolerated extras:
// lm_head.weight of a tied model, and rotary_emb.inv_freq buffers written by old exporters.
void load_weights(DecoderModelImpl& model, const std::filesystem::path& dir);

class SafetensorsSet;
// The checks of load_weights alone (names and shapes; `dir` names the files in errors). The model's
// parameters need not hold memory. A MoE model's expert stacks may be held in the Hub's per-expert
// layout instead (expert_names.h).
void check_weights(const SafetensorsSet& files, DecoderModelImpl& model,
                   const std::filesystem::path& dir);

// The weights in `dir` as `model`'s parameters by name (its initial values, read range by range
// when asked), after check_weights(). The model's parameters need not hold memory.
ValueSource weights_source(const std::filesystem::path& dir, DecoderModelImpl& model);

// Writes config.json (torch_dtype = dtype) and the parameters, cast to `dtype`, as
// model.safetensors, or as shards plus index when larger than max_shard_bytes, under the Hub's
// names (a MoE model's experts one tensor each: expert_names.h). Each file is written atomically.
void save_weights(DecoderModelImpl& model, const std::filesystem::path& dir,
                  torch::ScalarType dtype, uint64_t max_shard_bytes = kDefaultMaxShardBytes);

}  // namespace dstrain::model
