// The activation memory model against the CPU allocator: a small decoder trains one micro-batch
// (fused loss, as the trainer runs it) with each checkpointing setting and with tiled MLP, and the
// bytes it holds after forward and at its peak are compared with the prediction; so does the same
// decoder with blocks of a kind only this file knows. Then the `auto` choice against given limits.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "estimate/activations.h"
#include "model/activation_offload.h"
#include "model/model.h"
#include "model/rng_state.h"
#include "model/tiled_mlp.h"
#include "qwen25_config.h"
#include "tests/unit/estimate/small_model.h"
#include "tests/unit/model/counting_allocator.h"

namespace dstrain::estimate {
namespace {

using model::testing::CountingScope;

using testing::small_model;

constexpr int64_t kBatch = 2, kSeq = 256;
constexpr int64_t kChunkBytes = int64_t{1} << 20;  // 128 tokens of 2048 float32 logits

struct Setting {
  Checkpointing checkpointing;
  int64_t tiled_mlp;
  bool fused_loss = true;
};

std::string name_of(const Setting& s, torch::ScalarType dtype) {
  return fmt::format("gradient_checkpointing {}, tiled_mlp {}, fused_loss {}, {}",
                     checkpointing_word(s.checkpointing), s.tiled_mlp, s.fused_loss,
                     c10::toString(dtype));
}

ActivationInput input_for(const Setting& s, torch::ScalarType dtype,
                          const model::ModelConfig& config = small_model()) {
  ActivationInput in;
  in.model = model::DecoderModel(config, model::Materialize::kNo);
  in.micro_batch = kBatch;
  in.seq_len = kSeq;
  in.element_bytes = dtype == torch::kFloat32 ? 4 : 2;
  in.tiled_mlp = s.tiled_mlp;
  in.fused_loss = s.fused_loss;
  in.loss_chunk_bytes = kChunkBytes;
  return in;
}

struct Measured {
  int64_t after_forward = 0;  // held between forward and backward
  int64_t peak = 0;           // during forward + backward
};

// Adds blocks to a model in `dtype`.
using Extend = std::function<void(model::DecoderModelImpl& m, torch::ScalarType dtype)>;

// One micro-batch as the trainer runs it (fused_loss: the head's fused loss, else logits);
// parameter gradients exist beforehand (a first pass made them), so what is counted is the
// activations and their gradients. `extend`: blocks added to the small model.
Measured measure(const Setting& s, torch::ScalarType dtype, const Extend& extend = {},
                 const model::ModelConfig& config = small_model()) {
  torch::manual_seed(0);
  model::DecoderModel m = model::build_model(config, dtype, 1);
  if (extend) extend(*m, dtype);
  m->set_tiled_mlp(s.tiled_mlp);
  m->set_loss_chunk_bytes(kChunkBytes);
  if (s.checkpointing == Checkpointing::kSelective) {
    m->wrap_blocks(model::WrapperSlot::kCheckpointing, model::selective_checkpoint_layers());
  } else if (s.checkpointing != Checkpointing::kNone) {
    m->wrap_blocks(model::WrapperSlot::kCheckpointing,
                   model::checkpoint_layers(s.checkpointing == Checkpointing::kOffload
                                                ? std::make_shared<model::ActivationOffload>()
                                                : nullptr));
  }
  m->train();
  const torch::Tensor ids = torch::randint(0, 2048, {kBatch, kSeq}, torch::kLong);
  const torch::Tensor labels = ids.roll(-1, 1);
  auto pass = [&](Measured* out, CountingScope* scope) {
    const int64_t start = scope ? scope->counter().current() : 0;
    if (scope) scope->counter().reset_peak();
    const torch::Tensor loss = m->loss_sum(ids, labels, s.fused_loss).mean();
    if (out) out->after_forward = scope->counter().current() - start;
    loss.backward();
    if (out) out->peak = scope->counter().peak() - start;
  };
  pass(nullptr, nullptr);
  CountingScope scope;
  Measured out;
  pass(&out, &scope);
  return out;
}

const Setting kSettings[] = {{Checkpointing::kNone, 0},
                             {Checkpointing::kPlain, 0},
                             {Checkpointing::kOffload, 0},
                             {Checkpointing::kSelective, 0},
                             {Checkpointing::kNone, model::kTiledMlpAuto},
                             {Checkpointing::kSelective, model::kTiledMlpAuto},
                             {Checkpointing::kPlain, model::kTiledMlpAuto},
                             {Checkpointing::kNone, 0, /*fused_loss=*/false},
                             {Checkpointing::kPlain, 0, /*fused_loss=*/false}};

// What a forward leaves for backward, without checkpointing, is every layer's saved tensors and the
// head's: the derivation tensor by tensor should hold almost exactly.
TEST(EstimateActivations, SavedTensorsAfterForwardMatchTheCpuAllocator) {
  torch::set_num_threads(1);
  for (const torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const int64_t tiled : {int64_t{0}, model::kTiledMlpAuto}) {
      const Setting s{Checkpointing::kNone, tiled};
      const ActivationInput in = input_for(s, dtype);
      const ActivationParts p = activation_parts(in);
      const int64_t want = p.context + in.model->num_layers() * p.layer_saved + p.head_saved;
      const Measured got = measure(s, dtype);
      std::cout << name_of(s, dtype) << ": kept after forward " << got.after_forward
                << " bytes, predicted " << want << "\n";
      EXPECT_NEAR(static_cast<double>(got.after_forward), static_cast<double>(want), 0.01 * want)
          << name_of(s, dtype);
    }
  }
}

// Selective checkpointing keeps, per layer, its input and its attention's output and float32
// log-sum-exp (the flash kernel's, [B, H, T]): after forward exactly those more than plain
// checkpointing, and the whole within 2% of the derivation (in bfloat16 what plain checkpointing
// keeps after forward is itself 20 KB, 1.8%, above its derivation).
TEST(EstimateActivations, SelectiveKeepsInputAndAttentionPerLayerOnTheCpuAllocator) {
  torch::set_num_threads(1);
  for (const torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    const Setting s{Checkpointing::kSelective, 0};
    const ActivationInput in = input_for(s, dtype);
    const ActivationParts p = activation_parts(in);
    const int64_t c = in.element_bytes, L = in.model->num_layers();
    ASSERT_EQ(p.layer_attention, kBatch * kSeq * (c * 4 * 16 + 4 * 4)) << "H·D = 4·16, H = 4";
    const int64_t layers = L * (p.layer_input + p.layer_attention);
    const Measured got = measure(s, dtype);
    const Measured plain = measure({Checkpointing::kPlain, 0}, dtype);
    std::cout << name_of(s, dtype) << ": kept after forward " << got.after_forward
              << " bytes, plain " << plain.after_forward << ", predicted difference "
              << L * p.layer_attention << "\n";
    EXPECT_EQ(got.after_forward - plain.after_forward, L * p.layer_attention) << name_of(s, dtype);
    const int64_t want = p.context + layers + p.head_saved;
    EXPECT_NEAR(static_cast<double>(got.after_forward), static_cast<double>(want), 0.02 * want)
        << name_of(s, dtype);
  }
}

// The peak of forward + backward per setting (the fused loss and the logits), within 6% of the
// prediction.
TEST(EstimateActivations, PeakOfEachSettingMatchesTheCpuAllocator) {
  torch::set_num_threads(1);
  for (const torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const Setting& s : kSettings) {
      const ActivationInput in = input_for(s, dtype);
      const ActivationRow want = activation_row(in, s.checkpointing);
      const Measured got = measure(s, dtype);
      std::cout << name_of(s, dtype) << ": peak " << got.peak << " bytes, predicted " << want.device
                << " (" << fmt::format("{:+.1f}%", 100.0 * (want.device - got.peak) / got.peak)
                << ")\n";
      EXPECT_NEAR(static_cast<double>(got.peak), static_cast<double>(want.device),
                  0.06 * want.device)
          << name_of(s, dtype);
      EXPECT_EQ(want.host, 0) << "the CPU keeps nothing elsewhere";
    }
  }
}

