#pragma once
// The small model the memory tests measure against the CPU allocator: a llama with grouped-query
// attention and a vocabulary large enough that the loss runs in several chunks.

#include <nlohmann/json.hpp>

#include "model/model_config.h"

namespace dstrain::estimate::testing {

inline model::ModelConfig small_model() {
  return model::parse_model_config(nlohmann::json{{"model_type", "llama"},
                                                  {"vocab_size", 2048},
                                                  {"hidden_size", 64},
                                                  {"intermediate_size", 176},
                                                  {"num_hidden_layers", 4},
                                                  {"num_attention_heads", 4},
                                                  {"num_key_value_heads", 2},
                                                  {"max_position_embeddings", 1024},
                                                  {"rms_norm_eps", 1e-6},
                                                  {"tie_word_embeddings", false}});
}

}  // namespace dstrain::estimate::testing
