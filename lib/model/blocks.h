#pragma once
// The model as an ordered list of blocks: the unit that everything applied from outside the model
// works with. A decoder model is [embedding, layer 0, ..., layer L-1, head]; its forward is
//
//   x = input_ids;  for (block : blocks) x = run(block, x);
//
// where run() is the block's own forward inside whatever wrappers were installed around every
// block (BlockWrapper): activation checkpointing (checkpoint_layers() below), ZeRO-3's gathering of
// a block's parameters before it runs and its release after (lib/train/parallelize.h), a test's
// probe. Settings that act inside a block go through the Block interface itself (the attention core
// of sequence parallelism, tiled MLP), and LoRA finds the projections it may adapt there too. So a
// new kind of block (another model family's layer, a MoE layer) needs no change outside lib/model:
// it implements Block, and every wrapper and setting applies to it as to the others.
//
// A block also says what it holds of one micro-batch from its forward to its backward under each
// activation-checkpointing setting (Block::activation_memory): the memory model of lib/estimate
// walks the block list and adds that up, so a new block is predicted from its own description.
//
// Each block owns parameters of the model, by their Hugging Face names (ModelBlock::parameters);
// every parameter of the model belongs to exactly one block. A block may also read an earlier
// block's parameters (ModelBlock::shares): the head of a model with tied embeddings (Qwen2.5-0.5B)
// projects with model.embed_tokens.weight, which belongs to the embedding block; ZeRO-3 then
// gathers the embedding's parameters for the head too.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "model/checkpointing.h"
#include "model/layers.h"
#include "model/model_config.h"
#include "model/moe.h"

namespace dstrain::model {

class ActivationOffload;

constexpr int64_t kIgnoreIndex = -100;  // a label that counts in no loss

// A block's place: the embedding comes first (token ids in), the head last (the projection onto
// the vocabulary, or its fused loss); layers are the repeated middle, what activation
// checkpointing recomputes.
enum class BlockRole { kEmbedding, kLayer, kHead };

// What a block's forward reads besides its input: the same for every block of one forward, and
// copied into whatever runs a block again later (activation checkpointing's recompute).
struct BlockContext {
  // RoPE tables [T, D] in the model's dtype, at this forward's positions; [B, T, D] with
  // `documents` (each token's position in its document).
  torch::Tensor cos, sin;
  // Rows of packed documents, each attending only to itself (document_attention.h); null: each
  // row is one sequence.
  std::shared_ptr<const Documents> documents;
  torch::Tensor labels;  // [B, T] aligned labels: the head returns its fused loss; else logits
  int64_t loss_chunk_bytes =
      0;                  // the fused loss's chunk (fused_linear_cross_entropy.h); 0: default
  bool training = false;  // the model's mode
  // A MoE model in training, or with its router losses on: what its layers report of this
  // forward (moe.h); null otherwise.
  c10::intrusive_ptr<RouterRecord> router;
  // [B, T] bool: the tokens that are not padding (the router's losses skip the others); undefined:
  // every token.
  torch::Tensor real_tokens;
};

// A linear projection inside a block that an adapter can be added to (LoRA: its
// LinearImpl::adapter, which the block's forward reads through project(), layers.h).
struct Projection {
  std::string path;  // relative to the block, e.g. "self_attn.q_proj"
  Linear linear;

