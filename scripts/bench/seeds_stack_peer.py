#!/usr/bin/env python3
"""The users' own stack as a peer of scripts/bench/gpu-train: transformers + PEFT + DeepSpeed's
engine, set up from a train.yaml the way the users' training script does it, on one GPU.

  seeds_stack_peer.py --config_yml TRAIN_YAML --steps S --warmup W [--device cuda|cpu]
                      [--doc-len 4096 | --token-file F] [--attn eager|sdpa]

TRAIN_YAML is the users' config (SEEDS_TRAIN_YAML below: Qwen2.5-0.5B, LoRA r=16 on
q/k/v/o_proj, ZeRO-3, micro-batch 1 x accumulation 8, 1024 tokens, bf16) with model.name_or_path a
directory holding only a config.json: the weights are random (no download), built on the device.
What follows their script:
- model: AutoModelForCausalLM in bf16 (training.bf16), attention "eager" unless
  training.use_flash_attn (their choice; --attn sdpa overrides it for a comparison);
- LoRA: peft.LoraConfig from the lora: section (r, alpha, dropout, target_modules, bias none);
- optimizer: torch.optim.AdamW over model.parameters() (lr, weight_decay from training:), given to
  `deepspeed.initialize(model=..., optimizer=..., model_parameters=..., config=<the deepspeed:
  section as a dict>)`; DeepSpeed uses this client optimizer (the section's optimizer: is not
  built), inside its ZeRO-3 optimizer. `torch_adam: true` is added to the section's optimizer
  params, so that nothing would need DeepSpeed's compiled fused Adam even if it were built;
- data: their Dataset (each text tokenized with truncation to data.max_length and padding to
  max_length, attention_mask, labels = input_ids), DistributedSampler(shuffle=True), DataLoader
  (per_device_train_batch_size, pin_memory, training.num_workers workers, drop_last). The texts are
  random token ids (documents of --doc-len tokens: none shorter than max_length, so no padding),
  or with --token-file the documents of a dstrain token file (version 1), padded as theirs are;
- loop: for each batch, `engine(**batch)` (transformers' loss), `engine.backward(loss)`,
  `engine.step()`; the optimizer steps every gradient_accumulation_steps micro-batches.
Left out: their LinearLR warm-up (torch 2.11 refuses it: a start factor of 0 raises ValueError,
and DeepSpeed's ZeRO-3 optimizer is not a torch Optimizer; it sets only the learning rate),
evaluation and checkpoint saving (not part of a training step). One process, as `deepspeed
--num_gpus 1` starts it (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT set here when unset).

A step is one optimizer step (accumulation x micro-batch x max_length tokens), timed as
gpu_train_peer.py does: CUDA events around it, the median over the steps after --warmup.
Prints one JSON line: tokens_per_s (all positions), real_tokens_per_s (positions holding a
document's token: the attention mask's), step_ms, max_allocated_gb, max_reserved_gb, loss. Exit 3 on
CUDA out of memory, 1 on other errors. --device cpu runs it on the CPU (DS_ACCELERATOR=cpu,
torch.distributed over Gloo, wall-clock timing): a check that the stack works, not a measurement.
"""

import argparse
import importlib
import json
import os
import socket
import statistics
import sys
import time

# The users' train.yaml, model and data paths aside (gpu-train writes it with a random-weight
# model directory and its token file; dstrain trains the same file).
SEEDS_TRAIN_YAML = {
    "model": {"name_or_path": "MODEL_DIR"},
    "data": {"train_path": "TRAIN_PATH", "text_field": "text", "max_length": 1024},
    "training": {"epochs": 3, "per_device_train_batch_size": 1, "gradient_accumulation_steps": 8,
                 "lr": 2.0e-5, "weight_decay": 0.0, "warmup_ratio": 0.03, "seed": 42,
                 "bf16": True, "use_flash_attn": False, "num_workers": 4,
                 "num_workers_eval": 2},
    "lora": {"r": 16, "alpha": 32, "dropout": 0.05,
             "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
    "deepspeed": {
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
        "optimizer": {"type": "AdamW", "params": {"lr": 2.0e-5, "betas": [0.9, 0.999],
                                                  "eps": 1.0e-8, "weight_decay": 0.0}},
        "zero_optimization": {
            "stage": 3, "offload_optimizer": {"device": "none"},
            "offload_param": {"device": "none"}, "overlap_comm": True,
            "contiguous_gradients": True, "reduce_bucket_size": 5.0e7,
            "stage3_prefetch_bucket_size": 5.0e7, "stage3_param_persistence_threshold": 1.0e5},
        "bf16": {"enabled": True},
        "gradient_clipping": 1.0,
        "wall_clock_breakdown": False,
    },
}

START = time.monotonic()


def progress(what):
    """Where the time goes, on stderr (the caller's log)."""
    print(f"[seeds peer {time.monotonic() - START:6.1f} s] {what}", file=sys.stderr, flush=True)


def single_process_env():
    """What `deepspeed --num_gpus 1` puts in the environment of its one rank."""
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)


