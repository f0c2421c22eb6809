#include <memory>

#include "apps/dstrain/command_info.h"
#include "apps/dstrain/commands.h"
#include "train/train.h"

namespace dstrain::app {

void set_export_command(CLI::App& root, int* exit_code) {
  auto* cmd = add_worker_subcommand(root, kExportCommand);
  cmd->footer(
      "Writes config.json, model.safetensors (or shards + model.safetensors.index.json) and the\n"
      "run's tokenizer files. Works for checkpoints of any world size and ZeRO stage.\n"
      "A LoRA checkpoint needs --adapter-only (a PEFT adapter directory, checked to load in\n"
      "PEFT) or --merge-lora (the merged model; the base model must be the one trained on).\n"
      "Examples:\n"
      "  dstrain export runs/tiny/checkpoints/latest --out runs/tiny/hf --dtype bfloat16\n"
      "  dstrain export runs/lora/checkpoints/latest --adapter-only --out runs/lora/adapter");
  auto o = std::make_shared<train::ExportOptions>();
  cmd->add_option("CKPT", o->checkpoint, "The checkpoint to export")->required()->type_name("");
  cmd->add_option("--out", o->out_dir, "Output directory")->required()->type_name("DIR");
  cmd->add_option("--dtype", o->dtype, "auto (the run's compute dtype), float32, bfloat16, float16")
      ->check(CLI::IsMember({"auto", "float32", "bfloat16", "float16"}))
      ->default_val("auto");
  auto* adapter = cmd->add_flag("--adapter-only", o->adapter_only,
                                "LoRA checkpoint: write the PEFT adapter (adapter_config.json + "
                                "adapter_model.safetensors; auto dtype = float32)");
  cmd->add_flag("--merge-lora", o->merge_lora,
                "LoRA checkpoint: write the base model with the adapter merged in")
      ->excludes(adapter);
  cmd->callback([o, exit_code] { *exit_code = train::run_export(*o); });
}

}  // namespace dstrain::app
