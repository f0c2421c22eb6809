#!/usr/bin/env python3
"""The transformers peer of dstrain's CPU MoE benchmark (scripts/bench/cpu-moe): transformers' own
Qwen3MoeForCausalLM built from the same config.json with the given experts implementation
(`grouped_mm`: the experts' tokens sorted and one torch grouped matrix product per projection;
`eager`: a loop over the experts that received tokens), trained in fp32 by a plain loop (AdamW,
clipping at 1.0) on the same corpus bytes in the same micro-batch × sequence windows, one process.

Prints `peer impl=<name> tokens_per_s=<float> steps=<n> params=<n> peak_rss_mb=<f>` (tokens/s: the
median over the timed steps after 3 warm-up steps).

Usage: hf_moe_peer.py CONFIG_JSON CORPUS STEPS MICRO_BATCH SEQ_LEN grouped_mm|eager
"""
import resource
import statistics
import sys
import time

import torch
import transformers

WARMUP = 3


def main():
    config_path, corpus, steps, micro, seq, impl = sys.argv[1:7]
    steps, micro, seq = int(steps), int(micro), int(seq)
    torch.manual_seed(42)
    config = transformers.AutoConfig.from_pretrained(config_path)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="sdpa", experts_implementation=impl)
    model.train()
    data = torch.tensor(list(open(corpus, "rb").read()), dtype=torch.long)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    times = []
    for step in range(steps + WARMUP):
        start = (step * micro * (seq + 1)) % (len(data) - micro * (seq + 1))
        window = data[start:start + micro * (seq + 1)].view(micro, seq + 1)
        t0 = time.perf_counter()
        ids = window[:, :-1]
        loss = model(input_ids=ids, labels=ids.clone()).loss  # (shifted inside, as trained)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= WARMUP:
            times.append(time.perf_counter() - t0)
    params = sum(p.numel() for p in model.parameters())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peer impl={impl} tokens_per_s={micro * seq / statistics.median(times):.1f} "
          f"steps={steps} params={params} peak_rss_mb={rss:.0f}")


if __name__ == "__main__":
    main()
