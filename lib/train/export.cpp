// `dstrain export`: checkpoint shards → a Hugging Face model directory. Parameters are assembled
// one at a time from the fp32 master pieces of every shard (so shards written at any world size or
// stage export the same way) and written in the chosen dtype.

#include <filesystem>

#include <torch/torch.h>

#include "ckpt/layout.h"
#include "ckpt/shards.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "model/model.h"
#include "model/model_config.h"
#include "model/weights.h"
#include "train/lora_export.h"
#include "train/train.h"

namespace dstrain::train {
namespace stdfs = std::filesystem;

int run_export(const ExportOptions& options) {
  if (options.out_dir.empty()) fail(ErrorKind::kUsage, "export: --out DIR is required");
  const std::string tag_dir = ckpt::resolve_checkpoint(options.checkpoint);
  ckpt::CheckpointReader reader(tag_dir);
  const model::ModelConfig mc =
      model::load_model_config(stdfs::path(tag_dir) / ckpt::kModelConfigFile);
  const std::string dtype_name =
      options.dtype == "auto" ? reader.manifest().value("compute_dtype", "float32") : options.dtype;
  const torch::ScalarType dtype = model::resolve_dtype(dtype_name, mc);

  torch::NoGradGuard no_grad;
  if (options.adapter_only || options.merge_lora || reader.manifest().contains("lora")) {
    export_lora(options, reader, mc);
  } else {
    model::DecoderModel m(mc);
    for (auto& p : m->named_parameters()) {
      p.value().copy_(reader.read_full("master", p.key()));
    }
    model::save_weights(*m, options.out_dir, dtype);
  }
  int copied = 0;
  for (const char* name : ckpt::kTokenizerFiles) {
    const stdfs::path src = stdfs::path(tag_dir) / name;
    if (stdfs::is_regular_file(src)) {
      fs::write_file_atomic(stdfs::path(options.out_dir) / name, fs::read_file(src));
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