// Mixture-of-Experts layers (model/moe.h: Qwen3-MoE's router, renormalised top-k weights cast to
// the activations' dtype; Mixtral's float32 weights), every layer MoE: what a forward keeps within
// 1% of the derivation and each setting's peak within the bound the dense layers meet.
TEST(EstimateActivations, MixtureOfExpertsLayersMatchTheCpuAllocator) {
  torch::set_num_threads(1);
  for (const std::string type : {"qwen3_moe", "mixtral"}) {
    nlohmann::json doc = {{"model_type", type},          {"vocab_size", 2048},
                          {"hidden_size", 64},           {"intermediate_size", 48},
                          {"moe_intermediate_size", 48}, {"num_experts", 8},
                          {"num_experts_per_tok", 2},    {"norm_topk_prob", true},
                          {"num_hidden_layers", 3},      {"num_attention_heads", 4},
                          {"num_key_value_heads", 2},    {"max_position_embeddings", 1024},
                          {"tie_word_embeddings", false}};
    const model::ModelConfig config = model::parse_model_config(doc);
    for (const torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
      const std::string at = type + ", " + c10::toString(dtype);
      const Setting none{Checkpointing::kNone, 0};
      const ActivationInput in = input_for(none, dtype, config);
      const ActivationParts p = activation_parts(in);
      const int64_t want = p.context + in.model->num_layers() * p.layer_saved + p.head_saved;
      const Measured got = measure(none, dtype, {}, config);
      std::cout << at << ": kept after forward " << got.after_forward << " bytes, predicted "
                << want << "\n";
      EXPECT_NEAR(static_cast<double>(got.after_forward), static_cast<double>(want), 0.01 * want)
          << at;
      for (const Checkpointing setting :
           {Checkpointing::kNone, Checkpointing::kPlain, Checkpointing::kSelective}) {
        const Setting s{setting, 0};
        const ActivationRow row = activation_row(input_for(s, dtype, config), setting);
        const Measured peak = measure(s, dtype, {}, config);
        std::cout << at << ", " << checkpointing_word(setting) << ": peak " << peak.peak
                  << " bytes, predicted " << row.device << "\n";
        EXPECT_NEAR(static_cast<double>(peak.peak), static_cast<double>(row.device),
                    0.06 * row.device)
            << at << ", " << checkpointing_word(setting);
      }
    }
  }
}

