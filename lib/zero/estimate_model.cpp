// Parameter shapes of a decoder model from its config.json, and the estimate input of a run.
#include "zero/estimate.h"

#include <fmt/format.h>

#include "core/error.h"
#include "hub/resolve.h"

namespace dstrain::zero {

// Mirrors lib/model's modules (layers.cpp); the unit test checks the sum against
// ModelConfig::num_parameters(true) for several architectures.
std::vector<ParamShape> parameter_shapes(const model::ModelConfig& c) {
  const int64_t C = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int64_t q = c.num_attention_heads * c.head_dim;
  const int64_t kv = c.num_key_value_heads * c.head_dim;
  const int layers = static_cast<int>(c.num_hidden_layers);
  std::vector<ParamShape> out{{"model.embed_tokens.weight", V * C, 0}};
  for (int i = 0; i < layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    const int u = 1 + i;
    auto add = [&](const std::string& name, int64_t numel) { out.push_back({p + name, numel, u}); };
    add("self_attn.q_proj.weight", q * C);
    if (c.qkv_bias) add("self_attn.q_proj.bias", q);
    add("self_attn.k_proj.weight", kv * C);
    if (c.qkv_bias) add("self_attn.k_proj.bias", kv);
    add("self_attn.v_proj.weight", kv * C);
    if (c.qkv_bias) add("self_attn.v_proj.bias", kv);
    add("self_attn.o_proj.weight", C * q);
    if (c.o_bias) add("self_attn.o_proj.bias", C);
    if (c.qk_norm) {
      add("self_attn.q_norm.weight", c.head_dim);
      add("self_attn.k_norm.weight", c.head_dim);
    }
    add("mlp.gate_proj.weight", I * C);
    if (c.mlp_bias) add("mlp.gate_proj.bias", I);
    add("mlp.up_proj.weight", I * C);
    if (c.mlp_bias) add("mlp.up_proj.bias", I);
    add("mlp.down_proj.weight", C * I);
    if (c.mlp_bias) add("mlp.down_proj.bias", C);
    add("input_layernorm.weight", C);
    add("post_attention_layernorm.weight", C);
  }
  out.push_back({"model.norm.weight", C, layers + 1});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", V * C, layers + 1});
  return out;
}

EstimateInput estimate_input(const config::Config& config, const model::ModelConfig& model,
                             int world_size) {
  EstimateInput in;
  in.params = parameter_shapes(model);
  in.world_size = world_size;
  in.compute_bytes = config.training.bf16 || config.training.fp16 ? 2 : 4;
  const auto& opt = config.training.optimizer;
  in.optimizer_bytes = opt.type == "sgd" ? (opt.momentum != 0 ? 4 : 0) : 8;
  in.param_persistence_threshold = config.zero.stage3_param_persistence_threshold;
  return in;
}

std::string estimate_report(const std::string& config_path,
                            const std::vector<std::string>& overrides, int world_size, bool json) {
  if (world_size < 1)
    fail(ErrorKind::kUsage, "estimate: the world size is {}; expected >= 1", world_size);
  config::LoadOptions load;
  load.overrides = overrides;
  load.world_size = world_size;
  const config::Config config = config::load_config(config_path, load);
  // Only config.json is read: a hub id not cached is fetched without its weights.
  const auto dir =
      hub::resolve_model_dir({config.model.name_or_path, config.model.revision, /*weights=*/false});
  const model::ModelConfig model = model::load_model_config(dir);
  const EstimateInput in = estimate_input(config, model, world_size);
  return json ? format_estimate_json(in, dir.string()) : format_estimate(in, dir.string());
}

}  // namespace dstrain::zero
