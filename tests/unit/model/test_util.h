#pragma once
// Helpers shared by the model tests: a self-deleting temporary directory and small configs.

#include <stdlib.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/common/expect_error.h"
#include "tests/common/temp_dir.h"

#include "core/error.h"
#include "model/model_config.h"

namespace dstrain::model::testing {

using dstrain::testing::TempDir;

inline std::filesystem::path tiny_config_path() {
  return std::filesystem::path(DSTRAIN_SOURCE_DIR) / "configs/models/tiny/config.json";
}

// A small Llama-shaped config document; tests edit it per family.
inline nlohmann::json small_config_json(const std::string& model_type = "llama") {
  return {{"model_type", model_type},    {"vocab_size", 97},
          {"hidden_size", 64},           {"intermediate_size", 96},
          {"num_hidden_layers", 2},      {"num_attention_heads", 4},
          {"num_key_value_heads", 2},    {"max_position_embeddings", 128},
          {"rms_norm_eps", 1e-6},        {"rope_theta", 10000.0},
          {"tie_word_embeddings", false}};
}

inline ModelConfig small_config(const std::string& model_type = "llama") {
  return parse_model_config(small_config_json(model_type));
}

using ::dstrain::testing::expect_error;

}  // namespace dstrain::model::testing