// A block of a kind no file of dstrain knows, described here only: x + sigmoid(x·Wᵀ)·W with W
// [K, C]. Its autograd keeps x (the first product's input) and g = sigmoid(x·Wᵀ) (sigmoid's output
// and the second product's input); its backward holds the output's gradient, dg and dh [N, K], dx
// [N, C] and the weight's two gradient products [K, C].
class ToyGateImpl : public torch::nn::Module, public model::Block {
 public:
  ToyGateImpl(int64_t hidden, int64_t width)
      : weight(register_parameter("weight", torch::randn({width, hidden}) * 0.02)) {}
  torch::Tensor forward(const torch::Tensor& x, const model::BlockContext&) override {
    const torch::Tensor g = torch::sigmoid(torch::matmul(x, weight.t()));
    return x + torch::matmul(g, weight);
  }
  std::vector<torch::Tensor> weights() override { return {weight}; }
  model::ActivationMemory activation_memory(const model::ActivationRun& run,
                                            model::Checkpointing setting) const override {
    const int64_t K = weight.size(0), C = weight.size(1), c = run.element_bytes, N = run.tokens;
    model::ActivationMemory m;
    m.input = N * c * C;
    const int64_t saved = m.input + N * c * K;
    const int64_t backward = N * c * (2 * C + 2 * K) + 2 * K * C * c;
    if (setting == model::Checkpointing::kNone) {
      m.kept = saved;
      m.backward = backward;
      return m;
    }
    // Checkpointed (selective too: it has no attention to keep): its input, or on a GPU offloaded
    // its input in host memory; the recompute brings back the rest and its output.
    (setting == model::Checkpointing::kOffload && run.cuda ? m.host : m.kept) = m.input;
    m.backward = saved + m.input + backward;
    return m;
  }