  // Its name in LoRA's target_modules: the last part of the path.
  std::string key() const { return path.substr(path.rfind('.') + 1); }
};

// An expert stack inside a block that an adapter can be added to (LoRA's target_parameters: its
// ExpertsImpl::adapter slot, which the experts' forward reads).
struct ExpertStack {
  std::string path;       // the experts module, relative to the block: "mlp.experts"
  std::string parameter;  // "gate_up_proj" or "down_proj"
  Experts experts;
};

// The run lib/estimate's memory model predicts: one micro-batch's forward and backward on one
// rank.
struct ActivationRun {
  int64_t tokens = 0;            // of the micro-batch on this rank
  int64_t element_bytes = 4;     // the activations' dtype: 2 (bf16/fp16) or 4 (fp32)
  bool cuda = false;             // a GPU (offloaded inputs leave the device)
  bool fused_kernels = false;    // the fused RMSNorm/RoPE/SwiGLU/loss kernels (fused_layer_ops.h)
  int64_t tiled_mlp = 0;         // kTiledMlpOff, kTiledMlpAuto or tokens per tile (tiled_mlp.h)
  bool fused_loss = true;        // the head's loss fused in chunks (fused_linear_cross_entropy.h)
  int64_t loss_chunk_bytes = 0;  // that loss's chunk budget; 0: the device's default
  bool weights_train = true;     // the blocks' weights get gradients (not under LoRA)
};

// What a block holds of that micro-batch, bytes on the rank. Checkpointed, a layer keeps its input
// (or, offloaded, leaves it in host memory) and its backward first recomputes what it did not keep
// and its output: that is part of `backward`.
struct ActivationMemory {
  int64_t input = 0;     // its input
  int64_t kept = 0;      // on the device from its forward to its backward
  int64_t host = 0;      // in host memory from its forward to its backward (offload)
  int64_t forward = 0;   // working memory at the end of its forward beyond what it keeps
  int64_t backward = 0;  // working memory of its backward beyond what it keeps
};

class Block {
 public:
  virtual ~Block() = default;
  // x → the next block's input: token ids [B, T] (embedding) or hidden states [B, T, C] in, hidden
  // states out; the head returns logits [B, T, V], or with ctx.labels the sum of the token losses
  // (a float32 scalar).
  virtual torch::Tensor forward(const torch::Tensor& x, const BlockContext& ctx) = 0;
  // Every parameter tensor the forward reads, in a fixed order: its own, and any it shares with
  // an earlier block.
  virtual std::vector<torch::Tensor> weights() = 0;
  // Where each of weights() lives across a tensor-parallel group (placement.h), declared by the
  // module that made it, in the same order; empty: every one replicated.
  virtual std::vector<Placement> placements() { return {}; }
  // The projections an adapter may be added to; none by default.
  virtual std::vector<Projection> projections() { return {}; }
  // The expert stacks an adapter may be added to, in their module's parameter order; none by
  // default.
  virtual std::vector<ExpertStack> expert_stacks() { return {}; }
  // The routing projections, whose forward reads LinearImpl::active_weight() (LoRA's
  // modules_to_save may train them whole): a MoE layer's router and Qwen2-MoE's shared-expert
  // gate; none by default.
  virtual std::vector<Projection> routers() { return {}; }
  // Attention between RoPE and o_proj runs `core` (sequence parallelism); empty restores causal
  // attention. Blocks without attention ignore it.
  virtual void set_attention_core(const AttentionCore& core) {}
  // kTiledMlpOff, kTiledMlpAuto or tokens per tile (tiled_mlp.h); blocks without an MLP ignore it.
  virtual void set_tiled_mlp(int64_t setting) {}
  // What it holds of `run` when it runs under `setting` (checkpoint_layers() and its kin wrap
  // layer blocks only: the memory model asks the others for Checkpointing::kNone).
  virtual ActivationMemory activation_memory(const ActivationRun& run,
                                             Checkpointing setting) const = 0;
  // The multiply-adds of its matrices for one token, by which pipeline stages are balanced
  // (lib/train/pipeline.h): by default none for the embedding, every 2-D parameter's elements
  // elsewhere (ModelBlock::parameters; the tied head's borrowed matrix too); negative: that rule.
  virtual double multiply_adds_per_token() const { return -1; }
};

// A parameter a block owns.
struct BlockParameter {
  std::string name;  // its name in the model (the Hugging Face state dict's)
  torch::Tensor tensor;
  Placement placement{};
};

// A block in the model's list.
struct ModelBlock {
  size_t index = 0;  // its position in the list
  // "model.embed_tokens", "model.layers.3", "head", or what a caller named an added block; a
  // projection's module path is name + "." + Projection::path.
  std::string name;
  BlockRole role = BlockRole::kLayer;
  std::shared_ptr<Block> block;
  // The parameters it owns, in the order of Block::weights().
  std::vector<BlockParameter> parameters;
  std::vector<size_t> shares;  // earlier blocks whose parameters it reads too
};

// The block's own forward, or the wrappers installed inside the one being called.
using BlockFn = std::function<torch::Tensor(const torch::Tensor& x)>;
// Runs `block` on `x` by calling `run` once (or not at all), doing its part around that call; may
// hold on to `run` to call it again later (it stays valid for as long as the model). `ctx` is the
// forward's context.
using BlockWrapper = std::function<torch::Tensor(const ModelBlock& block, const torch::Tensor& x,
                                                 const BlockContext& ctx, const BlockFn& run)>;

// Where a wrapper sits around every block, innermost first; DecoderModelImpl::wrap_blocks puts each
// in its slot, so the order does not depend on the order of installation:
// - kGraphs: CUDA graphs (layer_graphs.h) record and replay the block's own forward;
// - kCheckpointing: activation checkpointing recomputes everything inside it in backward (the
//   graphs' replay included), and nothing outside it (the engine's gathers run once);
// - kEngine: the ZeRO engine gathers the block's parameters before anything inside runs and
//   starts its backward work from the block's output (lib/train/parallelize.h); a test's probe.
enum class WrapperSlot { kGraphs = 0, kCheckpointing = 1, kEngine = 2 };
inline constexpr size_t kWrapperSlots = 3;

// Activation checkpointing of every layer block (activation_checkpoint.h): in training mode with
// grad on, only the block's input is kept and the block is recomputed in backward; otherwise the
// plain run. With `offload`, the inputs are kept in that store (activation_offload.h) instead of
// the autograd graph. For WrapperSlot::kCheckpointing.
BlockWrapper checkpoint_layers(std::shared_ptr<ActivationOffload> offload = nullptr);

// Selective checkpointing (selective_attention.h): checkpoint_layers() whose layers also keep their
// attention's output and softmax statistics from the forward, so that the recompute runs
// everything but attention. For WrapperSlot::kCheckpointing.
BlockWrapper selective_checkpoint_layers();

// The token embedding (model.embed_tokens): ids [B, T] → [B, T, C]. With `tp` (tensor_parallel.h)
// vocabulary-parallel: `embed` holds the ids [first, first + its rows), the ranks' lookups summed
// (this rank's token rows [n, C] under its sequence parallelism).
class TokenEmbedding final : public Block {
 public:
  explicit TokenEmbedding(torch::nn::Embedding embed, TensorParallel* tp = nullptr,
                          int64_t first = 0)
      : embed_(std::move(embed)), tp_(tp), first_(first) {}
  torch::Tensor forward(const torch::Tensor& ids, const BlockContext& ctx) override;
  std::vector<torch::Tensor> weights() override { return {embed_->weight}; }
  std::vector<Placement> placements() override;
  // Nothing: its backward reads the token ids, which the batch holds anyway; vocabulary-parallel,
  // the ids within its rows (int64) and the mask of the others (bool).
  ActivationMemory activation_memory(const ActivationRun& run, Checkpointing) const override {
    return {8 * run.tokens, tp_ ? 9 * run.tokens : 0, 0, 0, 0};
  }