def token_file_documents(torch, path):
    """The documents of a dstrain token file (docs/data.md, version 1) as 1-D int64 tensors."""
    import struct
    with open(path, "rb") as f:
        data = f.read()
    version, width = struct.unpack("<II", data[8:16])
    _vocab, count, docs = struct.unpack("<QQQ", data[16:40])
    if data[:8] != b"DSTOKENS" or version != 1 or width != 2:
        raise ValueError(f"{path}: not a version-1 uint16 dstrain token file")
    offsets = struct.unpack(f"<{docs + 1}Q", data[40:48 + 8 * docs])
    start = 48 + 8 * docs
    tokens = torch.frombuffer(bytearray(data[start:start + 2 * count]), dtype=torch.int16)
    tokens = tokens.to(torch.int64) & 0xFFFF
    return [tokens[offsets[i]:offsets[i + 1]] for i in range(docs)]


def make_dataset(torch, n, doc_len, vocab, max_len, pad_id, seed, documents=None):
    """Their ParquetTextDataset over n random documents (or the given `documents`): each item what
    tokenizer(text, truncation=True, max_length=max_len, padding="max_length",
    return_tensors="pt") gives (squeezed), with labels a copy of input_ids."""

    class RandomTextDataset(torch.utils.data.Dataset):
        def __init__(self):
            g = torch.Generator().manual_seed(seed)
            self.texts = documents or torch.randint(0, vocab, (n, doc_len), generator=g)

        def __len__(self):
            return len(self.texts)

        def __getitem__(self, idx):
            ids = self.texts[idx][:max_len]
            input_ids = torch.full((max_len,), pad_id, dtype=torch.long)
            attention_mask = torch.zeros(max_len, dtype=torch.long)
            input_ids[:len(ids)] = ids
            attention_mask[:len(ids)] = 1
            item = {"input_ids": input_ids, "attention_mask": attention_mask}
            item["labels"] = item["input_ids"].clone()
            return item

    return RandomTextDataset()