  torch::Tensor weight;
};
TORCH_MODULE(ToyGate);

constexpr int64_t kToyWidth = 96;

// Two toy blocks among the small model's layers: after layer 0 and after layer 2.
void add_toys(model::DecoderModelImpl& m, torch::ScalarType dtype) {
  for (const size_t at : {size_t{2}, size_t{5}}) {
    ToyGate toy(64, kToyWidth);
    toy->to(dtype);
    m.add_block(at, "toy" + std::to_string(at), toy.ptr());
  }
}

// The memory model walks the block list: blocks it has never seen are predicted from their own
// description. After forward the model with two toy blocks holds exactly what they say they keep
// (checkpointed, with each call's generator state) more than the model without, and the peak of
// every setting is within the bound the decoder's own blocks meet.
TEST(EstimateActivations, ABlockOfAKindOfItsOwnIsPredictedFromItsOwnDescription) {
  torch::set_num_threads(1);
  for (const torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const Setting& s : {Setting{Checkpointing::kNone, 0}, Setting{Checkpointing::kPlain, 0},
                             Setting{Checkpointing::kSelective, 0}}) {
      ActivationInput in = input_for(s, dtype);
      in.model = model::DecoderModel(small_model(), model::Materialize::kNo);
      add_toys(*in.model, dtype);
      ASSERT_EQ(in.model->blocks().size(), 8u);
      model::ActivationRun run;
      run.tokens = kBatch * kSeq;
      run.element_bytes = in.element_bytes;
      // What they say, and checkpointed, each call's generator state (model/rng_state.h).
      const int64_t rng =
          s.checkpointing == Checkpointing::kNone ? 0 : model::capture_rng({}).cpu.nbytes();
      const int64_t toys_keep =
          2 * (in.model->blocks()[2]->block->activation_memory(run, s.checkpointing).kept + rng);
      const Measured without = measure(s, dtype);
      const Measured with = measure(s, dtype, add_toys);
      EXPECT_EQ(with.after_forward - without.after_forward, toys_keep) << name_of(s, dtype);
      const ActivationRow want = activation_row(in, s.checkpointing);
      std::cout << name_of(s, dtype) << " with toy blocks: peak " << with.peak
                << " bytes, predicted " << want.device << " ("
                << fmt::format("{:+.1f}%", 100.0 * (want.device - with.peak) / with.peak) << ")\n";
      EXPECT_NEAR(static_cast<double>(with.peak), static_cast<double>(want.device),
                  0.06 * want.device)
          << name_of(s, dtype);
    }
  }
}

// auto: the fastest setting that fits. Rows as a GPU gives them: each setting smaller than the one
// before; model states add to every row.
std::vector<ActivationRow> gpu_rows() {
  return {{Checkpointing::kNone, 900, 0},
          {Checkpointing::kSelective, 500, 0},
          {Checkpointing::kPlain, 300, 0},
          {Checkpointing::kOffload, 120, 240}};
}

