// data.packing end to end (docs/data.md, docs/training.md "Loss normalisation"): with the loss
// normalised over the global batch's labelled tokens, the same global batch of packed documents
// split 1 × 8, 8 × 1 or over 2 ranks gives the same step-1 gradient (fp32, within 1e-6 of its
// norm), which the micro-step mean does not; the padding each mode leaves is said at start-up and
// in the metrics; a stream-packed run resumes bit-identically as a documents-packed one does
// (resume_test.cpp runs the default, documents); prompt/completion pairs train and chat data is
// refused.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {
namespace stdfs = std::filesystem;

struct Split {
  int nproc, micro, accum;
};

struct StepOne {
  std::map<std::string, torch::Tensor> weights;  // after one SGD step of lr 1
  double loss = 0, grad_norm = 0;
};

// One SGD step (lr 1, no decay, no clipping) of the tiny model on documents packed into samples
// of 512 positions (lines of 100-300 bytes: samples of 2 to 4 whole lines, their padding varies),
// the 8 samples of the global batch split as `split`, exported.
StepOne step_one(const Split& split, const std::string& normalization) {
  TempDir dir;
  JobSpec spec;
  spec.nproc = split.nproc;
  spec.micro = split.micro;
  spec.accum = split.accum;
  spec.max_steps = 1;
  spec.max_length = 512;
  spec.save_final = true;
  spec.extra_overrides = {"training.optimizer=sgd",
                          "training.lr=1.0",
                          "training.lr_scheduler=constant",
                          "training.warmup_ratio=0",
                          "training.weight_decay=0",
                          "data.packing=documents",
                          "training.loss_normalization=" + normalization};
  const RunResult r = run_job(dir, spec);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const RunResult e =
      run_dstrain({"export", dir.file("ckpt/latest"), "--out", dir.file("hf")}, {}, 120);
  EXPECT_EQ(e.exit_code, 0) << e.out << e.err;
  StepOne s;
  if (r.exit_code != 0 || e.exit_code != 0) return s;
  const model::SafetensorsSet set(dir.file("hf"));
  for (const std::string& name : set.names()) s.weights[name] = set.read(name).to(torch::kDouble);
  s.loss = read_metric(dir.file("run/metrics.jsonl"), "train/loss").at(1);
  s.grad_norm = read_metric(dir.file("run/metrics.jsonl"), "grad_norm").at(1);
  return s;
}

// The L2 norm of the difference of two runs' weights after the step: with lr 1 and the same
// initial weights, the norm of the difference of their gradients.
double gradient_difference(const StepOne& a, const StepOne& b) {
  double sum = 0;
  for (const auto& [name, w] : a.weights) {
    sum += (w - b.weights.at(name)).pow(2).sum().item<double>();
  }
  return std::sqrt(sum);
}

TEST(PackedDocuments, TheGlobalBatchGivesOneGradientHoweverItIsSplit) {
  const StepOne one_by_8 = step_one({1, 8, 1}, "tokens");
  ASSERT_FALSE(one_by_8.weights.empty());
  ASSERT_GT(one_by_8.grad_norm, 0);
  for (const Split& split : {Split{1, 1, 8}, Split{2, 4, 1}, Split{2, 2, 2}}) {
    const StepOne other = step_one(split, "tokens");
    ASSERT_EQ(other.weights.size(), one_by_8.weights.size());
    const std::string what = std::to_string(split.nproc) + " rank(s) x micro " +
                             std::to_string(split.micro) + " x " + std::to_string(split.accum);
    const double difference = gradient_difference(one_by_8, other);
    std::printf("%s: |gradient - 1 x 8's| = %.3g, |gradient| = %.4g\n", what.c_str(), difference,
                one_by_8.grad_norm);
    EXPECT_LE(difference, 1e-6 * one_by_8.grad_norm) << what;
    EXPECT_NEAR(other.loss, one_by_8.loss, 1e-6 * one_by_8.loss) << what;
  }
  // The micro-step mean weighs each micro-batch's tokens by its own count: packed samples hold
  // different numbers of labels, so 8 × 1 gives another gradient (what the check above would see).
  const StepOne mean_of_8 = step_one({1, 1, 8}, "micro_steps");
  ASSERT_FALSE(mean_of_8.weights.empty());
  const double mean_difference = gradient_difference(one_by_8, mean_of_8);
  std::printf("micro_steps 8 x 1: |gradient - 1 x 8's| = %.3g\n", mean_difference);
  EXPECT_GT(mean_difference, 1e-4 * one_by_8.grad_norm);
}

