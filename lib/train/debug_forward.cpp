#include "train/debug_forward.h"

#include <filesystem>
#include <memory>
#include <optional>

#include <torch/torch.h>

#include "comm/gloo_communicator.h"
#include "core/error.h"
#include "lora/adapter_io.h"
#include "lora/lora_model.h"
#include "model/model.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "train/sequence_parallel.h"

namespace dstrain::train {
namespace stdfs = std::filesystem;
namespace {

torch::Device parse_device(const std::string& name) {
  if (name == "cuda" && !torch::cuda::is_available()) {
    fail(ErrorKind::kUsage,
         "--device cuda: no CUDA device is available to this build of dstrain (a CPU-only "
         "LibTorch, or no GPU visible); use --device cpu");
  }
  return name == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
}

// A 2-D int64 tensor `name` of the ids file, with every value in [0, vocab); `required` false
// returns an undefined tensor when the file has no such tensor.
torch::Tensor read_ids(const model::SafetensorsFile& file, const std::string& name, int64_t vocab,
                       bool required) {
  const std::string& path = file.path().string();
  if (!file.contains(name)) {
    if (required) fail(ErrorKind::kInput, "{}: no tensor '{}' (expected int64 [B, T])", path, name);
    return {};
  }
  torch::Tensor t = file.read(name);
  if (t.scalar_type() != torch::kInt64 || t.dim() != 2 || t.size(0) < 1 || t.size(1) < 2) {
    fail(ErrorKind::kInput,
         "{}: tensor '{}' must be int64 [B, T] with B >= 1, T >= 2; it is {} with {} dimensions",
         path, name, file.info(name).dtype, t.dim());
  }
  const bool labels = name == "labels";
  const torch::Tensor valid =
      labels ? (t == model::kIgnoreIndex) | ((t >= 0) & (t < vocab)) : (t >= 0) & (t < vocab);
  if (!valid.all().item<bool>()) {
    fail(ErrorKind::kInput, "{}: tensor '{}' holds ids outside [0, {}){}", path, name, vocab,
         labels ? " (other than -100)" : "");
  }
  return t;
}

// HF's shift: position t is scored against labels[:, t + 1]; the last position has no label.
torch::Tensor shift_labels(const torch::Tensor& labels) {
  const torch::Tensor pad = torch::full({labels.size(0), 1}, model::kIgnoreIndex, labels.options());
  return torch::cat({labels.slice(1, 1), pad}, 1);
}

struct Batch {
  torch::Tensor ids;     // [B, T]
  torch::Tensor labels;  // [B, T], HF convention (not shifted)
};

Batch read_batch(const std::string& ids_path, int64_t vocab) {
  if (!stdfs::is_regular_file(ids_path)) {
    fail(ErrorKind::kInput,
         "--ids {}: no such file (expected a safetensors file with int64 'input_ids' [B, T])",
         ids_path);
  }
  const model::SafetensorsFile file(ids_path);
  Batch b{read_ids(file, "input_ids", vocab, true), read_ids(file, "labels", vocab, false)};
  if (!b.labels.defined()) b.labels = b.ids;
  if (b.labels.sizes() != b.ids.sizes()) {
    fail(ErrorKind::kInput, "{}: 'labels' and 'input_ids' differ in shape", ids_path);
  }
  return b;
}

// The LoRA wiring of a LoRA run (parallelize.h, step 1) on an already cast model: base frozen,
// adapters built from the adapter's own settings and loaded, then moved to the model's device and
// dtype as the ZeRO engine's working copies are.
std::unique_ptr<lora::LoraModel> attach_adapter(model::DecoderModel& m, const std::string& dir,
                                                torch::Device device, torch::ScalarType dtype) {
  const lora::Adapter adapter = lora::read_adapter(dir);
  const std::string key = (stdfs::path(dir) / lora::kAdapterConfigFile).string();
  for (auto& p : m->parameters()) p.set_requires_grad(false);
  auto lora_model = std::make_unique<lora::LoraModel>(m, adapter.options, key);
  lora_model->load(adapter.weights, dir);
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : lora_model->named_parameters()) t.set_data(t.detach().to(device, dtype));
  return lora_model;
}

// The sequence-parallel group this process belongs to (null for P = 1), checked against the
// environment, the model and the batch.
struct Group {
  std::unique_ptr<comm::Communicator> world;
  std::unique_ptr<SequenceParallel> sp;
};

Group join_group(const DebugForwardOptions& o, const model::ModelConfig& config, int64_t T) {
  const int p = o.sequence_parallel;
  if (p == 1) return {};
  if (o.device != "cpu") {
    fail(ErrorKind::kUsage, "--sequence-parallel {}: runs on --device cpu only (over Gloo)", p);
  }
  if (T % p != 0) {
    fail(ErrorKind::kInput,
         "--ids {}: the sequence length {} is not divisible by "
         "--sequence-parallel {}",
         o.ids_path, T, p);
  }
  SequenceParallel::check_model(config, p, o.model_dir);
  Group g;
  g.world = comm::make_gloo_communicator(comm::rendezvous_options_from_env());
  if (g.world->world_size() != p) {
    fail(ErrorKind::kUsage,
         "--sequence-parallel {}: expected a world of {} ranks (dstrain launch --nproc {} --exec "
         "-- dstrain debug forward ...), WORLD_SIZE is {}",
         p, p, p, g.world->world_size());
  }
  g.sp = std::make_unique<SequenceParallel>(*g.world, p);
  return g;
}

// The group's ranks' slices [B, T/P, ...] (rank order) → the whole [B, T, ...] on every rank.
torch::Tensor gather_sequence(comm::Communicator& world, const torch::Tensor& slice) {
  const torch::Tensor mine = slice.contiguous();
  torch::Tensor all = torch::empty({world.world_size() * mine.numel()}, mine.options());
  world.all_gather(all, mine.reshape({-1}))->wait();
  std::vector<int64_t> shape{world.world_size()};
  for (int64_t d : mine.sizes()) shape.push_back(d);
  const torch::Tensor rows = all.view(shape).transpose(0, 1);  // [B, P, T/P, ...]
  std::vector<int64_t> whole{mine.size(0), -1};
  for (int64_t d = 2; d < mine.dim(); ++d) whole.push_back(mine.size(d));
  return rows.reshape(whole);
}

}  // namespace

