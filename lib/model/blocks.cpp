#include "model/blocks.h"

#include <algorithm>

#include "core/error.h"
#include "model/activation_checkpoint.h"
#include "model/fused_linear_cross_entropy.h"
#include "model/selective_attention.h"
#include "model/tiled_mlp.h"

namespace dstrain::model {

BlockWrapper checkpoint_layers(std::shared_ptr<ActivationOffload> offload) {
  return [offload](const ModelBlock& block, const torch::Tensor& x, const BlockContext& ctx,
                   const BlockFn& run) {
    if (block.role != BlockRole::kLayer || !ctx.training || !torch::GradMode::is_enabled()) {
      return run(x);
    }
    // Only the block's own input is an input of the checkpoint (and goes to the offload store):
    // the context (RoPE tables shared by every layer) travels in `run`.
    return checkpoint([run](const std::vector<torch::Tensor>& in) { return run(in[0]); }, {x},
                      CheckpointOffload{offload, {true}});
  };
}

BlockWrapper selective_checkpoint_layers() {
  return [](const ModelBlock& block, const torch::Tensor& x, const BlockContext& ctx,
            const BlockFn& run) {
    if (block.role != BlockRole::kLayer || !ctx.training || !torch::GradMode::is_enabled()) {
      return run(x);
    }
    // One keep per layer call, filled by its forward and emptied by its recompute; it lives in
    // the checkpoint's closure, so it goes with the graph.
    auto keep = std::make_shared<AttentionKeep>();
    return checkpoint(
        [run, keep](const std::vector<torch::Tensor>& in) {
          const KeepAttentionScope scope(*keep);
          return run(in[0]);
        },
        {x});
  };
}

std::vector<Placement> TokenEmbedding::placements() {
  return {tp_ ? Placement::split(PlacementKind::kVocabulary) : Placement{}};
}

std::vector<Placement> LmHead::placements() {
  return {norm_->placement(), tp_ ? Placement::split(PlacementKind::kVocabulary) : Placement{}};
}

torch::Tensor TokenEmbedding::forward(const torch::Tensor& ids, const BlockContext&) {
  if (tp_ == nullptr) return embed_(ids);
  // The ids outside this rank's rows look up row 0 and are zeroed (so they add no gradient).
  const torch::Tensor outside = ids.lt(first_).logical_or_(ids.ge(first_ + embed_->weight.size(0)));
  const torch::Tensor local = (ids - first_).masked_fill_(outside, 0);
  return leave_region(tp_, embed_(local).masked_fill(outside.unsqueeze(-1), 0));
}

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& c, int64_t index, Materialize m,
                                   TensorParallel* tp, ExpertParallel* ep)
    : heads_(c.num_attention_heads), tp_(tp) {
  self_attn = register_module("self_attn", Attention(c, c.attention_window(index), m, tp));
  if (c.is_moe_layer(index)) {
    if (tp != nullptr) fail(ErrorKind::kInternal, "a MoE layer under tensor parallelism");
    sparse_mlp = register_module("mlp", SparseMoe(c, m, c.moe_layer_slot(index), ep));
    top_k_ = c.moe.top_k;
  } else {
    mlp = register_module("mlp", Mlp(c, m, tp));
  }
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, m));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, m));
  // Under sequence parallelism each rank normalises its own token rows.
  if (tp != nullptr && tp->sequence_parallel()) {
    input_layernorm->partial_gradient = post_attention_layernorm->partial_gradient = true;
  }
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& h, const BlockContext& ctx) {
  const auto [x, normed] = post_attention_layernorm->add_and_forward(
      h, self_attn(input_layernorm(h), ctx.cos, ctx.sin, ctx.documents.get()));
  if (!sparse_mlp.is_empty()) return x + sparse_mlp(normed, ctx.router.get(), ctx.real_tokens);
  return mlp->forward(normed, x);
}

