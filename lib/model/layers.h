#pragma once
// The parts of a decoder layer (blocks.h), as torch::nn modules whose registered names make
// named_parameters() produce the Hugging Face state-dict names (q_proj, input_layernorm, ...).
// Shapes: B batch, T sequence, C hidden_size, H query heads, KV key/value heads, D head_dim, I MLP
// width.

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "model/document_attention.h"
#include "model/model_config.h"
#include "model/placement.h"
#include "model/tensor_parallel.h"

namespace dstrain::model {

// kYes: parameters hold memory, with LibTorch's default initialisation (as torch::nn::Linear and
// torch::nn::Embedding draw it). kNo: parameters know their shapes, dtype and device but hold no
// memory and nothing is drawn or computed (see storage.h): an engine fills them (ZeRO-3 only its
// own shard), or nothing ever does (the memory estimator, LoRA's target matching).
enum class Materialize { kYes, kNo };

// Something added to a projection's output, computed from the same input: LoRA's
// B·A·dropout(x)·scale (lib/lora). x [..., in] → [..., out] in x's dtype. `training` is the owning
// module's mode, so dropout-like adapters act only in training.
class LinearAdapter {
 public:
  virtual ~LinearAdapter() = default;
  virtual torch::Tensor delta(const torch::Tensor& x, bool training) = 0;
  // The tensors delta() reads that may need gradients (for blocks that take gradients with
  // respect to explicit tensors, such as the tiled MLP: tiled_mlp.h).
  virtual std::vector<torch::Tensor> parameters() const = 0;
};

// y = x·Wᵀ + b: torch::nn::Linear's forward and default initialisation, buildable without memory.
// A projection owns the slot of its adapter, which project() (below) reads, so an adapter set on a
// projection is one its forward reads (no lookup by name).
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool bias, Materialize materialize);
  torch::Tensor forward(const torch::Tensor& x);  // [..., in] -> [..., out], without the adapter

  // The adapter added to this projection's output; null: none. The model never creates adapters:
  // whoever sets one keeps its parameters (they are not the module's parameters, so
  // named_parameters() stays the Hugging Face state dict).
  std::shared_ptr<LinearAdapter> adapter;
  // A trained copy of the weight that the forward reads instead of it (LoRA's modules_to_save:
  // the module trained whole beside the adapters; kept by whoever sets it, as the adapter);
  // undefined: the weight. Read through active_weight() by the forwards that allow it (a MoE
  // layer's routers: Block::routers()).
  torch::Tensor trained;
  const torch::Tensor& active_weight() const { return trained.defined() ? trained : weight; }

  // Tensor parallelism: its output features split (column-parallel: weight and bias by rows), or
  // its input features (row-parallel: the weight by columns, the bias whole and added once after
  // the ranks' partial products are summed; under the group's sequence parallelism on this rank's
  // token rows, so its gradient there is a part). Replicated unless one of these is called.
  void place_column();
  void place_row(const TensorParallel& tp);

  int64_t in_features, out_features;
  torch::Tensor weight;  // [out, in]
  torch::Tensor bias;    // [out], or undefined
  Placement weight_placement, bias_placement;
};
TORCH_MODULE(Linear);

// The one forward of a projection, which every weight matmul of a block runs through (a new number
// format or adapter kind changes these two functions alone): x·Wᵀ + b plus the adapter's delta
// (training: the owning module's mode, so dropout-like adapters act only in training).
//   residual   added to the output: fused into the matmul where add_projection() fuses it (a GPU,
//              no bias), else added after the adapter's delta
//   partial    a row-parallel projection's partial products: without the bias, which is added
//              once after the group's sum (tensor_parallel.h)
struct ProjectionEpilogue {
  torch::Tensor residual;
  bool partial = false;
};
torch::Tensor project(const LinearImpl& p, const torch::Tensor& x, bool training,
                      const ProjectionEpilogue& epilogue = {});
// q, k and v of one input: one matrix product over the stacked weights where use_fused_qkv(x)
// holds (fused_qkv.h), each projection's own otherwise; the adapters' deltas added per projection.
std::array<torch::Tensor, 3> project_qkv(const LinearImpl& q, const LinearImpl& k,
                                         const LinearImpl& v, const torch::Tensor& x,
                                         bool training);

// Causal attention over the whole sequence, the part of attention between RoPE and o_proj:
// q [B, H, T, D], k and v [B, KV, T, D] → [B, H, T, D], each key/value head serving H/KV
// consecutive query heads. Over every earlier position, or with a window over the `window` latest
// ones (sliding_window_attention.h); through SDPA's fused kernels, never a [T, T] score matrix.
// Inside a selectively checkpointed layer the forward keeps its output and the recompute reuses it
// (selective_attention.h). With `documents` (rows of packed documents), within each document only
// (document_attention.h).
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, std::optional<int64_t> window,
                               const Documents* documents = nullptr);

