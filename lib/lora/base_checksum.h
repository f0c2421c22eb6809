#pragma once
// A fingerprint of a model's base weights, so that an adapter checkpoint (which holds no base
// weights) is only ever resumed or merged onto the weights it was trained on.
//
// crc32 over every parameter in named_parameters() order: its name, its dtype and its bytes
// (contiguous, CPU). The value depends on the weights and their dtype, not on where they came
// from: the same pretrained files or the same random-init seed and config give the same checksum.
// Take it on the float32 weights (before a cast to the compute dtype) for a stable reference.

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"

namespace dstrain::lora {

// 8 lowercase hex digits.
std::string base_checksum(model::DecoderModelImpl& model);

// The same checksum from per-parameter parts computed anywhere (e.g. each rank checksums the
// parameters it can read, from their float32 values): tensor_crc of each parameter, then
// combine_checksum of them all in named_parameters() order.
struct TensorCrc {
  uint32_t crc = 0;
  uint64_t bytes = 0;  // length of what was checksummed
};
TensorCrc tensor_crc(const std::string& name, const torch::Tensor& value);
std::string combine_checksum(const std::vector<TensorCrc>& parts);

}  // namespace dstrain::lora
