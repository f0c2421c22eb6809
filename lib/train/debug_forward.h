#pragma once
// `dstrain debug forward`: one forward and backward pass of a Hugging Face model directory on
// given token ids, with logits, loss and gradients written to a safetensors file. It is the
// dstrain side of the reference comparisons (tests/reference), so it runs the model as training
// does, through train::parallelize() (parallelize.h): the model built without memory, with an
// adapter the LoRA wiring of a LoRA run (frozen base, adapters from lib/lora), with
// sequence_parallel its attention over the group, and the ZeRO engine (stage 0) filling the
// parameters from the files in the compute dtype and averaging the gradients over the ranks in
// its backward. Nothing is updated.
//
// Loss: the Hugging Face causal-LM loss, computed as training computes it by default (the head
// fused with the loss, model.fused_loss; the logits written are the head's output on the same
// hidden states). HF shifts inside the loss (logits[:, t] predicts labels[:, t + 1]); the model's
// losses do not shift, so the labels are shifted here:
// aligned[:, t] = labels[:, t + 1], aligned[:, T - 1] = -100. Without a "labels" tensor the labels
// are the input ids, as in `model(input_ids, labels=input_ids)`.

#include <cstdint>
#include <string>

namespace dstrain::train {

struct DebugForwardOptions {
  std::string model_dir;  // Hugging Face model directory (config.json + safetensors)
  // safetensors: int64 "input_ids" [B, T], optional "labels" [B, T] and "position_ids" [B, T]:
  // positions restarting at 0 make the rows packed documents, each attending only to itself at
  // positions from 0 (as transformers reads position ids without an attention mask).
  std::string ids_path;
  std::string out_path;           // safetensors file to write
  std::string dtype = "float32";  // compute dtype: float32 | bfloat16 (| float16, auto)
  std::string device = "cpu";     // cpu | cuda
  // A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) applied to the
  // model as a LoRA run applies it (its r, lora_alpha, lora_dropout, target_modules, use_rslora).
  // Empty: the plain model.
  std::string adapter_dir;
  // Evaluation mode (as model.eval()): LoRA dropout off. Otherwise training mode, as in training.
  bool eval = false;
  // P > 1: this process is one rank of a sequence-parallel group of P processes over Gloo (RANK,
  // WORLD_SIZE = P, MASTER_ADDR, MASTER_PORT, as `dstrain launch --nproc P --exec` sets them),
  // running the training code path of sequence_parallel.h on its T/P tokens of each sequence;
  // rank 0 writes the file with the whole sequences' logits and the group's gradients. CPU only.
  int sequence_parallel = 1;
  // T > 1: one rank of a tensor-parallel group of T processes over Gloo (as above, WORLD_SIZE =
  // T), holding its slice of the model (tensor_parallel.h), with the region's sequence
  // parallelism when tensor_sequence_parallel; rank 0 writes the whole logits and the whole
  // parameters' gradients. CPU only; not with sequence_parallel.
  int tensor_parallel = 1;
  bool tensor_sequence_parallel = true;
};

struct DebugForwardResult {
  double loss = 0;
  std::string dtype;      // the compute dtype's name
  int64_t gradients = 0;  // how many "grad.*" tensors were written
  bool wrote = true;      // false on ranks other than 0 of a sequence-parallel group
};

// Writes to `out_path`: "logits" [B, T, V], "loss" [] and, without an adapter, "grad.<parameter>"
// for every model parameter; with one, "grad.<module>.lora_A.weight" / "lora_B.weight" for every
// adapted module (the base is frozen, as in a LoRA run). All float32 on the CPU.
// Error(kUsage) for --device cuda without a GPU, for sequence_parallel or tensor_parallel with
// cuda, with each other or in a world of another size; Error(kInput) when T is not divisible by
// sequence_parallel (or, with the region's sequence parallelism, B·T by tensor_parallel);
// Error(kConfig) for a model tensor_parallel cannot split; Error(kInput) for a
// missing or malformed ids file (ids outside the vocabulary, shapes) and for an adapter lib/lora
// cannot use or that does not fit the model (lora/adapter_io.h, LoraModel::load).
DebugForwardResult debug_forward(const DebugForwardOptions& options);

}  // namespace dstrain::train
