#pragma once
// DecoderModel: a decoder-only causal language model (Llama / Mistral / Qwen2 / Qwen3 and the
// Mixture-of-Experts Qwen2-MoE / Qwen3-MoE / Mixtral) built from a ModelConfig. Its
// named_parameters() are exactly the Hugging Face (transformers 5) state-dict names
//   model.embed_tokens.weight                                  [V, C]
//   model.layers.N.self_attn.{q,k,v,o}_proj.{weight,bias}      (bias per family: model_config.h)
//   model.layers.N.self_attn.{q,k}_norm.weight                 [D] (qwen3, qwen3_moe)
//   model.layers.N.mlp.{gate,up,down}_proj.weight              (a dense layer)
//   model.layers.N.mlp.gate.weight, .mlp.experts.{gate_up_proj,down_proj}, ...  (a MoE layer:
//   moe.h) model.layers.N.{input,post_attention}_layernorm.weight     [C] model.norm.weight [C]
//   lm_head.weight                                             [V, C] (only when untied)
// so loading and saving Hugging Face weights is a copy by name (see weights.h; a MoE layer's
// experts are converted from and to the Hub's per-expert tensors: expert_names.h).
//
// The model knows nothing about parallelism but tensor parallelism (tensor_parallel.h: built for
// one rank of a group, it holds that rank's slices and calls the group's collectives through an
// interface). It is an ordered list of blocks (blocks.h):
//   0        "model.embed_tokens"  TokenEmbedding   owns model.embed_tokens.weight
//   1 + i    "model.layers.i"      DecoderLayer     owns model.layers.i.*
//   L + 1    "head"                LmHead           owns model.norm.weight and lm_head.weight; with
//                                                   tied embeddings it reads the embedding block's
//                                                   weight instead (ModelBlock::shares = {0})
// and every forward runs them in that order through the wrappers installed from outside
// (wrap_blocks): lib/train/parallelize.h applies LoRA, sequence parallelism, tiled MLP, activation
// checkpointing and ZeRO to this list.

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "model/blocks.h"
#include "model/layers.h"
#include "model/model_config.h"
#include "model/tensor_parallel.h"

namespace dstrain::model {

// Sum of the per-token losses and the number of counted tokens, for averaging over micro-batches.
struct LossSum {
  LossSum() = default;
  LossSum(torch::Tensor sum, torch::Tensor count, RouterTotals router = {})
      : sum(std::move(sum)), count(std::move(count)), router(std::move(router)) {}
  torch::Tensor sum;    // float32 scalar, differentiable
  torch::Tensor count;  // int64 scalar (a tensor, so computing it does not sync with the device)
  // A MoE model with its router losses on: their statistics (moe.h); else undefined.
  RouterTotals router;
  // sum / max(count, 1): the mean over counted tokens, 0 when none is counted.
  torch::Tensor mean() const { return sum / count.clamp_min(1).to(torch::kFloat); }
};

// Where the tokens of a forward lie in their sequence, for RoPE: a forward over T tokens sees
// positions [first, first + T) of a sequence `length` long (dynamic RoPE scales by the whole
// length). The default, length 0, is the whole sequence from position 0. A rank of a
// sequence-parallel group runs a slice of each sequence. With `documents` the rows (of `length`
// tokens) are packed documents: each token's RoPE position is its index in its document, and each
// document attends only to itself (document_attention.h).
struct Positions {
  int64_t first = 0;
  int64_t length = 0;  // 0: first + T
  std::shared_ptr<const Documents> documents;
};

// Embedding, decoder layers and final norm: registered as "model" so names start with "model.".
class DecoderBackboneImpl : public torch::nn::Module {
 public:
  // With `tp`, `config` is tensor_parallel_config()'s (this rank's shapes).
  DecoderBackboneImpl(const ModelConfig& config, Materialize materialize,
                      TensorParallel* tp = nullptr, ExpertParallel* ep = nullptr);

  torch::nn::Embedding embed_tokens{nullptr};  // [V, C]
  torch::nn::ModuleList layers{nullptr};       // L × DecoderLayer
  RMSNorm norm{nullptr};                       // [C]
};
TORCH_MODULE(DecoderBackbone);

class DecoderModelImpl : public torch::nn::Module {
 public:
  // Builds the modules in float32 with LibTorch's default initialisation; call init_weights() or
  // load_weights() next, then ->to(dtype/device). With Materialize::kNo nothing is allocated or
  // drawn, whatever the size (a 70B config builds in milliseconds), and nothing can be read from
  // the parameters until someone gives them data. With `tp` the model is that rank's part of a
  // tensor-parallel model (tensor_parallel.h): its parameters have the Hugging Face names and this
  // rank's shapes (their placements: placement.h); `config` stays the whole model's. With `ep` its
  // MoE layers hold this rank's share of the experts (moe.h: ExpertParallel).
  explicit DecoderModelImpl(ModelConfig config, Materialize materialize = Materialize::kYes,
                            std::shared_ptr<TensorParallel> tp = nullptr,
                            std::shared_ptr<ExpertParallel> ep = nullptr);

