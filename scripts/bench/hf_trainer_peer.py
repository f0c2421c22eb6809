#!/usr/bin/env python3
"""The Hugging Face Trainer peer of dstrain's CPU benchmark: transformers' own LlamaForCausalLM
built from the same config.json, trained by `transformers.Trainer` (DDP over Gloo on CPU, AdamW,
clipping at 1.0) on the same corpus bytes in the same micro-batch × sequence windows.

Run under torchrun (scripts/bench/cpu-train does). Prints one line per rank:
`peer rank=<r> tokens_per_s=<float> steps=<n> params=<n> peak_rss_mb=<f>` (tokens/s: the median
over the timed steps, all ranks' tokens).

Usage: hf_trainer_peer.py CONFIG_JSON CORPUS STEPS MICRO_BATCH SEQ_LEN [fp32|bf16]
bf16: the Trainer's own mixed precision (`bf16=True`: autocast to bfloat16 on the CPU, fp32 weights).
"""
import os
import resource
import statistics
import sys
import tempfile
import time

import torch
import transformers

WARMUP = 3


class Windows(torch.utils.data.Dataset):
    """Rank-agnostic fixed windows of T + 1 corpus bytes (the Trainer's sampler shards them)."""

    def __init__(self, data, count, seq):
        self.data, self.count, self.seq = data, count, seq

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        off = (i * (self.seq + 1)) % (self.data.numel() - self.seq - 1)
        chunk = self.data[off:off + self.seq + 1]
        return {"input_ids": chunk[:-1], "labels": chunk[:-1]}


class StepTimer(transformers.TrainerCallback):
    """Wall time of each step after the first `warmup` ones."""

    def __init__(self, warmup=WARMUP):
        self.times, self.t0, self.warmup = [], None, warmup

    def on_step_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        if state.global_step > self.warmup:
            self.times.append(time.perf_counter() - self.t0)


def main():
    cfg_path, corpus, steps, mb, seq = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    bf16 = len(sys.argv) > 6 and sys.argv[6] == "bf16"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(42)
    config = transformers.AutoConfig.from_pretrained(os.path.dirname(cfg_path))
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                          attn_implementation="sdpa")
    data = torch.frombuffer(bytearray(open(corpus, "rb").read()), dtype=torch.uint8).long()
    data = data.clamp_max(config.vocab_size - 1)
    total = steps + WARMUP
    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, per_device_train_batch_size=mb, max_steps=total, learning_rate=1e-3,
            weight_decay=0.01, max_grad_norm=1.0, lr_scheduler_type="constant", logging_strategy="no",
            save_strategy="no", report_to=[], use_cpu=True, ddp_backend="gloo",
            dataloader_num_workers=0, disable_tqdm=True, seed=42,
            ddp_find_unused_parameters=False, bf16=bf16)
        trainer = transformers.Trainer(model=model, args=args,
                                       train_dataset=Windows(data, total * mb * world, seq),
                                       callbacks=[timer])
        trainer.train()
    n = sum(p.numel() for p in model.parameters())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peer rank={rank} tokens_per_s={mb * seq * world / statistics.median(timer.times):.1f} "
          f"steps={len(timer.times)} params={n} peak_rss_mb={rss:.1f}", flush=True)


if __name__ == "__main__":
    main()
