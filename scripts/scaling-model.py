#!/usr/bin/env python3
"""ZeRO scaling worked out on paper: bytes per step, step time and memory per GPU of dstrain's ZeRO
stages 1-3, projected from measured and published inputs (bench/scaling_inputs.json).

    scripts/scaling-model.py                      # every table of docs/scaling.md, as markdown
    scripts/scaling-model.py --update-doc         # rewrite those tables in docs/scaling.md
    scripts/scaling-model.py --check-doc          # exit 1 if docs/scaling.md differs from the output
    scripts/scaling-model.py check                # 2-rank CPU runs: byte counters vs the formulas
    scripts/scaling-model.py check --update-doc   # ... and write that table into docs/scaling.md

The byte formulas follow lib/zero and the communicators' counters (lib/comm): a reduce-scatter or
all-gather of an S-byte buffer sends S/N*(N-1) bytes per rank, an all-reduce twice that. The time
model runs the step on two streams, compute and communication, as dstrain issues it (NCCL on its
own stream, ordered after the compute enqueued before each call): buckets launched from the last
to the first as their gradients become final, at most two in flight; stage 3's units gathered
before their forward and backward segments, prefetched within stage3_prefetch_bucket_size, and
reduce-scattered as their gradients complete. A collective costs NCCL's latency model plus the
bytes a rank sends divided by the published bus bandwidth. Compute is the measured 0.5B step's
FLOP rate applied to each shape's FLOPs, except where the inputs carry measured_layers (from
scripts/bench/layer-times): that shape's decoder layers and optimizer as measured, extrapolated to
its depth. Python 3, standard library only.
"""
import argparse
import collections
import json
import math
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_INPUTS = os.path.join(REPO, "bench", "scaling_inputs.json")
DEFAULT_DOC = os.path.join(REPO, "docs", "scaling.md")
STAGES = (1, 2, 3)
GB = 1e9
GIB = 2.0**30


class InputError(Exception):
    """Bad input: one message naming the file and key; exit code 2."""


# ----------------------------------------------------------------------------------------------
# Inputs


class Inputs:
    def __init__(self, path):
        self.path = path
        try:
            with open(path, encoding="utf-8") as f:
                self.raw = json.load(f)
        except OSError as e:
            raise InputError(f"{path}: cannot read: {e.strerror}")
        except json.JSONDecodeError as e:
            raise InputError(f"{path}: line {e.lineno}: not valid JSON: {e.msg}")

    def get(self, dotted, kind=(int, float)):
        """The value at `dotted` ("a.b.c"); an entry {"value": v, ...} yields v."""
        node = self.raw
        for part in dotted.split("."):
            if isinstance(node, dict) and "value" in node and part not in node:
                node = node["value"]
            if not isinstance(node, dict) or part not in node:
                raise InputError(f"{self.path}: missing key '{dotted}'")
            node = node[part]
        if isinstance(node, dict) and "value" in node:
            node = node["value"]
        if kind is not None and not isinstance(node, kind):
            raise InputError(f"{self.path}: key '{dotted}' is {node!r}; expected {kind_name(kind)}")
        return node

    def shape(self, name):
        shapes = self.get("shapes", dict)
        if not isinstance(shapes.get(name), dict):
            raise InputError(f"{self.path}: shapes has no object '{name}'")
        return Shape(name, shapes[name], f"{self.path}: shapes.{name}")


def kind_name(kind):
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "a number", float: "a number", dict: "an object", list: "a list", str: "a string",
             bool: "true or false"}
    return " or ".join(sorted({names.get(k, k.__name__) for k in kinds}))


class Shape:
    """A Llama/Qwen2-shaped decoder: hidden H, intermediate I, L layers, heads, kv heads, vocab."""

    KEYS = ("hidden", "intermediate", "layers", "heads", "kv_heads", "head_dim", "vocab")

    def __init__(self, name, s, where):
        self.name = name
        for k in self.KEYS:
            if not isinstance(s.get(k), int) or s[k] <= 0:
                raise InputError(f"{where}.{k} is {s.get(k)!r}; expected a positive integer")
        self.H, self.I, self.L = s["hidden"], s["intermediate"], s["layers"]
        self.heads, self.kv_heads, self.head_dim, self.V = (s["heads"], s["kv_heads"],
                                                            s["head_dim"], s["vocab"])
        self.tied = bool(s.get("tied", False))
        self.qkv_bias = bool(s.get("qkv_bias", False))
        self.micro = s.get("micro", 1)
        self.seq = s.get("seq", 2048)
        self.checkpointing = bool(s.get("checkpointing", False))
        self.element_bytes = s.get("element_bytes", 2)

    def parameters(self):
        """[(name, numel, unit)] in dstrain's named_parameters() order; units are the model's blocks
        (lib/model/blocks.h: embedding 0, layer i 1 + i, norm and lm_head L+1)."""
        H, q, kv = self.H, self.heads * self.head_dim, self.kv_heads * self.head_dim
        out = [("model.embed_tokens.weight", self.V * H, 0)]
        for i in range(self.L):
            p, u = f"model.layers.{i}.", 1 + i
            out.append((p + "self_attn.q_proj.weight", q * H, u))
            if self.qkv_bias:
                out.append((p + "self_attn.q_proj.bias", q, u))
            for proj in ("k_proj", "v_proj"):
                out.append((p + f"self_attn.{proj}.weight", kv * H, u))
                if self.qkv_bias:
                    out.append((p + f"self_attn.{proj}.bias", kv, u))
            out.append((p + "self_attn.o_proj.weight", H * q, u))
            for proj in ("gate_proj", "up_proj"):
                out.append((p + f"mlp.{proj}.weight", self.I * H, u))
            out.append((p + "mlp.down_proj.weight", H * self.I, u))
            out.append((p + "input_layernorm.weight", H, u))
            out.append((p + "post_attention_layernorm.weight", H, u))
        out.append(("model.norm.weight", H, self.L + 1))
        if not self.tied:
            out.append(("lm_head.weight", self.V * H, self.L + 1))
        return out

    def numel(self):
        return sum(n for _, n, _ in self.parameters())

    def tokens(self):
        return self.micro * self.seq

    def segment_forward_flops(self):
        """Forward FLOPs per token of each segment (embed, layer 0..L-1, head): 2 per matmul weight
        plus attention's 4·heads·head_dim·seq per layer; three times that forward + backward is
        docs/models.md's 6·N + 12·L·H·Q·T (N counting the LM head, tied or not)."""
        per_layer = collections.Counter()
        for _, n, u in self.parameters():
            per_layer[u] += n
        attention = 4 * self.heads * self.head_dim * self.seq
        layers = [2 * per_layer[1 + i] + attention for i in range(self.L)]
        head = 2 * (self.H + self.V * self.H)
        return [0] + layers + [head]

    def flops_per_token(self):
        return 3 * sum(self.segment_forward_flops())


