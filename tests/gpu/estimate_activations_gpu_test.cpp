// The activation memory model (estimate/activations.h) on a GPU, where the fused RMSNorm,
// RoPE, SwiGLU and loss kernels run: a Qwen2.5-shaped small decoder in bf16 trains one
// micro-batch with each checkpointing setting and with tiled MLP, and the CUDA allocator's bytes
// after forward and at the peak are compared with the prediction; and with CUDA graphs per layer
// (no checkpointing and plain), the peak's growth over the same run without them is compared with
// the column `graphs`. Exits 77 (skipped) without a device.
#include <c10/cuda/CUDACachingAllocator.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "estimate/activations.h"
#include "model/activation_offload.h"
#include "model/layer_graphs.h"
#include "model/model.h"
#include "model/tiled_mlp.h"

namespace dstrain::estimate {
namespace {

// Qwen2.5-0.5B's proportions (C = H·D, KV = H/7, I ≈ 5.4·C) at a quarter of its width.
model::ModelConfig qwen_like() {
  return model::parse_model_config(nlohmann::json{{"model_type", "qwen2"},
                                                  {"vocab_size", 32768},
                                                  {"hidden_size", 224},
                                                  {"intermediate_size", 1216},
                                                  {"num_hidden_layers", 6},
                                                  {"num_attention_heads", 7},
                                                  {"num_key_value_heads", 1},
                                                  {"max_position_embeddings", 32768},
                                                  {"rms_norm_eps", 1e-6},
                                                  {"tie_word_embeddings", true}});
}

constexpr int64_t kBatch = 2, kSeq = 4096;
constexpr int64_t kChunkBytes = int64_t{64} << 20;

// The bytes the tensors asked for (requested_bytes), not the allocator's blocks (allocated_bytes):
// a cached block reused for a smaller tensor is charged whole when the rest is too small to split
// (up to 1 MiB a tensor), which the model does not predict. On an H200 the allocated bytes after
// forward of the first case were 3.6% above the prediction (559.1 against 539.7 MB) where the
// tiled cases' peaks agreed within 5 KB.
int64_t allocated(bool peak) {
  torch::cuda::synchronize();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return peak ? stats.requested_bytes[0].peak : stats.requested_bytes[0].current;
}

struct Measured {
  int64_t after_forward = 0;
  int64_t peak = 0;
};

Measured measure(Checkpointing setting, int64_t tiled) {
  torch::manual_seed(0);
  model::DecoderModel m = model::build_model(qwen_like(), torch::kBFloat16, 1);
  m->to(torch::Device(torch::kCUDA, 0));
  m->set_tiled_mlp(tiled);
  m->set_loss_chunk_bytes(kChunkBytes);
  if (setting == Checkpointing::kSelective) {
    m->wrap_blocks(model::WrapperSlot::kCheckpointing, model::selective_checkpoint_layers());
  } else if (setting != Checkpointing::kNone) {
    m->wrap_blocks(model::WrapperSlot::kCheckpointing,
                   model::checkpoint_layers(setting == Checkpointing::kOffload
                                                ? std::make_shared<model::ActivationOffload>()
                                                : nullptr));
  }
  m->train();
  const torch::Tensor ids = torch::randint(0, 32768, {kBatch, kSeq}, torch::kLong).to(torch::kCUDA);
  const torch::Tensor labels = ids.roll(-1, 1);
  Measured out;
  for (int pass = 0; pass < 2; ++pass) {  // the first allocates the gradients and workspaces
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    const int64_t start = allocated(false);
    const torch::Tensor loss = m->loss_sum(ids, labels, /*fused=*/true).mean();
    out.after_forward = allocated(false) - start;
    loss.backward();
    out.peak = allocated(true) - start;
  }
  return out;
}

// The peak of the third forward and backward (the first records, where graphs are on) over the
// bytes allocated before the first, the parameters' gradients included.
int64_t peak_with(Checkpointing setting, bool graphs) {
  const torch::Device cuda(torch::kCUDA, 0);
  const model::TrainingStream stream(cuda);
  torch::manual_seed(0);
  model::DecoderModel m = model::build_model(qwen_like(), torch::kBFloat16, 1);
  m->to(cuda);
  m->set_loss_chunk_bytes(kChunkBytes);
  model::LayerGraphs recorded(model::cuda_graph_recorder(cuda),
                              {/*recompute_follows=*/setting == Checkpointing::kPlain});
  if (graphs) m->wrap_blocks(model::WrapperSlot::kGraphs, recorded.wrapper());
  if (setting == Checkpointing::kPlain) {
    m->wrap_blocks(model::WrapperSlot::kCheckpointing, model::checkpoint_layers());
  }
  m->train();
  const torch::Tensor ids = torch::randint(0, 32768, {kBatch, kSeq}, torch::kLong).to(cuda);
  const torch::Tensor labels = ids.roll(-1, 1);
  const int64_t start = allocated(false);
  int64_t peak = 0;
  for (int pass = 0; pass < 3; ++pass) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    m->loss_sum(ids, labels, /*fused=*/true).mean().backward();
    peak = allocated(true) - start;
  }
  if (graphs) {
    EXPECT_EQ(recorded.stats().eager_calls, 0) << "every layer replayed";
    EXPECT_EQ(recorded.stats().failure, "");
  }
  return peak;
}

ActivationInput input_for(int64_t tiled) {
  ActivationInput in;
  in.model = model::DecoderModel(qwen_like(), model::Materialize::kNo);
  in.micro_batch = kBatch;
  in.seq_len = kSeq;
  in.element_bytes = 2;
  in.cuda = in.fused_kernels = true;
  in.tiled_mlp = tiled;
  in.loss_chunk_bytes = kChunkBytes;
  return in;
}

// What forward keeps is derived tensor by tensor (within 2%); the peak adds the backward's
// working memory, derived from what the kernels allocate (within 15%).
TEST(EstimateActivationsGpu, KeptTensorsAndPeakMatchTheCudaAllocator) {
  struct Case {
    Checkpointing setting;
    int64_t tiled;
  };
  for (const Case c : {Case{Checkpointing::kNone, 0}, Case{Checkpointing::kPlain, 0},
                       Case{Checkpointing::kOffload, 0}, Case{Checkpointing::kSelective, 0},
                       Case{Checkpointing::kNone, model::kTiledMlpAuto},
                       Case{Checkpointing::kPlain, model::kTiledMlpAuto}}) {
    const ActivationInput in = input_for(c.tiled);
    const ActivationParts p = activation_parts(in);
    const ActivationRow row = activation_row(in, c.setting);
    const Measured got = measure(c.setting, c.tiled);
    const std::string what = fmt::format("gradient_checkpointing {}, tiled_mlp {}",
                                         model::checkpointing_word(c.setting), c.tiled);
    std::cout << what << ": kept after forward " << got.after_forward << ", peak " << got.peak
              << " bytes; predicted peak " << row.device << "\n";
    if (c.setting == Checkpointing::kNone) {
      const int64_t kept = p.context + in.model->num_layers() * p.layer_saved + p.head_saved;
      EXPECT_NEAR(static_cast<double>(got.after_forward), static_cast<double>(kept), 0.02 * kept)
          << what;
    }
    EXPECT_NEAR(static_cast<double>(got.peak), static_cast<double>(row.device), 0.15 * row.device)
        << what;
  }
}

// What graphs keep on top (their buffers and a gradient buffer per parameter of each layer; the
// saved activations and the backward's working memory in their pool) against the measured growth
// of the peak, within 25%.
TEST(EstimateActivationsGpu, CudaGraphsGrowThePeakByTheGraphsColumn) {
  for (const Checkpointing setting : {Checkpointing::kNone, Checkpointing::kPlain}) {
    ActivationInput in = input_for(0);
    in.graphs = true;
    const ActivationRow row = activation_row(in, setting);
    const int64_t off = peak_with(setting, false), on = peak_with(setting, true);
    const std::string what =
        fmt::format("gradient_checkpointing {}", model::checkpointing_word(setting));
    std::cout << what << ": peak without graphs " << off << ", with " << on << " bytes; graphs "
              << "column " << row.graphs << "\n";
    ASSERT_GT(row.graphs, 0) << what;
    EXPECT_NEAR(static_cast<double>(on - off), static_cast<double>(row.graphs), 0.25 * row.graphs)
        << what;
  }
}

}  // namespace
}  // namespace dstrain::estimate