TEST(CheckpointingChoice, TakesTheFastestSettingThatFits) {
  const int64_t states = 100;
  struct Case {
    int64_t limit;
    Checkpointing want;
    bool fits;
  };
  for (const Case& c :
       {Case{1000, Checkpointing::kNone, true}, Case{999, Checkpointing::kSelective, true},
        Case{600, Checkpointing::kSelective, true}, Case{599, Checkpointing::kPlain, true},
        Case{400, Checkpointing::kPlain, true}, Case{399, Checkpointing::kOffload, true},
        Case{220, Checkpointing::kOffload, true}, Case{219, Checkpointing::kOffload, false},
        Case{0, Checkpointing::kOffload, false}}) {
    const CheckpointingChoice choice = choose_checkpointing(gpu_rows(), states, c.limit);
    EXPECT_EQ(choice.setting, c.want) << "limit " << c.limit;
    EXPECT_EQ(choice.fits, c.fits) << "limit " << c.limit;
    EXPECT_EQ(choice.peaks, (std::vector<int64_t>{1000, 600, 400, 220}));
    EXPECT_EQ(choice.limit, c.limit);
  }
}

// On the CPU offload is plain checkpointing (same peak): needing more than selective, or with
// nothing fitting, auto takes plain, the faster of the two.
TEST(CheckpointingChoice, OnTheCpuNeverTakesOffload) {
  ActivationInput in = input_for({Checkpointing::kNone, 0}, torch::kFloat32);
  const std::vector<ActivationRow> rows = activation_rows(in);
  ASSERT_EQ(rows[2].device, rows[3].device);
  ASSERT_LT(rows[2].device, rows[1].device);
  ASSERT_LT(rows[1].device, rows[0].device);
  EXPECT_EQ(choose_checkpointing(rows, 0, rows[0].device).setting, Checkpointing::kNone);
  EXPECT_EQ(choose_checkpointing(rows, 0, rows[0].device - 1).setting, Checkpointing::kSelective);
  EXPECT_EQ(choose_checkpointing(rows, 0, rows[1].device - 1).setting, Checkpointing::kPlain);
  const CheckpointingChoice none_fits = choose_checkpointing(rows, 0, 1);
  EXPECT_EQ(none_fits.setting, Checkpointing::kPlain);
  EXPECT_FALSE(none_fits.fits);
}

// The line the trainer logs names the choice, every setting's peak and the limit.
TEST(CheckpointingChoice, DescribesTheChoiceThePeaksAndTheLimit) {
  const CheckpointingChoice c =
      choose_checkpointing(gpu_rows(), int64_t{3} << 30, (int64_t{3} << 30) + 500);
  EXPECT_EQ(describe_choice(c),
            "gradient_checkpointing: auto chose selective: predicted peak (model states + "
            "activations) none 3.00 GiB, selective 3.00 GiB, plain 3.00 GiB, offload 3.00 GiB; "
            "limit 3.00 GiB");
  const CheckpointingChoice tight = choose_checkpointing(gpu_rows(), 0, 1);
  EXPECT_NE(describe_choice(tight).find("chose offload (the smallest; no setting is predicted to "
                                        "fit)"),
            std::string::npos);
}

// The GPU path for the Qwen2.5-0.5B shape in bf16: per token per layer c·(6C + 2·KVD + 3I) +
// 4·heads + 8 bytes; offload keeps two layer inputs on the device and every one on the host.
ActivationInput qwen25_half_billion_on_a_gpu() {
  ActivationInput in;
  in.model = model::DecoderModel(testing::qwen25_half_billion(), model::Materialize::kNo);
  in.micro_batch = 4;
  in.seq_len = 2048;
  in.element_bytes = 2;
  in.cuda = in.fused_kernels = true;
  return in;
}

