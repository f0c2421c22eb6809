// `dstrain debug forward`: flags → train::debug_forward() (lib/train/debug_forward.h), which runs
// one forward and backward pass of a Hugging Face model directory (optionally with a PEFT LoRA
// adapter) and writes logits, loss and gradients. `dstrain debug decode`: the text of every
// document of a token file (data::decode_to_jsonl). They are the dstrain side of the reference
// comparisons (tests/reference, docs/reference.md) and are hidden from
// `dstrain --help` because they are checking tools, not part of training.

#include <cstdio>
#include <memory>
#include <string>

#include "apps/dstrain/command_info.h"
#include "apps/dstrain/commands.h"
#include "data/tokenize_file.h"
#include "train/debug_forward.h"
#include "train/device.h"

namespace dstrain::app {
namespace {

void set_forward_command(CLI::App& debug, int* exit_code) {
  auto* cmd = debug.add_subcommand(
      "forward", "One forward + backward pass; writes logits, loss and gradients (safetensors)");
  cmd->footer(
      "IDS holds int64 'input_ids' [B, T] and optionally 'labels' [B, T] (default: the input "
      "ids).\n"
      "The loss is Hugging Face's causal-LM loss (labels shifted by one inside, -100 ignored).\n"
      "OUT gets 'logits' [B, T, V], 'loss' [] and 'grad.<parameter>' for every parameter, fp32;\n"
      "with --adapter the base is frozen and the gradients are the adapter's "
      "('grad.<module>.lora_A.weight', 'grad.<module>.lora_B.weight').\n"
      "Example:\n"
      "  dstrain debug forward --model hf/qwen2-tiny --ids ids.safetensors --out "
      "dstrain.safetensors\n"
      "  dstrain launch --nproc 2 --exec -- dstrain debug forward --sequence-parallel 2 ...");
  auto o = std::make_shared<train::DebugForwardOptions>();
  cmd->add_option("--model", o->model_dir, "Hugging Face model directory")
      ->required()
      ->type_name("DIR");
  cmd->add_option("--ids", o->ids_path, "safetensors file with 'input_ids' (and 'labels')")
      ->required()
      ->type_name("FILE");
  cmd->add_option("--out", o->out_path, "safetensors file to write")->required()->type_name("FILE");
  cmd->add_option("--dtype", o->dtype, "Compute dtype")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->default_val("float32");
  cmd->add_option("--device", o->device, "Device")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->default_val("cpu");
  cmd->add_option("--adapter", o->adapter_dir,
                  "PEFT LoRA adapter directory to apply, as a LoRA run applies it")
      ->type_name("DIR");
  cmd->add_flag("--eval", o->eval, "Evaluation mode (LoRA dropout off), as model.eval()");
  cmd->add_option("--sequence-parallel", o->sequence_parallel,
                  "Run as one rank of a sequence-parallel group of P processes started by "
                  "'dstrain launch --nproc P --exec -- dstrain debug forward ...' (CPU; T "
                  "divisible by P); rank 0 writes OUT")
      ->type_name("P")
      ->check(CLI::PositiveNumber)
      ->default_val(1);
  cmd->add_option("--tensor-parallel", o->tensor_parallel,
                  "Run as one rank of a tensor-parallel group of T processes started by "
                  "'dstrain launch --nproc T --exec -- dstrain debug forward ...' (CPU), each "
                  "holding 1/T of every layer; rank 0 writes OUT")
      ->type_name("T")
      ->check(CLI::PositiveNumber)
      ->default_val(1);
  cmd->add_option("--tensor-sequence-parallel", o->tensor_sequence_parallel,
                  "With --tensor-parallel: the region's sequence parallelism, as "
                  "parallel.tensor_sequence_parallel")
      ->type_name("BOOL")
      ->default_val(true);
  cmd->callback([o, exit_code] {
    const train::DebugForwardResult r = train::debug_forward(*o);
    if (!r.wrote) {
      *exit_code = 0;
      return;
    }
    std::printf("loss %.8f (%s, %s%s), %lld gradients, wrote %s\n", r.loss, r.dtype.c_str(),
                o->device.c_str(), o->eval ? ", eval" : "", static_cast<long long>(r.gradients),
                o->out_path.c_str());
    *exit_code = 0;
  });
}

void set_decode_command(CLI::App& debug, int* exit_code) {
  auto* cmd = debug.add_subcommand(
      "decode", "Decode every document of a token file; writes JSON Lines {\"text\": ...}");
  cmd->footer(
      "Example:\n"
      "  dstrain debug decode --tokenizer hf/llama --input corpus.tokens --out corpus.jsonl");
  auto o = std::make_shared<data::DecodeOptions>();
  cmd->add_option("--tokenizer", o->tokenizer, "\"byte\" or a tokenizer directory")->required();
  cmd->add_option("--input", o->input, "Token file")->required()->type_name("FILE");
  cmd->add_option("--out", o->output, "JSON Lines file to write")->required()->type_name("FILE");
  cmd->callback([o, exit_code] {
    const int64_t n = data::decode_to_jsonl(*o);
    std::printf("wrote %s: %lld documents\n", o->output.c_str(), static_cast<long long>(n));
    *exit_code = 0;
  });
}

void set_devices_command(CLI::App& debug, int* exit_code) {
  auto* cmd = debug.add_subcommand(
      "devices", "What N ranks of this node would compute on (LibTorch loaded, GPUs looked for)");
  cmd->footer(
      "One line: the LibTorch version and the CUDA devices the ranks would take, or that they\n"
      "compute on the CPU. Exits as a rank would fail at start where one of LOCAL_RANK 0..N-1 has\n"
      "no GPU (3 for a build without CUDA on a node with NVIDIA GPUs, 2 for too few GPUs).\n"
      "'dstrain launch --dry-run --check' runs it on every host.\n"
      "Example:\n"
      "  dstrain debug devices --ranks 8");
  auto ranks = std::make_shared<int>(1);
  cmd->add_option("--ranks", *ranks, "Ranks on this node")
      ->check(CLI::Range(1, 65536))
      ->default_val(1);
  cmd->callback([ranks, exit_code] {
    std::printf("%s\n", train::describe_devices(*ranks).c_str());
    *exit_code = 0;
  });
}

}  // namespace

void set_debug_command(CLI::App& root, int* exit_code) {
  auto* cmd = add_worker_subcommand(root, kDebugCommand);  // hidden; see docs/gpu.md
  cmd->footer(
      "Example:\n"
      "  dstrain debug forward --model hf/qwen2-tiny --ids ids.safetensors --out "
      "dstrain.safetensors\n"
      "  dstrain launch --nproc 2 --exec -- dstrain debug forward --sequence-parallel 2 ...");
  cmd->require_subcommand(1);
  set_forward_command(*cmd, exit_code);
  set_decode_command(*cmd, exit_code);
  set_devices_command(*cmd, exit_code);
}

}  // namespace dstrain::app
