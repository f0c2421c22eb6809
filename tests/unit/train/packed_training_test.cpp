// Training on packed documents is training on each document alone: 20 AdamW steps on samples of
// whole documents packed together (data.packing: documents) give, step for step, the losses of the
// same documents padded one per row, with each step's loss the mean over its labelled tokens
// (train/loss_normalization.h). The padded reference takes each step's documents from the packed
// samples themselves (bin-packing reorders documents), and runs them through a copy of the model
// with the same initial weights. Every family: Llama, Qwen2 (biases), Qwen3 (q/k norms), Mistral
// with a window shorter than the longest documents.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <random>
#include <vector>

#include "data/batch.h"
#include "data/samples.h"
#include "model/model.h"
#include "tests/unit/model/test_util.h"
#include "train/loss_normalization.h"

namespace dstrain::train {
namespace {

constexpr int64_t kLength = 48;     // positions per sample
constexpr int64_t kMicro = 3;       // samples per micro-batch
constexpr int64_t kMicroSteps = 2;  // micro-batches per step
constexpr int32_t kEos = 1, kPad = 0;

// 300 documents of 2 to 60 tokens (some longer than a sample: split into pieces), seeded: a
// random first token, then each token a fixed function of the one before (something to learn).
std::shared_ptr<data::Corpus> corpus(int32_t vocab) {
  auto c = std::make_shared<data::Corpus>();
  std::mt19937 rng(5);
  std::uniform_int_distribution<int64_t> length(2, 60);
  std::uniform_int_distribution<int32_t> token(2, vocab - 1);
  for (int i = 0; i < 300; ++i) {
    std::vector<int32_t> doc(static_cast<size_t>(length(rng)));
    doc[0] = token(rng);
    for (size_t k = 1; k < doc.size(); ++k) doc[k] = 2 + (doc[k - 1] * 7 + 3) % (vocab - 2);
    c->add_document(doc.data(), static_cast<int64_t>(doc.size()));
  }
  return c;
}

// The documents of packed `batch`, one per row of T positions, padded (pad ids, labels -100).
std::pair<torch::Tensor, torch::Tensor> padded_rows(const data::Batch& batch) {
  std::vector<torch::Tensor> ids, labels;
  for (int64_t row = 0; row < batch.input_ids.size(0); ++row) {
    int64_t at = 0;
    for (const int64_t n : batch.documents[static_cast<size_t>(row)]) {
      const torch::Tensor label = batch.labels[row].narrow(0, at, n);
      if (label.ne(data::kIgnoreIndex).any().item<bool>()) {  // not the row's padding
        ids.push_back(torch::full({kLength}, kPad, torch::kLong));
        labels.push_back(torch::full({kLength}, data::kIgnoreIndex, torch::kLong));
        ids.back().narrow(0, 0, n).copy_(batch.input_ids[row].narrow(0, at, n));
        labels.back().narrow(0, 0, n).copy_(label);
      }
      at += n;
    }
  }
  return {torch::stack(ids), torch::stack(labels)};
}

TEST(PackedTraining, TwentyStepsEqualTheSameDocumentsPaddedOnePerRow) {
  for (const std::string family : {"llama", "qwen2", "qwen3", "mistral"}) {
    nlohmann::json j = model::testing::small_config_json(family);
    if (family == "mistral") j["sliding_window"] = 16;
    if (family == "qwen3") j["head_dim"] = 16;
    const model::ModelConfig config = model::parse_model_config(j);
    data::SampleOptions o;
    o.max_length = kLength;
    o.packing = data::Packing::kDocuments;
    o.eos_id = kEos;
    o.pad_id = kPad;
    std::vector<int64_t> order(300);
    for (int64_t i = 0; i < 300; ++i) order[static_cast<size_t>(i)] = (i * 37) % 300;
    const data::SampleSet samples(corpus(static_cast<int32_t>(config.vocab_size)), order, o, "mem");
    ASSERT_GE(samples.size(), 20 * kMicro * kMicroSteps);
    ASSERT_GT(samples.padding_fraction(), 0.0);

    torch::manual_seed(3);
    model::DecoderModel packed(config), padded(config);
    {
      torch::NoGradGuard no_grad;
      const auto from = packed->parameters();
      const auto to = padded->parameters();
      for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
    }
    const auto adamw = torch::optim::AdamWOptions(1e-2).weight_decay(0.01);
    torch::optim::AdamW packed_opt(packed->parameters(), adamw);
    torch::optim::AdamW padded_opt(padded->parameters(), adamw);
    double first = 0, last = 0;
    int64_t next = 0, packed_rows = 0, padded_rows_seen = 0;
    for (int step = 1; step <= 20; ++step) {
      std::vector<data::Batch> batches;
      double labelled = 0;
      for (int64_t m = 0; m < kMicroSteps; ++m) {
        std::vector<int64_t> indices;
        for (int64_t r = 0; r < kMicro; ++r) indices.push_back(next++);
        batches.push_back(data::collate(samples, indices, false));
        labelled += static_cast<double>(batches.back().labelled);
      }
      const torch::Tensor scale = micro_step_scale(
          LossNormalization::kTokens, torch::tensor(labelled, torch::kDouble), kMicroSteps, 1, 1);
      // Packed: the trainer's micro-step loss, divided by the micro-steps as the engine does.
      packed_opt.zero_grad();
      double packed_loss = 0;
      for (const data::Batch& b : batches) {
        model::Positions positions;
        positions.documents =
            std::make_shared<const model::Documents>(model::Documents{b.documents});
        const torch::Tensor loss =
            micro_step_loss(packed->loss_sum(b.input_ids, b.labels, true, positions),
                            LossNormalization::kTokens, scale) /
            static_cast<double>(kMicroSteps);
        loss.backward();
        packed_loss += loss.item<double>();
        packed_rows += b.input_ids.size(0);
      }
      // Padded: every document of the step alone in a row, the same token mean.
      padded_opt.zero_grad();
      std::vector<torch::Tensor> ids, labels;
      for (const data::Batch& b : batches) {
        auto [i, l] = padded_rows(b);
        ids.push_back(i);
        labels.push_back(l);
      }
      const torch::Tensor all_ids = torch::cat(ids), all_labels = torch::cat(labels);
      padded_rows_seen += all_ids.size(0);
      const torch::Tensor loss = padded->loss_sum(all_ids, all_labels, true).sum / labelled;
      loss.backward();
      const double padded_loss = loss.item<double>();
      EXPECT_NEAR(packed_loss, padded_loss, 1e-5 * padded_loss) << family << " step " << step;
      packed_opt.step();
      padded_opt.step();
      if (step == 1) first = padded_loss;
      last = padded_loss;
    }
    EXPECT_LT(last, first - 0.1) << family << ": the runs learn, so the steps compare updates";
    EXPECT_GT(padded_rows_seen, packed_rows) << family << ": samples held several documents";
  }
}

}  // namespace
}  // namespace dstrain::train
