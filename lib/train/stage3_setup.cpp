#include "train/stage3_setup.h"

#include <string>

namespace dstrain::train {

int unit_of(const std::string& name, int64_t num_layers) {
  const std::string layer_prefix = "model.layers.";
  if (name.rfind("model.embed_tokens.", 0) == 0) return 0;
  if (name.rfind(layer_prefix, 0) == 0) return 1 + std::stoi(name.substr(layer_prefix.size()));
  return static_cast<int>(num_layers) + 1;
}

std::vector<zero::NamedParameter> engine_parameters(model::DecoderModelImpl& model) {
  std::vector<zero::NamedParameter> out;
  for (const auto& item : model.named_parameters()) {
    out.push_back({item.key(), item.value(), unit_of(item.key(), model.num_layers())});
  }
  return out;
}

std::vector<std::vector<int>> forward_segments(const model::DecoderModelImpl& model) {
  std::vector<std::vector<int>> segments{{0}};
  for (int64_t i = 0; i < model.num_layers(); ++i) segments.push_back({static_cast<int>(1 + i)});
  const int head = static_cast<int>(model.num_layers()) + 1;
  segments.push_back(model.config().tie_word_embeddings ? std::vector<int>{head, 0}
                                                        : std::vector<int>{head});
  return segments;
}

namespace {

// Embed and every decoder layer, each segment bracketed: input_ids [B, T] → hidden [B, T, C].
// The head segment is left to the caller.
torch::Tensor hidden_with_engine(model::DecoderModelImpl& model, zero::Engine& engine,
                                 const torch::Tensor& input_ids,
                                 const model::Positions& positions) {
  const int64_t T = input_ids.size(1);
  engine.pre_forward(0);
  torch::Tensor h = model.embed(input_ids);
  engine.post_forward(0, h);
  auto [cos, sin] = model.rope(T, h, positions);
  for (int64_t i = 0; i < model.num_layers(); ++i) {
    const auto segment = static_cast<size_t>(1 + i);
    engine.pre_forward(segment);
    h = model.layer(i, h, cos, sin);
    engine.post_forward(segment, h);
  }
  return h;
}

size_t head_segment(const model::DecoderModelImpl& model) {
  return static_cast<size_t>(model.num_layers() + 1);
}

}  // namespace

torch::Tensor forward_with_engine(model::DecoderModelImpl& model, zero::Engine& engine,
                                  const torch::Tensor& input_ids,
                                  const model::Positions& positions) {
  const torch::Tensor h = hidden_with_engine(model, engine, input_ids, positions);
  engine.pre_forward(head_segment(model));
  torch::Tensor logits = model.head(h);
  engine.post_forward(head_segment(model), logits);
  return logits;
}

model::LossSum loss_sum_with_engine(model::DecoderModelImpl& model, zero::Engine& engine,
                                    const torch::Tensor& input_ids, const torch::Tensor& labels,
                                    bool fused, const model::Positions& positions) {
  if (!fused) {
    return model::causal_lm_loss_sum(forward_with_engine(model, engine, input_ids, positions),
                                     labels);
  }
  const torch::Tensor h = hidden_with_engine(model, engine, input_ids, positions);
  engine.pre_forward(head_segment(model));
  model::LossSum loss = model.head_loss_sum(h, labels);
  // The loss sum is the head segment's output: its gradient arriving starts the head's backward.
  engine.post_forward(head_segment(model), loss.sum);
  return loss;
}

}  // namespace dstrain::train