def build(args, cfg, torch):
    import peft
    import transformers
    progress(f"transformers {transformers.__version__}, peft {peft.__version__} imported")
    model_cfg, train_cfg, lora_yml = cfg.get("model", {}), cfg.get("training", {}), cfg.get("lora", {})
    torch.manual_seed(int(train_cfg.get("seed", 42)))
    bf16 = bool(train_cfg.get("bf16", True))
    attn = args.attn or ("flash_attention_2" if train_cfg.get("use_flash_attn", False) else "eager")
    config = transformers.AutoConfig.from_pretrained(model_cfg["name_or_path"])
    # Built on the device: a random init of 0.5B parameters on the host takes tens of seconds
    # (their from_pretrained loads on the host and DeepSpeed moves it; the step is the same).
    with torch.device(args.device):
        model = transformers.AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16 if bf16 else torch.float32, attn_implementation=attn)
    progress(f"model built on {args.device} ({attn} attention)")
    lcfg = peft.LoraConfig(
        r=int(lora_yml.get("r", 16)), lora_alpha=int(lora_yml.get("alpha", 32)),
        lora_dropout=float(lora_yml.get("dropout", 0.05)),
        target_modules=[m.strip() for m in lora_yml.get("target_modules",
                                                       ["q_proj", "k_proj", "v_proj", "o_proj"])],
        bias="none", task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, lcfg)
    return model, config


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--config_yml", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--doc-len", type=int, default=4096)
    p.add_argument("--token-file", help="documents from a dstrain token file instead")
    p.add_argument("--attn", choices=["eager", "sdpa"], help="instead of the config's choice")
    args = p.parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    single_process_env()
    import torch
    import yaml
    with open(args.config_yml, encoding="utf-8") as f:
        cfg = yaml.safe_load(f)
    data_cfg, train_cfg = cfg.get("data", {}), cfg.get("training", {})
    ds_cfg = cfg.get("deepspeed", {})
    ds_cfg.setdefault("optimizer", {}).setdefault("params", {})["torch_adam"] = True
    try:
        import deepspeed
        progress(f"deepspeed {deepspeed.__version__} imported from {os.path.dirname(deepspeed.__file__)}")
        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        else:
            # DeepSpeed's CPU accelerator compiles a shared-memory collectives op at start (minutes
            # on two cores); one rank needs no collectives, so Gloo alone serves, as on platforms
            # where that op is not available.
            importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
            deepspeed.init_distributed(dist_backend="gloo")
        model, config = build(args, cfg, torch)
        optimizer = torch.optim.AdamW(model.parameters(), lr=float(train_cfg.get("lr", 2e-5)),
                                      weight_decay=float(train_cfg.get("weight_decay", 0.0)))
        engine, optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, model_parameters=model.parameters(), config=ds_cfg)
        progress(f"deepspeed.initialize: ZeRO stage {engine.zero_optimization_stage()}, "
                 f"{type(engine.optimizer).__name__} around {type(engine.basic_optimizer).__name__}, "
                 f"bf16 {engine.bfloat16_enabled()}")
        accum = engine.gradient_accumulation_steps()
        micro = int(train_cfg.get("per_device_train_batch_size", 1))
        max_len = int(data_cfg.get("max_length", 1024))
        steps = args.warmup + args.steps
        pad = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
        documents = token_file_documents(torch, args.token_file) if args.token_file else None
        train_ds = make_dataset(torch, steps * accum * micro, args.doc_len, config.vocab_size,
                                max_len, pad, int(train_cfg.get("seed", 42)), documents)
        train_samp = torch.utils.data.distributed.DistributedSampler(train_ds, shuffle=True)
        train_dl = torch.utils.data.DataLoader(
            train_ds, batch_size=micro, sampler=train_samp, pin_memory=True,
            num_workers=int(train_cfg.get("num_workers", 4)), drop_last=True)
        times, reals, step, micro_step, loss, real = [], [], 0, 0, None, 0
        engine.train()
        for ep in range(int(train_cfg.get("epochs", 3))):
            train_samp.set_epoch(ep)
            for batch in train_dl:
                if micro_step % accum == 0:
                    timer = Timer(torch, args.device)
                    real = 0
                real += int(batch["attention_mask"].sum())  # on the host: no device sync
                batch = {k: v.to(engine.device) for k, v in batch.items()}
                out = engine(**batch)
                loss = out.loss
                engine.backward(loss)
                engine.step()
                micro_step += 1
                if micro_step % accum:
                    continue
                seconds = timer.stop()
                step += 1
                progress(f"step {step}: {seconds * 1e3:.1f} ms, loss {loss.item():.4f}")
                if step > args.warmup:
                    times.append(seconds)
                    reals.append(real / seconds)
                if step == steps:
                    break
            if step == steps:
                break
    except torch.cuda.OutOfMemoryError:
        print(json.dumps({"oom": True}))
        return 3
    step_s = statistics.median(times)
    on_cuda = args.device == "cuda"
    print(json.dumps({
        "tokens_per_s": accum * micro * max_len / step_s,
        "real_tokens_per_s": statistics.median(reals), "step_ms": step_s * 1e3,
        "max_allocated_gb": torch.cuda.max_memory_allocated() / 2**30 if on_cuda else None,
        "max_reserved_gb": torch.cuda.max_memory_reserved() / 2**30 if on_cuda else None,
        "loss": loss.item(), "steps": len(times), "accumulation": accum, "micro": micro,
        "max_length": max_len}))
    return 0


class Timer:
    """CUDA events around a step (as gpu_train_peer.py); the wall clock on the CPU."""

    def __init__(self, torch, device):
        self.cuda = device == "cuda"
        if self.cuda:
            self.start, self.end = (torch.cuda.Event(enable_timing=True),
                                    torch.cuda.Event(enable_timing=True))
            self.start.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self):
        if not self.cuda:
            return time.perf_counter() - self.t0
        self.end.record()
        self.end.synchronize()
        return self.start.elapsed_time(self.end) / 1e3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
