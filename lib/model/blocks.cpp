#include "model/blocks.h"

#include "model/activation_checkpoint.h"
#include "model/fused_linear_cross_entropy.h"
#include "model/selective_attention.h"

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

torch::Tensor TokenEmbedding::forward(const torch::Tensor& ids, const BlockContext&) {
  return embed_(ids);
}

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& c, int64_t index, Materialize m) {
  self_attn = register_module("self_attn", Attention(c, c.attention_window(index), m));
  mlp = register_module("mlp", Mlp(c, m));
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, m));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, m));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& h, const BlockContext& ctx) {
  const auto [x, normed] =
      post_attention_layernorm->add_and_forward(h, self_attn(input_layernorm(h), ctx.cos, ctx.sin));
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

std::vector<Projection> DecoderLayerImpl::projections() {
  auto& a = *self_attn;
  auto& m = *mlp;
  return {{"self_attn.q_proj", a.q_proj}, {"self_attn.k_proj", a.k_proj},
          {"self_attn.v_proj", a.v_proj}, {"self_attn.o_proj", a.o_proj},
          {"mlp.gate_proj", m.gate_proj}, {"mlp.up_proj", m.up_proj},
          {"mlp.down_proj", m.down_proj}};
}

torch::Tensor LmHead::forward(const torch::Tensor& h, const BlockContext& ctx) {
  return ctx.labels.defined() ? loss_sum(h, ctx.labels, ctx.loss_chunk_bytes) : logits(h);
}

torch::Tensor LmHead::logits(const torch::Tensor& h) {
  return torch::nn::functional::linear(norm_(h), weight());
}

torch::Tensor LmHead::loss_sum(const torch::Tensor& h, const torch::Tensor& labels,
                               int64_t chunk_bytes) {
  return linear_cross_entropy_sum(norm_(h), weight(), labels, kIgnoreIndex, chunk_bytes);
}

}  // namespace dstrain::model