TEST(EstimateActivations, Qwen25HalfBillionOnAGpu) {
  ActivationInput in = qwen25_half_billion_on_a_gpu();
  const ActivationParts p = activation_parts(in);
  EXPECT_EQ(p.tokens, 8192);
  EXPECT_EQ(p.layer_saved, 8192 * (2 * (6 * 896 + 2 * 128 + 3 * 4864) + 4 * 14 + 8));
  EXPECT_EQ(p.layer_input, 8192 * 2 * 896);
  const ActivationRow plain = activation_row(in, Checkpointing::kPlain);
  const ActivationRow offload = activation_row(in, Checkpointing::kOffload);
  EXPECT_EQ(offload.host, 24 * p.layer_input);
  EXPECT_EQ(plain.device - offload.device, 22 * p.layer_input);
  // Selective: each layer keeps its attention's output (bf16) and log-sum-exp beside its input.
  // The peak of both is the head's moment here (its 1 GiB loss chunk outweighs a layer's
  // recompute), so selective adds every layer's attention to plain's.
  EXPECT_EQ(p.layer_attention, 8192 * (2 * 896 + 4 * 14));
  const ActivationRow selective = activation_row(in, Checkpointing::kSelective);
  EXPECT_EQ(selective.device - plain.device, 24 * p.layer_attention);
  EXPECT_EQ(selective.host, 0);
  // Sequence parallelism over 4 ranks: a quarter of the tokens per rank.
  in.sp_size = 4;
  EXPECT_EQ(activation_parts(in).layer_saved * 4, p.layer_saved);
}

// CUDA graphs (training.cuda_graphs: on) on the same shape: per layer 4 buffers of c·N·C (6 with
// plain checkpointing) and a bf16 gradient buffer per parameter of the layer (14,912,384: q, k, v
// with biases, o, the MLP, two norms); at stage 3 every parameter (494,032,768, the embedding
// tied) kept gathered; under LoRA no gradient buffers; nothing where graphs cannot run.
TEST(EstimateActivations, CudaGraphsKeepTheirBuffersOnTop) {
  ActivationInput in = qwen25_half_billion_on_a_gpu();
  const ActivationRow none = activation_row(in, Checkpointing::kNone);
  const ActivationRow plain = activation_row(in, Checkpointing::kPlain);
  EXPECT_EQ(none.graphs, 0);
  in.graphs = true;
  in.zero_stage = 2;
  const int64_t input = 8192 * 2 * 896, grads = 2 * 14'912'384;
  EXPECT_EQ(activation_row(in, Checkpointing::kNone).graphs, 24 * (4 * input + grads));
  EXPECT_EQ(activation_row(in, Checkpointing::kNone).device,
            none.device + 24 * (4 * input + grads));
  EXPECT_EQ(activation_row(in, Checkpointing::kPlain).graphs, 24 * (6 * input + grads));
  EXPECT_EQ(activation_row(in, Checkpointing::kPlain).device,
            plain.device + 24 * (6 * input + grads));
  // The pools: the buffers, every layer's saved tensors (one layer's with checkpointing) and one
  // layer's backward.
  const ActivationParts p = activation_parts(in);
  EXPECT_EQ(activation_row(in, Checkpointing::kNone).graph_pools,
            24 * (4 * input + grads) + 24 * p.layer_saved + p.layer_backward);
  EXPECT_EQ(activation_row(in, Checkpointing::kPlain).graph_pools,
            24 * (6 * input + grads) + p.layer_saved + p.layer_backward);
  EXPECT_EQ(activation_row(in, Checkpointing::kSelective).graphs, 0);
  EXPECT_EQ(activation_row(in, Checkpointing::kOffload).graphs, 0);
  in.zero_stage = 3;
  EXPECT_EQ(activation_row(in, Checkpointing::kNone).graphs,
            24 * (4 * input + grads) + 2 * 494'032'768);
  EXPECT_EQ(activation_row(in, Checkpointing::kNone).graph_buffers, 24 * (4 * input + grads));
  in.head_trains = false;  // LoRA
  EXPECT_EQ(activation_row(in, Checkpointing::kNone).graphs, 24 * 4 * input + 2 * 494'032'768);
}

}  // namespace
}  // namespace dstrain::estimate
