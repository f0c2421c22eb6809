#include "model/model.h"

#include <map>

#include "core/error.h"
#include "model/rope.h"
#include "model/storage.h"

namespace dstrain::model {

DecoderBackboneImpl::DecoderBackboneImpl(const ModelConfig& c, Materialize materialize,
                                         TensorParallel* tp, ExpertParallel* ep) {
  auto opts = torch::nn::EmbeddingOptions(c.vocab_size, c.hidden_size);
  // As in HF, the pad row gets no gradient from the lookup (it still does from a tied lm_head).
  if (c.pad_token_id && *c.pad_token_id >= 0 && *c.pad_token_id < c.vocab_size)
    opts.padding_idx(*c.pad_token_id);
  // Given a weight, Embedding uses it instead of allocating and initialising its own.
  if (materialize == Materialize::kNo)
    opts._weight(unmaterialized({c.vocab_size, c.hidden_size}, torch::kFloat));
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(opts));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers->push_back(DecoderLayer(c, i, materialize, tp, ep));
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps, materialize));
  norm->partial_gradient = tp != nullptr && tp->sequence_parallel();
}

DecoderModelImpl::DecoderModelImpl(ModelConfig config, Materialize materialize,
                                   std::shared_ptr<TensorParallel> tp,
                                   std::shared_ptr<ExpertParallel> ep)
    : config_(std::move(config)), tp_(std::move(tp)), ep_(std::move(ep)) {
  const int64_t tp_rank = tp_ ? tp_->rank() : 0, tp_size = tp_ ? tp_->size() : 1;
  const ModelConfig local = tensor_parallel_config(config_, tp_rank, tp_size);
  // The first id of this rank's vocabulary slice (embedding and head).
  const int64_t first = tp_rank * local.vocab_size;
  model = register_module("model", DecoderBackbone(local, materialize, tp_.get(), ep_.get()));
  if (!config_.tie_word_embeddings) {
    lm_head = register_module(
        "lm_head", Linear(local.hidden_size, local.vocab_size, /*bias=*/false, materialize));
  }
  inv_freq_ = rope_inv_freq(config_, config_.max_position_embeddings);
  rope_scaling_ = rope_attention_scaling(config_);
  head_ = std::make_shared<LmHead>(model->norm, lm_head,
                                   lm_head ? torch::nn::Embedding(nullptr) : model->embed_tokens,
                                   tp_.get(), first);
  std::vector<std::shared_ptr<const ModelBlock>> blocks;
  auto add = [&](std::string name, BlockRole role, std::shared_ptr<Block> block) {
    ModelBlock b;
    b.name = std::move(name);
    b.role = role;
    b.block = std::move(block);
    blocks.push_back(std::make_shared<const ModelBlock>(std::move(b)));
  };
  add("model.embed_tokens", BlockRole::kEmbedding,
      std::make_shared<TokenEmbedding>(model->embed_tokens, tp_.get(), first));
  for (int64_t i = 0; i < num_layers(); ++i)
    add(fmt::format("model.layers.{}", i), BlockRole::kLayer, decoder_layer(i).ptr());
  add("head", BlockRole::kHead, head_);
  blocks_ = std::move(blocks);
  assign_parameters();
}

void DecoderModelImpl::insert_block(size_t position, const std::string& name, BlockRole role,
                                    std::shared_ptr<Block> block) {
  if (position == 0 || position >= blocks_.size()) {
    fail(ErrorKind::kInternal,
         "add_block '{}': position {} is not between the embedding (block 0) and the head (block "
         "{})",
         name, position, blocks_.size() - 1);
  }
  ModelBlock b;
  b.name = name;
  b.role = role;
  b.block = std::move(block);
  blocks_.insert(blocks_.begin() + static_cast<std::ptrdiff_t>(position),
                 std::make_shared<const ModelBlock>(std::move(b)));
  assign_parameters();
}

