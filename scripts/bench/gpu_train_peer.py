#!/usr/bin/env python3
"""The PyTorch peer of scripts/bench/gpu-train: one (seq, micro, mode) training case on one GPU.

  gpu_train_peer.py MODEL_DIR --seq T --micro B --steps S --warmup W --mode full|lora
                    [--precision master|autocast] [--liger] [--gradient-checkpointing]
                    [--memory-fraction F]

A transformers model built from MODEL_DIR/config.json (random init, SDPA attention) trained with
torch.optim.AdamW(fused=True) on random token ids. Precision "master" (default, as dstrain's
training.bf16): bf16 parameters for forward/backward, fp32 master weights and moments in the
optimizer, the updated master copied back to bf16. "autocast": fp32 parameters under
torch.autocast(bfloat16). LoRA (peft): r=16, alpha=32 on q/k/v/o_proj, base weights frozen bf16,
adapters fp32 (peft's default) under autocast.
--liger: transformers + Liger kernels (liger-kernel's apply_liger_kernel_to_qwen2, or _to_llama
for a Llama config, before the model is built: RMSNorm, RoPE, SwiGLU and the fused linear
cross-entropy, which never materialises the logits); the loss is then the model's own
(`shift_labels`: the same positions and targets as without Liger). --gradient-checkpointing:
transformers' non-reentrant checkpointing of every decoder layer. --memory-fraction:
torch.cuda.set_per_process_memory_fraction(F) first, so that the caching allocator may hold at
most F of the GPU's memory (scripts/bench/long-seq's budget; dstrain's
DSTRAIN_CUDA_MEMORY_FRACTION).
Prints one JSON line: tokens_per_s (median over the steps after warm-up, CUDA events),
step_ms, max_allocated_gb, max_reserved_gb. Exit 3 on CUDA out of memory (the caller's batch
search), 1 on other errors.
"""

import argparse
import json
import statistics
import sys
import time

import torch

START = time.monotonic()


def progress(what):
    """Where the time goes, on stderr (the caller's log): import, model build, each step."""
    print(f"[peer {time.monotonic() - START:6.1f} s] {what}", file=sys.stderr, flush=True)


def build(args):
    import transformers
    progress(f"transformers {transformers.__version__} imported")
    config = transformers.AutoConfig.from_pretrained(args.model_dir)
    if args.liger:
        import liger_kernel
        import liger_kernel.transformers as liger
        from importlib.metadata import version
        apply = {"qwen2": liger.apply_liger_kernel_to_qwen2,
                 "llama": liger.apply_liger_kernel_to_llama}[config.model_type]
        apply(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
              fused_linear_cross_entropy=True)
        progress(f"liger-kernel {version('liger-kernel')} applied to {config.model_type} (from "
                 f"{liger_kernel.__path__[0]})")
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.precision == "master" or args.mode == "lora" else torch.float32
    # Built on the device: a random init of 0.5B parameters on the host takes tens of seconds.
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation="sdpa")
    model.train()
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    progress("model built on cuda" + (", gradient checkpointing" if args.gradient_checkpointing
                                      else ""))
    if args.mode == "lora":
        import peft
        lora = peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, bias="none",
                               target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                               task_type="CAUSAL_LM")
        model = peft.get_peft_model(model, lora)
    return model, config.vocab_size


class MasterAdamW:
    """bf16 model parameters with fp32 master copies updated by fused AdamW."""

    def __init__(self, params, lr):
        self.params = [p for p in params if p.requires_grad]
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.opt = torch.optim.AdamW(self.master, lr=lr, weight_decay=0.0, fused=True)

    def step(self):
        for p, m in zip(self.params, self.master):
            m.grad = p.grad.float()
        self.opt.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.master):
                p.copy_(m)
                p.grad = None
        for m in self.master:
            m.grad = None


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("model_dir")
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--micro", type=int, required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--mode", choices=["full", "lora"], default="full")
    p.add_argument("--precision", choices=["master", "autocast"], default="master")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="torch.profiler over this many steps after two, as dstrain's "
                        "logging.profile_steps")
    p.add_argument("--profile-out", help="where the profile's Chrome trace goes")
    p.add_argument("--liger", action="store_true", help="transformers + Liger kernels")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--memory-fraction", type=float,
                   help="torch.cuda.set_per_process_memory_fraction: the allocator's limit")
    args = p.parse_args(argv)
    if args.memory_fraction is not None:
        if not 0 < args.memory_fraction <= 1:
            p.error(f"--memory-fraction {args.memory_fraction}: expected a number in (0, 1]")
        torch.cuda.set_per_process_memory_fraction(args.memory_fraction)
    try:
        model, vocab = build(args)
        trainable = [q for q in model.parameters() if q.requires_grad]
        master = args.mode == "full" and args.precision == "master"
        opt = (MasterAdamW(trainable, 1e-5) if master
               else torch.optim.AdamW(trainable, lr=1e-5, weight_decay=0.0, fused=True))
        g = torch.Generator(device="cuda").manual_seed(1)
        times = []
        profiler = None
        for step in range(args.warmup + args.steps):
            if args.profile_steps and step == 2:
                torch.cuda.synchronize()
                profiler = torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU,
                                torch.profiler.ProfilerActivity.CUDA], record_shapes=True)
                profiler.__enter__()
            ids = torch.randint(0, vocab, (args.micro, args.seq + 1), device="cuda", generator=g)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=not master):
                if args.liger:
                    loss = model(input_ids=ids[:, :-1], shift_labels=ids[:, 1:]).loss
                else:
                    logits = model(input_ids=ids[:, :-1]).logits
            if not args.liger:
                loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab),
                                                         ids[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            if not master:
                opt.zero_grad(set_to_none=True)
            end.record()
            end.synchronize()
            progress(f"step {step + 1}: {start.elapsed_time(end):.1f} ms")
            if profiler is not None and step == 1 + args.profile_steps:
                profiler.__exit__(None, None, None)
                profiler.export_chrome_trace(args.profile_out)
                progress(f"profile of steps 3-{step + 1}: {args.profile_out}")
                profiler = None
            if step >= args.warmup:
                times.append(start.elapsed_time(end) / 1e3)
    except torch.cuda.OutOfMemoryError:
        print(json.dumps({"oom": True}))
        return 3
    step_s = statistics.median(times)
    print(json.dumps({
        "tokens_per_s": args.micro * args.seq / step_s, "step_ms": step_s * 1e3,
        "max_allocated_gb": torch.cuda.max_memory_allocated() / 2**30,
        "max_reserved_gb": torch.cuda.max_memory_reserved() / 2**30,
        "loss": loss.item()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