// What a layer's attention runs in causal_attention's place, set from outside the model (sequence
// parallelism wraps causal_attention in all-to-alls); same contract. Empty: causal_attention.
using AttentionCore = std::function<torch::Tensor(
    const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
    std::optional<int64_t> window, const Documents* documents)>;

// RMSNorm with HF semantics: statistics in float32 whatever the input dtype, the normalised value
// cast back to the input dtype and then scaled by `weight` [dim].
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, Materialize materialize = Materialize::kYes);
  torch::Tensor forward(const torch::Tensor& x);  // [..., dim] -> same
  // {x + delta, forward(x + delta)}: the residual add before the norm, fused with it on a GPU
  // (add_rms_norm in fused_layer_ops.h).
  std::pair<torch::Tensor, torch::Tensor> add_and_forward(const torch::Tensor& x,
                                                          const torch::Tensor& delta);

  // Replicated, with a partial gradient when partial_gradient is set.
  Placement placement() const { return Placement::replicated_with(partial_gradient); }

  torch::Tensor weight;  // [dim]
  // Tensor parallelism: this rank normalises only part of what the group normalises (its token
  // rows, its heads), so its gradient of the weight is its part (tensor_parallel.h).
  bool partial_gradient = false;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// Causal grouped-query self-attention with RoPE (Qwen3: per-head q_norm/k_norm before RoPE),
// over every earlier position or, with a window, the `window` latest ones (itself included; see
// sliding_window_attention.h). Where use_fused_qkv(x) holds, q/k/v are one matrix product
// (fused_qkv.h), the adapters' deltas added per projection after it. With `tp` (tensor
// parallelism, tensor_parallel.h) built from tensor_parallel_config(): this rank's heads, o_proj
// row-parallel.
class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const ModelConfig& config, std::optional<int64_t> window, Materialize materialize,
                TensorParallel* tp = nullptr);
  // x: [B, T, C]; cos, sin: [T, D] in x's dtype (the positions of x's tokens), or [B, T, D] per
  // row with packed `documents` (each document attends to itself). Returns [B, T, C]. With tensor
  // parallelism and its sequence parallelism, x and the result are this rank's token rows [n, C].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const Documents* documents = nullptr);

  Linear q_proj{nullptr};   // weight [H·D, C]
  Linear k_proj{nullptr};   // weight [KV·D, C]
  Linear v_proj{nullptr};   // weight [KV·D, C]
  Linear o_proj{nullptr};   // weight [C, H·D]
  RMSNorm q_norm{nullptr};  // [D], qwen3 only
  RMSNorm k_norm{nullptr};  // [D], qwen3 only
  AttentionCore core;       // empty: causal_attention

 private:
  int64_t heads_, kv_heads_, head_dim_;
  std::optional<int64_t> window_;
  TensorParallel* tp_;
};
TORCH_MODULE(Attention);

// SwiGLU MLP: down(silu(gate(x)) * up(x)). Optionally tiled over tokens (tiled_mlp.h): the
// [tokens, I] intermediates then exist one tile at a time, in training and in eval. With `tp`
// (tensor_parallel.h): gate/up column-parallel, down row-parallel; x and the result are this rank's
// token rows [n, C] under its sequence parallelism.
class MlpImpl : public torch::nn::Module {
 public:
  // `width`: the MLP's (0: config.intermediate_size; a MoE model's shared expert has its own).
  MlpImpl(const ModelConfig& config, Materialize materialize, TensorParallel* tp = nullptr,
          int64_t width = 0);
  torch::Tensor forward(const torch::Tensor& x);  // [B, T, C] -> [B, T, C]
  // residual + forward(x), the add fused into the down projection where add_projection fuses it
  // (fused_layer_ops.h; not with a down_proj bias or a tiled MLP).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& residual);
  // kTiledMlpOff (the default), kTiledMlpAuto or tokens per tile: see mlp_tile_tokens().
  void set_tiling(int64_t setting) { tiling_ = setting; }

  Linear gate_proj{nullptr};  // [I, C]
  Linear up_proj{nullptr};    // [I, C]
  Linear down_proj{nullptr};  // [C, I]

 private:
  // [..., C] -> [..., C], plus residual when it is defined. `partial`: this rank's partial
  // products of the row-parallel down projection, without its bias (tensor parallelism).
  torch::Tensor untiled(const torch::Tensor& x, bool training, const torch::Tensor& residual = {},
                        bool partial = false);
  int64_t tiling_ = 0;
  TensorParallel* tp_;
};
TORCH_MODULE(Mlp);

}  // namespace dstrain::model
