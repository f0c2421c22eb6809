#!/usr/bin/env python3
"""The PyTorch peer of dstrain's CPU benchmark: the same Llama-shaped decoder, trained with
torch.nn.parallel.DistributedDataParallel over Gloo and torch.optim.AdamW, on the same corpus bytes.

Run under torchrun (scripts/bench/cpu-train does, with the project environment's torch 2.11).
Prints one line per rank: `peer rank=<r> tokens_per_s=<float> steps=<n> params=<n> peak_rss_mb=<f>`
(tokens/s: the median over the timed steps, all ranks' tokens).

Usage: torch_ddp_peer.py CONFIG_JSON CORPUS STEPS MICRO_BATCH SEQ_LEN [fp32|bf16]
bf16: torch.autocast("cpu", torch.bfloat16) around forward and loss, fp32 weights (PyTorch's own
mixed precision).
CONFIG_JSON is a Hugging Face config.json (llama model_type, tied or untied embeddings).
"""
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        v = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(v + self.eps)).to(x.dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, self.nh, self.nkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c.get("head_dim") or h // self.nh
        self.q = nn.Linear(h, self.nh * self.hd, bias=False)
        self.k = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.v = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.o = nn.Linear(self.nh * self.hd, h, bias=False)
        i = c["intermediate_size"]
        self.gate, self.up, self.down = nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False), nn.Linear(i, h, bias=False)
        self.n1, self.n2 = RMSNorm(h, c["rms_norm_eps"]), RMSNorm(h, c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        y = self.n1(x)
        q = self.q(y).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k(y).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v(y).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, -1))
        y = self.n2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class Decoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.tied = c.get("tie_word_embeddings", False)
        if not self.tied:
            self.head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        inv = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, hd, 2).float() / hd))
        self.inv_freq = inv
        std = c.get("initializer_range", 0.02)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, std)

    def forward(self, ids):
        T = ids.shape[1]
        f = torch.outer(torch.arange(T).float(), self.inv_freq)
        emb = torch.cat((f, f), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        x = self.embed(ids)
        for l in self.layers:
            x = l(x, cos, sin)
        x = self.norm(x)
        return F.linear(x, self.embed.weight) if self.tied else self.head(x)


def main():
    cfg_path, corpus, steps, mb, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    bf16 = len(sys.argv) > 6 and sys.argv[6] == "bf16"
    c = json.load(open(cfg_path))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(42)
    model = Decoder(c)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, weight_decay=0.01)
    data = torch.frombuffer(bytearray(open(corpus, "rb").read()), dtype=torch.uint8).long()
    data = data.clamp_max(c["vocab_size"] - 1)
    per_step = mb * (T + 1)
    warmup = 3
    times = []
    for step in range(steps + warmup):
        t0 = time.perf_counter()
        off = ((step * world + rank) * per_step) % (data.numel() - per_step)
        chunk = data[off:off + per_step].view(mb, T + 1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = ddp(chunk[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        opt.step()
        loss.item()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    dist.barrier()
    n = sum(p.numel() for p in model.parameters())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peer rank={rank} tokens_per_s={mb * T * world / statistics.median(times):.1f} "
          f"steps={steps} params={n} peak_rss_mb={rss:.1f} loss={loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
