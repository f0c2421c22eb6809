#include "train/debug_forward.h"

#include <filesystem>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <torch/torch.h>

#include "comm/gloo_communicator.h"
#include "comm/solo_communicator.h"
#include "core/error.h"
#include "lora/adapter_io.h"
#include "lora/lora_model.h"
#include "model/model.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "optim/optimizer.h"
#include "train/parallel_groups.h"
#include "train/parallelize.h"
#include "train/sequence_parallel.h"
#include "train/tensor_parallel.h"

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
  // From 'position_ids' [B, T] restarting at 0 per document: the rows are packed documents.
  std::shared_ptr<const model::Documents> documents;
};

Batch read_batch(const std::string& ids_path, int64_t vocab) {
  if (!stdfs::is_regular_file(ids_path)) {
    fail(ErrorKind::kInput,
         "--ids {}: no such file (expected a safetensors file with int64 'input_ids' [B, T])",
         ids_path);
  }
  const model::SafetensorsFile file(ids_path);
  Batch b;
  b.ids = read_ids(file, "input_ids", vocab, true);
  b.labels = read_ids(file, "labels", vocab, false);
  if (!b.labels.defined()) b.labels = b.ids;
  if (b.labels.sizes() != b.ids.sizes()) {
    fail(ErrorKind::kInput, "{}: 'labels' and 'input_ids' differ in shape", ids_path);
  }
  if (file.contains("position_ids")) {
    const torch::Tensor p = file.read("position_ids");
    std::optional<model::Documents> documents;
    if (p.scalar_type() == torch::kInt64 && p.sizes() == b.ids.sizes()) {
      documents = model::Documents::from_position_ids(p);
    }
    if (!documents) {
      fail(ErrorKind::kInput,
           "{}: tensor 'position_ids' must be int64 [B, T] like 'input_ids', 0 at the start of "
           "each row and of each packed document, counting up by 1 within one",
           ids_path);
    }
    b.documents = std::make_shared<const model::Documents>(std::move(*documents));
  }
  return b;
}

// The group this process belongs to (sequence- or tensor-parallel; a solo world for neither),
// checked against the environment, the model and the batch.
struct Group {
  std::unique_ptr<comm::Communicator> world;
  std::unique_ptr<ParallelGroups> groups;  // the layout's, of one axis
  std::shared_ptr<TensorParallelGroup> tp;
  std::unique_ptr<SequenceParallel> sp;
};

Group join_group(const DebugForwardOptions& o, const model::ModelConfig& config, int64_t B,
                 int64_t T) {
  const int p = o.sequence_parallel, t = o.tensor_parallel, n = p * t;
  Group g;
  if (n == 1) {
    g.world = comm::make_solo_communicator();
  } else {
    const std::string flag =
        p > 1 ? fmt::format("--sequence-parallel {}", p) : fmt::format("--tensor-parallel {}", t);
    if (p > 1 && t > 1) {
      fail(ErrorKind::kUsage, "--sequence-parallel and --tensor-parallel: one or the other");
    }
    if (o.device != "cpu")
      fail(ErrorKind::kUsage, "{}: runs on --device cpu only (over Gloo)", flag);
    if (T % p != 0) {
      fail(ErrorKind::kInput, "--ids {}: the sequence length {} is not divisible by {}", o.ids_path,
           T, flag);
    }
    if (t > 1 && o.tensor_sequence_parallel && (B * T) % t != 0) {
      fail(ErrorKind::kInput, "--ids {}: the {} x {} tokens are not divisible by {}", o.ids_path, B,
           T, flag);
    }
    model::check_tensor_parallel(config, t, o.model_dir, "--tensor-parallel");
    SequenceParallel::check_model(config, p, o.model_dir);
    g.world = comm::make_gloo_communicator(comm::rendezvous_options_from_env());
    if (g.world->world_size() != n) {
      fail(ErrorKind::kUsage,
           "{}: expected a world of {} ranks (dstrain launch --nproc {} --exec -- dstrain debug "
           "forward ...), WORLD_SIZE is {}",
           flag, n, n, g.world->world_size());
    }
  }
  layout::Sizes sizes;
  sizes.sequence = p;
  sizes.tensor = t;
  g.groups = std::make_unique<ParallelGroups>(*g.world, layout::ParallelLayout(n, sizes));
  g.tp = std::make_shared<TensorParallelGroup>(g.groups->tensor(), g.groups->slice_replicas(),
                                               o.tensor_sequence_parallel);
  g.sp = std::make_unique<SequenceParallel>(g.groups->sequence());
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

// The plan of a run that trains the model directory's weights (with the adapter, its adapters) in
// `dtype` at ZeRO stage 0, each bucket's gradient averaged over the ranks by the end of backward;
// nothing is ever updated.
// With tensor parallelism `m` is this rank's slice, which reads its slices of the files' values.
ParallelPlan debug_plan(const DebugForwardOptions& o, model::DecoderModel m,
                        TensorParallelGroup& tp, torch::ScalarType dtype) {
  ParallelPlan plan;
  plan.engine.stage = 0;
  plan.engine.compute_dtype = dtype;
  plan.engine.overlap_comm = false;
  plan.optimizer = [](int64_t numel, std::vector<optim::Range>) {
    return optim::make_sgd(numel, optim::SgdOptions{});
  };
  // The files hold the whole model.
  model::DecoderModel whole =
      tp.size() == 1 ? m : model::DecoderModel(m->config(), model::Materialize::kNo);
  plan.initial_values = model::weights_source(o.model_dir, *whole);
  if (tp.size() > 1) plan.initial_values = slice_source(plan.initial_values, *m, tp);
  if (!o.adapter_dir.empty()) {
    lora::Adapter adapter = lora::read_adapter(o.adapter_dir);
    LoraPlan l;
    l.options = adapter.options;
    l.key = (stdfs::path(o.adapter_dir) / lora::kAdapterConfigFile).string();
    l.load = std::move(adapter.weights);
    l.load_source = o.adapter_dir;
    plan.lora = std::move(l);
  }
  return plan;
}

}  // namespace

