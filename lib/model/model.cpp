#include "model/model.h"

#include "core/error.h"
#include "model/activation_checkpoint.h"
#include "model/rope.h"
#include "model/storage.h"

namespace dstrain::model {

namespace {

// Drops the memory of every parameter of `module` (shapes are kept).
void release_parameters(torch::nn::Module& module) {
  for (auto& p : module.parameters()) release_storage(p);
}

}  // namespace

DecoderBackboneImpl::DecoderBackboneImpl(const ModelConfig& c, Materialize materialize) {
  const bool keep = materialize == Materialize::kYes;
  auto opts = torch::nn::EmbeddingOptions(c.vocab_size, c.hidden_size);
  // As in HF, the pad row gets no gradient from the lookup (it still does from a tied lm_head).
  if (c.pad_token_id && *c.pad_token_id >= 0 && *c.pad_token_id < c.vocab_size)
    opts.padding_idx(*c.pad_token_id);
  // Given a weight, Embedding uses it instead of allocating and initialising its own.
  if (!keep) opts._weight(unmaterialized({c.vocab_size, c.hidden_size}, torch::kFloat));
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(opts));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    DecoderLayer layer(c, i);
    if (!keep) release_parameters(*layer);
    layers->push_back(layer);
  }
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  if (!keep) release_parameters(*norm);
}

DecoderModelImpl::DecoderModelImpl(ModelConfig config, Materialize materialize)
    : config_(std::move(config)) {
  model = register_module("model", DecoderBackbone(config_, materialize));
  if (!config_.tie_word_embeddings) {
    lm_head = register_module(
        "lm_head",
        torch::nn::Linear(
            torch::nn::LinearOptions(config_.hidden_size, config_.vocab_size).bias(false)));
    if (materialize == Materialize::kNo) release_parameters(*lm_head);
  }
  inv_freq_ = rope_inv_freq(config_, config_.max_position_embeddings);
  rope_scaling_ = rope_attention_scaling(config_);
}

DecoderLayer DecoderModelImpl::decoder_layer(int64_t index) const {
  return DecoderLayer(model->layers->ptr<DecoderLayerImpl>(static_cast<size_t>(index)));
}

std::pair<torch::Tensor, torch::Tensor> DecoderModelImpl::rope(int64_t seq_len,
                                                               const torch::Tensor& like,
                                                               const Positions& positions) {
  const int64_t end = positions.first + seq_len;
  const int64_t length = positions.length > 0 ? positions.length : end;
  if (positions.first < 0 || end > length) {
    fail(ErrorKind::kInternal, "rope: positions [{}, {}) outside a sequence of {}", positions.first,
         end, length);
  }
  if (inv_freq_.device() != like.device()) inv_freq_ = inv_freq_.to(like.device());
  torch::Tensor inv_freq = inv_freq_;
  // Dynamic scaling depends on the length once it exceeds max_position_embeddings (rope.h).
  if (config_.rope_scaling.type == "dynamic" && length > config_.max_position_embeddings)
    inv_freq = rope_inv_freq(config_, length).to(like.device());
  auto [cos, sin] = rope_tables(inv_freq, end, rope_scaling_);
  cos = cos.narrow(0, positions.first, seq_len);
  sin = sin.narrow(0, positions.first, seq_len);
  return {cos.to(like.scalar_type()), sin.to(like.scalar_type())};
}

void DecoderModelImpl::set_attention_core(const AttentionCore& core) {
  for (int64_t i = 0; i < num_layers(); ++i) decoder_layer(i)->self_attn->core = core;
}

torch::Tensor DecoderModelImpl::embed(const torch::Tensor& input_ids) {
  return model->embed_tokens(input_ids);
}

torch::Tensor DecoderModelImpl::layer(int64_t index, const torch::Tensor& hidden,
                                      const torch::Tensor& cos, const torch::Tensor& sin) {
  if (hooks_.before) hooks_.before(index, hidden);
  DecoderLayer block = decoder_layer(index);
  torch::Tensor out;
  if (gradient_checkpointing_ && is_training() && torch::GradMode::is_enabled()) {
    // Only the layer's own input goes to the offload store: cos/sin are shared by every layer.
    out = checkpoint(
        [block](const std::vector<torch::Tensor>& in) mutable {
          return block->forward(in[0], in[1], in[2]);
        },
        {hidden, cos, sin}, CheckpointOffload{offload_, {true, false, false}});
  } else {
    out = block->forward(hidden, cos, sin);
  }
  if (hooks_.after) hooks_.after(index, out);
  return out;
}

void DecoderModelImpl::set_activation_offload(bool on) {
  if (!on) {
    offload_.reset();
  } else if (!offload_) {
    offload_ = std::make_shared<ActivationOffload>();
  }
}

void DecoderModelImpl::set_tiled_mlp(int64_t setting) {
  for (int64_t i = 0; i < num_layers(); ++i) decoder_layer(i)->mlp->set_tiling(setting);
}

const torch::Tensor& DecoderModelImpl::head_weight() const {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

torch::Tensor DecoderModelImpl::head(const torch::Tensor& hidden) {
  return torch::nn::functional::linear(model->norm(hidden), head_weight());
}

LossSum DecoderModelImpl::head_loss_sum(const torch::Tensor& hidden, const torch::Tensor& labels,
                                        int64_t chunk_bytes) {
  const torch::Tensor sum =
      linear_cross_entropy_sum(model->norm(hidden), head_weight(), labels, kIgnoreIndex,
                               chunk_bytes > 0 ? chunk_bytes : loss_chunk_bytes_);
  return {sum, labels.ne(kIgnoreIndex).sum()};
}

torch::Tensor DecoderModelImpl::forward(const torch::Tensor& input_ids) {
  return head(hidden_states(input_ids));
}

torch::Tensor DecoderModelImpl::hidden_states(const torch::Tensor& input_ids,
                                              const Positions& positions) {
  if (input_ids.dim() != 2)
    fail(ErrorKind::kInternal, "DecoderModel::forward expects input_ids [B, T], got {} dims",
         input_ids.dim());
  const int64_t T = input_ids.size(1);
  torch::Tensor h = embed(input_ids);
  auto [cos, sin] = rope(T, h, positions);
  for (int64_t i = 0; i < num_layers(); ++i) h = layer(i, h, cos, sin);
  return h;
}

}  // namespace dstrain::model