DebugForwardResult debug_forward(const DebugForwardOptions& o) {
  const torch::Device device = parse_device(o.device);
  const model::ModelConfig config = model::load_model_config(o.model_dir);
  const torch::ScalarType dtype = model::resolve_dtype(o.dtype, config);
  const Batch batch = read_batch(o.ids_path, config.vocab_size);

  model::DecoderModel m(config);
  model::load_weights(*m, o.model_dir);
  m->to(device, dtype);
  const std::unique_ptr<lora::LoraModel> lora_model =
      o.adapter_dir.empty() ? nullptr : attach_adapter(m, o.adapter_dir, device, dtype);
  m->train(!o.eval);
  const int64_t T = batch.ids.size(1);
  Group group = join_group(o, config, T);
  data::Batch whole;
  whole.input_ids = batch.ids.to(device);
  whole.labels = shift_labels(batch.labels).to(device);  // shifted before any slicing
  const data::Batch mine = group.sp ? group.sp->slice(whole) : whole;
  const model::Positions positions = group.sp ? group.sp->positions(T) : model::Positions{};
  if (group.sp) group.sp->apply(*m);
  // Loss and gradients as training computes them by default (model.fused_loss): the head fused
  // with the loss. The logits are the head's output on the same hidden states, outside the graph.
  const torch::Tensor hidden = m->hidden_states(mine.input_ids, positions);
  model::LossSum loss_sum = m->head_loss_sum(hidden, mine.labels);
  if (group.sp) loss_sum = group.sp->reduce_loss(loss_sum);
  const torch::Tensor loss = loss_sum.mean();
  loss.backward();
  torch::Tensor logits;
  {
    torch::NoGradGuard no_grad;
    logits = m->head(hidden);
    if (group.world) logits = gather_sequence(*group.world, logits);
  }
  // Each rank of a group holds its share of the gradient; the engine's average is the whole.
  auto group_grad = [&](const torch::Tensor& g) {
    if (!group.world || !g.defined()) return g;
    torch::Tensor sum = g.contiguous().clone();
    group.world->all_reduce(sum, comm::ReduceOp::kAvg)->wait();
    return sum;
  };

  model::NamedTensors out;
  out.emplace_back("logits", logits.detach().to(torch::kCPU, torch::kFloat32));
  out.emplace_back("loss", loss.detach().to(torch::kCPU, torch::kFloat32));
  auto add_grad = [&](const std::string& name, const torch::Tensor& p) {
    const torch::Tensor g = group_grad(p.grad());
    out.emplace_back("grad." + name,
                     g.defined() ? g.to(torch::kCPU, torch::kFloat32) : torch::zeros(p.sizes()));
  };
  if (lora_model) {
    for (const auto& [name, t] : lora_model->named_parameters()) add_grad(name, t);
  } else {
    for (const auto& item : m->named_parameters()) add_grad(item.key(), item.value());
  }
  if (group.world && group.world->rank() != 0) {
    return {loss.item<double>(), model::dtype_name(dtype), 0, false};
  }
  model::write_safetensors(
      o.out_path, out, std::nullopt,
      {{"format", "pt"}, {"dtype", model::dtype_name(dtype)}, {"device", o.device}});
  return {loss.item<double>(), model::dtype_name(dtype), static_cast<int64_t>(out.size()) - 2};
}

}  // namespace dstrain::train