std::vector<torch::Tensor> DecoderLayerImpl::weights() {
  const auto& a = *self_attn;
  std::vector<torch::Tensor> out = {a.q_proj->weight, a.k_proj->weight, a.v_proj->weight};
  for (const auto* p : {&a.q_proj, &a.k_proj, &a.v_proj}) {
    if ((*p)->bias.defined()) out.push_back((*p)->bias);
  }
  const size_t first = out.size();
  for (const torch::Tensor& t : parameters()) {
    bool listed = false;
    for (size_t i = 0; i < first; ++i) listed = listed || out[i].is_same(t);
    if (!listed) out.push_back(t);
  }
  return out;
}

std::vector<Placement> DecoderLayerImpl::placements() {
  // Each tensor's placement as the module that holds it declares it.
  std::vector<std::pair<torch::Tensor, Placement>> declared;
  for (const Projection& p : projections()) {
    declared.emplace_back(p.linear->weight, p.linear->weight_placement);
    if (p.linear->bias.defined()) declared.emplace_back(p.linear->bias, p.linear->bias_placement);
  }
  for (const RMSNorm* n :
       {&input_layernorm, &post_attention_layernorm, &self_attn->q_norm, &self_attn->k_norm}) {
    if (!n->is_empty()) declared.emplace_back((*n)->weight, (*n)->placement());
  }
  // A MoE layer's router and shared expert: whole on every rank; its experts split over the
  // expert-parallel group where there is one (declared first: a tensor's first declaration counts).
  if (!sparse_mlp.is_empty()) {
    const Experts& experts = sparse_mlp->experts;
    const Placement stacks =
        sparse_mlp->expert_parallel()
            ? Placement::split(PlacementKind::kExperts, PlacementGroup::kExpert)
            : Placement{};
    declared.emplace_back(experts->gate_up_proj, stacks);
    declared.emplace_back(experts->down_proj, stacks);
    for (const torch::Tensor& t : sparse_mlp->parameters()) declared.emplace_back(t, Placement{});
  }
  std::vector<Placement> out;
  for (const torch::Tensor& t : weights()) {
    const auto it = std::find_if(declared.begin(), declared.end(),
                                 [&t](const auto& d) { return d.first.is_same(t); });
    if (it == declared.end()) {
      fail(ErrorKind::kInternal, "a decoder layer's parameter has no declared placement");
    }
    out.push_back(it->second);
  }
  return out;
}

std::vector<Projection> DecoderLayerImpl::projections() {
  auto& a = *self_attn;
  std::vector<Projection> out = {{"self_attn.q_proj", a.q_proj},
                                 {"self_attn.k_proj", a.k_proj},
                                 {"self_attn.v_proj", a.v_proj},
                                 {"self_attn.o_proj", a.o_proj}};
  // A MoE layer's experts are no projections (3-D stacks); its shared expert's are.
  const Mlp& m = sparse_mlp.is_empty() ? mlp : sparse_mlp->shared_expert;
  if (m.is_empty()) return out;
  const std::string at = sparse_mlp.is_empty() ? "mlp." : "mlp.shared_expert.";
  out.push_back({at + "gate_proj", m->gate_proj});
  out.push_back({at + "up_proj", m->up_proj});
  out.push_back({at + "down_proj", m->down_proj});
  return out;
}

std::vector<ExpertStack> DecoderLayerImpl::expert_stacks() {
  if (sparse_mlp.is_empty()) return {};
  return {{"mlp.experts", "gate_up_proj", sparse_mlp->experts},
          {"mlp.experts", "down_proj", sparse_mlp->experts}};
}

std::vector<Projection> DecoderLayerImpl::routers() {
  if (sparse_mlp.is_empty()) return {};
  std::vector<Projection> out = {{"mlp.gate", sparse_mlp->gate}};
  if (!sparse_mlp->shared_expert_gate.is_empty()) {
    out.push_back({"mlp.shared_expert_gate", sparse_mlp->shared_expert_gate});
  }
  return out;
}

