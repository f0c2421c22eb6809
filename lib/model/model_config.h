#pragma once
// ModelConfig: the architecture of a decoder-only transformer, read from a Hugging Face
// `config.json`.
//
// Supported `model_type`s: llama (1/2/3.x), mistral, qwen2 (also Qwen2.5), qwen3. The families
// differ only in small switches, so one struct describes them all:
//   llama   q/k/v/o bias = attention_bias, MLP bias = mlp_bias, rope_scaling llama3|linear
//   mistral no bias; sliding_window on every layer
//   qwen2   q/k/v bias always, o_proj and MLP without bias; sliding_window on the layers that
//           layer_types names (use_sliding_window + max_window_layers when it is absent)
//   qwen3   explicit head_dim (HF default 128), q/k/o bias = attention_bias, per-head RMSNorm
//           q_norm/k_norm applied before RoPE; sliding window as qwen2
// Defaults for absent optional keys follow the Hugging Face config classes. Every error is
// Error(kInput) whose message names the file (or "config.json"), the key and what was expected.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/shared_files.h"

namespace dstrain::model {

// RoPE frequency scaling (`rope_scaling`, or the scaling part of `rope_parameters`); rope.h
// computes the frequencies from it.
struct RopeScaling {
  std::string type = "default";   // default | linear | llama3 | yarn | dynamic
  double factor = 1.0;            // every type but default
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  // llama3: required; yarn: max_position_embeddings when absent (as transformers fills it in)
  int64_t original_max_position_embeddings = 8192;
  double beta_fast = 32.0;  // yarn: rotations over the original context above which a frequency
  double beta_slow = 1.0;   //   is kept, below beta_slow ones it is divided by factor
  std::optional<double> attention_factor;  // yarn: scales cos/sin; derived from factor if absent
  double mscale = 0.0;                     // yarn: with mscale_all_dim (both non-zero), derives
  double mscale_all_dim = 0.0;             //   attention_factor as DeepSeek's configs ask
  bool truncate = true;  // yarn: round the ramp's ends outwards to whole dimensions
};

constexpr const char* kFullAttention = "full_attention";
constexpr const char* kSlidingAttention = "sliding_attention";

// Mixture-of-Experts (qwen2_moe, qwen3_moe, mixtral; moe.h): layers whose MLP is a set of experts
// of which a router picks `top_k` for each token, as transformers computes them.
struct MoeConfig {
  int64_t experts = 0;  // E: num_experts (mixtral: num_local_experts); 0: a dense model
  int64_t top_k = 0;    // num_experts_per_tok
  int64_t expert_size =
      0;  // each expert's MLP width: moe_intermediate_size (mixtral: intermediate_size)
  int64_t shared_expert_size = 0;  // qwen2_moe's shared expert: shared_expert_intermediate_size
  bool norm_topk_prob = false;     // the top-k weights renormalised to sum 1 (mixtral: always)
  // Mixtral keeps the routing weights in float32; Qwen casts them to the router logits' dtype.
  bool float32_weights = false;
  int64_t sparse_step = 1;            // decoder_sparse_step: every step-th layer is MoE
  std::vector<int64_t> dense_layers;  // mlp_only_layers: layers with a dense MLP
  double aux_loss_coef = 0.001;       // router_aux_loss_coef
  // The router's losses (moe.h, RouterTotals), added to the language-model loss in training: the
  // load-balancing loss (output_router_logits, or model.router_aux_loss) × aux_loss_coef, and the
  // router z-loss × z_loss_coef (model.router_z_loss_coef; 0: off).
  bool aux_loss = false;
  double z_loss_coef = 0.0;
  // The router's logits in float32 whatever the activations' dtype (model.router_dtype; a
  // deviation from transformers, which computes them in the activations' dtype).
  bool float32_router = false;
  bool router_losses() const { return aux_loss || z_loss_coef > 0; }
};

struct ModelConfig {
  std::string model_type;  // llama | mistral | qwen2 | qwen3 | qwen2_moe | qwen3_moe | mixtral
  std::vector<std::string> architectures;  // e.g. {"LlamaForCausalLM"}; informational
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;          // C
  int64_t intermediate_size = 0;    // MLP width
  int64_t num_hidden_layers = 0;    // L
  int64_t num_attention_heads = 0;  // H
  int64_t num_key_value_heads = 0;  // KV heads (GQA); divides H
  int64_t head_dim = 0;             // Q; hidden_size / H unless given (qwen3: 128 unless given)
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // bias on q_proj, k_proj, v_proj
  bool o_bias = false;    // bias on o_proj
  bool mlp_bias = false;  // bias on gate/up/down_proj (llama mlp_bias)
  bool qk_norm = false;   // qwen3 q_norm/k_norm
  // The window of sliding-window layers: query i sees keys i - window < j <= i. Set for mistral
  // when sliding_window is, for qwen2/qwen3 only with use_sliding_window.
  std::optional<int64_t> sliding_window;
  // [L] kFullAttention | kSlidingAttention per layer. mistral: every layer sliding when
  // sliding_window is set (MistralConfig ignores layer_types); qwen2/qwen3: config.json's
  // layer_types, else sliding from max_window_layers on when sliding_window is set; llama: full.
  std::vector<std::string> layer_types;
  std::string torch_dtype;  // "" when config.json names none; else float32|bfloat16|float16
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // config may hold one id or a list (Llama 3)
  std::optional<int64_t> pad_token_id;
  MoeConfig moe;       // experts == 0 for the dense families
  nlohmann::json raw;  // the parsed config.json, written back (updated) by to_json()

