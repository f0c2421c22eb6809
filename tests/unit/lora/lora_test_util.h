#pragma once
// Helpers shared by the LoRA tests: a small model with its adapters, and fixed input ids.

#include <torch/torch.h>

#include "lora/lora_model.h"
#include "model/model.h"
#include "tests/unit/model/test_util.h"

namespace dstrain::lora::testing {

using model::testing::expect_error;
using model::testing::small_config;
using model::testing::TempDir;

inline model::DecoderModel small_model(uint64_t seed = 1) {
  return model::build_model(small_config(), torch::kFloat, seed);
}

inline LoraOptions small_options(std::vector<std::string> targets = {"q_proj", "v_proj"}) {
  LoraOptions o;
  o.r = 4;
  o.alpha = 8;
  o.target_modules = std::move(targets);
  o.seed = 11;
  return o;
}

// A small Qwen3-MoE: 4 experts of width 16, top-2, hidden 64, 2 layers.
inline model::DecoderModel moe_model(uint64_t seed = 1) {
  nlohmann::json doc = model::testing::small_config_json("qwen3_moe");
  doc["num_experts"] = 4;
  doc["num_experts_per_tok"] = 2;
  doc["moe_intermediate_size"] = 16;
  doc["norm_topk_prob"] = true;
  return model::build_model(model::parse_model_config(doc), torch::kFloat, seed);
}

// small_options() on q_proj plus the expert stacks `parameters` (target_parameters).
inline LoraOptions stack_options(std::vector<std::string> parameters) {
  LoraOptions o = small_options({"q_proj"});
  o.target_parameters = std::move(parameters);
  return o;
}

// Gives every lora_B random values (B starts at zero, which would hide any error in the delta).
inline void randomize_b(const LoraModel& lora, uint64_t seed) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (const auto& w : lora.weights()) w.B.copy_(torch::randn(w.B.sizes()) * 0.05);
}

inline torch::Tensor input_ids(int64_t batch = 2, int64_t len = 12) {
  torch::manual_seed(5);
  return torch::randint(0, 97, {batch, len}, torch::kLong);
}

}  // namespace dstrain::lora::testing