// A parameter belongs to the first block that reads it; a later block reading it shares that
// block. Every parameter must be read by some block (else no engine would ever see it).
void DecoderModelImpl::assign_parameters() {
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : named_parameters())
    names[item.value().unsafeGetTensorImpl()] = item.key();
  std::map<const c10::TensorImpl*, size_t> owner;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    ModelBlock b = *blocks_[i];
    b.index = i;
    b.parameters.clear();
    b.shares.clear();
    const std::vector<torch::Tensor> weights = b.block->weights();
    const std::vector<Placement> placements = b.block->placements();
    if (!placements.empty() && placements.size() != weights.size()) {
      fail(ErrorKind::kInternal, "block {} declares {} placements for {} parameters", b.name,
           placements.size(), weights.size());
    }
    for (size_t k = 0; k < weights.size(); ++k) {
      const torch::Tensor& t = weights[k];
      const auto* impl = t.unsafeGetTensorImpl();
      const auto name = names.find(impl);
      if (name == names.end()) {
        fail(ErrorKind::kInternal, "block {} reads a tensor that is no parameter of the model",
             b.name);
      }
      const auto [it, first] = owner.emplace(impl, i);
      if (first) {
        b.parameters.push_back({name->second, t, placements.empty() ? Placement{} : placements[k]});
      } else if (it->second != i) {
        b.shares.push_back(it->second);
      }
    }
    blocks_[i] = std::make_shared<const ModelBlock>(std::move(b));
  }
  for (const auto& [impl, name] : names) {
    if (!owner.count(impl)) fail(ErrorKind::kInternal, "parameter {} belongs to no block", name);
  }
}

void DecoderModelImpl::wrap_blocks(WrapperSlot slot, BlockWrapper wrapper) {
  auto& held = wrappers_.at(static_cast<size_t>(slot));
  if (held)
    fail(ErrorKind::kInternal, "wrap_blocks: slot {} holds a wrapper already",
         static_cast<int>(slot));
  held = std::make_shared<const BlockWrapper>(std::move(wrapper));
}

torch::Tensor DecoderModelImpl::run_block(size_t index, const torch::Tensor& x,
                                          const BlockContext& ctx) {
  const std::shared_ptr<const ModelBlock>& b = blocks_.at(index);
  // Each closure holds what it calls: a wrapper may keep `run` for a later recompute.
  BlockFn run;
  for (const auto& wrapper : wrappers_) {  // innermost first
    if (!wrapper) continue;
    BlockFn inner = run ? std::move(run) : [block = b->block, ctx](const torch::Tensor& in) {
      return block->forward(in, ctx);
    };
    run = [wrapper, b, ctx, inner = std::move(inner)](const torch::Tensor& in) {
      return (*wrapper)(*b, in, ctx, inner);
    };
  }
  return run ? run(x) : b->block->forward(x, ctx);
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
  // Packed documents: each token at its position in its document, the longest document being
  // what dynamic scaling sees (transformers: the largest position id + 1).
  const Documents* documents = positions.documents.get();
  const int64_t positions_needed = documents ? documents->longest() : end;
  const int64_t seen = documents ? positions_needed : length;
  // Dynamic scaling depends on the length once it exceeds max_position_embeddings (rope.h).
  if (config_.rope_scaling.type == "dynamic" && seen > config_.max_position_embeddings)
    inv_freq = rope_inv_freq(config_, seen).to(like.device());
  auto [cos, sin] = rope_tables(inv_freq, positions_needed, rope_scaling_);
  if (documents) {
    const torch::Tensor at =
        documents->positions(length).narrow(1, positions.first, seq_len).to(like.device());
    const auto rows = [&](const torch::Tensor& table) {
      return table.index_select(0, at.reshape(-1))
          .view({at.size(0), seq_len, table.size(1)})
          .to(like.scalar_type());
    };
    return {rows(cos), rows(sin)};
  }
  cos = cos.narrow(0, positions.first, seq_len);
  sin = sin.narrow(0, positions.first, seq_len);
  return {cos.to(like.scalar_type()), sin.to(like.scalar_type())};
}

