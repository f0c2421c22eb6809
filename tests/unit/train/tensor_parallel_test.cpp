// Tensor parallelism against the whole model, with ranks as threads: T = 2 and 4 ranks, each
// holding its slice of the model (model/tensor_parallel.h), with and without the sequence
// parallelism of the region, for every family (Llama with attention and MLP biases, Mistral with a
// window shorter than the sequence, Qwen2 with q/k/v biases, Qwen3 with q/k norms, tied
// embeddings, a padding id, Llama with YaRN's RoPE scaling): the fused loss, the logits, the
// unfused loss over them and every parameter's gradient equal one process running the whole model;
// the initial values of a slice are the whole model's (slice_source); LoRA adapters are slices of
// the whole model's with their gradients; a pipeline of tensor-parallel stages sends each rank's
// part of the hidden states; a model that does not divide is refused naming the count.

#include "train/tensor_parallel.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <thread>

#include "comm/gloo_communicator.h"
#include "estimate/activations.h"
#include "lora/lora_model.h"
#include "model/model.h"
#include "tests/common/expect_error.h"
#include "tests/common/free_port.h"
#include "tests/common/thread_communicator.h"
#include "tests/unit/model/counting_allocator.h"
#include "tests/unit/train/engine_test_util.h"
#include "train/parallel_groups.h"
#include "train/parallelize.h"
#include "train/pipeline.h"

