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
// The checks of load_weights alone (names and shapes; `dir` names the files in errors), for a
// caller that reads only parts of the tensors (SafetensorsSet::read_range). The model's parameters
// need not hold memory.
void check_weights(const SafetensorsSet& files, DecoderModelImpl& model,
                   const std::filesystem::path& dir);

// Writes config.json (torch_dtype = dtype) and the parameters, cast to `dtype`, as
// model.safetensors, or as shards plus index when larger than max_shard_bytes. Each file is written
// atomically.
void save_weights(DecoderModelImpl& model, const std::filesystem::path& dir,
                  torch::ScalarType dtype, uint64_t max_shard_bytes = kDefaultMaxShardBytes);

}  // namespace dstrain::model