double DecoderLayerImpl::multiply_adds_per_token() const {
  double total = 0;
  for (const auto& item : named_parameters()) {
    const torch::Tensor& t = item.value();
    if (t.dim() == 2) total += static_cast<double>(t.numel());
    // An expert stack [E, ...]: a token runs through top_k of its E experts.
    if (t.dim() == 3) total += static_cast<double>(t.numel() / t.size(0) * top_k_);
  }
  return total;
}

// What the layer keeps, derived tensor by tensor from what its ops save for backward (layers.cpp,
// fused_layer_ops.cpp, tiled_mlp.cpp) on each of the two paths it runs. Per token, in bytes, with
// c the activations' element size, C hidden, HD = heads·head_dim, KVD = kv_heads·head_dim, I the
// MLP width:
//
//   fused kernels (a CUDA device, float32/bfloat16):
//     2·(2cC + 4)           each RMSNorm: its input and rstd (PyTorch's fused norm), its output
//                           (the next projections' input)
//     c·(2·HD + 2·KVD)      attention: q and k after RoPE (the RoPE kernel keeps only the tables),
//                           v, and SDPA's output (o_proj's input, the same memory)
//     4·heads               SDPA's float32 log-sum-exp
//     3cI                   SwiGLU: gate and up (the fused kernel), its product (down_proj's input)
//   eager ops (the CPU, float16 on a GPU, DSTRAIN_CUDA_KERNELS=0):
//     2·(4C + 2cC + 4)      each RMSNorm: its float32 input (the input itself in float32), the
//                           normalised value in c, its output, the float32 rstd
//     the same attention terms
//     4cI                   SwiGLU: gate, silu(gate), up, the product
//   Qwen3's q/k norms on top: their input and per-head rstd, (c or 4 + c)·(HD + KVD) +
//   4·(heads + kv_heads) with the kernels or eager
//
// For the Qwen2.5-0.5B shape in bf16 on a GPU that is c·(6C + 2·KVD + 3I) + 4·heads + 8 bytes per
// token (40.5 KB). Tiled MLP keeps only the MLP's input (the second norm's output, counted above)
// in place of the 3cI / 4cI.
//
// Its backward's working memory on top of its saved tensors: MLP, the gradient of the layer's
// output, then of the product and of gate and up (or of silu(gate) and up), while the product
// itself is released (down_proj's backward is done with it); attention, the gradients of its
// output, q, k and v (a GPU's flash backward also accumulates dq in float32). Tiled: d x for
// every token, one tile's recomputed intermediates and their gradients, and the MLP weights'
// float32 gradient sums.
//
// Tensor parallelism (tensor_parallel.h) with its sequence parallelism: the layer's input and its
// norms' tensors are this rank's N/T token rows, and its projections keep the rows gathered whole
// (c·C for every token, twice: attention's and the MLP's input) where the norms' outputs were.
// Without it the norms run on every token and their outputs are what the projections keep, as
// above; every other term is this rank's heads' and MLP width's (its config's).
//
// A MoE layer's MLP (moe.h) keeps, per token with k experts of width I and E of them: the router's
// float32 probabilities (4E) and top-k indices (8k), with norm_topk_prob the top-k weights and
// their sum (4k + 4) of the division; the sorted rows' order, tokens and inverse order (24k); and
// per routed row its input (cC), the SwiGLU terms above at width I, its output (cC, kept by the
// product with its weight) and that weight (c, Mixtral's float32 4); a shared expert its MLP terms
// at its width, its output (cC) and its gate's sigmoid (c). Its backward: the layer output's
// gradient, then per routed row the gradients of its output, product and gate/up (cC + 2cI).
// Whatever the routing, the rows are N·k.
//
// Checkpointed, it keeps its input, c·C per token (selective: also its attention's output and
// log-sum-exp, c·HD + 4·heads, and on a GPU the recompute's attention holds k and v repeated to the
// query heads, c·2·(HD − KVD) more; offloaded on a GPU: the input in host memory), and its backward
// first brings back what it did not keep and its output.
ActivationMemory DecoderLayerImpl::activation_memory(const ActivationRun& run,
                                                     Checkpointing setting) const {
  const auto& a = *self_attn;
  const int64_t C = a.q_proj->in_features, HD = a.q_proj->out_features;
  const int64_t KVD = a.k_proj->out_features;
  const int64_t c = run.element_bytes, N = run.tokens;
  const bool fused = run.fused_kernels;
  // One RMSNorm, its output included.
  const int64_t norm = (fused ? c * C : 4 * C + c * C) + c * C + 4;
  int64_t attention = c * (2 * HD + 2 * KVD) + 4 * heads_;
  if (!a.q_norm.is_empty()) {
    // Qwen3's q/k norms: each keeps its input (eager: as float32) and its rstd per head, and
    // eager also its normalised value (the weight's product's input); RoPE keeps nothing of q, k.
    const int64_t kv_heads = KVD / (HD / heads_);
    attention += (fused ? c : 4 + c) * (HD + KVD) + 4 * (heads_ + kv_heads);
  }
  // The MLP per token: what it keeps, and its backward's working memory beyond the layer output's
  // gradient.
  const auto swiglu_saved = [&](int64_t width) { return (fused ? 3 : 4) * c * width; };
  int64_t I = 0, mlp_saved = 0, mlp_backward = 0;
  if (sparse_mlp.is_empty()) {
    I = mlp->gate_proj->out_features;
    mlp_saved = swiglu_saved(I);
    mlp_backward = 2 * c * I;
  } else {
    const SparseMoeImpl& moe = *sparse_mlp;
    const int64_t E = moe.gate->out_features, k = top_k_;
    I = moe.experts->down_proj.size(2);
    const int64_t weight = moe.float32_weights() ? 4 : c;
    mlp_saved = 4 * E + 8 * k + (moe.norm_topk_prob() ? 4 * k + 4 : 0) + 24 * k +
                k * (c * C + swiglu_saved(I) + c * C + weight);
    if (!moe.shared_expert.is_empty()) {
      mlp_saved += swiglu_saved(moe.shared_expert->gate_proj->out_features) + c * C + c;
    }
    mlp_backward = k * (c * C + 2 * c * I);
  }
  const int64_t tile = sparse_mlp.is_empty() ? mlp_tile_tokens(run.tiled_mlp, N, C) : 0;
  const int64_t T = tp_ != nullptr && tp_->sequence_parallel() ? tp_->size() : 1;
  const int64_t norms = T == 1 ? N * 2 * norm : (N / T) * 2 * (norm - c * C) + N * 2 * c * C;
  const int64_t saved = norms + N * (attention + (tile > 0 ? 0 : mlp_saved));
  const int64_t attention_grads = N * (c * C + c * (2 * HD + 2 * KVD) + (run.cuda ? 4 * HD : 0));
  const int64_t backward =
      tile == 0
          ? std::max(attention_grads, N * (c * C + mlp_backward))
          : std::max(attention_grads,
                     N * c * C + tile * (mlp_saved + (fused ? 3 : 4) * c * I) + 4 * 3 * C * I);
  ActivationMemory m;
  m.input = (N / T) * c * C;
  switch (setting) {
    case Checkpointing::kNone:
      m.kept = saved;
      m.backward = backward;
      return m;
    case Checkpointing::kSelective: {
      const int64_t kept_attention = N * (c * HD + 4 * heads_);
      const int64_t repeated_kv = run.cuda ? N * c * 2 * (HD - KVD) : 0;
      m.kept = m.input + kept_attention;
      m.backward = saved - kept_attention + repeated_kv + m.input + backward;
      return m;
    }
    case Checkpointing::kPlain:
    case Checkpointing::kOffload:
      // On the CPU the host is the device: offload is plain.
      if (setting == Checkpointing::kOffload && run.cuda) {
        m.host = m.input;
      } else {
        m.kept = m.input;
      }
      m.backward = saved + m.input + backward;
      return m;
  }
  return m;
}