  // The blocks in forward order (blocks.h); every parameter belongs to exactly one of them.
  const std::vector<std::shared_ptr<const ModelBlock>>& blocks() const { return blocks_; }
  // Inserts a block at `position`, after the embedding and before the head (1 <= position <
  // blocks().size()), its module registered under `name` (no dots) so that its parameters are
  // named "<name>.<parameter>". `BlockModule` is a torch::nn::Module that implements Block.
  template <class BlockModule>
  void add_block(size_t position, const std::string& name, std::shared_ptr<BlockModule> module,
                 BlockRole role = BlockRole::kLayer) {
    register_module(name, module);
    insert_block(position, name, role, std::move(module));
  }
  // From now on every block runs inside `wrapper`, in `slot` (blocks.h: graphs innermost, then
  // checkpointing, then the engine). Error(kInternal) when the slot holds a wrapper already.
  void wrap_blocks(WrapperSlot slot, BlockWrapper wrapper);
  // Removes every wrapper.
  void unwrap_blocks() { wrappers_ = {}; }
  // Block `index` on `x` inside the wrappers.
  torch::Tensor run_block(size_t index, const torch::Tensor& x, const BlockContext& ctx);
  // The context of a forward over `seq_len` tokens at `positions` (RoPE tables in the parameters'
  // dtype, on their device); `labels` make the head return its fused loss.
  BlockContext context(int64_t seq_len, const Positions& positions = {},
                       const torch::Tensor& labels = {});

  // input_ids [B, T] int64 → logits [B, T, V] in the model's dtype (every rank of a tensor-parallel
  // group: the whole vocabulary). Ids must lie in [0, vocab_size)
  // (not checked here: that would cost a device sync per step; the data pipeline guarantees it).
  // `positions`: where input_ids lie in their sequences, for a sequence-parallel slice.
  torch::Tensor forward(const torch::Tensor& input_ids, const Positions& positions = {});
  // The loss of input_ids [B, T] against labels [B, T] (aligned, as causal_lm_loss_sum takes
  // them), with the router's statistics where they are on (LossSum::router). fused
  // (model.fused_loss): the head's fused loss, which never holds the [B, T, V] logits; otherwise
  // the logits and then causal_lm_loss_sum. Same loss and gradients either way, up to float
  // rounding.
  LossSum loss_sum(const torch::Tensor& input_ids, const torch::Tensor& labels, bool fused,
                   const Positions& positions = {});
  // Every block but the head: input_ids [B, T] → hidden [B, T, C] (this rank's token rows [n, C]
  // under tensor parallelism's sequence parallelism). forward(ids) is head(hidden_states(ids)).
  torch::Tensor hidden_states(const torch::Tensor& input_ids, const Positions& positions = {});
  // The head's logits: hidden [B, T, C] → [B, T, V].
  torch::Tensor head(const torch::Tensor& hidden);
  // The head's fused loss (final norm, then the projection fused with the cross entropy), chunks
  // of `chunk_bytes` float32 logits at a time (0: set_loss_chunk_bytes(), else the device's
  // default). hidden [B, T, C], labels [B, T] aligned as for causal_lm_loss_sum, whose value and
  // gradients this equals up to float rounding.
  LossSum head_loss_sum(const torch::Tensor& hidden, const torch::Tensor& labels,
                        int64_t chunk_bytes = 0);
  // Bytes of float32 logits per chunk of the fused loss; 0 (the default): the device's default
  // (loss_chunk_bytes). One chunk's logits and log-probabilities, about twice this, are the
  // loss's working memory.
  void set_loss_chunk_bytes(int64_t bytes) { loss_chunk_bytes_ = bytes; }
  // The weight the head projects with: lm_head.weight, or model.embed_tokens.weight when tied.
  const torch::Tensor& head_weight() const;
  // RoPE cos/sin [T, D] for `seq_len` tokens at `positions` ([B, T, D] with packed documents),
  // on `like`'s device, in its dtype (yarn's attention factor applied).
  std::pair<torch::Tensor, torch::Tensor> rope(int64_t seq_len, const torch::Tensor& like,
                                               const Positions& positions = {});
  // Every block's attention runs `core` in causal_attention's place (layers.h); empty restores it.
  void set_attention_core(const AttentionCore& core);
  // Tiled MLP in every block (tiled_mlp.h): kTiledMlpOff (default), kTiledMlpAuto, or tokens per
  // tile.
  void set_tiled_mlp(int64_t setting);
  const ModelConfig& config() const { return config_; }
  // What the MoE layers reported of the last forward that forward(), loss_sum() or
  // hidden_states() ran, in training or with the router losses on (moe.h); null otherwise.
  RouterRecord* last_router() const { return router_.get(); }
  // The tensor-parallel group this model is a part of; null: the whole model.
  TensorParallel* tensor_parallel() const { return tp_.get(); }
  // The expert-parallel group its MoE layers' experts are spread over; null: none.
  ExpertParallel* expert_parallel() const { return ep_.get(); }
  int64_t num_layers() const { return config_.num_hidden_layers; }
  DecoderLayer decoder_layer(int64_t index) const;