namespace dstrain::train {
namespace {

using dstrain::testing::run_ranks;
using dstrain::testing::ThreadCommunicator;

// Every rank of a world of `n` in one tensor-parallel group.
layout::ParallelLayout all_tensor_parallel(int n) {
  return {n, layout::Sizes{1, 1, n}};
}

// float32 over two layers: the summation orders differ (the ranks' partial products are added by
// the all-reduce). A tensor's difference is measured relative to its norm, ‖got − want‖₂ /
// ‖want‖₂, and by its largest element relative to the tensor's largest value. The step-1 gradient
// as a whole (every parameter of a rank's, one vector) is held to 1e-6; a single tensor to 2e-6:
// the largest, up to 1.2e-6 at T = 4 by both measures, is a k_proj bias's, whose gradient is
// nearly all cancellation (a key bias moves every score of a query by the same amount, to which
// softmax is blind, but for RoPE's rotation), so what is left of it is mostly rounding.
constexpr double kWholeTol = 1e-6;
constexpr double kTol = 2e-6;

// Squared norms of a difference and of its reference, summed over tensors.
struct Difference {
  double diff = 0;
  double want = 0;
  double relative() const { return std::sqrt(diff / std::max(1e-60, want)); }
};

Difference expect_close(const torch::Tensor& got, const torch::Tensor& want,
                        const std::string& what) {
  EXPECT_EQ(got.sizes(), want.sizes()) << what;
  if (got.sizes() != want.sizes()) return {};
  const torch::Tensor diff = (got - want).to(torch::kDouble);
  const Difference d{diff.square().sum().item<double>(),
                     want.to(torch::kDouble).square().sum().item<double>()};
  const double scale = std::max(1e-12, want.abs().max().item<double>());
  const double element = diff.abs().max().item<double>() / scale;
  EXPECT_LT(d.relative(), kTol) << what << ": relative difference (norm) " << d.relative();
  EXPECT_LT(element, kTol) << what << ": relative difference (largest element) " << element;
  return d;
}

struct Family {
  std::string name;
  nlohmann::json config;
};

nlohmann::json base(const std::string& type, int64_t kv_heads) {
  return {{"model_type", type},
          {"vocab_size", 96},
          {"hidden_size", 64},
          {"intermediate_size", 96},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", kv_heads},
          {"max_position_embeddings", 128},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0},
          {"tie_word_embeddings", false}};
}

std::vector<Family> families() {
  std::vector<Family> out;
  nlohmann::json llama = base("llama", 4);
  llama["attention_bias"] = true;  // q/k/v/o biases: o_proj's is a row-parallel bias
  llama["mlp_bias"] = true;        // down_proj's too
  llama["pad_token_id"] = 50;      // the padding row lies in one rank's slice
  out.push_back({"LlamaBiases", llama});
  nlohmann::json mistral = base("mistral", 4);
  mistral["sliding_window"] = 5;
  out.push_back({"MistralWindow", mistral});
  nlohmann::json qwen2 = base("qwen2", 4);
  qwen2["tie_word_embeddings"] = true;
  out.push_back({"Qwen2TiedBiases", qwen2});
  nlohmann::json qwen3 = base("qwen3", 4);
  qwen3["head_dim"] = 8;
  out.push_back({"Qwen3QkNorms", qwen3});
  nlohmann::json yarn = base("llama", 4);  // RoPE scaled (YaRN: frequencies and attention factor)
  yarn["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32}};
  out.push_back({"LlamaYarn", yarn});
  return out;
}

struct Case {
  Family family;
  int tp;
  bool sequence_parallel;
};

std::pair<torch::Tensor, torch::Tensor> batch(int64_t rows, int64_t T, int64_t vocab) {
  torch::manual_seed(11);
  const torch::Tensor ids = torch::randint(0, vocab, {rows, T + 1}, torch::kInt64);
  torch::Tensor labels = ids.narrow(1, 1, T).clone();
  labels.index_put_({0, torch::indexing::Slice(0, 5)}, model::kIgnoreIndex);
  return {ids.narrow(1, 0, T).contiguous(), labels};
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Megatron-LM's split of a parameter, by its name: the embedding, lm_head, q/k/v and gate/up
// weights and biases by rows, o_proj and down_proj weights by columns, the rest whole (-1); for an
// adapter, A by columns under a row-parallel weight and B by rows under a column-parallel one.
int expected_dim(const std::string& name) {
  for (const auto& [suffix, a] :
       {std::pair<std::string, bool>{".lora_A.weight", true}, {".lora_B.weight", false}}) {
    if (!ends_with(name, suffix)) continue;
    const int dim = expected_dim(name.substr(0, name.size() - suffix.size()) + ".weight");
    if (a) return dim == 1 ? 1 : -1;
    return dim == 0 ? 0 : -1;
  }
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") return 0;
  for (const char* column : {".q_proj.", ".k_proj.", ".v_proj.", ".gate_proj.", ".up_proj."}) {
    if (name.find(column) != std::string::npos) return 0;
  }
  for (const char* row : {".o_proj.weight", ".down_proj.weight"}) {
    if (ends_with(name, row)) return 1;
  }
  return -1;
}

// Slice `rank` of `size` of the whole model's (or adapters') `name`.
torch::Tensor slice_of(const std::string& name, const torch::Tensor& whole, int rank, int size) {
  const int dim = expected_dim(name);
  if (dim < 0) return whole;
  const int64_t n = whole.size(dim) / size;
  return whole.narrow(dim, rank * n, n);
}

uint64_t all_reduces_of(const comm::Communicator& group) {
  const auto& calls = group.stats().calls;
  const auto it = calls.find(comm::CollectiveKind::kAllReduce);
  return it == calls.end() ? 0 : it->second;
}

// This rank's gradient of `name` as the engine's step takes it: a partial gradient (a replicated
// parameter's, placement.h) summed over the group. Collective when it is partial.
torch::Tensor summed(TensorParallelGroup& tp, const torch::Tensor& grad, const PlacedShapes& placed,
                     const std::string& name) {
  const model::Placement& placement = placed.at(name).placement;
  return placement.partial_gradient ? tp.whole_gradient(grad, placement) : grad;
}

class TensorParallelModel : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelModel, LossLogitsAndEveryGradientEqualTheWholeModel) {
  const Case c = GetParam();
  const model::ModelConfig config = model::parse_model_config(c.family.config);
  const int64_t T = 16;
  const auto [ids, labels] = batch(2, T, config.vocab_size);
  model::DecoderModel whole = model::build_model(config, torch::kFloat32, 3);
  const model::LossSum want = whole->loss_sum(ids, labels, /*fused=*/true);
  want.mean().backward();
  torch::Tensor want_logits;
  {
    torch::NoGradGuard no_grad;
    want_logits = whole->forward(ids);
  }
  std::map<std::string, torch::Tensor> whole_params;
  for (const auto& item : whole->named_parameters()) whole_params[item.key()] = item.value();

  run_ranks(c.tp, [&](ThreadCommunicator& world) {
    ParallelGroups groups(world, all_tensor_parallel(c.tp));
    auto tp = std::make_shared<TensorParallelGroup>(groups.tensor(), groups.slice_replicas(),
                                                    c.sequence_parallel);
    model::DecoderModel local(config, model::Materialize::kYes, tp);
    {
      torch::NoGradGuard no_grad;
      for (auto& item : local->named_parameters()) {
        item.value().copy_(slice_of(item.key(), whole_params.at(item.key()), tp->rank(), c.tp));
      }
    }
    const std::string at = "rank " + std::to_string(tp->rank());
    const model::LossSum got = local->loss_sum(ids, labels, /*fused=*/true);
    EXPECT_EQ(got.count.item<int64_t>(), want.count.item<int64_t>());
    expect_close(got.sum.detach(), want.sum.detach(), "loss sum, " + at);
    const uint64_t all_reduces = all_reduces_of(*groups.tensor());
    got.mean().backward();
    // With the region's sequence parallelism nothing in backward is all-reduced (the replicated
    // parameters' partial gradients are summed once per step, by the engine).
    if (c.sequence_parallel) {
      EXPECT_EQ(all_reduces_of(*groups.tensor()), all_reduces);
    }
    const PlacedShapes placed = placed_shapes(*local, nullptr);
    Difference gradient;
    for (const auto& item : local->named_parameters()) {
      const torch::Tensor& whole_grad = whole_params.at(item.key()).grad();
      ASSERT_TRUE(item.value().grad().defined()) << item.key() << ", " << at;
      const Difference d = expect_close(summed(*tp, item.value().grad(), placed, item.key()),
                                        slice_of(item.key(), whole_grad, tp->rank(), c.tp),
                                        item.key() + " gradient, " + at);
      gradient.diff += d.diff;
      gradient.want += d.want;
    }
    EXPECT_LT(gradient.relative(), kWholeTol) << "the step-1 gradient, " << at;
    if (tp->rank() == 0) std::cout << "step-1 gradient: " << gradient.relative() << " relative\n";
    torch::NoGradGuard no_grad;
    expect_close(local->forward(ids), want_logits, "logits, " + at);
    expect_close(local->loss_sum(ids, labels, /*fused=*/false).sum, want.sum.detach(),
                 "unfused loss, " + at);
  });
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const Family& f : families()) {
    for (const int tp : {2, 4}) {
      for (const bool sp : {false, true}) out.push_back({f, tp, sp});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Families, TensorParallelModel, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return i.param.family.name + "T" + std::to_string(i.param.tp) +
                                  (i.param.sequence_parallel ? "SequenceParallel" : "");
                         });

// A slice's initial values come from the whole model's: rows of the column-parallel weights, the
// columns of each row of the row-parallel ones (read in blocks of rows), replicated ones whole.
TEST(TensorParallelValues, SliceSourceReadsEachRanksSliceOfTheWholeValues) {
  const model::ModelConfig config = model::parse_model_config(families()[0].config);
  model::DecoderModel whole(config, model::Materialize::kNo);
  const model::ValueSource values = model::init_source(*whole, 5);
  run_ranks(2, [&](ThreadCommunicator& world) {
    ParallelGroups groups(world, all_tensor_parallel(2));
    auto tp = std::make_shared<TensorParallelGroup>(groups.tensor(), groups.slice_replicas(), true);
    model::DecoderModel local(config, model::Materialize::kNo, tp);
    const model::ValueSource sliced = slice_source(values, *local, *tp);
    for (const auto& item : local->named_parameters()) {
      const std::string& name = item.key();
      const torch::Tensor all = values(name, 0, whole->named_parameters()[name].numel())
                                    .view(whole->named_parameters()[name].sizes());
      const torch::Tensor want = slice_of(name, all, tp->rank(), 2).reshape({-1});
      const int64_t n = item.value().numel();
      EXPECT_TRUE(torch::equal(sliced(name, 0, n), want)) << name;
      // A range that starts and ends inside rows.
      if (n > 10) {
        EXPECT_TRUE(torch::equal(sliced(name, 3, n - 7), want.narrow(0, 3, n - 10))) << name;
      }
    }
  });
}

// The placements the model's modules declare are Megatron-LM's split (expected_dim, this test's
// own table), and the replicated ones whose gradient on a rank is a part say so: the q/k norms
// always, the layer norms and row-parallel biases under the region's sequence parallelism.
TEST(TensorParallelPlacements, TheModulesDeclareMegatronsSplit) {
  for (const int f : {0, 3}) {  // Llama with every bias, Qwen3 with q/k norms
    const model::ModelConfig config = model::parse_model_config(families()[f].config);
    for (const bool sp : {false, true}) {
      const model::DecoderModel m(config, model::Materialize::kNo, tensor_parallel_shapes(2, sp));
      int checked = 0;
      for (const auto& block : m->blocks()) {
        for (const model::BlockParameter& p : block->parameters) {
          EXPECT_EQ(p.placement.dim(), expected_dim(p.name)) << p.name;
          const bool qk_norm = p.name.find("_norm.") != std::string::npos &&
                               p.name.find("self_attn") != std::string::npos;
          const bool partial = p.placement.replicated() && (qk_norm || sp);
          EXPECT_EQ(p.placement.partial_gradient, partial) << p.name << (sp ? ", sp" : "");
          ++checked;
        }
      }
      EXPECT_EQ(checked, static_cast<int>(m->named_parameters().size()));
    }
  }
}

// LoRA on every projection of a tensor-parallel model: each rank's A and B are its slices of the
// whole model's (drawn whole, then sliced; loaded whole, then sliced), and after one forward and
// backward the loss and every adapter gradient equal the whole model's.
TEST(TensorParallelLora, AdaptersAreSlicesOfTheWholeModelsWithTheirGradients) {
  const model::ModelConfig config = model::parse_model_config(families()[3].config);  // Qwen3
  const auto [ids, labels] = batch(2, 16, config.vocab_size);
  lora::LoraOptions options;
  options.r = 4;
  options.alpha = 8;
  options.target_modules = {"all-linear"};
  options.seed = 9;
  model::DecoderModel whole = model::build_model(config, torch::kFloat32, 3);
  for (auto& p : whole->parameters()) p.set_requires_grad(false);
  lora::LoraModel whole_lora(whole, options, "lora");
  // B = 0 would hide every B gradient path but one: start from a loaded, non-zero B.
  std::vector<lora::LoraWeights> loaded = whole_lora.weights();
  torch::manual_seed(5);
  for (auto& w : loaded) w.B = torch::randn(w.B.sizes()) * 0.1;
  whole_lora.load(loaded, "test");
  whole->loss_sum(ids, labels, /*fused=*/true).mean().backward();
  std::map<std::string, torch::Tensor> whole_params;
  for (const auto& item : whole->named_parameters()) whole_params[item.key()] = item.value();
  std::map<std::string, torch::Tensor> want;
  for (const auto& [name, t] : whole_lora.named_parameters()) want[name] = t;
  for (const bool sp : {false, true}) {
    run_ranks(2, [&](ThreadCommunicator& world) {
      ParallelGroups groups(world, all_tensor_parallel(2));
      auto tp = std::make_shared<TensorParallelGroup>(groups.tensor(), groups.slice_replicas(), sp);
      model::DecoderModel local(config, model::Materialize::kYes, tp);
      {
        torch::NoGradGuard no_grad;
        for (auto& item : local->named_parameters()) {
          item.value().copy_(slice_of(item.key(), whole_params.at(item.key()), tp->rank(), 2));
          item.value().set_requires_grad(false);
        }
      }
      lora::LoraModel local_lora(local, options, "lora");
      const std::string at =
          "rank " + std::to_string(tp->rank()) + (sp ? ", sequence parallel" : "");
      // The adapters' placements follow their projections' (expected_dim's table); the whole
      // one of A and B has a partial gradient.
      for (const auto& p : local_lora.block_parameters()) {
        EXPECT_EQ(p.placement.dim(), expected_dim(p.name)) << p.name;
        EXPECT_EQ(p.placement.partial_gradient, p.placement.replicated()) << p.name;
      }
      // As drawn: A whole or sliced, B zero.
      for (const auto& [name, t] : local_lora.named_parameters()) {
        if (name.find("lora_A") == std::string::npos) continue;
        const torch::Tensor slice = slice_of(name, want.at(name), tp->rank(), 2);
        EXPECT_TRUE(torch::equal(t.detach(), slice.detach())) << name << " as drawn, " << at;
      }
      local_lora.load(loaded, "test");
      local->loss_sum(ids, labels, /*fused=*/true).mean().backward();
      const PlacedShapes placed = placed_shapes(*local, &local_lora);
      for (const auto& [name, t] : local_lora.named_parameters()) {
        const torch::Tensor slice = slice_of(name, want.at(name).grad(), tp->rank(), 2);
        ASSERT_TRUE(t.grad().defined()) << name << ", " << at;
        expect_close(summed(*tp, t.grad(), placed, name), slice, name + " gradient, " + at);
      }
    });
  }
}

// The model of the memory tests: a vocabulary large enough that the head's loss runs in chunks.
model::ModelConfig memory_model() {
  nlohmann::json j = base("llama", 4);
  j["vocab_size"] = 512;
  j["hidden_size"] = 128;
  j["intermediate_size"] = 256;
  j["num_hidden_layers"] = 3;
  return model::parse_model_config(j);
}

constexpr int64_t kMemoryBatch = 4, kMemorySeq = 64;

struct RankMemory {
  double kept = 0;  // bytes a rank holds from its forward to its backward
  double peak = 0;  // a rank's peak during forward + backward, beyond what it held before
  estimate::ActivationRow predicted;
  estimate::ActivationParts parts;
};

// One micro-batch on each rank of a group of 2 over Gloo (ranks as threads of this process, each
// with its own communicator on 127.0.0.1: the collectives' own buffers are the real ones); a first
// pass makes the parameters' gradients, the second is counted, with the CPU allocator's counters
// of each rank's thread (rank 0's reported; rank 1 does the same work).
RankMemory measure_ranks(bool sp, model::Checkpointing setting) {
  torch::set_num_threads(1);
  const model::ModelConfig config = memory_model();
  torch::manual_seed(2);
  const torch::Tensor ids = torch::randint(0, 512, {kMemoryBatch, kMemorySeq}, torch::kLong);
  const torch::Tensor labels = ids.roll(-1, 1);
  // Two process groups of one process enqueue from two threads at once here (a rank of a job
  // enqueues from one): LibTorch's process-wide flight recorder of collectives is not safe for that
  // (a crash in about one run of seven), so it records nothing.
  setenv("TORCH_FR_BUFFER_SIZE", "0", 1);
  using Counter = model::testing::CountingAllocator;
  model::testing::CountingScope scope;
  RankMemory out;
  const int port = dstrain::testing::free_port();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::RendezvousOptions options;
        options.master_port = port;
        options.rank = r;
        options.world_size = 2;
        options.timeout = std::chrono::seconds(60);
        const std::unique_ptr<comm::Communicator> world = comm::make_gloo_communicator(options);
        ParallelGroups groups(*world, all_tensor_parallel(2));
        auto tp =
            std::make_shared<TensorParallelGroup>(groups.tensor(), groups.slice_replicas(), sp);
        model::DecoderModel m(config, model::Materialize::kYes, tp);
        if (setting != model::Checkpointing::kNone) {
          m->wrap_blocks(model::WrapperSlot::kCheckpointing, model::checkpoint_layers());
        }
        m->train();
        m->loss_sum(ids, labels, /*fused=*/true).mean().backward();
        world->barrier();
        // Counted from here by what this thread allocates: Gloo's worker threads drop the last
        // references to some of the warm-up's tensors at their own time (once, measured here in
        // one run of about sixty, a [N, C] gradient freed during the forward).
        Counter::start_thread_count();
        const torch::Tensor loss = m->loss_sum(ids, labels, /*fused=*/true).mean();
        const int64_t kept = Counter::thread_since();
        loss.backward();
        const int64_t peak = Counter::thread_since_peak();
        world->barrier();
        if (r == 0) {
          estimate::ActivationInput in;
          in.model = model::DecoderModel(config, model::Materialize::kNo, tp);
          in.micro_batch = kMemoryBatch;
          in.seq_len = kMemorySeq;
          out.predicted = estimate::activation_row(in, setting);
          out.parts = estimate::activation_parts(in);
          out.kept = static_cast<double>(kept);
          out.peak = static_cast<double>(peak);
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  return out;
}

// What a forward keeps for backward on each rank, against the memory model's rows for one rank's
// slice (estimate/activations.h over the blocks' own description): with the region's sequence
// parallelism the norms on half the token rows and the gathered rows kept whole, without it the
// norms on every row.
TEST(TensorParallelMemory, WhatForwardKeepsMatchesTheMemoryModelPerRank) {
  const int64_t layers = memory_model().num_hidden_layers;
  for (const bool sp : {false, true}) {
    const RankMemory got = measure_ranks(sp, model::Checkpointing::kNone);
    const int64_t predicted =
        got.parts.context + layers * got.parts.layer_saved + got.parts.head_saved;
    std::cout << (sp ? "with" : "without") << " the region's sequence parallelism: kept after "
              << "forward " << got.kept << " bytes a rank, predicted " << predicted << "\n";
    EXPECT_NEAR(got.kept, static_cast<double>(predicted), 0.02 * static_cast<double>(predicted))
        << (sp ? "sequence parallel" : "no sequence parallel");
  }
}

// The peak of forward + backward on each rank, the collectives' buffers included (the partial
// sums a row-parallel projection reduces and what the reduction receives into, the rows gathered
// for a column-parallel one and for the backward), against the memory model's peak, within the 6%
// of the whole model's test (tests/unit/estimate/activations_test.cpp).
TEST(TensorParallelMemory, PeakOfForwardAndBackwardMatchesTheMemoryModelPerRank) {
  for (const bool sp : {false, true}) {
    for (const model::Checkpointing setting :
         {model::Checkpointing::kNone, model::Checkpointing::kPlain}) {
      const RankMemory got = measure_ranks(sp, setting);
      const auto want = static_cast<double>(got.predicted.device);
      const std::string what = fmt::format("{}, gradient_checkpointing {}",
                                           sp ? "sequence parallel" : "no sequence parallel",
                                           model::checkpointing_word(setting));
      std::cout << what << ": peak " << got.peak << " bytes a rank, predicted " << want << " ("
                << fmt::format("{:+.1f}%", 100.0 * (want - got.peak) / got.peak) << ")\n";
      EXPECT_NEAR(got.peak, want, 0.06 * want) << what;
    }
  }
}

// A pipeline of 2 stages, each a tensor-parallel group of 2 (4 ranks): each rank sends the next
// stage (and the gradient back) its half of the hidden states, with the region's sequence
// parallelism (its token rows) and without it (its half of the whole states, all-gathered by the
// receiving group), and the step's loss and every gradient are the whole model's.
TEST(TensorParallelPipeline, EachRankSendsItsPartOfTheHiddenStates) {
  const model::ModelConfig config = model::parse_model_config(base("llama", 4));
  const int64_t B = 2, T = 16;
  const int micro_batches = 2;
  std::vector<PipelineStage::MicroBatch> batches;
  model::DecoderModel whole = model::build_model(config, torch::kFloat32, 3);
  double count = 0;
  for (int i = 0; i < micro_batches; ++i) {
    const auto [ids, labels] = batch(B, T, config.vocab_size);
    batches.push_back({ids, labels, {}});
    count += static_cast<double>(labels.ne(model::kIgnoreIndex).sum().item<int64_t>());
  }
  double want_loss = 0;
  for (const auto& mb : batches) {
    const model::LossSum l = whole->loss_sum(mb.input_ids, mb.labels, /*fused=*/true);
    want_loss += l.sum.item<double>();
    (l.sum / count).backward();
  }
  std::map<std::string, torch::Tensor> whole_params;
  for (const auto& item : whole->named_parameters()) whole_params[item.key()] = item.value();
  const uint64_t part_bytes = static_cast<uint64_t>(B * T * config.hidden_size * 4 / 2);
  for (const bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "the region's sequence parallelism" : "whole states between the regions");
    run_ranks(4, [&](ThreadCommunicator& world) {
      ParallelGroups groups(world, layout::ParallelLayout(4, layout::Sizes{2, 1, 2}));
      auto tp = std::make_shared<TensorParallelGroup>(groups.tensor(), groups.slice_replicas(), sp);
      model::DecoderModel local(config, model::Materialize::kYes, tp);
      {
        torch::NoGradGuard no_grad;
        for (auto& item : local->named_parameters()) {
          item.value().copy_(slice_of(item.key(), whole_params.at(item.key()), tp->rank(), 2));
        }
      }
      const StageRanges stages =
          balance_stages(block_costs(*local), 2, "parallel.pipeline_parallel_size");
      PipelineStage stage(*local, groups.pipeline(), stages, {});
      const model::LossSum got = stage.run(
          batches, [&](const model::LossSum& l) { return l.sum * (1.0 / count); }, "key");
      const int p = groups.coordinate(layout::Axis::kPipeline);
      const std::string at = fmt::format("stage {}, tensor rank {}", p, tp->rank());
      if (p == 1) {
        EXPECT_NEAR(got.sum.item<double>(), want_loss, 1e-5 * std::abs(want_loss)) << at;
      }
      // Stage 0 sends the states forward, stage 1 their gradients back: half of each a rank.
      EXPECT_EQ(groups.pipeline()->stats().bytes_sent.at(comm::CollectiveKind::kSend),
                micro_batches * part_bytes)
          << at;
      for (size_t b : stage.blocks()) {
        for (const model::BlockParameter& param : local->blocks()[b]->parameters) {
          ASSERT_TRUE(param.tensor.grad().defined()) << param.name << ", " << at;
          expect_close(param.placement.partial_gradient
                           ? tp->whole_gradient(param.tensor.grad(), param.placement)
                           : param.tensor.grad(),
                       slice_of(param.name, whole_params.at(param.name).grad(), tp->rank(), 2),
                       param.name + " gradient, " + at);
        }
      }
    });
  }
}

// The engine's step sums the replicated parameters' partial gradients over the tensor-parallel
// group once, after the step's micro-steps and the data-parallel reduction (Megatron-LM's
// finalize_model_grads): Qwen3 (q/k norms) under the region's sequence parallelism (every norm,
// the row-parallel biases), TP 2 × DP 2, 3 micro-steps, ZeRO 0, 2 and 3, and 2 with the optimizer
// offloaded (the host's gradient shard summed through the device's communicator). Plain SGD at
// learning rate 1 makes the step's gradient the update: every parameter after it equals its slice
// of the whole model's after one step, the step all-reduces once over the tensor-parallel group,
// the update does not move into backward (it waits for the sums), and the replicated copies stay
// equal.
TEST(TensorParallelEngine, PartialGradientsAreSummedOnceAStep) {
  const model::ModelConfig config = model::parse_model_config(families()[3].config);  // Qwen3
  const int micro_steps = 3;
  std::vector<PipelineStage::MicroBatch> batches;
  double count = 0;
  for (int i = 0; i < micro_steps; ++i) {
    const auto [ids, labels] = batch(2, 16, config.vocab_size);
    batches.push_back({ids, labels, {}});
    count += static_cast<double>(labels.ne(model::kIgnoreIndex).sum().item<int64_t>());
  }
  model::DecoderModel whole = model::build_model(config, torch::kFloat32, 3);
  for (const auto& mb : batches) {
    (whole->loss_sum(mb.input_ids, mb.labels, /*fused=*/true).sum / count).backward();
  }
  std::map<std::string, torch::Tensor> whole_params;
  for (const auto& item : whole->named_parameters()) whole_params[item.key()] = item.value();
  model::DecoderModel shapes(config, model::Materialize::kNo);
  const model::ValueSource values = model::init_source(*shapes, 3);
  for (const auto& [stage, offload] :
       std::vector<std::pair<int, bool>>{{0, false}, {2, false}, {3, false}, {2, true}}) {
    SCOPED_TRACE("ZeRO stage " + std::to_string(stage) + (offload ? ", optimizer offloaded" : ""));
    run_ranks(4, [&, stage = stage, offload = offload](ThreadCommunicator& world) {
      torch::set_num_threads(1);
      ParallelPlan plan;
      plan.engine.stage = stage;
      plan.engine.offload_optimizer = offload;
      plan.optimizer = testing::sgd();
      plan.initial_values = values;
      plan.tensor_sequence_parallel = true;
      Parallelized p = parallelize(world, layout::ParallelLayout(4, layout::Sizes{1, 1, 2}),
                                   torch::kCPU, config, std::move(plan));
      EXPECT_FALSE(p.engine->can_update_during_backward());
      p.engine->set_step_lr(1.0);  // armed only where no update waits for the sums
      // The master pieces this rank updates, by parameter and element range.
      std::map<std::string, model::Placement> placement;
      for (const auto& block : p.model->blocks()) {
        for (const auto& param : block->parameters) placement[param.name] = param.placement;
      }
      std::vector<torch::Tensor> before;
      for (const zero::StatePiece& piece : p.engine->owned_state())
        before.push_back(piece.tensors.at("master").clone());
      comm::Communicator& tensor = *p.groups->tensor();
      p.stage->run(
          batches, [&](const model::LossSum& l) { return l.sum * (micro_steps / count); }, "key");
      const uint64_t all_reduces = all_reduces_of(tensor);
      p.engine->step(1.0);
      EXPECT_EQ(all_reduces_of(tensor), all_reduces + 1);
      const int rank = p.groups->coordinate(layout::Axis::kTensor);
      const std::string at = "rank " + std::to_string(world.rank());
      const std::vector<zero::StatePiece> after = p.engine->owned_state();
      int partial = 0;
      for (size_t i = 0; i < after.size(); ++i) {
        const zero::StatePiece& piece = after[i];
        const torch::Tensor master = piece.tensors.at("master");
        const torch::Tensor grad =
            slice_of(piece.param, whole_params.at(piece.param).grad(), rank, 2)
                .reshape({-1})
                .narrow(0, piece.elements.begin, piece.elements.end - piece.elements.begin);
        // After the step (not the update alone: a norm's weights near 1 keep too few bits of
        // it for 2e-6; a gradient left partial would be off by half of it, 1e-4 of 1 and more).
        expect_close(master, before[i] - grad, piece.param + " after the step, " + at);
        if (!placement.at(piece.param).partial_gradient) continue;
        ++partial;
        // The tensor-parallel ranks hold the same pieces (one data-parallel rank's partition).
        const torch::Tensor first = p.tensor_parallel->whole(master, placement.at(piece.param));
        EXPECT_TRUE(torch::equal(first, master)) << piece.param << ", " << at;
      }
      EXPECT_GT(partial, 0);
    });
  }
}

TEST(TensorParallelChecks, CountsThatDoNotDivideAreRefusedNamingThem) {
  model::ModelConfig config = model::parse_model_config(base("llama", 2));
  dstrain::testing::expect_error(
      [&] { model::check_tensor_parallel(config, 4, "tiny", "parallel.tensor_parallel_size"); },
      ErrorKind::kConfig,
      {"num_key_value_heads (2) is not divisible by parallel.tensor_parallel_size (4)"});
  config.num_key_value_heads = 4;
  config.vocab_size = 97;
  dstrain::testing::expect_error(
      [&] { model::check_tensor_parallel(config, 2, "tiny", "parallel.tensor_parallel_size"); },
      ErrorKind::kConfig, {"vocab_size (97) is not divisible"});
  dstrain::testing::expect_error([] { check_tensor_parallel_length(30, 1, 4, true); },
                                 ErrorKind::kConfig, {"data.max_length (30)"});
  check_tensor_parallel_length(30, 1, 4, false);  // whole token rows between the regions
}

}  // namespace
}  // namespace dstrain::train
