#!/usr/bin/env python3
"""The ALST peer of scripts/bench/long-seq: DeepSpeed's Arctic Long Sequence Training pieces on the
CPU, on the same model, bytes and optimizer settings as hf_long_seq_peer.py (transformers' own model
class for the config.json, random init, float32, SDPA attention; AdamW at 1e-4, no weight decay,
clipping at 1.0, micro-batch 1, windows of SEQ_LEN + 1 corpus bytes, STEPS steps). Run under
torchrun with P ranks (`python -m torch.distributed.run --standalone --nproc-per-node P`), P = 1 or
more; DS_ACCELERATOR=cpu (set here if unset), torch.distributed over Gloo.

What it uses, as DeepSpeed's ALST tutorial (docs/_tutorials/ulysses-alst-sequence-parallelism.md)
puts them together:
- Ulysses sequence parallelism over the P ranks (P > 1): `UlyssesSPAttentionHF.register_with_
  transformers` (SDPA underneath, head-parallel attention after an all-to-all) and
  `UlyssesSPDataLoaderAdapter` (each rank trains its 1/P slice of one sequence, labels pre-shifted),
  the per-rank losses combined by the tutorial's differentiable weighted all-gather;
- `TiledMLP` on every LlamaMLP (the tutorial's monkey patch: ceil(T / hidden) tiles, the maximum
  over the ranks);
- `TiledFusedLogitsLoss` for the head and the loss (as ArcticTraining's SFT trainer calls it), in
  tiles of --loss-chunk-mb of float32 logits (32 MiB by default, dstrain's `fused_loss_chunk_mb: 32`
  in the benchmark; ArcticTraining's automatic choice is 1 GiB);
- transformers' non-reentrant gradient checkpointing of every decoder layer, inside DeepSpeed's
  `get_checkpoint_hidden_states_offloading_ctx_manager()` (the checkpointed layer inputs offloaded
  to host memory; on the CPU accelerator the manager keeps them where they are:
  `_ActivationOffloadEngine._should_skip` is true for a synchronized device);
- the DeepSpeed engine (`deepspeed.initialize`, ZeRO stage 0, fp32, torch.optim.AdamW as the
  client optimizer, gradient_clipping 1.0, the Ulysses `mpu`), which all-reduces the gradients over
  the sequence-parallel ranks. `--engine torch` instead: no engine, the same pieces with plain
  torch.optim.AdamW, the gradients all-reduced by hand and clipped by torch.
The loss divides each tile by the whole sequence's label count inside the tiled function, which
gives transformers' own gradient; `--loss tutorial` uses ArcticTraining's form instead (tile sums,
divided by the rank's label count afterwards, ranks combined by a differentiable all-gather), whose
head-weight gradient is that of the sum (docs/performance.md, "Against ALST").

Prints, from rank 0, `loss step=<i> value=<float> grad_norm=<float>` per step, `rss stage=...`
lines (the resident set after the imports, after the model and engine, after each step) and one line
`peer tokens_per_s=<float> steps=<n> params=<n> peak_rss_mb=<float> ranks=<P>` (tokens/s of the
last step, the whole sequence; peak RSS of rank 0's process).

Usage: alst_long_seq_peer.py CONFIG_JSON CORPUS SEQ_LEN STEPS [--engine deepspeed|torch]
       [--loss exact|tutorial]
       [--loss-chunk-mb MB]
"""
import argparse
import math
import os
import resource
import time
from functools import partial

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
import torch  # noqa: E402
import torch.distributed.nn.functional  # noqa: E402
import transformers  # noqa: E402
from deepspeed.runtime.activation_checkpointing.offload_activations import (  # noqa: E402
    get_checkpoint_hidden_states_offloading_ctx_manager)
from deepspeed.runtime.sequence_parallel.ulysses_sp import (  # noqa: E402
    TiledFusedLogitsLoss, TiledMLP, UlyssesSPAttentionHF, UlyssesSPDataLoaderAdapter)
from transformers.models.llama import modeling_llama  # noqa: E402

from hf_trainer_peer import Windows  # noqa: E402  (the same windows as the HF Trainer peers)


def rss_line(stage):
    """`rss stage=<s> now_mb=<f> peak_mb=<f>`: this process's resident set now and its peak."""
    fields = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    now, peak = (int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))
    return f"rss stage={stage} now_mb={now:.0f} peak_mb={peak:.0f}"


