// Fused q/k/v (model/fused_qkv.h) under the ZeRO engines: each q/k/v parameter's gradient arrives
// once per backward through its own accumulator (the engines' post-accumulate hooks fire once), so
// stages 0-3 at 2 ranks, with LoRA and checkpointing, give the three projections' losses and
// gradient norms up to float rounding (a gradient counted twice or lost would move the norm by
// far more). Also where the engines' layouts put the three weights back to back, so that the fused
// weight is a view of the engine's buffer rather than a copy. And sequence parallelism's attention
// core, which takes the fused product's views of q/k/v through its all-to-alls.
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/fused_qkv.h"
#include "model/layers.h"
#include "model/model.h"
#include "optim/optimizer.h"
#include "tests/common/thread_communicator.h"
#include "tests/unit/model/test_util.h"
#include "tests/unit/model/train_pass.h"
#include "tests/unit/train/engine_test_util.h"
#include "train/parallel_groups.h"
#include "train/parallelize.h"
#include "train/sequence_parallel.h"
#include "zero/engine.h"
#include "zero/grad_hooks.h"

namespace dstrain::train {
namespace {

using dstrain::testing::run_ranks;
using dstrain::testing::ThreadCommunicator;
using model::testing::relative_difference;
using testing::masters;
using testing::sgd;

std::vector<std::shared_ptr<model::AttentionImpl>> attentions(model::DecoderModelImpl& m) {
  std::vector<std::shared_ptr<model::AttentionImpl>> out;
  for (const auto& module : m.modules()) {
    if (auto a = std::dynamic_pointer_cast<model::AttentionImpl>(module)) out.push_back(a);
  }
  return out;
}

TEST(FusedQkvEngine, EachProjectionGradientIsAccumulatedOncePerBackward) {
  model::DecoderModel m =
      model::build_model(model::testing::small_config("qwen2"), torch::kFloat, 3);
  std::map<std::string, int> calls;
  std::vector<zero::AccumulatorHandle> handles;
  for (auto& p : m->named_parameters()) {
    calls[p.key()] = 0;
    handles.push_back(
        zero::add_post_accumulate_hook(p.value(), [&, name = p.key()] { ++calls[name]; }));
  }
  torch::manual_seed(2);
  const torch::Tensor ids = torch::randint(0, 97, {2, 9});
  model::FusedQkvEverywhere force;
  for (int pass = 1; pass <= 2; ++pass) {
    model::causal_lm_loss(m->forward(ids), ids.roll(-1, 1)).backward();
    for (const auto& [name, n] : calls) EXPECT_EQ(n, pass) << name;
  }
  EXPECT_EQ(calls.count("model.layers.0.self_attn.k_proj.bias"), 1u);
}

struct Setup {
  const char* model_type;  // llama: no q/k/v bias; qwen2: biases
  torch::ScalarType dtype;
  int stage;
  bool lora = false;  // LoRA on q_proj and v_proj (base frozen)
  bool checkpointing = false;
};

std::string describe(const Setup& s) {
  return std::string(s.model_type) + (s.dtype == torch::kFloat ? " fp32" : " bf16") + " stage " +
         std::to_string(s.stage) + (s.lora ? " lora" : "") + (s.checkpointing ? " ckpt" : "");
}

struct Run {
  std::vector<double> losses, norms;  // rank 0's, per step
  // Master weights after the steps minus before, per owned piece ("rank:param@begin").
  std::map<std::string, torch::Tensor> updates;
  int adjacent = 0, apart = 0;  // q/k/v weight layouts seen at the attention cores
  int biases_adjacent = 0;      // the same for the biases, where there are biases
  int fused_cores = 0;          // attention cores whose v was a view of the fused product
};

// Rank `comm`'s part of train(): `steps` steps of a 2-layer model; each attention core records
// whether its layer's q/k/v weights are back to back at that moment (gathered, at stage 3).
void train_rank(const Setup& s, const torch::Tensor& ids, int steps, ThreadCommunicator& comm,
                Run& run, std::mutex& mutex) {
  torch::set_num_threads(1);
  model::DecoderModel m(model::testing::small_config(s.model_type), model::Materialize::kNo);
  ParallelPlan plan;
  if (s.lora) plan.lora = testing::small_lora({"q_proj", "v_proj"});
  plan.checkpointing = s.checkpointing ? model::Checkpointing::kPlain : model::Checkpointing::kNone;
  plan.engine.stage = s.stage;
  plan.engine.compute_dtype = s.dtype;
  plan.engine.param_persistence_threshold = 100;  // norms and biases persistent at stage 3
  plan.engine.prefetch_bucket_size = 0;
  plan.optimizer = sgd();
  plan.initial_values = model::init_source(*m, 3);
  SequenceParallel no_sp(nullptr);
  Parallelized parallel = parallelize(m, {comm, torch::kCPU, no_sp}, std::move(plan));
  for (const auto& a : attentions(*m)) {
    model::AttentionImpl* layer = a.get();  // the module outlives every forward here
    a->core = [layer, &run, &mutex](const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, std::optional<int64_t> window,
                                    const model::Documents* documents) {
      const bool adjacent = model::adjacent_rows(
          {layer->q_proj->weight, layer->k_proj->weight, layer->v_proj->weight});
      // v [B, KV, T, D]: its positions lie (H + 2·KV)·D apart in the fused product, KV·D apart in
      // v_proj's own output (LoRA on v_proj adds its delta into a new tensor: KV·D too).
      const bool fused = v.stride(2) != v.size(1) * v.size(3);
      const bool biases_adjacent =
          layer->q_proj->bias.defined() &&
          model::adjacent_rows({layer->q_proj->bias, layer->k_proj->bias, layer->v_proj->bias});
      std::lock_guard<std::mutex> lock(mutex);
      ++(adjacent ? run.adjacent : run.apart);
      run.biases_adjacent += biases_adjacent ? 1 : 0;
      run.fused_cores += fused ? 1 : 0;
      return model::causal_attention(q, k, v, window, documents);
    };
  }
  m->train();
  const std::map<std::string, torch::Tensor> before = masters(*parallel.engine, comm.rank());
  const torch::Tensor mine = ids.narrow(0, 2 * comm.rank(), 2);
  for (int step = 0; step < steps; ++step) {
    const model::LossSum loss = m->loss_sum(mine, mine.roll(-1, 1), /*fused=*/true);
    parallel.engine->backward(loss.mean());
    const zero::StepResult r = parallel.engine->step(0.5);
    if (comm.rank() != 0) continue;
    run.losses.push_back(loss.mean().item<double>());
    run.norms.push_back(r.grad_norm());
  }
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& [key, after] : masters(*parallel.engine, comm.rank())) {
    run.updates[key] = after - before.at(key);
  }
}

Run train(const Setup& s, bool fused, int steps = 3) {
  // Drawn once, before the rank threads: they would share (and race on) torch's global generator.
  torch::manual_seed(7);
  const torch::Tensor ids = torch::randint(0, 97, {4, 12});
  std::optional<model::FusedQkvEverywhere> force;  // process-wide: set outside the rank threads
  if (fused) force.emplace();
  Run run;
  std::mutex mutex;
  run_ranks(2, [&](ThreadCommunicator& comm) { train_rank(s, ids, steps, comm, run, mutex); });
  return run;
}

// Relative difference allowed between two runs' updates (max |a - b| / max |a|): float32 rounding
// of d x (summed in another order) carried through the steps; in bf16 also the biased projections'
// rounding (fused_qkv_test.cpp). A gradient lost or counted twice differs by 50% or more.
double update_tolerance(torch::ScalarType dtype) {
  return dtype == torch::kFloat ? 1e-4 : 0.1;
}

void expect_same_run(const Setup& s) {
  const Run three = train(s, /*fused=*/false);
  const Run fused = train(s, /*fused=*/true);
  const double tol = s.dtype == torch::kFloat ? 1e-5 : 1e-2;
  ASSERT_EQ(three.losses.size(), fused.losses.size()) << describe(s);
  ASSERT_EQ(three.updates.size(), fused.updates.size()) << describe(s);
  for (const auto& [key, update] : three.updates) {
    EXPECT_LE(relative_difference(update, fused.updates.at(key)), update_tolerance(s.dtype))
        << describe(s) << " " << key;
  }
  for (size_t i = 0; i < three.losses.size(); ++i) {
    EXPECT_NEAR(fused.losses[i], three.losses[i], tol * three.losses[i])
        << describe(s) << " step " << i;
    EXPECT_NEAR(fused.norms[i], three.norms[i], tol * three.norms[i])
        << describe(s) << " step " << i;
  }
  EXPECT_LT(fused.losses.back(), fused.losses.front()) << describe(s);
  EXPECT_EQ(three.fused_cores, 0) << describe(s);
  if (!s.lora) {
    EXPECT_GT(fused.fused_cores, 0) << describe(s) << ": the fused path did not run";
  }
}

// Whether an engine lays the q/k/v weights of `s` out back to back, as seen during the forward.
bool weights_adjacent(const Setup& s) {
  const Run run = train(s, /*fused=*/true, /*steps=*/1);
  EXPECT_TRUE(run.adjacent == 0 || run.apart == 0) << describe(s) << ": layers differ";
  EXPECT_GT(run.adjacent + run.apart, 0) << describe(s);
  return run.adjacent > 0;
}

TEST(FusedQkvEngine, TrainsLikeTheThreeProjectionsAtEveryStage) {
  for (const int stage : {0, 1, 2, 3}) {
    expect_same_run({"llama", torch::kFloat, stage});
    expect_same_run({"qwen2", torch::kBFloat16, stage});
  }
  expect_same_run({"qwen2", torch::kFloat, 3, /*lora=*/true, /*checkpointing=*/true});
  expect_same_run({"llama", torch::kBFloat16, 2, /*lora=*/true, /*checkpointing=*/true});
}

TEST(FusedQkvEngine, WeightsAreBackToBackAtEveryStageAndWithLora) {
  // Stages 0-2: one flat buffer in the order of the block's weights(), q/k/v weights first, then
  // their biases; LoRA's frozen base in a buffer of its own, in the same order.
  EXPECT_TRUE(weights_adjacent({"llama", torch::kBFloat16, 0}));
  EXPECT_TRUE(weights_adjacent({"llama", torch::kFloat, 2}));
  EXPECT_TRUE(weights_adjacent({"qwen2", torch::kBFloat16, 1}));
  EXPECT_TRUE(weights_adjacent({"llama", torch::kBFloat16, 0, /*lora=*/true}));
  EXPECT_TRUE(weights_adjacent({"qwen2", torch::kBFloat16, 2, /*lora=*/true}));
  // Stage 3: a layer's unit holds its large parameters back to back; the biases (below the
  // persistence threshold) live in the persistent unit; LoRA's frozen base in the layer's frozen
  // unit.
  EXPECT_TRUE(weights_adjacent({"llama", torch::kBFloat16, 3}));
  EXPECT_TRUE(weights_adjacent({"qwen2", torch::kBFloat16, 3}));
  EXPECT_TRUE(weights_adjacent({"qwen2", torch::kFloat, 3, /*lora=*/true}));
  // The biases: back to back too.
  EXPECT_GT(train({"qwen2", torch::kBFloat16, 3}, true, 1).biases_adjacent, 0);
  EXPECT_GT(train({"qwen2", torch::kBFloat16, 1}, true, 1).biases_adjacent, 0);
}

// Rank 0's gradients (named_parameters() order) after one forward + backward of 2 sequences of 16
// tokens over a sequence-parallel group of 2 (llama; mistral with a window of 6).
std::vector<torch::Tensor> sequence_parallel_grads(bool window, bool fused) {
  nlohmann::json doc = model::testing::small_config_json(window ? "mistral" : "llama");
  if (window) doc["sliding_window"] = 6;
  const model::ModelConfig config = model::parse_model_config(doc);
  torch::manual_seed(11);
  const torch::Tensor ids = torch::randint(0, 97, {2, 17});
  std::optional<model::FusedQkvEverywhere> force;
  if (fused) force.emplace();
  std::vector<torch::Tensor> grads;
  run_ranks(2, [&](ThreadCommunicator& world) {
    model::DecoderModel m = model::build_model(config, torch::kFloat, 3);
    ParallelGroups groups(world, layout::ParallelLayout(2, layout::Sizes{1, 2}));
    SequenceParallel sp(groups.sequence());
    sp.apply(*m);
    data::Batch whole;
    whole.input_ids = ids.narrow(1, 0, 16).contiguous();
    whole.labels = ids.narrow(1, 1, 16).contiguous();
    const data::Batch mine = sp.slice(whole);
    const torch::Tensor h = m->hidden_states(mine.input_ids, sp.positions(16));
    sp.reduce_loss(m->head_loss_sum(h, mine.labels)).mean().backward();
    if (world.rank() != 0) return;
    for (const auto& p : m->named_parameters()) grads.push_back(p.value().grad().clone());
  });
  return grads;
}

TEST(FusedQkvEngine, SequenceParallelAttentionGivesTheThreeProjectionsGradients) {
  for (const bool window : {false, true}) {
    const std::vector<torch::Tensor> three = sequence_parallel_grads(window, false);
    const std::vector<torch::Tensor> fused = sequence_parallel_grads(window, true);
    ASSERT_EQ(three.size(), fused.size());
    for (size_t i = 0; i < three.size(); ++i) {
      EXPECT_LE(relative_difference(three[i], fused[i]), 1e-5) << "window " << window << " #" << i;
    }
  }
}

}  // namespace
}  // namespace dstrain::train
