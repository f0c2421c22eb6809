// `dstrain debug forward` (the dstrain side of tests/reference): on the tiny model saved with
// save_weights it writes finite logits equal to an in-process forward, a loss near ln(V) for a
// freshly initialised model, equal to the HF-style shifted loss computed here, and a gradient of
// the right shape for every parameter; bad inputs exit 2 naming the file.

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <torch/torch.h>

#include "model/model.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

constexpr uint64_t kSeed = 7;

// The tiny model, initialised from kSeed, written as a Hugging Face directory `dir`.
model::DecoderModel save_tiny_model(const std::string& dir) {
  const model::ModelConfig config =
      model::load_model_config(std::string(DSTRAIN_SOURCE_DIR) + "/configs/models/tiny");
  model::DecoderModel m = model::build_model(config, torch::kFloat32, kSeed);
  model::save_weights(*m, dir, torch::kFloat32);
  return m;
}

torch::Tensor random_ids(int64_t batch, int64_t seq, int64_t vocab) {
  torch::manual_seed(11);
  return torch::randint(0, vocab, {batch, seq}, torch::kInt64);
}

TEST(DebugForward, WritesLogitsLossAndEveryGradientOfTheTinyModel) {
  TempDir dir;
  model::DecoderModel m = save_tiny_model(dir.file("model"));
  const int64_t vocab = m->config().vocab_size;
  const torch::Tensor ids = random_ids(2, 16, vocab);
  model::write_safetensors(dir.file("ids.safetensors"), {{"input_ids", ids}});

  const RunResult r =
      run_dstrain({"debug", "forward", "--model", dir.file("model"), "--ids",
                   dir.file("ids.safetensors"), "--out", dir.file("out.safetensors")},
                  {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const model::SafetensorsFile out(dir.file("out.safetensors"));

  // Logits: the same model forward in this process (same weights, same ids).
  torch::Tensor want_logits;
  torch::Tensor want_loss;
  {
    const torch::Tensor logits = m->forward(ids);
    const torch::Tensor shifted =
        torch::cat({ids.slice(1, 1), torch::full({2, 1}, model::kIgnoreIndex, torch::kInt64)}, 1);
    want_logits = logits.detach();
    want_loss = torch::nn::functional::cross_entropy(logits.slice(1, 0, 15).reshape({-1, vocab}),
                                                     ids.slice(1, 1).reshape({-1}))
                    .detach();
    EXPECT_NEAR(model::causal_lm_loss(logits, shifted).item<double>(), want_loss.item<double>(),
                1e-6);
  }
  const torch::Tensor logits = out.read("logits");
  ASSERT_EQ(logits.sizes(), want_logits.sizes());
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
  EXPECT_LE((logits - want_logits).abs().max().item<double>(), 1e-5);

  const torch::Tensor loss = out.read("loss");
  EXPECT_EQ(loss.dim(), 0);
  const double l = loss.item<double>();
  EXPECT_TRUE(std::isfinite(l));
  EXPECT_NEAR(l, std::log(static_cast<double>(vocab)), 0.5);  // ~uniform predictions at init
  EXPECT_NEAR(l, want_loss.item<double>(), 1e-5);

  int params = 0;
  for (const auto& item : m->named_parameters()) {
    const std::string name = "grad." + item.key();
    ASSERT_TRUE(out.contains(name)) << name;
    const torch::Tensor g = out.read(name);
    EXPECT_EQ(g.sizes(), item.value().sizes()) << name;
    EXPECT_EQ(g.scalar_type(), torch::kFloat32) << name;
    EXPECT_TRUE(torch::isfinite(g).all().item<bool>()) << name;
    EXPECT_GT(g.abs().max().item<double>(), 0.0) << name;
    ++params;
  }
  EXPECT_EQ(out.names().size(), static_cast<size_t>(params + 2));
}

TEST(DebugForward, ExplicitLabelsWithIgnoredPositionsAreUsed) {
  TempDir dir;
  model::DecoderModel m = save_tiny_model(dir.file("model"));
  const torch::Tensor ids = random_ids(1, 8, m->config().vocab_size);
  torch::Tensor labels = ids.clone();
  labels.slice(1, 0, 5).fill_(model::kIgnoreIndex);  // only positions 4..6 predict something
  model::write_safetensors(dir.file("ids.safetensors"), {{"input_ids", ids}, {"labels", labels}});
  const RunResult r =
      run_dstrain({"debug", "forward", "--model", dir.file("model"), "--ids",
                   dir.file("ids.safetensors"), "--out", dir.file("out.safetensors")},
                  {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const torch::Tensor logits = m->forward(ids).detach();
  const double want =
      torch::nn::functional::cross_entropy(logits[0].slice(0, 4, 7), ids[0].slice(0, 5, 8))
          .item<double>();
  EXPECT_NEAR(model::SafetensorsFile(dir.file("out.safetensors")).read("loss").item<double>(), want,
              1e-5);
}

TEST(DebugForward, BadIdsFileExitsTwoNamingTheFile) {
  TempDir dir;
  save_tiny_model(dir.file("model"));
  const std::string garbage = dir.file("garbage.safetensors");
  model::write_safetensors(dir.file("float.safetensors"),
                           {{"input_ids", torch::zeros({1, 4}, torch::kFloat32)}});
  {
    FILE* f = std::fopen(garbage.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fputs("not a safetensors file", f);
    std::fclose(f);
  }
  for (const std::string& ids : {garbage, dir.file("float.safetensors"), dir.file("missing")}) {
    const RunResult r = run_dstrain({"debug", "forward", "--model", dir.file("model"), "--ids", ids,
                                     "--out", dir.file("out.safetensors")},
                                    {}, 60);
    EXPECT_EQ(r.exit_code, 2) << ids << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(ids), std::string::npos) << r.err;
    EXPECT_FALSE(file_exists(dir.file("out.safetensors")));
  }
}

TEST(DebugForward, CudaDeviceWithoutCudaIsAUsageError) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is available here";
  TempDir dir;
  save_tiny_model(dir.file("model"));
  model::write_safetensors(dir.file("ids.safetensors"),
                           {{"input_ids", torch::zeros({1, 4}, torch::kInt64)}});
  const RunResult r =
      run_dstrain({"debug", "forward", "--model", dir.file("model"), "--ids",
                   dir.file("ids.safetensors"), "--out", dir.file("out"), "--device", "cuda"},
                  {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--device cuda"), std::string::npos) << r.err;
}

// `dstrain debug devices` (what `launch --dry-run --check` runs on each host): the worker's
// LibTorch and where N ranks would compute; the error a rank would stop with where they could not.
TEST(DebugDevices, SaysWhereTheRanksWouldComputeOrWhyTheyCouldNot) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is available here";
  const RunResult ok = run_dstrain({"debug", "devices", "--ranks", "2"}, {}, 60);
  EXPECT_EQ(ok.exit_code, 0) << ok.out << ok.err;
  EXPECT_EQ(ok.out, "LibTorch " TORCH_VERSION "; no CUDA device: the ranks compute on the CPU\n")
      << ok.err;
  const RunResult cuda =
      run_dstrain({"debug", "devices", "--ranks", "2"}, {"DSTRAIN_DEVICE=cuda"}, 60);
  EXPECT_EQ(cuda.exit_code, 2) << cuda.out << cuda.err;
  EXPECT_NE(cuda.err.find("DSTRAIN_DEVICE=cuda but no CUDA device is visible"), std::string::npos)
      << cuda.err;
}

TEST(DebugForward, IsHiddenFromTheTopLevelHelp) {
  const RunResult r = run_dstrain({"--help"}, {}, 20);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.find("debug"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("export"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace dstrain::testing