  // Whether layer `layer`'s MLP is a Mixture-of-Experts (moe.h): not in mlp_only_layers, and
  // (layer + 1) a multiple of decoder_sparse_step.
  bool is_moe_layer(int64_t layer) const;
  // How many of the layers are MoE layers, and how many MoE layers come before `layer`.
  int64_t moe_layers() const { return moe_layer_slot(num_hidden_layers); }
  int64_t moe_layer_slot(int64_t layer) const;

  // The attention window of layer `layer` (sliding_window for a sliding layer), none when the
  // layer attends to every earlier position.
  std::optional<int64_t> attention_window(int64_t layer) const;

  // Parameter count. include_embeddings=false leaves out model.embed_tokens.weight and
  // lm_head.weight (tied or not); true counts every distinct parameter tensor once. `active`: of a
  // MoE layer's experts only the top_k a token runs through (what a token's forward multiplies).
  int64_t num_parameters(bool include_embeddings, bool active = false) const;

  // Training FLOPs per token for sequence length T: 6·N + 12·H·Q·Σ_layers K with N = the parameters
  // that do matmul work for a token: every non-embedding parameter (of a MoE layer's experts the
  // top_k a token runs through) plus the LM head (V·C, counted also when it
  // is tied to the embedding, whose lookup does no matmul), and K the keys a layer attends to: T,
  // or min(T, window) for a sliding-window layer. Forward + backward matmuls, plus attention scores
  // and values.
  double training_flops_per_token(int64_t seq_len) const;
};

// Parses a config.json document. `source` (the file name) prefixes every error message.
ModelConfig parse_model_config(const nlohmann::json& doc,
                               const std::string& source = shared_files::kModelConfig);

// Reads and parses `<dir>/config.json` (or the file itself when `path` is a file).
ModelConfig load_model_config(const std::filesystem::path& path);

// config.json contents for `config`: `raw` with every field above written over it, and
// `torch_dtype` set to `dtype` when not empty.
nlohmann::json to_json(const ModelConfig& config, const std::string& dtype = "");

// The model_types this build understands, for error messages and docs.
const std::vector<std::string>& supported_model_types();

}  // namespace dstrain::model