 private:
  torch::nn::Embedding embed_;
  TensorParallel* tp_;
  int64_t first_;
};

// Pre-norm residual decoder layer (model.layers.N): h + attn(norm(h)), then h + mlp(norm(h)).
class DecoderLayerImpl : public torch::nn::Module, public Block {
 public:
  // Layer number `index` of the model: its attention window is config.attention_window(index).
  // With `tp`, `config` is tensor_parallel_config()'s: attention and MLP tensor-parallel
  // (tensor_parallel.h); under its sequence parallelism h and the result are this rank's token
  // rows [n, C].
  // With `ep` a MoE layer holds this rank's share of the experts (moe.h).
  DecoderLayerImpl(const ModelConfig& config, int64_t index,
                   Materialize materialize = Materialize::kYes, TensorParallel* tp = nullptr,
                   ExpertParallel* ep = nullptr);
  torch::Tensor forward(const torch::Tensor& h, const BlockContext& ctx) override;
  // Every parameter, the attention's q, k and v weights first, then their biases: ZeRO lays a
  // block's parameters out in this order, so the three weights (and biases) lie back to back and
  // fused_qkv's stacked weight is a view of the engine's memory, not a copy (fused_qkv.h).
  std::vector<torch::Tensor> weights() override;
  std::vector<Placement> placements() override;
  std::vector<Projection> projections() override;
  std::vector<ExpertStack> expert_stacks() override;
  std::vector<Projection> routers() override;
  void set_attention_core(const AttentionCore& core) override { self_attn->core = core; }
  void set_tiled_mlp(int64_t setting) override {
    if (!mlp.is_empty()) mlp->set_tiling(setting);
  }
  // Derived tensor by tensor in blocks.cpp.
  ActivationMemory activation_memory(const ActivationRun& run,
                                     Checkpointing setting) const override;

