// Sequence parallelism against the whole-sequence computation, with ranks as threads: the Ulysses
// attention core on its own, then the whole model (loss and every gradient), for P = 2 and 4 and
// 1, 2 and 4 key/value heads, plain and sliding-window attention, and rows of packed documents
// whose boundaries fall inside the ranks' slices.

#include "train/sequence_parallel.h"

#include <gtest/gtest.h>

#include <mutex>

#include "model/model.h"
#include "tests/common/expect_error.h"
#include "tests/common/thread_communicator.h"
#include "train/parallel_groups.h"

namespace dstrain::train {
namespace {

using dstrain::testing::run_ranks;
using dstrain::testing::ThreadCommunicator;

constexpr double kTol = 1e-5;

void expect_close(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  const double scale = std::max(1.0, want.abs().max().item<double>());
  EXPECT_LT((got - want).abs().max().item<double>(), kTol * scale) << what;
}

struct AttentionCase {
  int p;
  int kv_heads;
  int64_t window;          // 0: full causal
  bool documents = false;  // rows of packed documents that cross the ranks' slices
};

class UlyssesAttention : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(UlyssesAttention, SlicesEqualWholeSequenceAttentionWithGradients) {
  const AttentionCase c = GetParam();
  const int64_t B = 2, H = 4, T = 16, D = 8, Tl = T / c.p;
  torch::manual_seed(7);
  const torch::Tensor q = torch::randn({B, H, T, D}), k = torch::randn({B, c.kv_heads, T, D}),
                      v = torch::randn({B, c.kv_heads, T, D}), w = torch::randn({B, H, T, D});
  const std::optional<int64_t> window =
      c.window > 0 ? std::optional<int64_t>(c.window) : std::nullopt;
  auto leaves = [](std::vector<torch::Tensor> ts) {
    for (auto& t : ts) t = t.detach().clone().requires_grad_(true);
    return ts;
  };
  const model::Documents packed{{{3, 9, 4}, {16}}};
  const model::Documents* documents = c.documents ? &packed : nullptr;
  const auto full = leaves({q, k, v});
  const torch::Tensor want = model::causal_attention(full[0], full[1], full[2], window, documents);
  (want * w).sum().backward();
  run_ranks(c.p, [&](ThreadCommunicator& comm) {
    const int64_t first = comm.rank() * Tl;
    const auto mine =
        leaves({q.narrow(2, first, Tl), k.narrow(2, first, Tl), v.narrow(2, first, Tl)});
    const torch::Tensor got = ulysses_attention(comm)(mine[0], mine[1], mine[2], window, documents);
    (got * w.narrow(2, first, Tl)).sum().backward();
    const std::string at = "rank " + std::to_string(comm.rank());
    expect_close(got, want.detach().narrow(2, first, Tl), "output, " + at);
    for (int i = 0; i < 3; ++i) {
      expect_close(mine[i].grad(), full[i].grad().narrow(2, first, Tl),
                   "gradient " + std::to_string(i) + ", " + at);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    HeadsAndWindows, UlyssesAttention,
    ::testing::Values(AttentionCase{2, 4, 0}, AttentionCase{2, 2, 0}, AttentionCase{2, 1, 0},
                      AttentionCase{4, 4, 0}, AttentionCase{4, 2, 0}, AttentionCase{4, 1, 0},
                      AttentionCase{2, 2, 5}, AttentionCase{4, 1, 3}, AttentionCase{2, 2, 0, true},
                      AttentionCase{4, 1, 3, true}),
    [](const ::testing::TestParamInfo<AttentionCase>& i) {
      return "P" + std::to_string(i.param.p) + "Kv" + std::to_string(i.param.kv_heads) +
             (i.param.window > 0 ? "Window" + std::to_string(i.param.window) : "") +
             (i.param.documents ? "Documents" : "");
    });

struct ModelCase {
  int p;
  int world;
  int kv_heads;
  bool window;
  bool selective = false;  // selective checkpointing: the head-sharded attention output is kept
};

model::ModelConfig small_model(int kv_heads, bool window) {
  nlohmann::json j = {{"model_type", window ? "mistral" : "llama"},
                      {"vocab_size", 97},
                      {"hidden_size", 64},
                      {"intermediate_size", 96},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", kv_heads},
                      {"max_position_embeddings", 128},
                      {"rms_norm_eps", 1e-6},
                      {"rope_theta", 10000.0},
                      {"tie_word_embeddings", false}};
  if (window) j["sliding_window"] = 6;
  return model::parse_model_config(j);
}

// Sequences of T tokens, labels aligned (label t = token t + 1) with some positions ignored, so
// that the slices count different numbers of tokens.
std::pair<torch::Tensor, torch::Tensor> batch(int64_t rows, int64_t T) {
  torch::manual_seed(11);
  const torch::Tensor ids = torch::randint(0, 97, {rows, T + 1}, torch::kInt64);
  torch::Tensor labels = ids.narrow(1, 1, T).clone();
  labels.index_put_({0, torch::indexing::Slice(0, 5)}, model::kIgnoreIndex);
  labels.index_put_({rows - 1, T - 1}, model::kIgnoreIndex);
  return {ids.narrow(1, 0, T).contiguous(), labels};
}

class SequenceParallelModel : public ::testing::TestWithParam<ModelCase> {};

// What the trainer does: the data-parallel ranks each take their rows, the ranks of a group each
// their slice of them; the engine averages gradients over the world. Equal to one process over
// every row when the data-parallel ranks' row counts are equal (the mean of their means).
TEST_P(SequenceParallelModel, LossAndEveryGradientEqualOneProcess) {
  const ModelCase c = GetParam();
  const model::ModelConfig config = small_model(c.kv_heads, c.window);
  const int dp = c.world / c.p;
  const int64_t T = 16, rows_per_dp = 2;
  const auto [ids, labels] = batch(rows_per_dp * dp, T);
  model::DecoderModel reference = model::build_model(config, torch::kFloat32, 3);
  torch::Tensor want_loss = torch::zeros({});
  for (int d = 0; d < dp; ++d) {
    const auto rows = torch::indexing::Slice(d * rows_per_dp, (d + 1) * rows_per_dp);
    const torch::Tensor h = reference->hidden_states(ids.index({rows}));
    const torch::Tensor loss = reference->head_loss_sum(h, labels.index({rows})).mean() / dp;
    loss.backward();
    want_loss += loss.detach();
  }
  std::mutex mutex;
  run_ranks(c.world, [&](ThreadCommunicator& world) {
    model::DecoderModel m = model::build_model(config, torch::kFloat32, 3);
    ParallelGroups groups(world, layout::ParallelLayout(c.world, layout::Sizes{1, c.p}));
    SequenceParallel sp(groups.sequence());
    sp.apply(*m);
    if (c.selective)
      m->wrap_blocks(model::WrapperSlot::kCheckpointing, model::selective_checkpoint_layers());
    const int d = groups.coordinate(layout::Axis::kData);
    const auto rows = torch::indexing::Slice(d * rows_per_dp, (d + 1) * rows_per_dp);
    data::Batch b;
    b.input_ids = ids.index({rows});
    b.labels = labels.index({rows});
    const data::Batch mine = sp.slice(b);
    const torch::Tensor h = m->hidden_states(mine.input_ids, sp.positions(T));
    const torch::Tensor loss = sp.reduce_loss(m->head_loss_sum(h, mine.labels)).mean();
    loss.backward();
    torch::Tensor mean_loss = loss.detach().clone().reshape({1});
    world.all_reduce(mean_loss, comm::ReduceOp::kAvg)->wait();
    expect_close(mean_loss[0], want_loss, "loss");
    const auto want = reference->named_parameters();
    for (const auto& p : m->named_parameters()) {
      torch::Tensor g = p.value().grad().contiguous();
      world.all_reduce(g, comm::ReduceOp::kAvg)->wait();  // what the engine does
      std::lock_guard<std::mutex> lock(mutex);
      expect_close(g, want[p.key()].grad(), p.key() + " on rank " + std::to_string(world.rank()));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    GroupsAndHeads, SequenceParallelModel,
    ::testing::Values(ModelCase{2, 2, 2, false}, ModelCase{2, 2, 1, false},
                      ModelCase{2, 2, 4, false}, ModelCase{4, 4, 1, false},
                      ModelCase{4, 4, 2, false}, ModelCase{4, 4, 4, false},
                      ModelCase{2, 4, 2, false}, ModelCase{2, 2, 2, true}, ModelCase{4, 4, 1, true},
                      ModelCase{2, 2, 2, false, true}, ModelCase{2, 2, 1, false, true},
                      ModelCase{2, 2, 2, true, true}),
    [](const ::testing::TestParamInfo<ModelCase>& i) {
      return "P" + std::to_string(i.param.p) + "World" + std::to_string(i.param.world) + "Kv" +
             std::to_string(i.param.kv_heads) + (i.param.window ? "Window" : "") +
             (i.param.selective ? "Selective" : "");
    });

TEST(SequenceParallelChecks, HeadsThatCannotBeSplitNameTheKey) {
  dstrain::testing::expect_error(
      [] { SequenceParallel::check_model(small_model(2, false), 8, "m"); }, ErrorKind::kConfig,
      {"model m: num_attention_heads (4)", "parallel.sequence_parallel_size (8)"});
  nlohmann::json j = {{"model_type", "llama"},    {"vocab_size", 97},
                      {"hidden_size", 96},        {"intermediate_size", 96},
                      {"num_hidden_layers", 1},   {"num_attention_heads", 6},
                      {"num_key_value_heads", 3}, {"max_position_embeddings", 128}};
  dstrain::testing::expect_error(
      [&] { SequenceParallel::check_model(model::parse_model_config(j), 2, "m"); },
      ErrorKind::kConfig, {"num_key_value_heads (3)", "parallel.sequence_parallel_size (2)"});
  dstrain::testing::expect_error([] { SequenceParallel::check_length(30, 4); }, ErrorKind::kConfig,
                                 {"data.max_length (30)", "parallel.sequence_parallel_size (4)"});
}

}  // namespace
}  // namespace dstrain::train