def tiled_mlp_forward(self, x):
    """LlamaMLP.forward as ALST's tutorial patches it: ceil(T / hidden) tiles, the same on all
    ranks."""
    shards = torch.tensor(math.ceil(x.shape[-2] / x.shape[-1]))
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(shards, op=dist.ReduceOp.MAX)

    def mlp(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    return TiledMLP.apply(mlp, self, x, int(shards.item()),
                          [self.down_proj.weight, self.gate_proj.weight, self.up_proj.weight])


def shift(labels):
    """Pre-shifted labels as UlyssesSPDataLoaderAdapter makes them (P = 1 has no adapter)."""
    return torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("corpus")
    ap.add_argument("seq", type=int)
    ap.add_argument("steps", type=int)
    ap.add_argument("--engine", choices=["deepspeed", "torch"], default="deepspeed")
    ap.add_argument("--loss-chunk-mb", type=float, default=32)
    ap.add_argument("--loss", choices=["exact", "tutorial"], default="exact")
    args = ap.parse_args()

    dist.init_distributed(dist_backend="gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    stages = [rss_line("imported")]
    torch.manual_seed(42)
    config = transformers.AutoConfig.from_pretrained(os.path.dirname(args.config))
    config.max_position_embeddings = max(config.max_position_embeddings, args.seq)
    modeling_llama.LlamaMLP.forward = tiled_mlp_forward
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                          attn_implementation="sdpa")
    mpu = UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model, core_attn_implementation="sdpa", sequence_parallel_size=world,
        micro_batch_size=1, seq_length=args.seq, seq_length_is_variable=False)  # None at P = 1
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    engine = None
    if args.engine == "deepspeed":
        ds_config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                     "gradient_clipping": 1.0, "zero_optimization": {"stage": 0},
                     "steps_per_print": 1 << 30, "sequence_parallel_size": world}
        engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                       config=ds_config, mpu=mpu)

    stages.append(rss_line("model+engine"))
    # Rank r reads windows r, r + P, ...; the adapter trains rank 0's window on all ranks first,
    # then rank 1's: the same order of windows as one rank reading them all.
    data = torch.frombuffer(bytearray(open(args.corpus, "rb").read()), dtype=torch.uint8).long()
    windows = Windows(data, math.ceil(args.steps / world) * world, args.seq)
    mine = torch.utils.data.Subset(windows, range(rank, len(windows), world))

    def collate(items):
        ids = items[0]["input_ids"].unsqueeze(0)
        return {"input_ids": ids, "labels": items[0]["labels"].unsqueeze(0),
                "position_ids": torch.arange(ids.shape[1]).unsqueeze(0)}

    loader = torch.utils.data.DataLoader(mine, batch_size=1, collate_fn=collate)
    sp_group = None
    if world > 1:
        sp_group = mpu.get_sequence_parallel_group()
        loader = UlyssesSPDataLoaderAdapter(loader, sp_rank=mpu.get_sequence_parallel_rank(),
                                            sp_group=sp_group, sp_world_size=world,
                                            device=torch.device("cpu"))
    vocab = config.vocab_size
    # tiles of about --loss-chunk-mb of float32 logits over this rank's slice
    chunk = args.loss_chunk_mb * (1 << 20)
    loss_shards = max(1, math.ceil(args.seq // world * vocab * 4 / chunk))

    def loss_fn(model, hidden, labels, scale):
        logits = model.lm_head(hidden)
        good = (labels != -100).sum()
        return model.loss_function(logits=logits, labels=None, vocab_size=vocab,
                                   shift_labels=labels) * good * scale

    offload = get_checkpoint_hidden_states_offloading_ctx_manager()
    params = [p for p in model.parameters() if p.requires_grad]
    times = []
    for step, batch in enumerate(loader):
        if step == args.steps:
            break
        t0 = time.perf_counter()
        labels = batch["shift_labels"] if "shift_labels" in batch else shift(batch["labels"])
        good = (labels != -100).sum()
        with offload:
            hidden = model.model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                                 use_cache=False).last_hidden_state
            if args.loss == "tutorial":
                # ArcticTraining's SFT loss: tile sums, divided by the rank's good labels, then the
                # tutorial's differentiable weighted average over the ranks
                loss_sum = TiledFusedLogitsLoss.apply(partial(loss_fn, scale=1.0), model, hidden,
                                                      labels, None, loss_shards,
                                                      [model.lm_head.weight], "sum")
                loss = loss_sum / good.clamp(min=1)
                if world > 1:
                    losses = torch.distributed.nn.functional.all_gather(loss, group=sp_group)
                    goods = torch.distributed.nn.functional.all_gather(good, group=sp_group)
                    loss = sum(l * g for l, g in zip(losses, goods)) / sum(goods)
                mine_loss = loss
            else:
                # each tile's sum over the good labels of the whole sequence: the function's output
                # is this rank's term of the mean, so its gradient from the loss is exactly 1
                total = good.clone()
                if world > 1:
                    dist.all_reduce(total, group=sp_group)
                mine_loss = TiledFusedLogitsLoss.apply(
                    partial(loss_fn, scale=1.0 / max(int(total), 1)), model, hidden, labels, None,
                    loss_shards, [model.lm_head.weight], "sum")
                loss = mine_loss.detach().clone()
                if world > 1:
                    dist.all_reduce(loss, group=sp_group)
            if engine is not None:
                engine.backward(mine_loss)
            else:
                mine_loss.backward()
        if engine is not None:  # the engine has all-reduced the gradients in backward
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
            engine.step()
        else:
            if world > 1:  # each rank holds its slice's part of the gradient: sum them, as the
                for p in params:  # engine does (its data-parallel size is 1)
                    dist.all_reduce(p.grad, group=sp_group)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        stages.append(rss_line(f"step{step + 1}"))
        if rank == 0:
            print(f"loss step={step + 1} value={loss.item():.6f} grad_norm={float(grad_norm):.6f} "
                  f"seconds={times[-1]:.2f}", flush=True)
    n = sum(p.numel() for p in model.parameters())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if rank == 0:
        print("\n".join(stages), flush=True)
        print(f"peer tokens_per_s={args.seq / times[-1]:.1f} steps={len(times)} params={n} "
              f"peak_rss_mb={rss:.1f} ranks={world}", flush=True)


if __name__ == "__main__":
    main()