  // A MoE layer's cost per token: what its matrices multiply for one token (of the experts the
  // top_k it runs through); a dense layer's is every matrix's.
  double multiply_adds_per_token() const override;

  Attention self_attn{nullptr};
  Mlp mlp{nullptr};               // a dense layer's MLP
  SparseMoe sparse_mlp{nullptr};  // a MoE layer's (moe.h), under the same name "mlp"
  RMSNorm input_layernorm{nullptr};
  RMSNorm post_attention_layernorm{nullptr};

 private:
  int64_t heads_ = 0;  // attention heads (the float32 log-sum-exp per head and token)
  int64_t top_k_ = 0;  // a MoE layer's experts per token
  TensorParallel* tp_ = nullptr;
};
TORCH_MODULE(DecoderLayer);

// The head: the final norm (model.norm), then the projection onto the vocabulary with lm_head, or
// with the embedding's weight when the embeddings are tied (`lm_head` null). hidden [B, T, C] →
// logits [B, T, V], or the fused loss. With `tp` (tensor_parallel.h) vocabulary-parallel, the
// weight holding the ids [first, first + its rows): the loss is computed across the slices and
// logits are gathered; under its sequence parallelism hidden is this rank's token rows [n, C] and
// logits come as [B·T, V].
class LmHead final : public Block {
 public:
  LmHead(RMSNorm norm, Linear lm_head, torch::nn::Embedding tied, TensorParallel* tp = nullptr,
         int64_t first = 0)
      : norm_(std::move(norm)),
        lm_head_(std::move(lm_head)),
        tied_(std::move(tied)),
        tp_(tp),
        first_(first) {}
  torch::Tensor forward(const torch::Tensor& h, const BlockContext& ctx) override;
  std::vector<torch::Tensor> weights() override { return {norm_->weight, weight()}; }
  std::vector<Placement> placements() override;
  // The same under every setting: the head is not checkpointed.
  ActivationMemory activation_memory(const ActivationRun& run, Checkpointing) const override;

  // lm_head.weight, or model.embed_tokens.weight when tied.
  const torch::Tensor& weight() const { return lm_head_ ? lm_head_->weight : tied_->weight; }
  torch::Tensor logits(const torch::Tensor& h);
  // The summed cross entropy of the projection against `labels` [B, T] (aligned; kIgnoreIndex
  // counts nothing), without ever holding the [B, T, V] logits (fused_linear_cross_entropy.h).
  torch::Tensor loss_sum(const torch::Tensor& h, const torch::Tensor& labels, int64_t chunk_bytes);

 private:
  // The head's one forward (a number format that keeps the head apart changes it alone): the
  // norm, then the vocabulary projection fused with the loss given labels, else the logits.
  torch::Tensor project(const torch::Tensor& h, const torch::Tensor& labels, int64_t chunk_bytes);

  RMSNorm norm_;
  Linear lm_head_;
  torch::nn::Embedding tied_;
  TensorParallel* tp_;
  int64_t first_;
};

}  // namespace dstrain::model
