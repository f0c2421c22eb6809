// `dstrain export`: checkpoint shards → a Hugging Face model directory. The model is never built:
// each parameter is assembled from the fp32 master pieces of every checkpoint shard (so shards
// written at any world size or stage export the same way) only when the safetensors writer
// reaches it, cast to the chosen dtype, written and dropped, so memory holds one parameter at a
// time. Large models are split into shards with an index, as save_weights() does.

#include <filesystem>
#include <map>

#include <torch/torch.h>

#include "ckpt/layout.h"
#include "ckpt/shards.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/shared_files.h"
#include "model/expert_names.h"
#include "model/model.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "train/lora_export.h"
#include "train/train.h"

namespace dstrain::train {
namespace stdfs = std::filesystem;
namespace {

// A tensor to write: the Hub's name and shape, and which elements of which parameter it holds.
struct ExportTensor {
  model::TensorSpec spec;
  std::string param;
  int64_t offset = 0;
};

// The model's parameters in its named_parameters() order (the order Hugging Face writes), with
// the shapes the checkpoint stored, under the Hub's names (a MoE model's expert stacks one tensor
// per expert and projection: expert_names.h). Error(kInput) when the checkpoint lacks one or
// disagrees.
std::vector<ExportTensor> export_tensors(const ckpt::CheckpointReader& reader,
                                         const model::ModelConfig& mc) {
  std::map<std::string, std::vector<int64_t>> stored;
  for (auto& [name, shape] : reader.params("master")) stored[name] = shape;
  std::vector<ExportTensor> specs;
  const model::DecoderModel m(mc, model::Materialize::kNo);
  for (const auto& block : m->blocks()) {
    for (const model::BlockParameter& p : block->parameters) {
      const auto it = stored.find(p.name);
      int64_t numel = 1;
      if (it != stored.end()) {
        for (int64_t d : it->second) numel *= d;
      }
      if (it == stored.end() || numel != p.tensor.numel()) {
        fail(ErrorKind::kInput, "{}: the checkpoint has no master weights of '{}' with {} elements",
             reader.dir(), p.name, p.tensor.numel());
      }
      const std::vector<model::HubPiece> pieces = model::hub_pieces(mc, p.name, it->second);
      if (pieces.empty()) specs.push_back({{p.name, it->second}, p.name, 0});
      for (const model::HubPiece& piece : pieces) {
        specs.push_back({{piece.name, piece.shape}, p.name, piece.offset});
      }
    }
  }
  return specs;
}

}  // namespace

int run_export(const ExportOptions& options) {
  if (options.out_dir.empty()) fail(ErrorKind::kUsage, "export: --out DIR is required");
  const std::string tag_dir = ckpt::resolve_checkpoint(options.checkpoint);
  ckpt::CheckpointReader reader(tag_dir);
  const model::ModelConfig mc =
      model::load_model_config(stdfs::path(tag_dir) / ckpt::kModelConfigFile);
  const std::string dtype_name =
      options.dtype == "auto" ? reader.manifest().compute_dtype : options.dtype;
  const torch::ScalarType dtype = model::resolve_dtype(dtype_name, mc);

  torch::NoGradGuard no_grad;
  const stdfs::path out(options.out_dir);
  if (options.adapter_only || options.merge_lora ||
      reader.manifest().component("lora") != nullptr) {
    export_lora(options, reader, mc);
  } else {
    const std::vector<ExportTensor> tensors = export_tensors(reader, mc);
    std::vector<model::TensorSpec> specs;
    std::map<std::string, const ExportTensor*> by_name;
    for (const ExportTensor& t : tensors) {
      specs.push_back(t.spec);
      by_name[t.spec.name] = &t;
    }
    // The pieces of one parameter come in a row: the last parameter read serves them all.
    std::string held_name;
    torch::Tensor held;
    model::write_safetensors_dir_streamed(
        out, specs, dtype,
        [&](const model::TensorSpec& spec) {
          const ExportTensor& t = *by_name.at(spec.name);
          if (t.param != held_name) {
            held = torch::Tensor();
            held = reader.read_full("master", t.param);
            held_name = t.param;
          }
          if (t.param == spec.name) return held;
          int64_t numel = 1;
          for (int64_t d : spec.shape) numel *= d;
          return held.reshape({-1}).narrow(0, t.offset, numel).view(spec.shape);
        },
        options.max_shard_bytes);
    fs::write_file_atomic(out / shared_files::kModelConfig,
                          model::to_json(mc, model::dtype_name(dtype)).dump(2) + "\n");
  }
  int copied = 0;
  for (const char* name : ckpt::kTokenizerFiles) {
    const stdfs::path src = stdfs::path(tag_dir) / name;
    if (stdfs::is_regular_file(src)) {
      fs::write_file_atomic(out / name, fs::read_file(src));
      ++copied;
    }
  }
  log::info("exported {} ({} parameters, {}) to {}{}", tag_dir, mc.num_parameters(true),
            model::dtype_name(dtype), options.out_dir,
            copied ? fmt::format(" with {} tokenizer file(s)", copied)
                   : std::string(" (the run used no tokenizer files)"));
  return 0;
}

}  // namespace dstrain::train
