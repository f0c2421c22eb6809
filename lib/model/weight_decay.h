#pragma once
// Which parameters take no weight decay. Which tensors are norm weights and biases is the model's
// knowledge, so the rule lives here and the optimizer's owners (zero/master_state) ask for it.
// Rule (as in common LLM recipes, and HF Trainer's bias/LayerNorm exclusion): 1-D parameters
// (norm weights, biases), names ending in ".bias", and names containing "norm" (any case).

#include <cstdint>
#include <string>

namespace dstrain::model {

bool takes_no_decay(const std::string& name, int64_t dim);

}  // namespace dstrain::model