BlockContext DecoderModelImpl::context(int64_t seq_len, const Positions& positions,
                                       const torch::Tensor& labels) {
  BlockContext ctx;
  // The embedding's output has its weight's dtype and device, and so every hidden state.
  std::tie(ctx.cos, ctx.sin) = rope(seq_len, model->embed_tokens->weight, positions);
  ctx.documents = positions.documents;
  ctx.labels = labels;
  ctx.loss_chunk_bytes = loss_chunk_bytes_;
  ctx.training = is_training();
  // (Out of training only for the router losses' value: transformers adds them in eval too.)
  if (config_.moe.experts > 0 && (ctx.training || config_.moe.router_losses())) {
    ctx.router =
        c10::make_intrusive<RouterRecord>(config_.moe_layers(), config_.moe.router_losses());
  }
  return ctx;
}

void DecoderModelImpl::set_attention_core(const AttentionCore& core) {
  for (const auto& b : blocks_) b->block->set_attention_core(core);
}

void DecoderModelImpl::set_tiled_mlp(int64_t setting) {
  for (const auto& b : blocks_) b->block->set_tiled_mlp(setting);
}

const torch::Tensor& DecoderModelImpl::head_weight() const {
  return head_->weight();
}

torch::Tensor DecoderModelImpl::head(const torch::Tensor& hidden) {
  return head_->logits(hidden);
}

LossSum DecoderModelImpl::head_loss_sum(const torch::Tensor& hidden, const torch::Tensor& labels,
                                        int64_t chunk_bytes) {
  const torch::Tensor sum =
      head_->loss_sum(hidden, labels, chunk_bytes > 0 ? chunk_bytes : loss_chunk_bytes_);
  return {sum, labels.ne(kIgnoreIndex).sum()};
}

torch::Tensor DecoderModelImpl::run_blocks(const torch::Tensor& input_ids,
                                           const Positions& positions, const torch::Tensor& labels,
                                           size_t end) {
  if (input_ids.dim() != 2)
    fail(ErrorKind::kInternal, "DecoderModel::forward expects input_ids [B, T], got {} dims",
         input_ids.dim());
  if (positions.documents) {
    positions.documents->check(input_ids.size(0), positions.length > 0
                                                      ? positions.length
                                                      : positions.first + input_ids.size(1));
  }
  const BlockContext ctx = context(input_ids.size(1), positions, labels);
  router_ = ctx.router;
  torch::Tensor x = input_ids;
  for (size_t i = 0; i < end; ++i) x = run_block(i, x, ctx);
  // Tensor parallelism's sequence parallelism: the head's logits of every token row, [B·T, V].
  if (end == blocks_.size() && !labels.defined() && x.dim() == 2) {
    x = x.view({input_ids.size(0), input_ids.size(1), x.size(-1)});
  }
  return x;
}

torch::Tensor DecoderModelImpl::forward(const torch::Tensor& input_ids,
                                        const Positions& positions) {
  return run_blocks(input_ids, positions, {}, blocks_.size());
}

LossSum DecoderModelImpl::loss_sum(const torch::Tensor& input_ids, const torch::Tensor& labels,
                                   bool fused, const Positions& positions) {
  LossSum loss = fused ? LossSum{run_blocks(input_ids, positions, labels, blocks_.size()),
                                 labels.ne(kIgnoreIndex).sum()}
                       : causal_lm_loss_sum(forward(input_ids, positions), labels);
  if (router_) loss.router = router_->totals(loss.sum);
  return loss;
}

torch::Tensor DecoderModelImpl::hidden_states(const torch::Tensor& input_ids,
                                              const Positions& positions) {
  return run_blocks(input_ids, positions, {}, blocks_.size() - 1);
}

}  // namespace dstrain::model
