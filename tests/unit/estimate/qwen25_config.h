#pragma once
// Qwen2.5-0.5B's config.json (the shape the estimates are checked against).

#include <nlohmann/json.hpp>

#include "model/model_config.h"

namespace dstrain::estimate::testing {

inline model::ModelConfig qwen25_half_billion() {
  return model::parse_model_config(nlohmann::json{{"model_type", "qwen2"},
                                                  {"vocab_size", 151936},
                                                  {"hidden_size", 896},
                                                  {"intermediate_size", 4864},
                                                  {"num_hidden_layers", 24},
                                                  {"num_attention_heads", 14},
                                                  {"num_key_value_heads", 2},
                                                  {"tie_word_embeddings", true},
                                                  {"rms_norm_eps", 1e-6},
                                                  {"max_position_embeddings", 32768}});
}

}  // namespace dstrain::estimate::testing