  DecoderBackbone model{nullptr};
  Linear lm_head{nullptr};  // null when tie_word_embeddings

 private:
  void insert_block(size_t position, const std::string& name, BlockRole role,
                    std::shared_ptr<Block> block);
  // Each block's own parameters and shares, from the tensors each one reads.
  void assign_parameters();
  // input_ids through blocks [0, end) in one context (labels: the head's fused loss).
  torch::Tensor run_blocks(const torch::Tensor& input_ids, const Positions& positions,
                           const torch::Tensor& labels, size_t end);

  ModelConfig config_;
  std::shared_ptr<TensorParallel> tp_;
  std::shared_ptr<ExpertParallel> ep_;
  // [D/2] float32 for sequences up to max_position_embeddings (all lengths but dynamic's longer
  // ones); not a parameter or buffer (never cast, never saved)
  torch::Tensor inv_freq_;
  double rope_scaling_ = 1.0;  // cos/sin factor (rope_attention_scaling)
  std::vector<std::shared_ptr<const ModelBlock>> blocks_;
  std::array<std::shared_ptr<const BlockWrapper>, kWrapperSlots> wrappers_;  // by WrapperSlot
  std::shared_ptr<LmHead> head_;
  int64_t loss_chunk_bytes_ = 0;
  c10::intrusive_ptr<RouterRecord> router_;
};
TORCH_MODULE(DecoderModel);

// float32 | bfloat16 | float16 → dtype; "auto" or "" → the config's torch_dtype, float32 if it has
// none. Error(kInput) naming the value otherwise.
torch::ScalarType resolve_dtype(const std::string& name, const ModelConfig& config);
std::string dtype_name(torch::ScalarType type);  // inverse of the above for the three float dtypes

// Hugging Face initialisation, deterministic for a seed and independent of dtype, device and of
// which parts are asked for: Linear and Embedding weights ~ normal(0, initializer_range) (the
// pad_token_id row of the embedding zeroed), biases zero, RMSNorm weights one. Each parameter's
// values come from generators seeded by (seed, name, block of 65536 elements), so a rank that owns
// a slice of a parameter computes exactly that slice's values without drawing the rest.
void init_weights(DecoderModelImpl& model, uint64_t seed);

// Elements [begin, end) of parameter `name` (of `shape`) flattened, as init_weights sets them: a
// 1-D float32 CPU tensor. Error(kInternal) for a range outside the parameter.
torch::Tensor init_values(const ModelConfig& config, const std::string& name,
                          c10::IntArrayRef shape, uint64_t seed, int64_t begin, int64_t end);

// init_values for every parameter of `model` by name (shapes are taken now; the parameters may
// hold no memory): (name, begin, end) → float32 values. Out-of-model names: std::out_of_range.
using ValueSource = std::function<torch::Tensor(const std::string&, int64_t, int64_t)>;
ValueSource init_source(DecoderModelImpl& model, uint64_t seed);

// A model initialised from `seed` and cast to `dtype`.
DecoderModel build_model(const ModelConfig& config, torch::ScalarType dtype, uint64_t seed);

// Mean cross entropy, in float32, over positions whose label is not -100. logits [B, T, V], labels
// [B, T] int64, already aligned with the positions (not shifted here). Returns 0 when every label
// is -100 (so an empty micro-batch adds nothing instead of NaN).
torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels);

LossSum causal_lm_loss_sum(const torch::Tensor& logits, const torch::Tensor& labels);

}  // namespace dstrain::model
