#pragma once
// `dstrain export` of a LoRA checkpoint: --adapter-only writes a PEFT adapter directory,
// --merge-lora the base model with ΔW = B·A·scale added (Hugging Face format).

#include "ckpt/shards.h"
#include "model/model_config.h"
#include "train/train.h"

namespace dstrain::train {

// Error(kUsage) when the checkpoint is not a LoRA one but a LoRA flag was given, or when it is one
// and neither (or both) flags were given.
void export_lora(const ExportOptions& options, const ckpt::CheckpointReader& reader,
                 const model::ModelConfig& config);

}  // namespace dstrain::train