DebugForwardResult debug_forward(const DebugForwardOptions& o) {
  const torch::Device device = parse_device(o.device);
  const model::ModelConfig config = model::load_model_config(o.model_dir);
  const torch::ScalarType dtype = model::resolve_dtype(o.dtype, config);
  const Batch batch = read_batch(o.ids_path, config.vocab_size);
  const int64_t T = batch.ids.size(1);
  Group group = join_group(o, config, batch.ids.size(0), T);
  TensorParallelGroup& tp = *group.tp;

  // The model as a run builds it: without memory (this rank's slice with tensor parallelism), then
  // parallelize() (LoRA, sequence parallelism, the engine filling the parameters from the files in
  // the compute dtype).
  model::DecoderModel m(config, model::Materialize::kNo,
                        tp.size() > 1 ? group.tp : std::shared_ptr<TensorParallelGroup>());
  Parallelized parallel =
      parallelize(m, {tp.replicas(), device, *group.sp}, debug_plan(o, m, tp, dtype));
  m->train(!o.eval);
  data::Batch whole;
  whole.input_ids = batch.ids.to(device);
  whole.labels = shift_labels(batch.labels).to(device);  // shifted before any slicing
  const data::Batch mine = group.sp->slice(whole);
  model::Positions positions = group.sp->positions(T);
  positions.documents = batch.documents;
  // Loss and gradients as training computes them by default (model.fused_loss): the head fused
  // with the loss, the engine's backward averaging the gradients over the ranks. The logits are
  // the head's output on the same hidden states, outside the graph.
  // A MoE model's router losses as config.json asks (output_router_logits), added to the loss.
  const torch::Tensor hidden = m->hidden_states(mine.input_ids, positions);
  model::LossSum local = m->head_loss_sum(hidden, mine.labels);
  if (model::RouterRecord* r = m->last_router()) local.router = r->totals(local.sum);
  const model::LossSum summed = group.sp->reduce_loss(local);
  torch::Tensor loss = summed.mean();
  torch::Tensor aux;
  if (summed.router.defined()) {
    const model::RouterLosses r = model::router_losses(summed.router);
    loss = loss + r.weighted(config.moe);
    aux = r.aux;
  }
  parallel.engine->backward(loss, {0, 1});
  torch::Tensor logits;
  {
    torch::NoGradGuard no_grad;
    logits = m->head(hidden);
    // The region's sequence parallelism: the token rows of every row, [B·T, V].
    if (logits.dim() == 2) logits = logits.view({batch.ids.size(0), T, -1});
    if (group.sp->size() > 1) logits = gather_sequence(*group.world, logits);
  }

  model::NamedTensors out;
  out.emplace_back("logits", logits.detach().to(torch::kCPU, torch::kFloat32));
  out.emplace_back("loss", loss.detach().to(torch::kCPU, torch::kFloat32));
  if (config.moe.aux_loss) out.emplace_back("aux_loss", aux.detach().to(torch::kCPU));
  // The whole parameter's gradient (with tensor parallelism gathered from the slices).
  const PlacedShapes placed = placed_shapes(*m, parallel.lora.get());
  auto add_grad = [&](const std::string& name, const torch::Tensor& p) {
    const torch::Tensor g = p.grad();
    const torch::Tensor mine = g.defined() ? g.to(torch::kFloat32) : torch::zeros(p.sizes());
    out.emplace_back("grad." + name,
                     tp.whole_gradient(mine, placed.at(name).placement).to(torch::kCPU));
  };
  if (parallel.lora) {
    for (const auto& [name, t] : parallel.lora->named_parameters()) add_grad(name, t);
  } else {
    for (const auto& item : m->named_parameters()) add_grad(item.key(), item.value());
  }
  if (group.world->rank() != 0) {
    return {loss.item<double>(), model::dtype_name(dtype), 0, false};
  }
  model::write_safetensors(
      o.out_path, out, std::nullopt,
      {{"format", "pt"}, {"dtype", model::dtype_name(dtype)}, {"device", o.device}});
  return {loss.item<double>(), model::dtype_name(dtype), static_cast<int64_t>(out.size()) - 2};
}

}  // namespace dstrain::train