# ----------------------------------------------------------------------------------------------
# Bytes: the communicators' counters (lib/comm) and what lib/zero issues


def ring_bytes(kind, buffer_bytes, n):
    """Bytes one rank sends (lib/comm: ring_pass_bytes = S / N * (N - 1), all-reduce twice)."""
    one = buffer_bytes // n * (n - 1)
    return 2 * one if kind == "all_reduce" else one


def round_up(v, m):
    return (v + m - 1) // m * m


def buckets(total, n, bucket_numel):
    """lib/zero/partition.cpp: the flat buffer padded to a multiple of N, cut every
    reduce_bucket_size rounded down to a multiple of N (at least N)."""
    padded = round_up(total, n)
    step = max(n, bucket_numel // n * n)
    return [(b, min(b + step, padded)) for b in range(0, padded, step)]


class Units:
    """Stage 3's units (lib/zero/stage3_engine.cpp): the caller's units without the parameters
    below the persistence threshold, which form one persistent unit; each padded to N."""

    def __init__(self, shape, n, threshold):
        numel = collections.Counter()
        persistent = 0
        for _, size, unit in shape.parameters():
            if size < threshold:
                persistent += size
            else:
                numel[unit] += size
        self.count = shape.L + 2
        self.padded = [round_up(numel[u], n) for u in range(self.count)]
        self.persistent = round_up(persistent, n)
        head = [shape.L + 1, 0] if shape.tied else [shape.L + 1]
        self.segments = [[0]] + [[1 + i] for i in range(shape.L)] + [head]

    def gathers_per_micro_step(self, u):
        """Forward: once per run of consecutive segments reading the unit; backward: once."""
        reads = [k for k, seg in enumerate(self.segments) if u in seg]
        runs = sum(1 for i, k in enumerate(reads) if i == 0 or reads[i - 1] != k - 1)
        return runs + 1


def engine_collectives(shape, stage, n, micro_steps, opts, element_bytes, norm=True):
    """{kind: (calls, bytes sent per rank)} of one optimizer step of the engine: the bucket or unit
    collectives and (`norm`) the gradient norm's 8-byte fp64 all-reduce."""
    out = collections.defaultdict(lambda: [0, 0])

    def add(kind, buffer_bytes, calls=1):
        out[kind][0] += calls
        out[kind][1] += calls * ring_bytes(kind, buffer_bytes, n)

    if stage < 3:
        for b, e in buckets(shape.numel(), n, opts["reduce_bucket_size"]):
            size = (e - b) * element_bytes
            if stage == 0 and n > 1:  # no all-reduce in a world of one (grad_reducer.cpp)
                add("all_reduce", size)
            if stage == 1:
                add("reduce_scatter", size)
            if stage == 2:
                add("reduce_scatter", size, micro_steps)
            if stage in (1, 2):
                add("all_gather", size)
    else:
        units = Units(shape, n, opts["stage3_param_persistence_threshold"])
        for u, padded in enumerate(units.padded):
            if padded:
                add("all_gather", padded * element_bytes,
                    micro_steps * units.gathers_per_micro_step(u))
                add("reduce_scatter", padded * element_bytes, micro_steps)
        if units.persistent:
            add("reduce_scatter", units.persistent * element_bytes, micro_steps)
            add("all_gather", units.persistent * element_bytes)
    if norm:
        add("all_reduce", 8)  # Σg² in fp64 (master_state.cpp)
    return {k: tuple(v) for k, v in out.items()}


# ----------------------------------------------------------------------------------------------
# Time of one collective: NCCL's latency model plus bytes over the published bus bandwidth


class Network:
    def __init__(self, inputs, inter_node_override=None):
        self.intra = inputs.get("network.intra_node_busbw_gbs")
        self.inter = {int(k): v for k, v in inputs.get("network.inter_node_busbw_gbs", dict).items()}
        self.lat = inputs.get("network.nccl_latency_us", dict)
        self.proto = inputs.get("network.protocol_bandwidth", dict)
        self.override = inter_node_override

    def busbw(self, nodes):
        if nodes == 1:
            return self.intra
        if self.override is not None:
            return self.override
        known = sorted(self.inter)
        if nodes <= known[0]:
            return self.inter[known[0]]
        if nodes >= known[-1]:
            return self.inter[known[-1]]
        lo = max(k for k in known if k <= nodes)
        hi = min(k for k in known if k >= nodes)
        if lo == hi:
            return self.inter[lo]
        f = (math.log2(nodes) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
        return self.inter[lo] + f * (self.inter[hi] - self.inter[lo])

    def _ll_max(self, nodes):
        caps = self.proto["LL_max_gbs"]
        return caps["1"] if nodes == 1 else caps["2"] if nodes == 2 else caps["many"]

    def seconds(self, kind, bytes_sent, n, nodes):
        """The fastest of NCCL's protocols (and, for all-reduce, of ring and tree)."""
        if n <= 1:
            return 0.0
        bus = self.busbw(nodes)
        allreduce = kind == "all_reduce"
        steps = 2 * (n - 1) if allreduce else n - 1
        inter = (2 * nodes if nodes > 1 else 0) if allreduce else nodes - 1
        best = math.inf
        for p in ("LL", "LL128", "Simple"):
            if p == "LL":
                share = self.proto["LL_multi_node"] if nodes > 1 or allreduce else self.proto[
                    "LL_single_node"]
                bw = min(self._ll_max(nodes), bus * share)
            elif p == "LL128":
                bw = bus * self.proto["LL128"]
            else:
                bw = bus
            intra = self.lat["nvlink"]["ring"][p]
            if nodes > 1:
                intra = max(intra, self.lat["net_overhead"] * (3 if p == "Simple" else 1))
            lat = (self.lat["base"]["ring"][p] + (steps - inter) * intra +
                   inter * self.lat["net"]["ring"][p])
            best = min(best, lat * 1e-6 + bytes_sent / (bw * GB))
            if allreduce:  # tree: log2(nodes) network hops; algorithm bandwidth busbw / 2
                ppn = n // nodes
                lat = (self.lat["base"]["tree"][p] + 2 * ((ppn - 1) * self.lat["nvlink"]["tree"][p] +
                                                          math.log2(nodes) * self.lat["net"]["tree"][p]))
                message = bytes_sent * n / (2 * (n - 1))
                best = min(best, lat * 1e-6 + message / (0.5 * bw * GB))
        return best


# ----------------------------------------------------------------------------------------------
# The step on two streams


class Timeline:
    """Compute and communication streams: a collective starts once the comm stream is free and
    the compute enqueued before it is done; a wait makes the compute stream wait for it. `serial`
    waits for every collective at once (no overlap)."""

    def __init__(self, net, n, nodes, serial):
        self.net, self.n, self.nodes, self.serial = net, n, nodes, serial
        self.t = 0.0
        self.comm = 0.0
        self.comm_busy = 0.0
        self.calls = 0
        self.mem = 0
        self.mem_peak = 0

    def compute(self, seconds):
        self.t += seconds

    def launch(self, kind, buffer_bytes):
        start = max(self.comm, self.t)
        self.comm = start + self.net.seconds(kind, ring_bytes(kind, buffer_bytes, self.n), self.n,
                                             self.nodes)
        self.comm_busy += self.comm - start
        self.calls += 1
        if self.serial:
            self.wait(self.comm)
        return self.comm

    def wait(self, end):
        self.t = max(self.t, end)

    def allocate(self, nbytes):
        self.mem += nbytes
        self.mem_peak = max(self.mem_peak, self.mem)


class Compute:
    """Seconds of each segment's forward and backward, and of the optimizer per element owned:
    from the FLOPs at `rate`, or, with `measured` (a measured_layers entry), each decoder layer's
    as measured and the optimizer's per element as measured (embedding and head still at `rate`)."""

    def __init__(self, inputs, shape, rate, measured=None):
        self.shape = shape
        tokens = shape.tokens()
        fwd = [f * tokens / rate for f in shape.segment_forward_flops()]
        self.fwd = fwd
        recompute = [0.0] + fwd[1:-1] + [0.0] if shape.checkpointing else [0.0] * len(fwd)
        self.bwd = [2 * f + r for f, r in zip(fwd, recompute)]
        ref = inputs.shape(inputs.get("compute.shape", str))
        self.opt_per_element = inputs.get("compute.optimizer_ms") * 1e-3 / ref.numel()
        if measured:
            layers = range(1, len(fwd) - 1)
            self.fwd = [measured["forward_ms"] * 1e-3 if k in layers else f for k, f in enumerate(fwd)]
            self.bwd = [measured["backward_ms"] * 1e-3 if k in layers else b
                        for k, b in enumerate(self.bwd)]
            self.opt_per_element = measured["optimizer_ns_per_element"] * 1e-9

    def step(self, owned):
        return sum(self.fwd) + sum(self.bwd) + self.opt_per_element * owned


def measured_layers(inputs, shapes):
    """{shape name: entry} of the optional measured_layers section (scripts/bench/layer-times
    writes it), each checked against its shape: the same layer dimensions, tokens a GPU and
    checkpointing, or the figures would be another shape's."""
    if "measured_layers" not in inputs.raw:
        return {}
    entries = inputs.get("measured_layers", dict)
    by_name = {s.name: s for s in shapes}
    out = {}
    for name, e in entries.items():
        where = f"{inputs.path}: measured_layers.{name}"
        s = by_name.get(name)
        if s is None:
            raise InputError(f"{where}: no such shape (shapes: {', '.join(by_name)})")
        if not isinstance(e, dict):
            raise InputError(f"{where} is {e!r}; expected an object")
        for key in ("forward_ms", "backward_ms", "optimizer_ns_per_element"):
            if not isinstance(e.get(key), (int, float)) or isinstance(e.get(key), bool) or e[key] <= 0:
                raise InputError(f"{where}.{key} is {e.get(key)!r}; expected a positive number")
        want = {"micro": s.micro, "seq": s.seq, "checkpointing": s.checkpointing,
                "shape": {"hidden": s.H, "intermediate": s.I, "heads": s.heads,
                          "kv_heads": s.kv_heads, "head_dim": s.head_dim}}
        for key, value in want.items():
            if e.get(key) != value:
                raise InputError(f"{where}.{key} is {e.get(key)!r}; the shape has {value!r}")
        out[name] = e
    return out


def sharded_step(tl, shape, comp, n, opts):
    """Stages 1 and 2 with one micro-step (they issue the same collectives then): backward
    launches each bucket's reduce-scatter once all its gradients are final, from the last bucket
    to the first, at most max_in_flight outstanding (a further launch waits for the oldest).
    With clipping the step waits for them, all-reduces the norm, updates bucket by bucket from
    the last and launches each bucket's all-gather behind its update. Without clipping each
    bucket is updated, and its all-gather launched, as its reduction is retired during backward
    (docs/zero.md, "When the update runs")."""
    es = shape.element_bytes
    params = shape.parameters()
    offsets, off = [], 0
    for _, size, _ in params:
        offsets.append(off)
        off += size
    segs = len(comp.fwd)
    # Gradients are final when their segment's backward ends; backward runs head ... embed.
    position = {seg: segs - 1 - seg for seg in range(segs)}
    cuts = buckets(off, n, opts["reduce_bucket_size"])
    ready = [0] * len(cuts)
    for (_, size, unit), begin in zip(params, offsets):
        for b, (lo, hi) in enumerate(cuts):
            if begin < hi and begin + size > lo:
                ready[b] = max(ready[b], position[unit])
    clipping = opts["gradient_clipping"]
    gathers = []

    def update(b):
        lo, hi = cuts[b]
        tl.compute(comp.opt_per_element * (hi - lo) / n)
        gathers.append(tl.launch("all_gather", (hi - lo) * es))

    def retire(entry):
        end, b = entry
        tl.wait(end)
        if not clipping:
            update(b)

    tl.compute(sum(comp.fwd))
    next_bucket = len(cuts) - 1
    in_flight = collections.deque()
    for pos in range(segs):
        tl.compute(comp.bwd[segs - 1 - pos])
        while next_bucket >= 0 and ready[next_bucket] <= pos:
            if len(in_flight) >= opts["max_in_flight"]:
                retire(in_flight.popleft())
            lo, hi = cuts[next_bucket]
            in_flight.append((tl.launch("reduce_scatter", (hi - lo) * es), next_bucket))
            next_bucket -= 1
    while in_flight:
        retire(in_flight.popleft())
    tl.wait(tl.launch("all_reduce", 8))
    if clipping:
        for b in reversed(range(len(cuts))):
            update(b)
    for end in gathers:
        tl.wait(end)
    return tl.t


class Stage3Run:
    """Stage 3 (lib/zero/stage3_schedule.cpp, stage3_step.cpp) on the timeline."""

    def __init__(self, tl, shape, comp, n, opts, prefetch):
        self.tl, self.comp, self.n, self.shape = tl, comp, n, shape
        self.units = Units(shape, n, opts["stage3_param_persistence_threshold"])
        self.prefetch = prefetch
        self.reduce_limit = opts["stage3_reduce_in_flight"]
        self.es = shape.element_bytes
        self.state = ["free"] * self.units.count
        self.gather_end = [0.0] * self.units.count
        self.reduced = [False] * self.units.count
        self.reductions = collections.deque()
        self.clipping = opts["gradient_clipping"]

    def bytes_of(self, u):
        return self.units.padded[u] * self.es

    def launch_gather(self, u):
        if self.state[u] != "free" or not self.units.padded[u]:
            return
        self.tl.allocate(self.bytes_of(u))
        self.gather_end[u] = self.tl.launch("all_gather", self.bytes_of(u))
        self.state[u] = "gathering"

    def wait_gathered(self, u):
        self.launch_gather(u)
        if self.state[u] == "gathering":
            self.tl.wait(self.gather_end[u])
            self.state[u] = "gathered"

    def release(self, u):
        if self.state[u] != "free":
            self.tl.allocate(-self.bytes_of(u))
            self.state[u] = "free"

    def prefetch_after(self, k, direction):
        budget = self.prefetch
        segs = self.units.segments
        k += direction
        while 0 <= k < len(segs):
            for u in segs[k]:
                if self.state[u] != "free" or self.reduced[u]:
                    continue
                budget -= self.units.padded[u]
                if budget < 0:
                    return
                self.launch_gather(u)
            k += direction

    def retire_oldest(self):
        end, freed, padded = self.reductions.popleft()
        self.tl.wait(end)
        self.tl.allocate(-freed)
        if not self.clipping:  # the unit's part of the master is updated here, in backward
            self.tl.compute(self.comp.opt_per_element * padded / self.n)

    def reduce(self, u, padded):
        if not padded:
            return
        if len(self.reductions) >= self.reduce_limit:
            self.retire_oldest()
        buffers = padded * self.es + padded // self.n * self.es  # unit gradient + output chunk
        self.tl.allocate(buffers)
        self.reductions.append((self.tl.launch("reduce_scatter", padded * self.es), buffers,
                                padded))

    def completed_after(self, k):
        """Units whose gradients are all final once segment k's backward is done: a layer's own,
        the head's; the embedding after segment 0 (tied: after both uses); the persistent unit
        (every norm) after the first layer's."""
        out = [u for u in self.units.segments[k] if u == k] if k > 0 else [0]
        if k == 1:
            out.append("persistent")
        return out

    def run(self):
        tl, segs = self.tl, self.units.segments
        for k, seg in enumerate(segs):
            for u in seg:
                self.wait_gathered(u)
            self.prefetch_after(k, +1)
            tl.compute(self.comp.fwd[k])
            following = segs[k + 1] if k + 1 < len(segs) else []
            for u in seg:
                if u not in following:
                    self.release(u)
        for k in reversed(range(len(segs))):
            for u in segs[k]:
                if not self.reduced[u]:
                    self.wait_gathered(u)
            self.prefetch_after(k, -1)
            tl.compute(self.comp.bwd[k])
            for u in self.completed_after(k):
                if u == "persistent":
                    self.reduce(u, self.units.persistent)
                    continue
                self.reduced[u] = True
                self.reduce(u, self.units.padded[u])
                self.release(u)
        while self.reductions:
            self.retire_oldest()
        tl.wait(tl.launch("all_reduce", 8))
        if self.clipping:
            tl.compute(self.comp.opt_per_element * (sum(self.units.padded) + self.units.persistent) /
                       self.n)
        if self.units.persistent:
            tl.wait(tl.launch("all_gather", self.units.persistent * self.es))
        return tl.t


def owned_elements(shape, stage, n, opts):
    if stage == 3:
        u = Units(shape, n, opts["stage3_param_persistence_threshold"])
        return (sum(u.padded) + u.persistent) // n
    return round_up(shape.numel(), n) // n


def simulate(net, shape, comp, stage, scale, opts, serial):
    """The timeline of one step; `serial`: every collective waited for at once, no prefetch."""
    n, nodes = scale
    tl = Timeline(net, n, nodes, serial)
    if stage == 3:
        depth = 0 if serial else opts["stage3_prefetch_bucket_size"]
        Stage3Run(tl, shape, comp, n, opts, depth).run()
    else:
        sharded_step(tl, shape, comp, n, opts)
    return tl


# ----------------------------------------------------------------------------------------------
# Memory per GPU


def model_state_bytes(shape, stage, n, opts):
    """bf16 compute, fp32 master, Adam: docs/zero.md's table with the engine's padding."""
    if stage == 3:
        u = Units(shape, n, opts["stage3_param_persistence_threshold"])
        shard = (sum(u.padded) + u.persistent) // n
        return 2 * shard + 2 * u.persistent + 2 * shard + 12 * shard
    padded = round_up(shape.numel(), n)
    if stage == 0:
        return 16 * padded
    grads = 2 * padded if stage == 1 else 2 * padded // n
    return 2 * padded + grads + 12 * padded // n


def activation_bytes(shape, loss_chunk_gib):
    a = 12 * shape.H + 6 * shape.I + 4 * shape.kv_heads * shape.head_dim
    tokens = shape.tokens()
    if shape.checkpointing:  # each layer's input kept; one layer's tensors and their gradients live
        per_token = shape.L * 2 * shape.H + 2 * a
    else:
        per_token = shape.L * a
    return tokens * per_token + loss_chunk_gib * GIB


def transient_bytes(net, shape, comp, stage, scale, opts):
    """Communication buffers on top of the model states: stage 1 the gradient shard and the
    all-gather inputs, stage 2 the bucket buffers (the largest parameter's buckets and two in
    flight) and the all-gather inputs, stage 3 the gathered units and unit gradients at their
    peak on the timeline."""
    n = scale[0]
    es = shape.element_bytes
    if stage == 3:
        return simulate(net, shape, comp, 3, scale, opts, serial=False).mem_peak
    shard = round_up(shape.numel(), n) // n * es
    if stage == 1:
        return 2 * shard
    bucket = max(n, opts["reduce_bucket_size"] // n * n)
    widest = max(size for _, size, _ in shape.parameters())
    spanned = -(-widest // bucket) + 1
    return (spanned + opts["max_in_flight"]) * bucket * es + shard


# ----------------------------------------------------------------------------------------------
# Tables


def fmt(v, digits=1):
    return f"{v:,.{digits}f}"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


class Model:
    def __init__(self, inputs):
        self.inputs = inputs
        self.opts = {k: inputs.get(f"dstrain.{k}", (int, bool)) for k in
                     ("reduce_bucket_size", "stage3_prefetch_bucket_size",
                      "stage3_param_persistence_threshold", "max_in_flight",
                      "stage3_reduce_in_flight", "gradient_clipping")}
        self.net = Network(inputs)
        self.peak = inputs.get("compute.peak_flops")
        self.ref = inputs.shape(inputs.get("compute.shape", str))
        if self.ref.checkpointing:
            raise InputError(f"{inputs.path}: shapes.{self.ref.name}.checkpointing must be false: "
                             "the measured run had no activation checkpointing")
        step_s = inputs.get("compute.tokens_per_step") / inputs.get("compute.tokens_per_s")
        self.fwd_bwd_s = step_s - inputs.get("compute.optimizer_ms") * 1e-3
        self.step_s = step_s
        self.rate = self.ref.flops_per_token() * self.ref.tokens() / self.fwd_bwd_s
        self.shapes = [inputs.shape(name) for name in inputs.get("shapes", dict)]
        self.scales = []
        for i, s in enumerate(inputs.get("scales", list)):
            if not isinstance(s, dict) or not all(isinstance(s.get(k), int) and s[k] > 0
                                                  for k in ("gpus", "nodes")):
                raise InputError(f"{inputs.path}: scales[{i}] is {s!r}; expected "
                                 '{"gpus": positive integer, "nodes": positive integer}')
            if s["gpus"] % s["nodes"]:
                raise InputError(f"{inputs.path}: scales[{i}]: {s['gpus']} GPUs do not divide "
                                 f"into {s['nodes']} nodes")
            self.scales.append((s["gpus"], s["nodes"]))
        self.memory = inputs.get("compute.memory_gb") * GB
        self.loss_chunk = inputs.get("activation_bytes.loss_chunk_gib")
        self.measured = measured_layers(inputs, self.shapes)

    def compute(self, shape):
        return Compute(self.inputs, shape, self.rate, self.measured.get(shape.name))

    def origin(self, shape):
        if shape.name == self.ref.name:
            return "measured"
        if shape.name in self.measured:
            return (f"measured per layer at {shape.seq} × {shape.micro}, extrapolated to "
                    f"{shape.L} layers")
        return "extrapolated"

    # -- tables

    def inputs_table(self):
        rows = []
        for key, what in (("compute.tokens_per_s", "tokens/s, one GPU, 0.5B shape, 8192 tokens a step"),
                          ("compute.optimizer_ms", "optimizer kernels a step (AdamW + norm), ms"),
                          ("compute.allocator_peak_gib", "allocator peak, GiB"),
                          ("compute.peak_flops", "dense bf16 peak, FLOP/s"),
                          ("network.intra_node_busbw_gbs", "busbw in a node (NVLink), GB/s"),
                          ("network.per_nic_busbw_gbs", "busbw of one 400 Gb/s NIC, GB/s"),
                          ("network.inter_node_busbw_gbs",
                           "busbw across nodes (reduce-scatter), GB/s, by node count")):
            section, name = key.split(".")
            entry = self.inputs.get(section, dict).get(name)
            if not isinstance(entry, dict) or not {"value", "kind", "where"} <= entry.keys():
                raise InputError(f"{self.inputs.path}: key '{key}' must be an object with value, "
                                 "kind, where and source")
            v = entry["value"]
            shown = (", ".join(f"{k}: {x}" for k, x in v.items()) if isinstance(v, dict) else
                     f"{v:,}" if v < 1e6 else f"{v:.3g}")
            rows.append([what, shown, entry["kind"], entry["where"]])
        rows.append(["forward + backward a step, ms", fmt(self.fwd_bwd_s * 1e3, 2), "derived",
                     "step − optimizer"])
        rows.append(["FLOP/s achieved in forward + backward",
                     f"{self.rate:.4g} ({fmt(100 * self.rate / self.peak)}% of peak)", "derived",
                     "FLOPs of the step / its forward + backward"])
        return table(["input", "value", "kind", "where"], rows)

    def shapes_table(self):
        rows = []
        for s in self.shapes:
            comp = self.compute(s)
            fb = sum(comp.fwd) + sum(comp.bwd)
            origin = self.origin(s)
            layer = (comp.fwd[1] + comp.bwd[1]) * 1e3
            rows.append([s.name, f"{s.numel() / 1e9:.3f} B", f"{s.flops_per_token() / 1e9:.2f}",
                         f"{s.micro} × {s.seq}", "yes" if s.checkpointing else "no",
                         fmt(layer, 2), fmt(fb * 1e3), fmt(comp.opt_per_element * s.numel() * 1e3),
                         origin])
        return table(["shape", "parameters", "GFLOP/token", "tokens a GPU", "checkpointing",
                      "one layer fwd+bwd ms", "fwd+bwd ms", "optimizer ms (all elements)",
                      "compute time"], rows)

    def bytes_table(self):
        rows = []
        for s in self.shapes:
            for stage in STAGES:
                per_scale = []
                counts = None
                for n, _ in self.scales:
                    c = engine_collectives(s, stage, n, 1, self.opts, s.element_bytes)
                    per_scale.append(fmt(sum(b for _, b in c.values()) / GB, 2))
                    counts = c
                rows.append([s.name, stage] +
                            [counts.get(k, (0, 0))[0] for k in
                             ("reduce_scatter", "all_gather", "all_reduce")] + per_scale)
        return table(["shape", "stage", "reduce-scatters", "all-gathers", "all-reduces"] +
                     [f"GB sent per rank, {n} GPUs" for n, _ in self.scales], rows)

    def projection_rows(self, net, shapes, scales, stages=STAGES):
        rows = []
        for s in shapes:
            comp = self.compute(s)
            for n, nodes in scales:
                for stage in stages:
                    owned = owned_elements(s, stage, n, self.opts)
                    ideal = comp.step(owned)
                    over = simulate(net, s, comp, stage, (n, nodes), self.opts, False)
                    ser = simulate(net, s, comp, stage, (n, nodes), self.opts, True)
                    tps = s.tokens() / over.t
                    fits = self.total_memory(s, comp, stage, (n, nodes)) <= self.memory
                    rows.append([s.name, n, stage, "yes" if fits else "**no**",
                                 fmt(ideal * 1e3), fmt(over.comm_busy * 1e3),
                                 fmt(over.t * 1e3), fmt(ser.t * 1e3), f"{100 * ideal / over.t:.0f}%",
                                 f"{100 * ideal / ser.t:.0f}%", fmt(tps, 0),
                                 f"{100 * s.flops_per_token() * tps / self.peak:.1f}%"])
        return rows

    def projection_table(self, net=None, shapes=None, scales=None, stages=STAGES):
        rows = self.projection_rows(net or self.net, shapes or self.shapes, scales or self.scales,
                                    stages)
        return table(["shape", "GPUs", "stage", "fits", "compute ms", "comm ms", "step ms (overlap)",
                      "step ms (no overlap)", "efficiency (overlap)", "efficiency (no overlap)",
                      "tokens/s per GPU", "MFU"], rows)

    def total_memory(self, s, comp, stage, scale):
        return (model_state_bytes(s, stage, scale[0], self.opts) +
                transient_bytes(self.net, s, comp, stage, scale, self.opts) +
                activation_bytes(s, self.loss_chunk))

    def memory_table(self):
        rows = []
        for s in self.shapes:
            comp = self.compute(s)
            act = activation_bytes(s, self.loss_chunk)
            for n, nodes in self.scales:
                for stage in STAGES:
                    states = model_state_bytes(s, stage, n, self.opts)
                    trans = transient_bytes(self.net, s, comp, stage, (n, nodes), self.opts)
                    total = states + trans + act
                    rows.append([s.name, n, stage, fmt(states / GB), fmt(trans / GB), fmt(act / GB),
                                 fmt(total / GB), "yes" if total <= self.memory else "**no**"])
        return table(["shape", "GPUs", "stage", "model states GB", "comm buffers GB",
                      "activations GB (estimate)", "total GB",
                      f"fits {self.memory / GB:.0f} GB"], rows)

    def calibration_table(self):
        s = self.ref
        states = model_state_bytes(s, 0, 1, self.opts)
        act = activation_bytes(s, self.loss_chunk)
        measured = self.inputs.get("compute.allocator_peak_gib")
        return table(["0.5B, stage 0, one GPU", "GiB"],
                     [["model states (16 bytes an element)", fmt(states / GIB, 2)],
                      ["activations + loss chunk (estimate)", fmt(act / GIB, 2)],
                      ["sum", fmt((states + act) / GIB, 2)],
                      ["measured allocator peak", fmt(measured, 2)]])

    def limits_table(self):
        rows = []
        for s in self.shapes:
            comp = self.compute(s)
            for n, nodes in self.scales:
                layer = Units(s, n, self.opts["stage3_param_persistence_threshold"]).padded[1]
                depth = self.opts["stage3_prefetch_bucket_size"] // layer
                cuts = len(buckets(s.numel(), n, self.opts["reduce_bucket_size"]))
                rs_layer = self.net.seconds("all_gather",
                                            ring_bytes("all_gather", layer * s.element_bytes, n),
                                            n, nodes)
                floor = self.net.seconds("all_gather", 0, n, nodes)
                calls3 = sum(c for c, _ in engine_collectives(s, 3, n, 1, self.opts,
                                                              s.element_bytes).values())
                rows.append([s.name, n, cuts, fmt(layer * s.element_bytes / 1e6),
                             min(depth, s.L), fmt(floor * 1e6, 0), fmt(rs_layer * 1e3, 2),
                             fmt(comp.fwd[1] * 1e3, 2), calls3,
                             fmt(calls3 * floor * 1e3, 1)])
        return table(["shape", "GPUs", "buckets (stages 1–2)", "layer unit MB",
                      "layers one prefetch starts (stage 3)", "latency floor of one all-gather µs",
                      "one layer's all-gather ms", "one layer's forward ms",
                      "collectives a step (stage 3)", "their latency floor ms"], rows)

    def variant(self, shape, comp, stage, scale, **changes):
        opts = dict(self.opts, **changes)
        tl = simulate(self.net, shape, comp, stage, scale, opts, False)
        ideal = comp.step(owned_elements(shape, stage, scale[0], opts))
        return tl, ideal

    def prefetch_table(self):
        """Stage 3 with the default prefetch budget and with budgets of one and two layer units."""
        rows = []
        for s in self.shapes:
            comp = self.compute(s)
            for n, nodes in self.scales:
                layer = Units(s, n, self.opts["stage3_param_persistence_threshold"]).padded[1]
                row = [s.name, n]
                for budget in (self.opts["stage3_prefetch_bucket_size"], layer, 2 * layer):
                    tl, ideal = self.variant(s, comp, 3, (n, nodes),
                                             stage3_prefetch_bucket_size=budget)
                    row += [fmt(tl.t * 1e3), f"{100 * ideal / tl.t:.0f}%", fmt(tl.mem_peak / GB, 2)]
                rows.append(row)
        head = []
        for what in ("default budget", "budget = 1 layer", "budget = 2 layers"):
            head += [f"{what}: step ms", "efficiency", "gathered peak GB"]
        return table(["shape", "GPUs"] + head, rows)

    def buckets_table(self):
        """Stages 1-2: the default, without clipping (update during backward), larger buckets."""
        variants = (("default", {}), ("no clipping", {"gradient_clipping": False}),
                    ("buckets of 2e8", {"reduce_bucket_size": 200_000_000}),
                    ("buckets of 5e8", {"reduce_bucket_size": 500_000_000}))
        rows = []
        for s in self.shapes:
            comp = self.compute(s)
            for n, nodes in self.scales:
                row = [s.name, n]
                for _, change in variants:
                    tl, ideal = self.variant(s, comp, 2, (n, nodes), **change)
                    row += [fmt(tl.t * 1e3), f"{100 * ideal / tl.t:.0f}%"]
                rows.append(row)
        head = []
        for what, _ in variants:
            head += [f"{what}: step ms", "efficiency"]
        return table(["shape", "GPUs"] + head, rows)

    def sensitivity_table(self):
        nic = self.inputs.get("network.per_nic_busbw_gbs")
        slow = Network(self.inputs, inter_node_override=nic)
        scales = [sc for sc in self.scales if sc[1] > 1]
        return self.projection_table(slow, scales=scales, stages=(2, 3))

    def tables(self):
        return collections.OrderedDict([
            ("inputs", self.inputs_table()),
            ("shapes", self.shapes_table()),
            ("bytes", self.bytes_table()),
            ("projection", self.projection_table()),
            ("limits", self.limits_table()),
            ("buckets", self.buckets_table()),
            ("prefetch", self.prefetch_table()),
            ("memory", self.memory_table()),
            ("calibration", self.calibration_table()),
            ("sensitivity", self.sensitivity_table()),
            ("published", self.published_table()),
            ("measured", self.measured_table()),
        ])

    def published_table(self):
        rows = []
        for i, r in enumerate(self.inputs.get("published_scaling", list)):
            where = f"{self.inputs.path}: published_scaling[{i}]"
            try:
                spec = dict(self.inputs.get("shapes", dict)[r["shape"]], micro=r["micro"],
                            seq=r["seq"], checkpointing=False)
                shape = Shape(r["shape"], spec, where)
                a, b = r["from"], r["to"]
                scales = [(a["gpus"], a["nodes"]), (b["gpus"], b["nodes"])]
                published = b["tokens_per_s_per_gpu"] / a["tokens_per_s_per_gpu"]
            except (KeyError, TypeError) as e:
                raise InputError(f"{where}: missing or malformed {e}")
            layer = Units(shape, scales[0][0], self.opts["stage3_param_persistence_threshold"])
            opts = dict(self.opts, stage3_prefetch_bucket_size=r["prefetch_layers"] * layer.padded[1])
            # The compute speed that gives the first configuration its published step time.
            target = shape.tokens() / a["tokens_per_s_per_gpu"]
            rate = self.rate
            for _ in range(20):
                comp = Compute(self.inputs, shape, rate)
                t = simulate(self.net, shape, comp, r["stage"], scales[0], opts, False).t
                rate *= t / target
            comp = Compute(self.inputs, shape, rate)
            times = [simulate(self.net, shape, comp, r["stage"], sc, opts, False).t for sc in scales]
            rows.append([r["name"], f"{a['gpus']} → {b['gpus']}",
                         f"{a['tokens_per_s_per_gpu']:,} → {b['tokens_per_s_per_gpu']:,}",
                         f"{100 * published:.1f}%", f"{100 * times[0] / times[1]:.1f}%"])
        return table(["published run", "GPUs", "tokens/s per GPU (published)",
                      "kept (published)", "kept (model)"], rows)

    def measured_table(self):
        """The NCCL calls timed on a GPU beside the model's time for the same call, then their
        provenance (the section's source)."""
        entries = self.inputs.get("measured_collectives", list)
        if not entries:
            return "(none yet)"
        rows = []
        for i, e in enumerate(entries):
            try:
                model = self.net.seconds(e["kind"], e["bytes_sent"], e["ranks"], e["nodes"])
                rows.append([e["kind"], e["ranks"], e["nodes"], f"{e['bytes_sent']:,}",
                             fmt(e["seconds"] * 1e6, 0), fmt(model * 1e6, 1), e.get("case", "")])
            except (KeyError, TypeError):
                raise InputError(f"{self.inputs.path}: measured_collectives[{i}] is {e!r}; "
                                 "expected kind, ranks, nodes, bytes_sent, seconds")
        text = table(["collective", "ranks", "nodes", "bytes sent a rank", "measured µs",
                      "model µs", "case"], rows)
        source = self.inputs.raw["measured_collectives"].get("source")
        return text + (f"\n\nSource: {source}" if isinstance(source, str) else "")


# ----------------------------------------------------------------------------------------------
# The check: a real 2-rank CPU run's counters (its trace) against the formulas


def trainer_all_reduces(steps, log_interval):
    """The trainer's own 8-byte all-reduces besides the engine's norm: the stop vote after every
    step but the last and the loss at logged steps (step 1, every log_interval, the last)."""
    logged = sum(1 for s in range(1, steps + 1) if s == 1 or s % log_interval == 0 or s == steps)
    return (steps - 1) + logged


def load_trace(run_dir):
    path = os.path.join(run_dir, "trace", "trace.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"{path}: no readable trace ({e})")


def counters_by_step(events):
    """From the comm spans' bytes_sent: {rank: {step: {kind: [calls, bytes]}}} of every
    reduce-scatter and all-gather and of the all-reduces of a bucket (stage 0), attributed to the
    step span they start in; and {rank: [calls, bytes]} of the other all-reduces (8-byte: the
    gradient norm and the trainer's), over the whole run."""
    steps = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("name") == "step" and e.get("cat") == "step":
            steps[e["pid"]].append((e["ts"], e["ts"] + e["dur"], e["args"]["step"]))
    per_step = collections.defaultdict(lambda: collections.defaultdict(
        lambda: collections.defaultdict(lambda: [0, 0])))
    other = collections.defaultdict(lambda: [0, 0])
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "comm" or "bytes_sent" not in e.get("args", {}):
            continue
        args = e["args"]
        if e["name"] not in ("reduce_scatter", "all_gather", "all_reduce"):
            continue
        if e["name"] == "all_reduce" and "bucket" not in args:
            other[e["pid"]][0] += 1
            other[e["pid"]][1] += args["bytes_sent"]
            continue
        step = next((s for lo, hi, s in steps[e["pid"]] if lo <= e["ts"] <= hi), None)
        if step is None:
            raise InputError(f"a {e['name']} of rank {e['pid']} at {e['ts']} us lies in no step "
                             "span of its trace")
        cell = per_step[e["pid"]][step][e["name"]]
        cell[0] += 1
        cell[1] += args["bytes_sent"]
    return per_step, other


def check_command(inputs, args):
    shape_in = inputs.get("check.shape", dict)
    shape = Shape("tiny", shape_in, f"{inputs.path}: check.shape")
    world = inputs.get("check.world", int)
    sets = inputs.get("check.set", dict)
    needed = ("training.max_steps", "training.gradient_accumulation_steps",
              "training.log_interval", "zero.reduce_bucket_size",
              "zero.stage3_param_persistence_threshold")
    for key in needed:
        if not isinstance(sets.get(key), int) or sets[key] <= 0:
            raise InputError(f"{inputs.path}: check.set.{key} is {sets.get(key)!r}; expected a "
                             "positive integer")
    steps, micro = sets["training.max_steps"], sets["training.gradient_accumulation_steps"]
    opts = {"reduce_bucket_size": sets["zero.reduce_bucket_size"],
            "stage3_param_persistence_threshold": sets["zero.stage3_param_persistence_threshold"]}
    work = args.work or tempfile.mkdtemp(prefix="dstrain-scaling-check-")
    rows, failures = [], []
    for stage in inputs.get("check.stages", list):
        run_dir = os.path.join(work, f"stage{stage}")
        if not args.no_run:
            run_check_job(inputs, args.dstrain, stage, run_dir, world, sets)
        labelled, other = counters_by_step(load_trace(run_dir))
        want = engine_collectives(shape, stage, world, micro, opts, shape.element_bytes, norm=False)
        for kind in ("reduce_scatter", "all_gather", "all_reduce"):
            if kind not in want:
                continue
            calls, nbytes = want[kind]
            got = sorted({tuple(labelled[r][s].get(kind, [0, 0])) for r in range(world)
                          for s in range(1, steps + 1)})
            ok = got == [(calls, nbytes)]
            if not ok:
                failures.append(f"stage {stage} {kind}: formula {calls} calls {nbytes} bytes, "
                                f"counters {got}")
            rows.append([stage, kind, calls, f"{nbytes:,}",
                         " / ".join(f"{c} / {b:,}" for c, b in got), "equal" if ok else "**differ**"])
        # One gradient norm a step (the engine's) and the trainer's own 8-byte ones, and its
        # 16-byte count of each step's labels and tokens.
        small = steps + trainer_all_reduces(steps, sets["training.log_interval"])
        calls = small + steps
        nbytes = (small * ring_bytes("all_reduce", 8, world) +
                  steps * ring_bytes("all_reduce", 16, world))
        got = sorted({tuple(other[r]) for r in range(world)})
        ok = got == [(calls, nbytes)]
        if not ok:
            failures.append(f"stage {stage} small all_reduces: formula {calls} calls {nbytes} "
                            f"bytes, counters {got}")
        rows.append([stage, f"8- and 16-byte all_reduce, whole run of {steps} steps", calls,
                     f"{nbytes:,}", " / ".join(f"{c} / {b:,}" for c, b in got),
                     "equal" if ok else "**differ**"])
    text = table(["stage", "collective (per step unless said)", "calls (formula)",
                  "bytes per rank (formula)", "calls / bytes (counters, every step, both ranks)",
                  "check"], rows)
    return text, failures, work


def run_check_job(inputs, dstrain, stage, run_dir, world, sets):
    config = os.path.join(REPO, inputs.get("check.config", str))
    cmd = [dstrain, "launch", "--nproc", str(world), config, "--trace"]
    overrides = dict(sets)
    overrides.update({"zero.stage": stage, "logging.out_dir": run_dir,
                      "checkpoint.dir": os.path.join(run_dir, "ckpt")})
    for k, v in overrides.items():
        cmd += ["--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
    env = dict(os.environ, DSTRAIN_DEVICE="cpu")  # the Gloo communicator records the comm track
    r = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, errors="replace", timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-3000:]}")


# ----------------------------------------------------------------------------------------------
# docs/scaling.md: generated blocks between <!-- scaling-model:NAME --> and <!-- /scaling-model -->


def doc_blocks(text):
    blocks, pos = {}, 0
    while True:
        start = text.find("<!-- scaling-model:", pos)
        if start < 0:
            return blocks
        head_end = text.index("-->", start)
        name = text[start + len("<!-- scaling-model:"):head_end].strip()
        end = text.index("<!-- /scaling-model -->", head_end)
        blocks[name] = (head_end + 3, end)
        pos = end


def update_doc(path, tables, write):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    blocks = doc_blocks(text)
    diffs = []
    for name, body in sorted(tables.items(), key=lambda kv: -blocks.get(kv[0], (0, 0))[0]):
        if name not in blocks:
            diffs.append(f"{path}: no block <!-- scaling-model:{name} -->")
            continue
        lo, hi = blocks[name]
        want = "\n" + body + "\n"
        if text[lo:hi] != want:
            diffs.append(f"{path}: table '{name}' " +
                         ("rewritten" if write else "differs from the script's output"))
            text = text[:lo] + want + text[hi:]
    if write:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return diffs


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs="?", default="tables", choices=("tables", "check"))
    p.add_argument("--inputs", default=DEFAULT_INPUTS, help="input file (default %(default)s)")
    p.add_argument("--doc", default=DEFAULT_DOC, help="document with the tables (default %(default)s)")
    p.add_argument("--update-doc", action="store_true", help="write the tables into --doc")
    p.add_argument("--check-doc", action="store_true", help="exit 1 unless --doc has these tables")
    p.add_argument("--dstrain", default=os.path.join(REPO, "build", "apps", "dstrain", "dstrain"),
                   help="check: the dstrain binary (default %(default)s)")
    p.add_argument("--work", help="check: directory for the runs (default: a new temporary one)")
    p.add_argument("--no-run", action="store_true", help="check: read the runs already in --work")
    args = p.parse_args(argv)
    try:
        inputs = Inputs(args.inputs)
        if args.command == "check":
            text, failures, work = check_command(inputs, args)
            tables = {"counters": text}
        else:
            tables, failures = Model(inputs).tables(), []
    except InputError as e:
        print(f"scaling-model: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        print(f"scaling-model: {e}", file=sys.stderr)
        return 1
    for name, body in tables.items():
        print(f"<!-- scaling-model:{name} -->\n{body}\n<!-- /scaling-model -->\n")
    if args.command == "check":
        print(f"runs in {work}", file=sys.stderr)
    for f in failures:
        print(f"scaling-model: {f}", file=sys.stderr)
    diffs = []
    if args.update_doc or args.check_doc:
        diffs = update_doc(args.doc, tables, write=args.update_doc)
        for d in diffs:
            print(f"scaling-model: {d}", file=sys.stderr)
    if failures or (args.check_doc and not args.update_doc and diffs):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
