#pragma once
// Shared argument checks for optimizers over flat shards.

#include <map>
#include <string>
#include <vector>

#include <torch/types.h>

namespace dstrain::optim {

// params/grads: the elements [offset, offset + params.numel()) of a shard of `numel` elements: 1-D,
// contiguous, of the same numel, on `device`; params float32, grads float32 or bfloat16.
// Error(kInternal) otherwise.
void check_piece(const char* optimizer, const torch::Tensor& params, const torch::Tensor& grads,
                 int64_t offset, int64_t numel, torch::Device device);

// compute_copy: undefined, or 1-D contiguous bfloat16 with params' numel on params' device.
// Error(kInternal) otherwise.
void check_compute_copy(const char* optimizer, const torch::Tensor& params,
                        const torch::Tensor& compute_copy);

// Copies `state` into `into` after checking that the names match exactly and every tensor has the
// shard's numel. Error(kInput) naming the first difference.
void load_named_state(const char* optimizer, std::map<std::string, torch::Tensor>& into,
                      const std::map<std::string, torch::Tensor>& state, int64_t step_count);

}  // namespace dstrain::optim
