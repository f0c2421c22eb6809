#!/usr/bin/env python3
"""The Hugging Face Trainer peer of scripts/bench/packing: transformers' own model from the same
config.json, trained by `transformers.Trainer` (DDP over Gloo on the CPU, AdamW, clipping at 1.0)
on the same documents as dstrain's byte tokenizer reads them (each document's UTF-8 bytes, then
eos 256), in one of two ways:

- pad: one document per sample, truncated to SEQ + 1 tokens and padded to SEQ (what the seeds'
  script does; labels -100 on the padding);
- flatten: `DataCollatorWithFlattening` (documents of a micro-batch concatenated into one row,
  position ids restarting per document, no padding), documents longer than SEQ + 1 tokens split into
  pieces of SEQ + 1 as dstrain's data.long_documents: split does; as many documents per
  micro-batch as hold MICRO × SEQ tokens on average (the positions of dstrain's micro-batch).

Run under torchrun. Prints one line per rank: `peer rank=<r> real_tokens_per_s=<f>
padding_fraction=<f> steps=<n>` (real tokens: positions holding a document's token, all ranks;
the median step time over the steps after the warm-up ones).

Usage: hf_packing_peer.py CONFIG_JSON DOCUMENTS_PARQUET STEPS MICRO SEQ pad|flatten
"""
import os
import statistics
import sys
import tempfile
import time

import pyarrow.parquet as pq
import torch
import transformers

WARMUP = 3
EOS, PAD = 256, 257


class StepTimer(transformers.TrainerCallback):
    """Wall time of each step after the first WARMUP ones."""

    def __init__(self):
        self.times, self.t0 = [], None

    def on_step_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        if state.global_step > WARMUP:
            self.times.append(time.perf_counter() - self.t0)


class Counting:
    """Wraps a collator: counts the positions and the real (non-pad) positions it hands out."""

    def __init__(self, inner):
        self.inner, self.positions, self.real = inner, 0, 0

    def __call__(self, features):
        batch = self.inner(features)
        ids = batch["input_ids"]
        self.positions += ids.numel()
        mask = batch.get("attention_mask")
        self.real += int(mask.sum()) if mask is not None else ids.numel()
        return batch


def documents(path, seq, mode):
    docs = [list(t.encode("utf-8")) + [EOS] for t in pq.read_table(path)["text"].to_pylist()]
    out = []
    for d in docs:
        if len(d) < 2:
            continue
        if mode == "pad":
            out.append(d[:seq + 1])
        else:  # pieces of seq + 1 tokens sharing one token, as dstrain splits
            for begin in range(0, len(d) - 1, seq):
                out.append(d[begin:begin + seq + 1])
    return out


def main():
    cfg_path, data_path = sys.argv[1], sys.argv[2]
    steps, micro, seq, mode = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(42)
    config = transformers.AutoConfig.from_pretrained(os.path.dirname(cfg_path))
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                          attn_implementation="sdpa")
    docs = documents(data_path, seq, mode)
    if mode == "pad":
        # Inputs and labels the sequence's first SEQ tokens (the model shifts the labels).
        rows = [{"input_ids": d[:seq]} for d in docs]
        collator = Counting(lambda features: pad_rows(features, seq))
    else:
        rows = [{"input_ids": d} for d in docs]
        collator = Counting(transformers.DataCollatorWithFlattening())
        mean = sum(len(d) for d in docs) / len(docs)
        micro = max(1, round(micro * seq / mean))
    total = steps + WARMUP
    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, per_device_train_batch_size=micro, max_steps=total, learning_rate=1e-3,
            weight_decay=0.01, max_grad_norm=1.0, lr_scheduler_type="constant",
            logging_strategy="no", save_strategy="no", report_to=[], use_cpu=True,
            ddp_backend="gloo", dataloader_num_workers=0, disable_tqdm=True, seed=42,
            ddp_find_unused_parameters=False, remove_unused_columns=False)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=rows,
                                       data_collator=collator, callbacks=[timer])
        trainer.train()
    step_s = statistics.median(timer.times)
    real_per_step = collator.real / total  # this rank's
    print(f"peer rank={rank} real_tokens_per_s={real_per_step * world / step_s:.1f} "
          f"padding_fraction={1 - collator.real / collator.positions:.4f} "
          f"steps={len(timer.times)} micro={micro}", flush=True)


def pad_rows(features, seq):
    """One document per row, padded to SEQ: pad ids, attention mask 0 and labels -100 there."""
    ids = torch.full((len(features), seq), PAD, dtype=torch.long)
    mask = torch.zeros((len(features), seq), dtype=torch.long)
    labels = torch.full((len(features), seq), -100, dtype=torch.long)
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        ids[i, :n] = torch.tensor(f["input_ids"])
        mask[i, :n] = 1
        labels[i, :n] = ids[i, :n]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


if __name__ == "__main__":
    main()
