// `dstrain debug forward`: one forward and backward pass of a Hugging Face model directory on given
// token ids, with logits, loss and every parameter's gradient written to a safetensors file. It is
// the dstrain side of the reference comparisons in scripts/gpu/parity.py (docs/gpu.md) and is
// hidden from `dstrain --help` because it is a checking tool, not part of training.
//
// Loss: the Hugging Face causal-LM loss. HF shifts inside the loss (logits[:, t] predicts
// labels[:, t + 1]); model::causal_lm_loss does not shift, so the labels are shifted here:
// aligned[:, t] = labels[:, t + 1], aligned[:, T - 1] = -100. Without a "labels" tensor the labels
// are the input ids, as in `model(input_ids, labels=input_ids)`.

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include <torch/torch.h>

#include "apps/dstrain/commands.h"
#include "core/error.h"
#include "model/model.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace dstrain::app {
namespace {

struct DebugForwardArgs {
  std::string model_dir;
  std::string ids_path;
  std::string out_path;
  std::string dtype = "float32";
  std::string device = "cpu";
};

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

void run_debug_forward(const DebugForwardArgs& a) {
  const torch::Device device = parse_device(a.device);
  if (!std::filesystem::is_regular_file(a.ids_path)) {
    fail(ErrorKind::kInput,
         "--ids {}: no such file (expected a safetensors file with int64 "
         "'input_ids' [B, T])",
         a.ids_path);
  }
  const model::ModelConfig config = model::load_model_config(a.model_dir);
  const torch::ScalarType dtype = model::resolve_dtype(a.dtype, config);
  const model::SafetensorsFile ids_file(a.ids_path);
  const torch::Tensor ids = read_ids(ids_file, "input_ids", config.vocab_size, true);
  torch::Tensor labels = read_ids(ids_file, "labels", config.vocab_size, false);
  if (!labels.defined()) labels = ids;
  if (labels.sizes() != ids.sizes()) {
    fail(ErrorKind::kInput, "{}: 'labels' and 'input_ids' differ in shape", a.ids_path);
  }

  model::DecoderModel m(config);
  model::load_weights(*m, a.model_dir);
  m->to(device, dtype);
  m->train();
  const torch::Tensor logits = m->forward(ids.to(device));
  const torch::Tensor loss = model::causal_lm_loss(logits, shift_labels(labels).to(device));
  loss.backward();

  model::NamedTensors out;
  out.emplace_back("logits", logits.detach().to(torch::kCPU, torch::kFloat32));
  out.emplace_back("loss", loss.detach().to(torch::kCPU, torch::kFloat32));
  for (const auto& item : m->named_parameters()) {
    const torch::Tensor& g = item.value().grad();
    out.emplace_back("grad." + item.key(), g.defined() ? g.to(torch::kCPU, torch::kFloat32)
                                                       : torch::zeros(item.value().sizes()));
  }
  model::write_safetensors(
      a.out_path, out, std::nullopt,
      {{"format", "pt"}, {"dtype", model::dtype_name(dtype)}, {"device", a.device}});
  std::printf("loss %.8f (%s, %s), %lld parameters with gradients, wrote %s\n", loss.item<double>(),
              model::dtype_name(dtype).c_str(), a.device.c_str(),
              static_cast<long long>(out.size() - 2), a.out_path.c_str());
}

void set_forward_command(CLI::App& debug, int* exit_code) {
  auto* cmd = debug.add_subcommand(
      "forward", "One forward + backward pass; writes logits, loss and gradients (safetensors)");
  cmd->footer(
      "IDS holds int64 'input_ids' [B, T] and optionally 'labels' [B, T] (default: the input "
      "ids).\n"
      "The loss is Hugging Face's causal-LM loss (labels shifted by one inside, -100 ignored).\n"
      "OUT gets 'logits' [B, T, V], 'loss' [] and 'grad.<parameter>' for every parameter, fp32.\n"
      "Example:\n"
      "  dstrain debug forward --model hf/qwen2-tiny --ids ids.safetensors --out "
      "dstrain.safetensors");
  auto a = std::make_shared<DebugForwardArgs>();
  cmd->add_option("--model", a->model_dir, "Hugging Face model directory")
      ->required()
      ->type_name("DIR");
  cmd->add_option("--ids", a->ids_path, "safetensors file with 'input_ids' (and 'labels')")
      ->required()
      ->type_name("FILE");
  cmd->add_option("--out", a->out_path, "safetensors file to write")->required()->type_name("FILE");
  cmd->add_option("--dtype", a->dtype, "Compute dtype")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->default_val("float32");
  cmd->add_option("--device", a->device, "Device")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->default_val("cpu");
  cmd->callback([a, exit_code] {
    run_debug_forward(*a);
    *exit_code = 0;
  });
}

}  // namespace

void set_debug_command(CLI::App& root, int* exit_code) {
  // An empty group hides the command from `dstrain --help`; it is documented in docs/gpu.md.
  auto* cmd = root.add_subcommand("debug", "Checking tools (reference comparisons)")->group("");
  cmd->require_subcommand(1);
  set_forward_command(*cmd, exit_code);
}

}  // namespace dstrain::app