// The head keeps its norm's tensors (not its output with the fused loss, which keeps neither its
// input nor the weight) and, with the fused loss, the float32 gradients it computes in forward:
// dL/dh [tokens, C] and dL/dW [V, C] (the latter only when its weight trains); unfused, the
// float32 log-softmax. At the end of its forward: the final norm's output, and the loss's working
// memory, per chunk of n tokens with the fused loss: a GPU's kernel turns its logits [n, V] (c)
// into their gradient in place; elsewhere two float32 [n, V] tensors live at once (the logits and
// their log-softmax), and later, with only the gradient in c left, its products with the weight
// [n, C] and, in reduced precision, the dW blocks of 8192 vocabulary rows; unfused, the logits
// (and their float32 copy in reduced precision). Its backward casts the fused loss's gradients
// to the activations' and weight's dtype; unfused, it holds the gradients of the loss and of the
// float32 logits.
//
// Tensor parallelism: V is this rank's slice of the vocabulary, and its loss over the slice runs
// as the eager operations (the fused kernel needs whole rows); with its sequence parallelism the
// norm runs on this rank's N/T token rows, gathered whole for the projection.
ActivationMemory LmHead::activation_memory(const ActivationRun& run, Checkpointing) const {
  const int64_t V = weight().size(0), C = weight().size(1);
  const int64_t c = run.element_bytes, N = run.tokens;
  const bool fused = run.fused_kernels && tp_ == nullptr;
  const int64_t T = tp_ != nullptr && tp_->sequence_parallel() ? tp_->size() : 1;
  const int64_t norm = (run.fused_kernels ? c * C : 4 * C + c * C) + c * C + 4;
  ActivationMemory m;
  m.input = (N / T) * c * C;
  m.kept = (N / T) * (norm - (run.fused_loss ? c * C : 0));
  if (!run.fused_loss) {
    m.kept += 4 * N * V;
    m.forward = N * V * (c + (c == 4 ? 0 : 4));
    m.backward = 8 * N * V;
    return m;
  }
  m.kept += 4 * N * C + (run.weights_train ? 4 * V * C : 0);
  m.backward = c == 4 ? 0 : c * N * C + (run.weights_train ? c * V * C : 0);
  const int64_t budget = run.loss_chunk_bytes > 0
                             ? run.loss_chunk_bytes
                             : (run.cuda ? kCudaLossChunkBytes : kDefaultLossChunkBytes);
  const int64_t n = std::min(N, loss_chunk_tokens(V, budget));
  const int64_t blocks = c == 4 ? 0 : std::min<int64_t>(8192, V) * C * c;
  const int64_t chunk =
      fused ? n * V * c + n * C * c + 4 * n : std::max(8 * n * V, n * V * c + n * C * c + blocks);
  m.forward = chunk + c * N * C;
  return m;
}

torch::Tensor LmHead::forward(const torch::Tensor& h, const BlockContext& ctx) {
  return project(h, ctx.labels, ctx.loss_chunk_bytes);
}

torch::Tensor LmHead::logits(const torch::Tensor& h) {
  return project(h, {}, 0);
}

torch::Tensor LmHead::loss_sum(const torch::Tensor& h, const torch::Tensor& labels,
                               int64_t chunk_bytes) {
  return project(h, labels, chunk_bytes);
}

torch::Tensor LmHead::project(const torch::Tensor& h, const torch::Tensor& labels,
                              int64_t chunk_bytes) {
  // The final norm on every rank, into the vocabulary-parallel region (tensor_parallel.h).
  const torch::Tensor x = enter_region(tp_, norm_(h));
  if (labels.defined()) {
    return linear_cross_entropy_sum(x, weight(), labels, kIgnoreIndex, chunk_bytes,
                                    VocabSlice{tp_, first_});
  }
  const torch::Tensor logits = torch::nn::functional::linear(x, weight());
  return tp_ ? tp_->gather_last(logits) : logits;
}

}  // namespace dstrain::model