// The share of padding in each mode at start-up and in the metrics, where the real tokens per
// second are the positions' rate less the padding.
TEST(PackedDocuments, PaddingIsSaidAtStartUpAndInTheMetrics) {
  std::map<std::string, double> padding;
  for (const std::string mode : {"documents", "pad", "stream"}) {
    TempDir dir;
    JobSpec spec;
    spec.max_steps = 4;
    spec.max_length = 256;
    spec.extra_overrides = {"data.packing=" + mode};
    const RunResult r = run_job(dir, spec);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const std::string said = mode + " packing: ";
    ASSERT_NE(r.out.find(said), std::string::npos) << r.out;
    const std::map<long, double> fraction =
        read_metric(dir.file("run/metrics.jsonl"), "padding_fraction");
    const std::map<long, double> real =
        read_metric(dir.file("run/metrics.jsonl"), "real_tokens_per_s");
    const std::map<long, double> all = read_metric(dir.file("run/metrics.jsonl"), "tokens_per_s");
    ASSERT_EQ(fraction.size(), 4u) << mode;
    for (const auto& [step, f] : fraction) {
      EXPECT_GE(f, 0.0);
      EXPECT_LT(f, 1.0);
      EXPECT_NEAR(real.at(step), all.at(step) * (1.0 - f), 1e-3 * all.at(step)) << mode;
    }
    padding[mode] = fraction.at(4);
  }
  // Lines of 100-300 bytes in samples of 256: one per sample leaves much padding, packing them
  // whole leaves little, the stream none.
  EXPECT_GT(padding["pad"], 0.2);
  EXPECT_LT(padding["documents"], padding["pad"] / 2);
  EXPECT_EQ(padding["stream"], 0.0);
}

TEST(PackedDocuments, AStreamPackedRunResumesBitIdentically) {
  TempDir dir;
  JobSpec spec = resumable_job();
  spec.extra_overrides = {"data.packing=stream"};
  const RunResult full_run = run_job(dir, spec);
  ASSERT_EQ(full_run.exit_code, 0) << full_run.out << full_run.err;
  const std::map<long, double> full = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(full.size(), 20u);
  stdfs::remove(dir.file("run/metrics.jsonl"));
  // The checkpoint's recorded config says stream.
  const RunResult resumed_run = run_dstrain({"resume", dir.file("ckpt/step_00000010")}, {}, 300);
  ASSERT_EQ(resumed_run.exit_code, 0) << resumed_run.out << resumed_run.err;
  const std::map<long, double> resumed = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(resumed.size(), 10u);
  expect_same_losses_after(10, resumed, full);
}

// data.format: prompt_completion end to end: pairs made of the tiny corpus's lines (the first half
// the prompt) train, with fewer labels than document tokens; chat data stops the run at once.
TEST(PromptCompletion, PairsTrainAndChatDataIsRefused) {
  TempDir dir;
  {
    std::ifstream corpus(DSTRAIN_SOURCE_DIR "/configs/data/tiny_corpus.txt");
    std::ofstream pairs(dir.file("sft.jsonl"));
    std::string line;
    for (int i = 0; i < 400 && std::getline(corpus, line); ++i) {
      const size_t half = line.size() / 2;
      pairs << nlohmann::json{{"prompt", line.substr(0, half)}, {"completion", line.substr(half)}}
                   .dump()
            << "\n";
    }
    std::ofstream(dir.file("chat.jsonl"))
        << R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})"
        << "\n";
  }
  JobSpec spec;
  spec.max_steps = 4;
  spec.max_length = 128;
  spec.extra_overrides = {"data.train_path=" + dir.file("sft.jsonl"),
                          "data.format=prompt_completion"};
  const RunResult r = run_job(dir, spec);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const size_t said = r.out.find("prompt/completion pairs: ");
  ASSERT_NE(said, std::string::npos) << r.out;
  const double percent = std::stod(r.out.substr(r.out.find('(', said) + 1));
  EXPECT_GT(percent, 40.0) << "half of each line is its prompt";
  EXPECT_LT(percent, 60.0);
  const std::map<long, double> loss = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(loss.size(), 4u);
  for (const auto& [step, value] : loss) EXPECT_TRUE(std::isfinite(value)) << step;

  spec.extra_overrides = {"data.train_path=" + dir.file("chat.jsonl"),
                          "data.format=prompt_completion"};
  const RunResult chat = run_job(dir, spec);
  EXPECT_EQ(chat.exit_code, 2) << chat.out << chat.err;
  EXPECT_NE((chat.out + chat.err).find("chat.jsonl:1"), std::string::npos) << chat.err;
  EXPECT_NE(
      (chat.out + chat.err).find("chat data must be rendered to prompt/completion text first"),
      std::string::npos)
      << chat.err;
}

}  // namespace
}  // namespace dstrain::testing
