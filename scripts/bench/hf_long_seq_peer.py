#!/usr/bin/env python3
"""The Hugging Face Trainer peer of scripts/bench/long-seq: transformers' own model class for the
config.json (random init, float32, SDPA attention), trained by `transformers.Trainer` on one CPU
process with gradient checkpointing (the Trainer's own switch), AdamW, micro-batch 1, on windows of
SEQ_LEN + 1 corpus bytes, for STEPS steps.

Prints one line: `peer tokens_per_s=<float> steps=<n> params=<n> peak_rss_mb=<float>` (tokens/s of
the last step; peak RSS of this process).

Usage: hf_long_seq_peer.py CONFIG_JSON CORPUS SEQ_LEN STEPS
"""
import os
import resource
import sys
import tempfile

import torch
import transformers

from hf_trainer_peer import StepTimer, Windows  # the same windows and timing as the CPU benchmark


def main():
    cfg_path, corpus, seq, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.manual_seed(42)
    config = transformers.AutoConfig.from_pretrained(os.path.dirname(cfg_path))
    config.max_position_embeddings = max(config.max_position_embeddings, seq)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                          attn_implementation="sdpa")
    data = torch.frombuffer(bytearray(open(corpus, "rb").read()), dtype=torch.uint8).long()
    timer = StepTimer(warmup=0)
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, per_device_train_batch_size=1, max_steps=steps, learning_rate=1e-4,
            max_grad_norm=1.0, lr_scheduler_type="constant", logging_strategy="no",
            save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0,
            disable_tqdm=True, seed=42, gradient_checkpointing=True, optim="adamw_torch")
        trainer = transformers.Trainer(model=model, args=args,
                                       train_dataset=Windows(data, steps, seq), callbacks=[timer])
        trainer.train()
    n = sum(p.numel() for p in model.parameters())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peer tokens_per_s={seq / timer.times[-1]:.1f} steps={len(timer.times)} params={n} "
          f"peak_rss_mb={rss:.1f}", flush=True)


if __name__ == "__main__":
    main()
