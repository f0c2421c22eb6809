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
its depth. Tensor parallelism (a projection of its design: TP ranks inside a node, data parallel
outermost) splits every matrix TP ways, puts its collectives on NVLink between the matmuls, on the
compute stream, and runs ZeRO over each TP rank's data-parallel group across the nodes. Pipeline
parallelism (lib/train/pipeline.h: stages the outermost split, balanced by the blocks' matrices,
1F1B or interleaved 1F1B) runs every rank of one pipeline on its own timeline in the schedule's
order, each point-to-point transfer of a micro-batch's boundary activations on the receiver's
critical path, each backward one micro-step of the stage's ZeRO 1 or 2 engine over its blocks.
Expert parallelism (lib/model/moe.h: E/E_p experts a rank, each pipeline stage's ranks factorised
again) runs the Mixture-of-Experts layers' all-to-alls on the compute stream, and ZeRO by two
engines, the dense parameters over the stage's ranks and the expert stacks over the ranks that hold
the same experts; the layers at a measured dense layer's FLOP rate.
Python 3, standard library only.
"""
import argparse
import collections
import copy
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
    """A Llama/Qwen2-shaped decoder: hidden H, intermediate I, L layers, heads, kv heads, vocab;
    as one rank of a tensor-parallel group of `tp` sees it (tensor_parallel())."""

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
        # Optional: the shape whose measured layers give this one's FLOP rate (none of its own
        # measured), and the one section of the page whose tables show it.
        self.layer_rate_of = s.get("layer_rate_of")
        self.only_in = s.get("only_in")
        self.tp = 1

    def tensor_parallel(self, tp):
        """The shape as one rank of a tensor-parallel group of `tp` sees it (Megatron's split: q, k,
        v, gate and up by columns, o and down by rows, embedding and head by vocabulary rows, 1/tp
        of each a rank; norms whole), and the group's micro-batch `tp` times one GPU's, so that
        every GPU still has the same tokens a step."""
        for what, v in (("heads", self.heads), ("kv_heads", self.kv_heads),
                        ("intermediate", self.I), ("vocab", self.V)):
            if v % tp:
                raise InputError(f"shapes.{self.name}.{what} ({v}) does not split {tp} ways")
        out = copy.copy(self)
        out.tp, out.micro = tp, self.micro * tp
        return out

    def parameters(self, whole=False):
        """[(name, numel, unit)] in dstrain's named_parameters() order, the rank's 1/tp of each
        split one (`whole`: the unsplit model); units are the model's blocks (lib/model/blocks.h:
        embedding 0, layer i 1 + i, norm and lm_head L+1)."""
        H, q, kv = self.H, self.heads * self.head_dim, self.kv_heads * self.head_dim
        t = 1 if whole else self.tp
        out = [("model.embed_tokens.weight", self.V * H // t, 0)]
        for i in range(self.L):
            p, u = f"model.layers.{i}.", 1 + i
            out.append((p + "self_attn.q_proj.weight", q * H // t, u))
            if self.qkv_bias:
                out.append((p + "self_attn.q_proj.bias", q // t, u))
            for proj in ("k_proj", "v_proj"):
                out.append((p + f"self_attn.{proj}.weight", kv * H // t, u))
                if self.qkv_bias:
                    out.append((p + f"self_attn.{proj}.bias", kv // t, u))
            out.append((p + "self_attn.o_proj.weight", H * q // t, u))
            for proj in ("gate_proj", "up_proj"):
                out.append((p + f"mlp.{proj}.weight", self.I * H // t, u))
            out.append((p + "mlp.down_proj.weight", H * self.I // t, u))
            out.append((p + "input_layernorm.weight", H, u))
            out.append((p + "post_attention_layernorm.weight", H, u))
        out.append(("model.norm.weight", H, self.L + 1))
        if not self.tied:
            out.append(("lm_head.weight", self.V * H // t, self.L + 1))
        return out

    def numel(self):
        """Elements a rank holds (the whole model without tensor parallelism)."""
        return sum(n for _, n, _ in self.parameters())

    def tokens(self):
        """Tokens of one micro-step: one GPU's, or its tensor-parallel group's."""
        return self.micro * self.seq

    def segment_forward_flops(self):
        """Forward FLOPs per token of each segment (embed, layer 0..L-1, head) of the whole model:
        2 per matmul weight plus attention's 4·heads·head_dim·seq per layer; three times that
        forward + backward is docs/models.md's 6·N + 12·L·H·Q·T (N counting the LM head, tied
        or not)."""
        per_layer = collections.Counter()
        for _, n, u in self.parameters(whole=True):
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


def tp_collectives(shape, sequence_parallel):
    """Tensor parallelism's collectives of one micro-step over the tp ranks of a group, each
    between two matmuls: (forward, backward), a list per segment (embedding, layers, head) of
    (kind, buffer bytes). S is the group's activation, tokens x hidden in the compute dtype. With
    sequence parallelism a layer all-gathers S before and reduce-scatters it after each of
    attention and the MLP, forward and backward (and again in the recompute of a checkpointed
    layer); the embedding reduce-scatters its output, the head all-gathers its input and
    reduce-scatters its input's gradient. Without, a layer all-reduces S twice forward and twice
    backward, the embedding its output, the head its input's gradient. The vocabulary-parallel loss
    all-reduces 3 fp32 values a token (maximum, sum of exponentials, target logit)."""
    S = shape.tokens() * shape.H * shape.element_bytes
    if sequence_parallel:
        layer = [("all_gather", S), ("reduce_scatter", S)] * 2
        embed, head_in = [("reduce_scatter", S)], [("all_gather", S)]
        head_grad = [("reduce_scatter", S)]
    else:
        layer = [("all_reduce", S)] * 2
        embed, head_in, head_grad = [("all_reduce", S)], [], [("all_reduce", S)]
    loss = [("all_reduce", shape.tokens() * 4)] * 3
    recompute = 2 if shape.checkpointing else 1
    forward = [embed] + [layer] * shape.L + [head_in + loss]
    backward = [[]] + [layer * recompute] * shape.L + [head_grad]
    return forward, backward


# ----------------------------------------------------------------------------------------------
# Time of one collective: NCCL's latency model plus bytes over the published bus bandwidth


class Network:
    def __init__(self, inputs, inter_node_override=None):
        self.intra = inputs.get("network.intra_node_busbw_gbs")
        self.inter = {int(k): v for k, v in inputs.get("network.inter_node_busbw_gbs", dict).items()}
        self.lat = inputs.get("network.nccl_latency_us", dict)
        self.proto = inputs.get("network.protocol_bandwidth", dict)
        self.nic = inputs.get("network.per_nic_busbw_gbs")
        self.override = inter_node_override
        self._seconds = {}

    def busbw(self, nodes, per_node):
        """A ring's busbw over `nodes` nodes with `per_node` of its ranks in each. Across nodes each
        rank has its own NIC, and the rings of the other groups on the node (a group per
        tensor-parallel rank) use theirs at the same time, so a group gets per_node NICs: at most
        per_node x one NIC's busbw, besides the measured figure for whole nodes."""
        if nodes == 1:
            return self.intra
        if self.override is not None:
            return self.override
        return min(self._whole_nodes(nodes), per_node * self.nic)

    def _whole_nodes(self, nodes):
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
        key = (kind, bytes_sent, n, nodes)
        if key not in self._seconds:
            self._seconds[key] = self._fastest(kind, bytes_sent, n, nodes)
        return self._seconds[key]

    def transfer_seconds(self, nbytes, across_nodes):
        """A point-to-point send of `nbytes` (a pipeline's activations or their gradients): what a
        ring of two ranks costs that sends nbytes a rank, one step of NCCL's latency plus the bytes
        over one NIC's busbw between nodes (every rank of a node sends through its own NIC at
        once) or NVLink's inside one."""
        return self.seconds("all_gather", nbytes, 2, 2 if across_nodes else 1)

    def _fastest(self, kind, bytes_sent, n, nodes):
        if n <= 1:
            return 0.0
        bus = self.busbw(nodes, n // nodes)
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

    def launch(self, kind, buffer_bytes, group=None):
        """A collective over this timeline's ranks, or over `group` (ranks, nodes): another
        group's collective on the same two streams (expert parallelism's second engine)."""
        n, nodes = group or (self.n, self.nodes)
        return self.launch_seconds(self.net.seconds(kind, ring_bytes(kind, buffer_bytes, n),
                                                    n, nodes))

    def launch_seconds(self, seconds):
        """A collective of `seconds` on the comm stream."""
        start = max(self.comm, self.t)
        self.comm = start + seconds
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
    """Seconds of each segment's forward and backward on the compute stream, and of the optimizer
    per element owned: from the FLOPs at `rate`, or, with `measured` (a measured_layers entry),
    each decoder layer's as measured and the optimizer's per element as measured (embedding and
    head still at `rate`). With tensor parallelism (shape.tp > 1) a rank does 1/tp of its group's
    FLOPs at `efficiency` times the rate of whole matrices, and each segment's tensor-parallel
    collectives (tp_fwd, tp_bwd; tp_norm: the gradient norm's) run on `net` in a node between its
    matmuls, counted in fwd and bwd."""

    def __init__(self, inputs, shape, rate, measured=None, net=None, sequence_parallel=True,
                 efficiency=1.0):
        self.shape = shape
        tp, tokens = shape.tp, shape.tokens()
        fwd = [f * tokens / rate for f in shape.segment_forward_flops()]
        recompute = [0.0] + fwd[1:-1] + [0.0] if shape.checkpointing else [0.0] * len(fwd)
        bwd = [2 * f + r for f, r in zip(fwd, recompute)]
        ref = inputs.shape(inputs.get("compute.shape", str))
        self.opt_per_element = inputs.get("compute.optimizer_ms") * 1e-3 / ref.numel()
        if measured:
            layers = range(1, len(fwd) - 1)
            scale = tokens / (measured["micro"] * measured["seq"])
            fwd = [measured["forward_ms"] * 1e-3 * scale if k in layers else f
                   for k, f in enumerate(fwd)]
            bwd = [measured["backward_ms"] * 1e-3 * scale if k in layers else b
                   for k, b in enumerate(bwd)]
            self.opt_per_element = measured["optimizer_ns_per_element"] * 1e-9
        self.tp_fwd, self.tp_bwd, self.tp_norm = [0.0] * len(fwd), [0.0] * len(bwd), 0.0
        if tp > 1:
            def seconds(calls):
                return sum(net.seconds(k, ring_bytes(k, b, tp), tp, 1) for k, b in calls)

            forward, backward = tp_collectives(shape, sequence_parallel)
            self.tp_fwd, self.tp_bwd = [seconds(c) for c in forward], [seconds(c) for c in backward]
            self.tp_norm = seconds([("all_reduce", 8)])
        share = tp * efficiency
        self.fwd = [f / share + c for f, c in zip(fwd, self.tp_fwd)]
        self.bwd = [b / share + c for b, c in zip(bwd, self.tp_bwd)]

    def tp_seconds(self):
        """Tensor parallelism's collectives in one step (all on the critical path)."""
        return sum(self.tp_fwd) + sum(self.tp_bwd) + self.tp_norm

    def step(self, owned):
        return sum(self.fwd) + sum(self.bwd) + self.opt_per_element * owned + self.tp_norm


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


def borrowed_layers(inputs, shapes, measured):
    """{shape name: entry} for the shapes whose layers run at another shape's measured FLOP rate
    (layer_rate_of): that shape's measured forward and backward scaled by the ratio of the two
    layers' forward FLOPs a token, its optimizer's time an element. A shape measured itself keeps
    its own; without a measurement of that shape, none (the FLOP rate of compute)."""
    by_name = {s.name: s for s in shapes}
    out = {}
    for s in shapes:
        if s.layer_rate_of is None or s.name in measured:
            continue
        where = f"{inputs.path}: shapes.{s.name}.layer_rate_of"
        ref = by_name.get(s.layer_rate_of)
        if ref is None:
            raise InputError(f"{where} is {s.layer_rate_of!r}; expected a shape's name")
        e = measured.get(ref.name)
        if e is None:
            continue
        if (s.micro, s.seq, s.checkpointing) != (ref.micro, ref.seq, ref.checkpointing):
            raise InputError(f"{where}: {ref.name} has another micro-batch, length or "
                             "checkpointing than this shape")
        ratio = s.segment_forward_flops()[1] / ref.segment_forward_flops()[1]
        out[s.name] = dict(e, forward_ms=e["forward_ms"] * ratio,
                           backward_ms=e["backward_ms"] * ratio, rate_of=ref.name)
    return out


class ShardedRun:
    """Stages 1 and 2 on the timeline (lib/zero/grad_reducer.cpp): in a backward that communicates,
    each bucket's reduce-scatter is launched once every unit (segment) with parameters in it has
    finished its backward, strictly from the last bucket to the first, at most max_in_flight
    outstanding (a further launch waits for the oldest); a bucket with parameters of units this
    backward does not run (another pipeline chunk's) waits for its end, and so do the buckets
    below it. With clipping the step waits for the reductions, all-reduces the norm, updates bucket
    by bucket from the last and launches each bucket's all-gather behind its update. Without
    clipping each bucket is updated, and its all-gather launched, as its reduction of the step's
    last micro-step is retired during backward (docs/zero.md, "When the update runs")."""

    def __init__(self, tl, shape, comp, n, opts, group=None):
        self.tl, self.comp, self.n, self.opts = tl, comp, n, opts
        self.group = group  # (ranks, nodes) of its collectives; None: the timeline's
        self.es = shape.element_bytes
        params = shape.parameters()
        offsets, off = [], 0
        for _, size, _ in params:
            offsets.append(off)
            off += size
        self.cuts = buckets(off, n, opts["reduce_bucket_size"])
        width = self.cuts[0][1] - self.cuts[0][0]  # every bucket but the last
        self.units_of = [set() for _ in self.cuts]
        for (_, size, unit), begin in zip(params, offsets):
            last = min((begin + size - 1) // width, len(self.cuts) - 1)
            for b in range(min(begin // width, len(self.cuts) - 1), last + 1):
                self.units_of[b].add(unit)
        self.buckets_of_unit = collections.defaultdict(list)
        for b, units in enumerate(self.units_of):
            for u in units:
                self.buckets_of_unit[u].append(b)
        self.clipping = opts["gradient_clipping"]
        self.in_flight = collections.deque()
        self.gathers = []
        self.active = False
        sizes = {hi - lo for lo, hi in self.cuts}  # two at most: every bucket's and the last's
        nodes = group[1] if group else tl.nodes
        self.rs_seconds = {size: tl.net.seconds("reduce_scatter",
                                                ring_bytes("reduce_scatter", size * self.es, n),
                                                n, nodes) for size in sizes}

    def update(self, b):
        lo, hi = self.cuts[b]
        self.tl.compute(self.comp.opt_per_element * (hi - lo) / self.n)
        self.gathers.append(self.tl.launch("all_gather", (hi - lo) * self.es, self.group))

    def retire(self, entry):
        end, b, last = entry
        self.tl.wait(end)
        if last and not self.clipping:
            self.update(b)

    def launch(self, b):
        if len(self.in_flight) >= self.opts["max_in_flight"]:
            self.retire(self.in_flight.popleft())
        lo, hi = self.cuts[b]
        self.in_flight.append((self.tl.launch_seconds(self.rs_seconds[hi - lo]), b, self.last))

    def backward(self, units, communicate=True, last=True):
        """One backward over `units` (in backward order); `communicate`: reduce its gradients
        (stage 1: the step's last micro-step; stage 2: every one); `last`: the step's last."""
        self.begin_backward(communicate, last)
        for u in units:
            self.tl.compute(self.comp.bwd[u])
            self.unit_done(u)
        self.end_backward()

    def begin_backward(self, communicate, last):
        self.active, self.last = communicate, last
        self.waiting = [len(u) for u in self.units_of]
        self.following = len(self.cuts) - 1

    def unit_done(self, u):
        """Unit u's backward is done: launch the buckets it completes, strictly from the last."""
        if not self.active:
            return
        for b in self.buckets_of_unit[u]:
            self.waiting[b] -= 1
        while self.following >= 0 and self.waiting[self.following] <= 0:
            self.launch(self.following)
            self.following -= 1

    def end_backward(self):
        while self.active and self.following >= 0:  # end_backward()
            self.launch(self.following)
            self.following -= 1

    def reduce_norm(self):
        """Waits for the reductions; the norm's all-reduce over the data-parallel group, then the
        tensor-parallel group's sum of it."""
        while self.in_flight:
            self.retire(self.in_flight.popleft())
        self.tl.wait(self.tl.launch("all_reduce", 8))
        self.tl.compute(self.comp.tp_norm)

    def update_all(self):
        if self.clipping:
            for b in reversed(range(len(self.cuts))):
                self.update(b)
        for end in self.gathers:
            self.tl.wait(end)
        return self.tl.t


def sharded_step(tl, shape, comp, n, opts):
    """Stages 1 and 2 with one micro-step (they issue the same collectives then): ShardedRun over
    a forward and a backward of every segment."""
    run = ShardedRun(tl, shape, comp, n, opts)
    tl.compute(sum(comp.fwd))
    run.backward(reversed(range(len(comp.fwd))))
    run.reduce_norm()
    return run.update_all()


class Stage3Run:
    """Stage 3 (lib/zero/stage3_schedule.cpp, stage3_step.cpp) on the timeline."""

    def __init__(self, tl, shape, comp, n, opts, prefetch, group=None):
        self.tl, self.comp, self.n, self.shape = tl, comp, n, shape
        self.group = group  # (ranks, nodes) of its collectives; None: the timeline's
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
        self.gather_end[u] = self.tl.launch("all_gather", self.bytes_of(u), self.group)
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
        self.reductions.append((self.tl.launch("reduce_scatter", padded * self.es, self.group),
                                buffers, padded))

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
        tl.compute(self.comp.tp_norm)  # the tensor-parallel group's sum of the norm
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
# Pipeline parallelism (lib/train/pipeline.h, pipeline.cpp): the schedule, the stage split, and a
# step of every rank of one pipeline on its own timeline


def pipeline_schedule(stages, stage, micro_batches, chunks):
    """Rank `stage`'s actions of one step, (forward, micro-batch, chunk), in pipeline.cpp's order:
    1F1B with one chunk a rank (P - p - 1 forwards to fill, then one forward and one backward in
    turn, then the last backwards), interleaved 1F1B with more (Megatron-LM's order, micro-batches
    P at a time through each chunk; m a multiple of P)."""
    if chunks > 1 and micro_batches % stages:
        raise InputError(f"interleaving needs micro-batches ({micro_batches}) a multiple of the "
                         f"{stages} stages")

    def action(forward, k):
        group = k % (stages * chunks)
        chunk = group // stages
        micro = (k // (stages * chunks)) * stages + k % stages
        return forward, micro, chunk if forward else chunks - 1 - chunk

    total = micro_batches * chunks
    fill = (stages - stage - 1) * 2 + (chunks - 1) * stages if chunks > 1 else stages - stage - 1
    warmup = min(total, fill)
    out = [action(True, k) for k in range(warmup)]
    for k in range(total - warmup):
        out += [action(True, k + warmup), action(False, k)]
    return out + [action(False, k) for k in range(total - warmup, total)]


def pipeline_bubble(stages, micro_batches, chunks):
    """The idle share of a step with equal stages (pipeline.h): (P - 1) / (v·m + P - 1)."""
    return (stages - 1) / (chunks * micro_batches + stages - 1)


def block_costs(shape):
    """pipeline.cpp's block_costs: each block's matrices' elements (the multiply-adds a token of
    its projections), the embedding's lookup none, a tied head its vocabulary projection."""
    costs = [0] * (shape.L + 2)
    for name, n, u in shape.parameters(whole=True):
        if u > 0 and name.endswith("proj.weight") or name == "lm_head.weight":
            costs[u] += n
    if shape.tied:
        costs[-1] += shape.V * shape.H
    return costs


def balance_stages(costs, parts):
    """pipeline.cpp's balance_stages: contiguous ranges [first, end) of at least one block each
    that minimise the largest stage's cost (ties: the earlier stages smaller)."""
    n = len(costs)
    if n < parts:
        raise InputError(f"{parts} pipeline stages for a model of {n} blocks")
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    best = [[math.inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for j in range(1, parts + 1):
        for i in range(j, n - (parts - j) + 1):
            for s in range(j - 1, i):
                cost = max(best[j - 1][s], prefix[i] - prefix[s])
                if cost < best[j][i]:
                    best[j][i], cut[j][i] = cost, s
    out, end = [None] * parts, n
    for j in range(parts, 0, -1):
        out[j - 1] = (cut[j][end], end)
        end = cut[j][end]
    return out


class StageView:
    """The blocks one pipeline rank holds, as the ZeRO machinery reads a shape: their parameters
    only, in block order (the engine's partition order), units renumbered 0, 1, ... in that order;
    and `comp`'s times of those blocks."""

    def __init__(self, shape, comp, blocks):
        self.blocks = list(blocks)
        local = {b: k for k, b in enumerate(self.blocks)}
        self._params = [(name, n, local[u]) for name, n, u in shape.parameters() if u in local]
        self.element_bytes = shape.element_bytes
        self.fwd = [comp.fwd[b] for b in self.blocks]
        self.bwd = [comp.bwd[b] for b in self.blocks]
        self.tp_seconds = sum(comp.tp_fwd[b] + comp.tp_bwd[b] for b in self.blocks)
        self.opt_per_element, self.tp_norm = comp.opt_per_element, comp.tp_norm

    def parameters(self):
        return self._params

    def numel(self):
        return sum(n for _, n, _ in self._params)


class PipelineLayout:
    """A pipeline of `stages` ranks, one a stage, `chunks` virtual stages each (pipeline.h): the
    balanced split of `shape`'s blocks, each rank's blocks (StageView) and, by chunk, its local
    units; on `scale` (GPUs, nodes) with the stage s on the s-th block of GPUs / P ranks, which
    boundaries cross between nodes."""

    def __init__(self, shape, comp, stages, chunks, scale, split):
        self.P, self.v = stages, chunks
        gpus, nodes = scale
        self.split = split  # P·v ranges of blocks
        self.views, self.chunk_units = [], []
        for p in range(stages):
            mine = [split[c * stages + p] for c in range(chunks)]
            view = StageView(shape, comp, [b for lo, hi in mine for b in range(lo, hi)])
            self.views.append(view)
            local, units = 0, []
            for lo, hi in mine:
                units.append(list(range(local, local + hi - lo)))
                local += hi - lo
            self.chunk_units.append(units)
        per_node, per_stage = gpus // nodes, gpus // stages
        node = [s * per_stage // per_node for s in range(stages)]
        # Virtual stage s sends to s + 1: rank s mod P to rank (s + 1) mod P.
        self.across = [node[s % stages] != node[(s + 1) % stages]
                       for s in range(stages * chunks - 1)]

    def rank_of(self, s):
        return s % self.P

    def layers(self, s):
        """Decoder layers of virtual stage s (blocks 1 .. L of the embedding, L layers, head)."""
        lo, hi = self.split[s]
        return sum(1 for b in range(lo, hi) if 0 < b < self.split[-1][1] - 1)


def pipeline_step(net, layout, stage, dp_scale, opts, micro_batches, transfer, pipeline_nodes,
                  make_run=None):
    """One step of every rank of a pipeline, each on its own timeline (its compute stream and its
    data-parallel group's NCCL stream): the schedule's forwards and backwards of each rank in
    order, a forward after its input has arrived from the stage before, a backward after its
    output's gradient from the stage after. A transfer of `transfer[s]` seconds (virtual stage s to
    s + 1, and back) starts once the sender's compute of it is done and the receiver's compute
    before it (dstrain posts the receive then, and its compute waits for it: every transfer is on
    the receiver's critical path), after the transfer before it on the same link. Each backward is
    a micro-step of the rank's engine (ShardedRun over its blocks): stage 1 reduces on the step's
    last, stage 2 on every one. Then each rank waits for its reductions and all-reduces the norm
    over its data-parallel group; the norm is summed over the pipeline (every rank waits for the
    slowest); each rank updates and all-gathers. `make_run(tl, p)`: rank p's engine on its timeline
    (default: ShardedRun over its blocks). Returns the ranks' timelines."""
    P, v = layout.P, layout.v
    dp, dp_nodes = dp_scale
    tls, runs, actions = [], [], []
    for p in range(P):
        tl = Timeline(net, dp, dp_nodes, False)
        tls.append(tl)
        runs.append(make_run(tl, p) if make_run else
                    ShardedRun(tl, layout.views[p], layout.views[p], dp, opts))
        actions.append(pipeline_schedule(P, p, micro_batches, v))
    last = P * v - 1
    done = {}  # (forward, virtual stage, micro-batch): the end of its compute
    link = collections.defaultdict(float)  # (virtual stage, forward): the last transfer's end
    nxt, backwards = [0] * P, [0] * P
    micro_steps = micro_batches * v
    remaining = sum(len(a) for a in actions)
    while remaining:
        moved = False
        for p in range(P):
            tl, view = tls[p], layout.views[p]
            while nxt[p] < len(actions[p]):
                forward, i, c = actions[p][nxt[p]]
                s = c * P + p
                src = (True, s - 1, i) if forward else (False, s + 1, i)
                needs = (s > 0) if forward else (s < last)
                if needs and src not in done:
                    break
                if needs:
                    boundary = s - 1 if forward else s
                    start = max(done[src], tl.t, link[(boundary, forward)])
                    link[(boundary, forward)] = start + transfer[boundary]
                    tl.wait(link[(boundary, forward)])
                units = layout.chunk_units[p][c]
                if forward:
                    tl.compute(sum(view.fwd[u] for u in units))
                else:
                    k = backwards[p]
                    backwards[p] += 1
                    runs[p].backward(reversed(units), communicate=stage == 2 or
                                     k == micro_steps - 1, last=k == micro_steps - 1)
                done[(forward, s, i)] = tl.t
                nxt[p] += 1
                remaining -= 1
                moved = True
        if not moved:
            raise RuntimeError("pipeline schedule deadlocks")  # a bug in pipeline_schedule
    for tl in tls:
        tl.actions_end = tl.t  # its last backward's compute
    for run in runs:
        run.reduce_norm()
    if P > 1:  # the norm summed over the pipeline: 8 bytes, all-reduced over its P ranks
        end = max(tl.t for tl in tls) + net.seconds("all_reduce", ring_bytes("all_reduce", 8, P),
                                                    P, pipeline_nodes)
        for tl in tls:
            tl.wait(end)
    for run in runs:
        run.update_all()
    return tls


def pipeline_held(layout, p, micro_batches):
    """What rank p holds at the peak of its action list (the schedule's order, pipeline.cpp): the
    layers of its micro-batches in flight (forwarded, not yet backwarded; each layer's input kept
    with checkpointing), and boundary tensors [tokens, hidden]: the output of each micro-batch in
    flight that a later stage received, and the gradient a backward sends back to the stage
    before, held until the transfers before the rank's next action are done. [(layers, boundary
    tensors)] at each action."""
    P, v = layout.P, layout.v
    last = P * v - 1
    layers = outputs = 0
    out = []
    for forward, _, c in pipeline_schedule(P, p, micro_batches, v):
        s = c * P + p
        if forward:  # held from its forward on
            layers += layout.layers(s)
            outputs += s < last
            out.append((layers, outputs))
        else:  # held until its backward is done, which sends the input's gradient back
            out.append((layers, outputs + (s > 0)))
            layers -= layout.layers(s)
            outputs -= s < last
    return out


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


def activation_bytes(shape, loss_chunk_gib, sequence_parallel=True):
    """Per token and layer, bf16: the layer input, the two norms' outputs and the residual (8H)
    and q, the attention output, k, v, gate, up and the SwiGLU output (4H + 6I + 4Hkv). With
    tensor parallelism a rank keeps 1/tp of its group's: of all of them with sequence parallelism,
    of the second kind only without."""
    H, tp = shape.H, shape.tp
    outer, inner = 8 * H, 4 * H + 6 * shape.I + 4 * shape.kv_heads * shape.head_dim
    split = (lambda b: b / tp) if tp > 1 else (lambda b: b)
    a = split(outer + inner) if sequence_parallel else outer + split(inner)
    tokens = shape.tokens()
    if shape.checkpointing:  # each layer's input kept; one layer's tensors and their gradients live
        per_token = shape.L * (split(2 * H) if sequence_parallel else 2 * H) + 2 * a
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


def boundary_bytes(shape, sequence_parallel=True):
    """One micro-batch's hidden states at a stage boundary, as one rank sends them (pipeline.cpp's
    hidden_like): [tokens, hidden] in the compute dtype, this rank's 1/tp of the token rows with
    TP's sequence parallelism, all of them without."""
    rows = shape.tokens() // shape.tp if sequence_parallel else shape.tokens()
    return rows * shape.H * shape.element_bytes


def pipeline_activation_bytes(shape, layers, boundaries, loss_chunk_gib, sequence_parallel=True):
    """A pipeline rank's activations: activation_bytes() of its `layers` layer-micro-batches in
    flight (each layer's input with checkpointing, one layer's working set besides), plus
    `boundaries` boundary tensors and, on the rank with the head, the loss chunk."""
    held = copy.copy(shape)
    held.L = layers
    return (activation_bytes(held, loss_chunk_gib, sequence_parallel) +
            boundaries * boundary_bytes(shape, sequence_parallel))


# ----------------------------------------------------------------------------------------------
# Expert parallelism (lib/model/moe.h, lib/train/expert_parallel.h, lib/zero/grouped_engine.h): a
# Mixture-of-Experts shape, the all-to-alls of its layers on the compute stream, and ZeRO by two
# engines, the dense parameters over the stage's data-parallel ranks and the expert stacks over the
# expert-data-parallel ones


def is_expert(name):
    return ".mlp.experts." in name


class MoeShape(Shape):
    """A Qwen3-MoE-shaped decoder with every layer a Mixture-of-Experts layer and no shared expert:
    attention as Shape's plus Qwen3's q/k norms, a router [E, H] and the experts' stacks gate_up
    [E, 2I, H] and down [E, H, I] (lib/model/moe.h), I the experts' width; a token runs through
    top_k of the E experts. A rank of an expert-parallel group of `ep` holds E/ep of every layer's
    experts (with_layout())."""

    KEYS = ("hidden", "moe_intermediate", "layers", "heads", "kv_heads", "head_dim", "vocab",
            "experts", "top_k")

    def __init__(self, name, s, where):
        self.name = name
        for k in self.KEYS:
            if not isinstance(s.get(k), int) or isinstance(s.get(k), bool) or s[k] <= 0:
                raise InputError(f"{where}.{k} is {s.get(k)!r}; expected a positive integer")
        self.H, self.I, self.L = s["hidden"], s["moe_intermediate"], s["layers"]
        self.heads, self.kv_heads, self.head_dim, self.V = (s["heads"], s["kv_heads"],
                                                            s["head_dim"], s["vocab"])
        self.E, self.k = s["experts"], s["top_k"]
        if self.k > self.E:
            raise InputError(f"{where}.top_k ({self.k}) exceeds its experts ({self.E})")
        self.tied = bool(s.get("tied", False))
        self.qkv_bias = False
        self.qk_norm = bool(s.get("qk_norm", True))
        self.norm_topk_prob = bool(s.get("norm_topk_prob", True))
        self.micro, self.seq = 4, 2048
        self.checkpointing = False
        self.element_bytes = 2
        self.layer_rate_of = self.only_in = None
        self.tp, self.ep = 1, 1

    def with_layout(self, ep, micro, seq, checkpointing):
        """One rank's view under expert parallelism of `ep`, `micro` sequences of `seq` a
        micro-step, with or without activation checkpointing."""
        if self.E % ep:
            raise InputError(f"{self.name}: {ep} does not divide its {self.E} experts")
        out = copy.copy(self)
        out.ep, out.micro, out.seq, out.checkpointing = ep, micro, seq, checkpointing
        return out

    def parameters(self, whole=False):
        """[(name, numel, unit)] in dstrain's order (units as Shape's), this rank's E/ep experts
        (`whole`: all E)."""
        key = (whole or self.ep == 1, self.ep)
        cache = self.__dict__.setdefault("_parameters", {})
        if key not in cache:
            cache[key] = self._parameters_of(self.E if key[0] else self.E // self.ep)
        return cache[key]

    def _parameters_of(self, e):
        H, q, kv = self.H, self.heads * self.head_dim, self.kv_heads * self.head_dim
        out = [("model.embed_tokens.weight", self.V * H, 0)]
        for i in range(self.L):
            p, u = f"model.layers.{i}.", 1 + i
            out.append((p + "self_attn.q_proj.weight", q * H, u))
            out.append((p + "self_attn.k_proj.weight", kv * H, u))
            out.append((p + "self_attn.v_proj.weight", kv * H, u))
            out.append((p + "self_attn.o_proj.weight", H * q, u))
            if self.qk_norm:
                out.append((p + "self_attn.q_norm.weight", self.head_dim, u))
                out.append((p + "self_attn.k_norm.weight", self.head_dim, u))
            out.append((p + "mlp.gate.weight", self.E * H, u))
            out.append((p + "mlp.experts.gate_up_proj", e * 2 * self.I * H, u))
            out.append((p + "mlp.experts.down_proj", e * H * self.I, u))
            out.append((p + "input_layernorm.weight", H, u))
            out.append((p + "post_attention_layernorm.weight", H, u))
        out.append(("model.norm.weight", H, self.L + 1))
        if not self.tied:
            out.append(("lm_head.weight", self.V * H, self.L + 1))
        return out

    def layer_numel(self):
        """(dense, experts' active) elements of one layer: everything but the stacks, and top_k
        experts' matrices, those a token runs through."""
        dense = sum(n for name, n, u in self.parameters(whole=True)
                    if u == 1 and not is_expert(name))
        return dense, self.k * 3 * self.H * self.I

    def active_numel(self):
        """The parameters a token uses: all but the experts it is not routed to."""
        total = sum(n for name, n, _ in self.parameters(whole=True) if not is_expert(name))
        return total + self.L * self.layer_numel()[1]

    def expert_numel(self):
        return sum(n for name, n, _ in self.parameters(whole=True) if is_expert(name))

    def segment_forward_flops(self):
        """As Shape's, counting the top_k experts a token runs through (active parameters)."""
        dense, experts = self.layer_numel()
        attention = 4 * self.heads * self.head_dim * self.seq
        return [0] + [2 * (dense + experts) + attention] * self.L + [2 * (self.H + self.V * self.H)]

    def layer_bytes(self, load=1.0):
        """Bytes a MoE layer keeps for backward per token, as dstrain estimates it on a GPU with its
        fused kernels (lib/model/blocks.cpp, activation_memory): the two norms, attention with
        Qwen3's q/k norms, the router's probabilities, indices and weights, and per routed row its
        input, the SwiGLU terms, its output and weight. `load`: the rows a rank receives against
        the mean (the rows' input and SwiGLU terms live on the rank of their expert)."""
        c, C = self.element_bytes, self.H
        HD, KVD = self.heads * self.head_dim, self.kv_heads * self.head_dim
        norms = 2 * (2 * c * C + 4)
        attention = c * (2 * HD + 2 * KVD) + 4 * self.heads
        if self.qk_norm:
            attention += c * (HD + KVD) + 4 * (self.heads + self.kv_heads)
        k, E = self.k, self.E
        router = 4 * E + 8 * k + (4 * k + 4 if self.norm_topk_prob else 0) + 24 * k
        rows = k * (load * (c * C + 3 * c * self.I) + c * C + c)
        return norms + attention + router + rows


def moe_activation_bytes(shape, layers, boundaries, loss_bytes, load=1.0):
    """`layers` layer-micro-batches of `shape`'s micro-batch in flight: each layer's bytes
    (layer_bytes), or with checkpointing each layer's input and one layer's bytes twice; plus
    `boundaries` boundary tensors and `loss_bytes`."""
    a = shape.layer_bytes(load)
    per_token = (layers * shape.element_bytes * shape.H + 2 * a if shape.checkpointing
                 else layers * a)
    return (shape.tokens() * per_token + boundaries * boundary_bytes(shape) + loss_bytes)


def moe_block_costs(shape):
    """pipeline.cpp's block_costs for MoE layers (DecoderLayerImpl::multiply_adds_per_token): a
    layer's 2-D matrices (attention, router) and top_k experts' stacks, the head its matrix."""
    costs = [0] * (shape.L + 2)
    for name, n, u in shape.parameters(whole=True):
        if name.endswith(("proj.weight", "mlp.gate.weight")) or name == "lm_head.weight":
            costs[u] += n
    experts = shape.layer_numel()[1]
    for u in range(1, shape.L + 1):
        costs[u] += experts
    if shape.tied:
        costs[-1] += shape.V * shape.H
    return costs


class AllToAll:
    """An all-to-all over an expert-parallel group of `ep` consecutive ranks (8 a node: a group
    of up to 8 lies in one node, a larger one spans ep / 8 nodes). Each rank sends (ep − 1)/ep of
    its rows away: to the ranks of its node over NVLink at `nvlink` GB/s, to the others through its
    own NIC at `nic` GB/s, both at once; `load` scales the busiest rank's bytes. Latency: NCCL's
    ring latency over the same ranks (n − 1 steps), the fastest protocol for the bytes."""

    def __init__(self, net, nvlink, nic, per_node):
        self.net, self.nvlink, self.nic, self.per_node = net, nvlink, nic, per_node

    def nodes(self, ep):
        return max(1, ep // self.per_node)

    def shares(self, ep):
        """(share of a rank's rows sent inside its node, share sent to other nodes)."""
        local = min(ep, self.per_node)
        return (local - 1) / ep, (ep - local) / ep

    def latency(self, protocol, ep):
        lat, nodes = self.net.lat, self.nodes(ep)
        steps, inter = ep - 1, nodes - 1
        intra = lat["nvlink"]["ring"][protocol]
        if nodes > 1:
            intra = max(intra, lat["net_overhead"] * (3 if protocol == "Simple" else 1))
        return (lat["base"]["ring"][protocol] + (steps - inter) * intra +
                inter * lat["net"]["ring"][protocol]) * 1e-6

    def seconds(self, nbytes, ep, load=1.0):
        """One all-to-all of `nbytes` a rank (before the split by destination)."""
        if ep <= 1:
            return 0.0
        local, remote = self.shares(ep)
        proto = self.net.proto
        best = math.inf
        for p, share in (("LL128", proto["LL128"]), ("Simple", 1.0)):
            t = max(load * nbytes * local / (share * self.nvlink * GB),
                    load * nbytes * remote / (share * self.nic * GB))
            best = min(best, self.latency(p, ep) + t)
        return best

    def counts_seconds(self, experts, ep, host):
        """The exchange of the per-expert counts (8 bytes an expert): one small all-to-all's
        latency and the host's round trip (dstrain reads the counts on the host to size the rows'
        exchange)."""
        if ep <= 1:
            return 0.0
        nbytes = 8 * experts * (ep - 1) // ep
        return self.net.seconds("all_gather", nbytes, ep, self.nodes(ep)) + host


class MoeCompute:
    """Compute's counterpart for a MoeShape rank: each layer's forward and backward at the FLOP rate
    of a measured dense layer (`ref`: its measured_layers entry, `ref_shape` its shape), the
    experts' matrices at `efficiency` of it (grouped products); the embedding and head at `rate`;
    the optimizer at the measured time an element. On the compute stream with each layer (all of
    them serial): per forward the counts' exchange and the rows' dispatch and combine all-to-alls,
    per backward the two again, and a checkpointed layer's recompute repeats the forward's three.
    `load`: the busiest rank's experts' rows against the mean (their compute and all-to-all
    bytes)."""

    def __init__(self, shape, ref, ref_shape, rate, efficiency, a2a, host, load=1.0):
        self.shape = shape
        tokens = shape.tokens()
        dense, experts = shape.layer_numel()
        attention = 4 * shape.heads * shape.head_dim * shape.seq
        work = 2 * dense + attention + load * 2 * experts / efficiency
        scale = work / ref_shape.segment_forward_flops()[1] * tokens / (ref["micro"] * ref["seq"])
        fwd, bwd = ref["forward_ms"] * 1e-3 * scale, ref["backward_ms"] * 1e-3 * scale
        head = 2 * (shape.H + shape.V * shape.H) * tokens / rate
        rows = tokens * shape.k * shape.H * shape.element_bytes
        self.one_a2a = a2a.seconds(rows, shape.ep, load)
        self.counts = a2a.counts_seconds(shape.E, shape.ep, host)
        forward = self.counts + 2 * self.one_a2a
        recompute = fwd + forward if shape.checkpointing else 0.0
        self.a2a_fwd = [0.0] + [forward] * shape.L + [0.0]
        self.a2a_bwd = [0.0] + [2 * self.one_a2a + (forward if shape.checkpointing else 0.0)] * \
            shape.L + [0.0]
        self.layer_compute = (fwd, bwd + (fwd if shape.checkpointing else 0.0))
        self.fwd = [0.0] + [fwd + forward] * shape.L + [head]
        self.bwd = [0.0] + [bwd + recompute + 2 * self.one_a2a] * shape.L + [2 * head]
        self.opt_per_element = ref["optimizer_ns_per_element"] * 1e-9
        n = len(self.fwd)
        self.tp_fwd, self.tp_bwd, self.tp_norm = [0.0] * n, [0.0] * n, 0.0

    def a2a_seconds(self):
        """The all-to-alls and counts' exchanges of one micro-step (all on the critical path)."""
        return sum(self.a2a_fwd) + sum(self.a2a_bwd)


class PartView:
    """The parameters of `blocks` that one engine holds (`keep(name)`), units renumbered as
    StageView's, and `comp`'s times of those blocks; L and tied as Units reads them (every block:
    the whole model's)."""

    def __init__(self, shape, comp, blocks, keep):
        self.blocks = list(blocks)
        local = {b: k for k, b in enumerate(self.blocks)}
        self._params = [(name, n, local[u]) for name, n, u in shape.parameters()
                        if u in local and keep(name)]
        self.element_bytes = shape.element_bytes
        self.fwd = [comp.fwd[b] for b in self.blocks]
        self.bwd = [comp.bwd[b] for b in self.blocks]
        self.opt_per_element, self.tp_norm, self.tp_seconds = comp.opt_per_element, 0.0, 0.0
        self.L, self.tied = len(self.blocks) - 2, shape.tied

    def parameters(self):
        return self._params

    def numel(self):
        return sum(n for _, n, _ in self._params)


class GroupedShardedRun:
    """GroupedEngine (lib/zero/grouped_engine.h) at stages 1-2: one backward's compute, each
    engine's buckets launched as their units finish; the reductions waited for, one norm, each
    engine's update and all-gathers. dstrain runs each engine's collectives on its own
    communicator; the model puts them on one stream (the second engine's with its `group`), as they
    share the same NVLink and NICs."""

    def __init__(self, runs, comp):
        self.runs, self.comp, self.tl = runs, comp, runs[0].tl

    def backward(self, units, communicate=True, last=True):
        for r in self.runs:
            r.begin_backward(communicate, last)
        for u in units:
            self.tl.compute(self.comp.bwd[u])
            for r in self.runs:
                r.unit_done(u)
        for r in self.runs:
            r.end_backward()

    def reduce_norm(self):
        for r in self.runs:
            while r.in_flight:
                r.retire(r.in_flight.popleft())
        self.tl.wait(self.tl.launch("all_reduce", 8))

    def update_all(self):
        for r in self.runs:
            if r.clipping:
                for b in reversed(range(len(r.cuts))):
                    r.update(b)
        for r in self.runs:
            for end in r.gathers:
                self.tl.wait(end)
        return self.tl.t


class GroupedStage3Run:
    """GroupedEngine at stage 3: every engine gathers its own units of each segment (each with its
    own prefetch budget), one compute, each reduce-scatters its units' gradients; `micro_steps`
    forwards and backwards, then one norm and each engine's update."""

    def __init__(self, parts, comp):
        self.parts, self.comp, self.tl = parts, comp, parts[0].tl

    def run(self, micro_steps=1):
        tl, segs = self.tl, self.parts[0].units.segments
        for _ in range(micro_steps):
            for p in self.parts:
                p.reduced = [False] * p.units.count
            for k, seg in enumerate(segs):
                for p in self.parts:
                    for u in seg:
                        p.wait_gathered(u)
                for p in self.parts:
                    p.prefetch_after(k, +1)
                tl.compute(self.comp.fwd[k])
                following = segs[k + 1] if k + 1 < len(segs) else []
                for p in self.parts:
                    for u in seg:
                        if u not in following:
                            p.release(u)
            for k in reversed(range(len(segs))):
                for p in self.parts:
                    for u in segs[k]:
                        if not p.reduced[u]:
                            p.wait_gathered(u)
                for p in self.parts:
                    p.prefetch_after(k, -1)
                tl.compute(self.comp.bwd[k])
                for p in self.parts:
                    for u in p.completed_after(k):
                        if u == "persistent":
                            p.reduce(u, p.units.persistent)
                            continue
                        p.reduced[u] = True
                        p.reduce(u, p.units.padded[u])
                        p.release(u)
        for p in self.parts:
            while p.reductions:
                p.retire_oldest()
        tl.wait(tl.launch("all_reduce", 8))
        for p in self.parts:
            if p.clipping:
                owned = (sum(p.units.padded) + p.units.persistent) / p.n
                tl.compute(p.comp.opt_per_element * owned)
        for p in self.parts:
            if p.units.persistent:
                tl.wait(tl.launch("all_gather", p.units.persistent * p.es, p.group))
        return tl.t


# ----------------------------------------------------------------------------------------------
# Tables


def fmt(v, digits=1):
    return f"{v:,.{digits}f}"


Layout = collections.namedtuple("Layout", "tp dp stage step tp_comm zero_comm memory fits "
                                          "tokens_per_s mfu")


PipelineRun = collections.namedtuple(
    "PipelineRun", "p tp dp stage v m bubble imbalance across_gb across_ms tp_comm zero_comm step "
                   "memory fits tokens_per_s mfu")


def layout_name(l):
    return f"{l.tp} × 1 × {l.dp}, stage {l.stage}"


def pipeline_name(l):
    return f"{l.p} × {l.tp} × {l.dp}, stage {l.stage}" + (f", v {l.v}" if l.v > 1 else "")


def gain(base_step, step):
    """Throughput against a baseline step, as +x% (or −x%)."""
    g = 100 * (base_step / step - 1)
    return "0%" if abs(g) < 0.5 else f"{'+' if g > 0 else '−'}{abs(g):.0f}%"


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
        self.measured.update(borrowed_layers(inputs, self.shapes, self.measured))
        # The ZeRO and tensor-parallel tables' shapes: those not kept for one section.
        self.zero_shapes = [s for s in self.shapes if s.only_in is None]
        self.tp_shapes, self.tp_sizes, self.tp_efficiency = self.tensor_parallel_inputs()
        self.tp_sequence_parallel = inputs.get("tensor_parallel.sequence_parallel", bool)
        self._layouts = {}
        self.pipeline_inputs()
        self._splits, self._pipelines = {}, {}

    def tensor_parallel_inputs(self):
        where = f"{self.inputs.path}: tensor_parallel"
        by_name = {s.name: s for s in self.shapes}
        names = self.inputs.get("tensor_parallel.shapes", list)
        if not names or any(n not in by_name for n in names):
            raise InputError(f"{where}.shapes is {names!r}; expected names from shapes "
                             f"({', '.join(by_name)})")
        sizes = self.inputs.get("tensor_parallel.sizes", list)
        efficiency = self.inputs.get("tensor_parallel.efficiency", dict)
        for tp in sizes:
            if not isinstance(tp, int) or tp <= 0:
                raise InputError(f"{where}.sizes has {tp!r}; expected positive integers")
            if tp > 1 and not isinstance(efficiency.get(str(tp)), (int, float)):
                raise InputError(f"{where}.efficiency has no number for size {tp}")
            for n, nodes in self.scales:
                if (n // nodes) % tp:
                    raise InputError(f"{where}.sizes: {tp} does not divide the {n // nodes} GPUs "
                                     "of a node (a tensor-parallel group lies inside one)")
        for name in names:  # every split must be whole
            for tp in sizes:
                try:
                    by_name[name].tensor_parallel(tp)
                except InputError as e:
                    raise InputError(f"{self.inputs.path}: {e}")
        return ([by_name[n] for n in names], sizes,
                {int(k): float(v) for k, v in efficiency.items()})

    def pipeline_inputs(self):
        where = f"{self.inputs.path}: pipeline_parallel"
        by_name = {s.name: s for s in self.shapes}
        names = self.inputs.get("pipeline_parallel.shapes", list)
        if not names or any(n not in by_name for n in names):
            raise InputError(f"{where}.shapes is {names!r}; expected names from shapes "
                             f"({', '.join(by_name)})")
        self.pp_shapes = [by_name[n] for n in names]
        self.pp_sizes = self.inputs.get("pipeline_parallel.sizes", list)
        self.pp_virtual = self.inputs.get("pipeline_parallel.virtual_stages", list)
        for key, values in (("sizes", self.pp_sizes), ("virtual_stages", self.pp_virtual)):
            if not values or any(not isinstance(v, int) or isinstance(v, bool) or v <= 0
                                 for v in values):
                raise InputError(f"{where}.{key} is {values!r}; expected positive integers")
        self.pp_micro = self.inputs.get("pipeline_parallel.micro_batch_sequences", int)
        self.pp_tokens = self.inputs.get("pipeline_parallel.tokens_per_gpu", int)
        self.pp_prefetch = self.inputs.get("pipeline_parallel.p1_prefetch_layers", int)
        self.pp_scales = []
        for i, s in enumerate(self.inputs.get("pipeline_parallel.scales", list)):
            if not isinstance(s, dict) or not all(isinstance(s.get(k), int) and s[k] > 0
                                                  for k in ("gpus", "nodes")) or \
                    s["gpus"] % s["nodes"]:
                raise InputError(f"{where}.scales[{i}] is {s!r}; expected whole nodes of GPUs")
            self.pp_scales.append((s["gpus"], s["nodes"]))
        for s in self.pp_shapes:
            if (self.pp_tokens % (self.pp_micro * s.seq) or
                    s.micro * s.seq != self.pp_tokens):
                raise InputError(f"{where}.tokens_per_gpu ({self.pp_tokens}) is not whole "
                                 f"micro-batches of {s.name}, or not its tokens a GPU")

    def compute(self, shape, sequence_parallel=None):
        sp = self.tp_sequence_parallel if sequence_parallel is None else sequence_parallel
        return Compute(self.inputs, shape, self.rate, self.measured.get(shape.name), self.net, sp,
                       self.tp_efficiency.get(shape.tp, 1.0))

    def origin(self, shape):
        if shape.name == self.ref.name:
            return "measured"
        if "rate_of" in self.measured.get(shape.name, {}):
            return (f"the {self.measured[shape.name]['rate_of']} layer's measured FLOP rate, "
                    f"extrapolated to {shape.L} layers")
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
                           "busbw across nodes (reduce-scatter), GB/s, by node count"),
                          ("tensor_parallel.efficiency",
                           "matmul rate of a rank's 1/TP of each matrix, by TP size")):
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
        for s in self.zero_shapes:
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
        rows = self.projection_rows(net or self.net, shapes or self.zero_shapes,
                                    scales or self.scales,
                                    stages)
        return table(["shape", "GPUs", "stage", "fits", "compute ms", "comm ms", "step ms (overlap)",
                      "step ms (no overlap)", "efficiency (overlap)", "efficiency (no overlap)",
                      "tokens/s per GPU", "MFU"], rows)

    def total_memory(self, s, comp, stage, scale, opts=None, sequence_parallel=True):
        opts = opts or self.opts
        return (model_state_bytes(s, stage, scale[0], opts) +
                transient_bytes(self.net, s, comp, stage, scale, opts) +
                activation_bytes(s, self.loss_chunk, sequence_parallel))

    # -- tensor parallelism

    def layout(self, shape, tp, stage, scale, prefetch_layers=None, sequence_parallel=None):
        """One layout of `scale` (GPUs, nodes): tensor-parallel groups of `tp` inside each node,
        ZeRO `stage` over the GPUs / tp ranks of each group's data-parallel group (8 / tp of them
        a node, every node), one step at the same tokens a GPU; dstrain's defaults, or stage 3's
        prefetch budget set to `prefetch_layers` of the rank's layer units."""
        sp = self.tp_sequence_parallel if sequence_parallel is None else sequence_parallel
        n, nodes = scale
        s = shape.tensor_parallel(tp)
        comp = self.compute(s, sp)
        dp = n // tp
        opts = self.opts
        if prefetch_layers is not None:
            layer = Units(s, dp, opts["stage3_param_persistence_threshold"]).padded[1]
            opts = dict(opts, stage3_prefetch_bucket_size=prefetch_layers * layer)
        tl = simulate(self.net, s, comp, stage, (dp, nodes), opts, False)
        memory = self.total_memory(s, comp, stage, (dp, nodes), opts, sp)
        tps = shape.tokens() / tl.t
        return Layout(tp, dp, stage, tl.t, comp.tp_seconds(), tl.comm_busy, memory,
                      memory <= self.memory, tps, shape.flops_per_token() * tps / self.peak)

    def layouts(self, shape, scale, prefetch_layers=None):
        """{(tp, stage): Layout} of every size and stage (computed once)."""
        key = (shape.name, scale, prefetch_layers)
        if key not in self._layouts:
            self._layouts[key] = {(tp, stage): self.layout(shape, tp, stage, scale, prefetch_layers)
                                  for tp in self.tp_sizes for stage in STAGES}
        return self._layouts[key]

    @staticmethod
    def fastest(layouts, tp=None):
        """The fastest layout that fits (of size `tp`); None if none does."""
        fit = [l for l in layouts.values() if l.fits and tp in (None, l.tp)]
        return min(fit, key=lambda l: l.step) if fit else None

    def tp_traffic_table(self):
        rows = []
        for shape in self.tp_shapes:
            for tp in self.tp_sizes:
                if tp == 1:
                    continue
                s, sp = shape.tensor_parallel(tp), self.tp_sequence_parallel
                forward, backward = tp_collectives(s, sp)
                calls = [c for seg in forward + backward for c in seg] + [("all_reduce", 8)]
                sent = sum(ring_bytes(k, b, tp) for k, b in calls)
                comp, other = self.compute(s, sp), self.compute(s, not sp)
                layer_tp = comp.tp_fwd[1] + comp.tp_bwd[1]
                act = [activation_bytes(s, self.loss_chunk, v) / GB for v in (sp, not sp)]
                rows.append([shape.name, tp, f"{s.numel() / 1e9:.2f} B", f"{s.micro} × {s.seq}",
                             fmt(s.tokens() * s.H * s.element_bytes / 1e6, 0), len(calls),
                             fmt(sent / GB, 1), fmt(comp.tp_seconds() * 1e3),
                             fmt(layer_tp * 1e3, 2),
                             fmt((comp.fwd[1] + comp.bwd[1] - layer_tp) * 1e3, 2),
                             fmt(act[0]), fmt(other.tp_seconds() * 1e3), fmt(act[1])])
        other = "without" if self.tp_sequence_parallel else "with"
        return table(["shape", "TP", "elements a rank", "group's micro-batch", "S MB",
                      "TP collectives a step", "GB a rank sends (NVLink)", "their ms a step",
                      "one layer: TP ms", "one layer: compute ms", "activations GB a GPU",
                      f"{other} its sequence parallelism: TP ms a step", "activations GB a GPU"],
                     rows)

    def tp_layouts_table(self):
        """For every shape, scale and TP size, its fastest ZeRO stage that fits (or the fastest,
        marked, where none does), against ZeRO-3 alone."""
        def pick(every, tp):
            return self.fastest(every, tp) or min((v for v in every.values() if v.tp == tp),
                                                  key=lambda v: v.step)

        rows = []
        for shape in self.tp_shapes:
            for scale in self.scales:
                every, tuned = self.layouts(shape, scale), self.layouts(shape, scale, 1)
                for tp in self.tp_sizes:
                    l, t = pick(every, tp), pick(tuned, tp)
                    rows.append([shape.name, scale[0], f"{l.tp} × {l.dp}", l.stage,
                                 "yes" if l.fits else "**no**", fmt(l.memory / GB),
                                 fmt(l.tp_comm * 1e3), fmt(l.zero_comm * 1e3), fmt(l.step * 1e3),
                                 fmt(l.tokens_per_s, 0), f"{100 * l.mfu:.1f}%",
                                 gain(every[(1, 3)].step, l.step), t.stage, fmt(t.step * 1e3),
                                 gain(tuned[(1, 3)].step, t.step)])
        return table(["shape", "GPUs", "TP × DP", "stage", "fits", "GB a GPU",
                      "TP comm ms (serial)", "ZeRO comm ms", "step ms", "tokens/s per GPU", "MFU",
                      "vs ZeRO-3 alone", "prefetch 1 layer: stage", "step ms",
                      "vs ZeRO-3 alone"], rows)

    def tp_best_table(self):
        rows = []
        for shape in self.tp_shapes:
            for scale in self.scales:
                for settings, prefetch in (("dstrain's defaults", None), ("1 layer", 1)):
                    every = self.layouts(shape, scale, prefetch)
                    best, base = self.fastest(every), every[(1, 3)]
                    row = [shape.name, scale[0], settings]
                    if best is None:
                        rows.append(row + ["nothing fits"] + [""] * 7)
                        continue
                    beat = sorted((l.tp, l.stage) for l in every.values()
                                  if l.fits and l.step < base.step and (l.tp, l.stage) != (1, 3))
                    rows.append(row + [layout_name(best), fmt(best.step * 1e3),
                                       fmt(best.tokens_per_s, 0), f"{100 * best.mfu:.1f}%",
                                       fmt(base.step * 1e3), f"{100 * base.mfu:.1f}%",
                                       gain(base.step, best.step),
                                       ", ".join(f"{t} × {st}" for t, st in beat) or "none"])
        return table(["shape", "GPUs", "stage 3 prefetch",
                      "fastest layout that fits (TP × SP × DP, stage)", "step ms",
                      "tokens/s per GPU", "MFU", "ZeRO-3 alone: step ms", "MFU", "gain",
                      "layouts faster than ZeRO-3 alone (TP × stage)"], rows)

    def tp_published_table(self):
        rows = []
        by_name = {s.name: s for s in self.shapes}
        for i, r in enumerate(self.inputs.get("published_tensor_parallel", list)):
            where = f"{self.inputs.path}: published_tensor_parallel[{i}]"
            try:
                shape = by_name[r["shape"]]
                scale, tp, stage = (r["gpus"], r["nodes"]), r["tp"], r["stage"]
                per_gpu = r["global_batch"] * r["seq"] / r["gpus"]
                if "mfu" in r:
                    mfu = f"{100 * r['mfu']:.0f}% (published)"
                else:  # this page's FLOPs a token at the run's length, times its tokens/s
                    run = Shape(shape.name, dict(self.inputs.get("shapes", dict)[shape.name],
                                                 seq=r["seq"]), where)
                    mfus = [100 * run.flops_per_token() * r[k] / self.peak for k in
                            ("tokens_per_s_per_gpu", "async_tp_tokens_per_s_per_gpu") if k in r]
                    mfu = f"{mfus[0]:.1f}% (from {r['tokens_per_s_per_gpu']:,} tokens/s)" + "".join(
                        f"; async TP {m:.1f}%" for m in mfus[1:])
                layout = f"TP {tp} × PP {r['pp']} × DP {r['gpus'] // (tp * r['pp'])}"
            except (KeyError, TypeError) as e:
                raise InputError(f"{where}: missing or malformed {e}")
            if scale[0] % scale[1] or (scale[0] // scale[1]) % tp:
                raise InputError(f"{where}: {tp} does not divide the GPUs of a node")
            ours, tuned = (self.layout(shape, tp, stage, scale, p) for p in (None, 1))
            rows.append([r["name"], scale[0], layout, f"{per_gpu:,.0f}", mfu,
                         f"{shape.name}, {layout_name(ours)}", "yes" if ours.fits else "**no**",
                         f"{100 * ours.mfu:.1f}%", f"{100 * tuned.mfu:.1f}%"])
        return table(["published run (H100)", "GPUs", "layout", "tokens a GPU a step", "MFU",
                      "dstrain, same GPUs, TP and sharding (model)", "fits", "MFU (defaults)",
                      "MFU (prefetch 1 layer)"], rows)

    # -- pipeline parallelism

    def stage_split(self, shape, parts):
        key = (shape.name, parts)
        if key not in self._splits:
            self._splits[key] = balance_stages(block_costs(shape), parts)
        return self._splits[key]

    def pipeline(self, shape, stages, tp, stage, chunks, scale, group_sequences, micro_batches,
                 simulate_step=True):
        """One pipeline layout of `scale` (GPUs, nodes): `stages` stages the outermost split, TP
        groups of `tp` inside each, ZeRO `stage` over each stage's data-parallel group, `chunks`
        virtual stages a rank, `micro_batches` micro-batches of `group_sequences` sequences a TP
        group. Memory always; the step only where `simulate_step` (else None)."""
        gpus, nodes = scale
        sp = self.tp_sequence_parallel
        s = shape.tensor_parallel(tp)
        s.micro = group_sequences
        comp = self.compute(s)
        layout = PipelineLayout(s, comp, stages, chunks, scale,
                                self.stage_split(shape, stages * chunks))
        dp, per_node = gpus // (stages * tp), gpus // nodes
        dp_scale = (dp, max(1, gpus // stages // per_node))
        one = boundary_bytes(s, sp)
        transfer = [self.net.transfer_seconds(one, a) for a in layout.across]
        last = stages * chunks - 1
        memory, across = 0, []
        for p in range(stages):
            view = layout.views[p]
            states = model_state_bytes(view, stage, dp, self.opts)
            buffers = transient_bytes(self.net, view, view, stage, dp_scale, self.opts)
            loss = self.loss_chunk if p == layout.rank_of(last) else 0
            # Linear in both counts: the peak is where a layer's and a boundary's bytes weigh most.
            layer = (pipeline_activation_bytes(s, 1, 0, 0, sp) -
                     pipeline_activation_bytes(s, 0, 0, 0, sp))
            held, n = max(pipeline_held(layout, p, micro_batches),
                          key=lambda h: h[0] * layer + h[1] * one)
            act = pipeline_activation_bytes(s, held, n, loss, sp)
            memory = max(memory, states + buffers + act)
            # Its sends a micro-batch: virtual stage s's output forward (boundary s) unless s is
            # the last, its input's gradient back (boundary s - 1) unless s is the first.
            mine = [c * stages + p for c in range(chunks)]
            sends = [b for s_ in mine for b in ([s_] if s_ < last else []) +
                     ([s_ - 1] if s_ > 0 else []) if layout.across[b]]
            across.append((micro_batches * len(sends) * one,
                           micro_batches * sum(transfer[b] for b in sends)))
        tokens = micro_batches * s.tokens() / (stages * tp)  # a GPU a step
        fits = memory <= self.memory
        step = zero = tp_comm = tps = mfu = None
        if simulate_step:
            pipeline_nodes = min(stages, nodes)
            tls = pipeline_step(self.net, layout, stage, dp_scale, self.opts, micro_batches,
                                transfer, pipeline_nodes)
            step = max(tl.t for tl in tls)
            zero = max(tl.comm_busy for tl in tls)
            tp_comm = max(micro_batches * view.tp_seconds + view.tp_norm for view in layout.views)
            tps = tokens / step
            mfu = shape.flops_per_token() * tps / self.peak
        gb, ms = max(across)
        busy = [sum(view.fwd) + sum(view.bwd) for view in layout.views]
        return PipelineRun(stages, tp, dp, stage, chunks, micro_batches,
                           pipeline_bubble(stages, micro_batches, chunks),
                           max(busy) * stages / sum(busy), gb, ms, tp_comm, zero, step, memory,
                           fits, tps, mfu)

    def without_pipeline(self, shape, tp, stage, scale):
        """P = 1: the tensor-parallel layout above (one micro-step of the shape's micro-batch),
        with stage 3's prefetch of p1_prefetch_layers layer units."""
        l = self.layout(shape, tp, stage, scale, self.pp_prefetch)
        return PipelineRun(1, tp, l.dp, stage, 1, 1, 0.0, 1.0, 0.0, 0.0, l.tp_comm, l.zero_comm,
                           l.step, l.memory, l.fits, l.tokens_per_s, l.mfu)

    def pipelines(self, shape, scale):
        """Every layout searched at `scale`: P, TP, ZeRO stage and v; the step simulated where it
        fits (computed once)."""
        key = (shape.name, scale)
        if key in self._pipelines:
            return self._pipelines[key]
        gpus, nodes = scale
        per_node = gpus // nodes
        out = []
        for stages in self.pp_sizes:
            for tp in self.tp_sizes:
                if gpus % (stages * tp) or tp > per_node or (gpus // stages) % tp:
                    continue  # TP groups of a stage inside one node
                if stages == 1:
                    out += [self.without_pipeline(shape, tp, z, scale) for z in STAGES]
                    continue
                m = self.pp_tokens * stages // (self.pp_micro * shape.seq)
                for v in self.pp_virtual:
                    if stages * v > shape.L + 2 or (v > 1 and m % stages):
                        continue
                    one = None
                    for z in (1, 2):
                        args = (shape, stages, tp, z, v, scale, self.pp_micro * tp, m)
                        l = self.pipeline(*args, simulate_step=False)
                        # Stage 2 issues stage 1's collectives and a reduce-scatter of every
                        # bucket at each earlier micro-step, on the same timeline: never faster.
                        # It is simulated only where stage 1 does not fit.
                        if l.fits and (z == 1 or not one.fits):
                            l = self.pipeline(*args)
                        out.append(l)
                        one = l
        self._pipelines[key] = out
        return out

    @staticmethod
    def fastest_pipeline(runs, stages=None):
        fit = [l for l in runs if l.fits and l.step is not None and stages in (None, l.p)]
        return min(fit, key=lambda l: l.step) if fit else None

    def pp_traffic_table(self):
        rows = []
        sp = self.tp_sequence_parallel
        for shape in self.pp_shapes:
            for tp in self.tp_sizes:
                s = shape.tensor_parallel(tp)
                s.micro = self.pp_micro * tp
                comp = self.compute(s)
                one = boundary_bytes(s, sp)
                rows.append([shape.name, tp, f"{s.micro} × {s.seq}", fmt(one / 1e6),
                             fmt(self.net.transfer_seconds(one, True) * 1e3, 2),
                             fmt(self.net.transfer_seconds(one, False) * 1e3, 2),
                             fmt((comp.fwd[1] + comp.bwd[1]) * 1e3, 2)])
        return table(["shape", "TP", "TP group's micro-batch", "boundary MB a rank (one send)",
                      "one send across nodes ms", "one send in a node ms",
                      "one layer's fwd + bwd ms (a micro-batch)"], rows)

    def pp_row(self, l):
        return [pipeline_name(l), l.m, f"{100 * l.bubble:.1f}%", fmt(l.across_gb / GB, 2),
                fmt(l.across_ms * 1e3), fmt(l.tp_comm * 1e3), fmt(l.zero_comm * 1e3),
                fmt(l.step * 1e3), fmt(l.tokens_per_s, 0), f"{100 * l.mfu:.1f}%",
                fmt(l.memory / GB)]

    PP_HEAD = ["layout (P × TP × DP, stage, v)", "m", "bubble (formula)",
               "activations across nodes: GB a rank a step", "their ms", "TP comm ms",
               "ZeRO comm ms", "step ms", "tokens/s per GPU", "MFU", "GB a GPU"]

    def pp_best_table(self):
        """The fastest layout with a pipeline (P > 1) that fits, beside the fastest without."""
        rows = []
        for shape in self.pp_shapes:
            for scale in self.pp_scales:
                runs = self.pipelines(shape, scale)
                piped = [l for l in runs if l.p > 1]
                best, flat = self.fastest_pipeline(piped), self.fastest_pipeline(runs, 1)
                if best is None:
                    least = min(piped, key=lambda l: l.memory)
                    row = [f"nothing fits (least: {pipeline_name(least)}, "
                           f"{fmt(least.memory / GB)} GB)"] + [""] * (len(self.PP_HEAD) - 1)
                else:
                    row = self.pp_row(best)
                if flat is None:
                    row += ["nothing fits", "", ""]
                else:
                    row += [pipeline_name(flat), f"{100 * flat.mfu:.1f}%",
                            gain(flat.step, best.step) if best else ""]
                rows.append([shape.name, scale[0]] + row)
        return table(["shape", "GPUs"] + self.PP_HEAD +
                     ["without a pipeline: fastest (P × TP × DP, stage)", "MFU",
                      "the pipeline's gain"], rows)

    def pp_layouts_table(self):
        """Each P's fastest layout that fits, against the fastest without a pipeline."""
        rows = []
        for shape in self.pp_shapes:
            for scale in self.pp_scales:
                runs = self.pipelines(shape, scale)
                flat = self.fastest_pipeline(runs, 1)
                for stages in self.pp_sizes:
                    mine = [l for l in runs if l.p == stages]
                    if not mine:
                        continue
                    best = self.fastest_pipeline(mine)
                    count = f"{sum(l.fits for l in mine)} of {len(mine)}"
                    if best is None:
                        least = min(mine, key=lambda l: l.memory)
                        rows.append([shape.name, scale[0], stages,
                                     f"nothing fits (least: {pipeline_name(least)}, "
                                     f"{fmt(least.memory / GB)} GB)", "", "", "", "", "", count,
                                     ""])
                        continue
                    rows.append([shape.name, scale[0], stages, pipeline_name(best),
                                 fmt(best.memory / GB), fmt(best.step * 1e3),
                                 f"{100 * best.mfu:.1f}%", f"{100 * best.bubble:.1f}%",
                                 fmt(best.imbalance, 2), count,
                                 gain(flat.step, best.step) if flat else "—"])
        return table(["shape", "GPUs", "P", "fastest that fits (P × TP × DP, stage, v)",
                      "GB a GPU", "step ms", "MFU", "bubble (formula)",
                      "slowest rank's compute / mean", "layouts that fit",
                      "vs without a pipeline"], rows)

    def pp_published_table(self):
        rows = []
        by_name = {s.name: s for s in self.shapes}
        for i, r in enumerate(self.inputs.get("published_pipeline_parallel", list)):
            where = f"{self.inputs.path}: published_pipeline_parallel[{i}]"
            try:
                shape = by_name[r["shape"]]
                scale, tp, pp, stage = (r["gpus"], r["nodes"]), r["tp"], r["pp"], r["stage"]
                dp = r["gpus"] // (tp * pp)
                per_gpu = r["global_batch"] * r["seq"] // r["gpus"]
                group = r["micro_tokens"] // shape.seq
                m = per_gpu * tp * pp // r["micro_tokens"]
                mfu = f"{100 * r['mfu']:.0f}% ({r['tflops_per_gpu']} TFLOP/s)"
            except (KeyError, TypeError) as e:
                raise InputError(f"{where}: missing or malformed {e}")
            if (r["micro_tokens"] % shape.seq or dp * tp * pp != r["gpus"] or
                    per_gpu * tp * pp % r["micro_tokens"]):
                raise InputError(f"{where}: the layout or the micro-batch does not divide")
            ours = [self.pipeline(shape, pp, tp, stage, v, scale, group, m) for v in (1, 2)]
            one = ours[0]
            rows.append([r["name"], r["gpus"], f"TP {tp} × PP {pp} × DP {dp}", f"{per_gpu:,}",
                         mfu, f"{shape.name}, {pipeline_name(one)}, m {m}",
                         "yes" if all(l.fits for l in ours) else "**no**",
                         fmt(max(l.memory for l in ours) / GB), f"{100 * one.bubble:.1f}%",
                         fmt(one.tp_comm * 1e3), fmt(one.zero_comm * 1e3), fmt(one.step * 1e3)] +
                        [f"{100 * l.mfu:.1f}%" for l in ours])
        return table(["published run (H100)", "GPUs", "layout", "tokens a GPU a step", "MFU",
                      "dstrain, same GPUs, layout and tokens (model)", "fits", "GB a GPU",
                      "1F1B: bubble (formula)", "TP comm ms (serial)", "ZeRO comm ms", "step ms",
                      "MFU (1F1B)", "MFU (interleaved, v 2)"], rows)

    def memory_table(self):
        rows = []
        for s in self.zero_shapes:
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
        for s in self.zero_shapes:
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
        for s in self.zero_shapes:
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
        for s in self.zero_shapes:
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
            ("tp-traffic", self.tp_traffic_table()),
            ("tp-layouts", self.tp_layouts_table()),
            ("tp-best", self.tp_best_table()),
            ("tp-published", self.tp_published_table()),
            ("pp-traffic", self.pp_traffic_table()),
            ("pp-layouts", self.pp_layouts_table()),
            ("pp-best", self.pp_best_table()),
            ("pp-published", self.pp_published_table()),
            ("ep-inputs", self.experts().inputs_table()),
            ("ep-shapes", self.experts().shapes_table()),
            ("ep-traffic", self.experts().traffic_table()),
            ("ep-layouts", self.experts().layouts_table()),
            ("ep-best", self.experts().best_table()),
            ("ep-published", self.experts().published_table()),
            ("published", self.published_table()),
            ("measured", self.measured_table()),
        ])

    def experts(self):
        """The expert-parallel projection (its inputs read once)."""
        if not hasattr(self, "_experts"):
            self._experts = ExpertProjection(self)
        return self._experts

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
# Expert parallelism: the layouts searched and their tables


MoeRun = collections.namedtuple(
    "MoeRun", "p ep ed stage ckpt v m tokens step a2a zero memory fits tokens_per_s tflops mfu "
              "memory_busiest")


def moe_name(l):
    """P × E_p × expert-data-parallel ranks, the ZeRO stage, checkpointing, virtual stages."""
    return (f"{l.p} × {l.ep} × {l.ed}, stage {l.stage}" + (", checkpointing" if l.ckpt else "") +
            (f", v {l.v}" if l.v > 1 else ""))


class ExpertProjection:
    """dstrain's expert parallelism on paper (inputs: expert_parallel): each pipeline stage's ranks
    factorised again, rank in stage = expert_data · E_p + expert; E/E_p of every MoE layer's experts
    a rank, everything else replicated as without it; ZeRO over the stage's ranks for the dense
    parameters, over the expert-data-parallel ranks (stage ranks / E_p) for the expert stacks, by two
    engines; the all-to-alls on the compute stream. TP 1 throughout (dstrain refuses TP with MoE)."""

    def __init__(self, model):
        self.m = model
        inputs = model.inputs
        where = f"{inputs.path}: expert_parallel"
        specs = inputs.get("expert_parallel.shapes", dict)
        self.shapes = [MoeShape(name, spec, f"{where}.shapes.{name}") for name, spec in specs.items()]
        if not self.shapes:
            raise InputError(f"{where}.shapes has no shape")
        lists = {}
        for key in ("sizes", "pipeline_sizes", "virtual_stages"):
            v = inputs.get(f"expert_parallel.{key}", list)
            if not v or any(not isinstance(x, int) or isinstance(x, bool) or x <= 0 for x in v):
                raise InputError(f"{where}.{key} is {v!r}; expected positive integers")
            lists[key] = v
        self.sizes, self.pp_sizes, self.virtual = (lists["sizes"], lists["pipeline_sizes"],
                                                   lists["virtual_stages"])
        self.tokens = inputs.get("expert_parallel.tokens_per_gpu", int)
        self.seq = inputs.get("expert_parallel.seq", int)
        self.pp_micro = inputs.get("expert_parallel.micro_batch_sequences", int)
        self.prefetch = inputs.get("expert_parallel.p1_prefetch_layers", int)
        if self.tokens % self.seq or self.tokens % (self.pp_micro * self.seq):
            raise InputError(f"{where}.tokens_per_gpu ({self.tokens}) is not whole micro-batches")
        self.scales = []
        for i, s in enumerate(inputs.get("expert_parallel.scales", list)):
            if not isinstance(s, dict) or not all(isinstance(s.get(k), int) and s[k] > 0
                                                  for k in ("gpus", "nodes")) or \
                    s["gpus"] % s["nodes"]:
                raise InputError(f"{where}.scales[{i}] is {s!r}; expected whole nodes of GPUs")
            self.scales.append((s["gpus"], s["nodes"]))
        self.table_scales = inputs.get("expert_parallel.layouts_table_gpus", list)
        self.efficiency = inputs.get("expert_parallel.grouped_gemm_efficiency")
        self.host = inputs.get("expert_parallel.host_round_trip_us") * 1e-6
        self.load = inputs.get("expert_parallel.busiest_rank_load")
        bw = inputs.get("expert_parallel.all_to_all_busbw_gbs", dict)
        if not all(isinstance(bw.get(k), (int, float)) for k in ("nvlink", "per_nic")):
            raise InputError(f"{where}.all_to_all_busbw_gbs needs nvlink and per_nic (GB/s)")
        self.ref_name = inputs.get("expert_parallel.layer_rate_of", str)
        self.ref = model.measured.get(self.ref_name)
        if self.ref is None or "rate_of" in self.ref:
            raise InputError(f"{where}.layer_rate_of is {self.ref_name!r}; expected a shape with "
                             "a measured_layers entry of its own")
        self.ref_shape = inputs.shape(self.ref_name)
        self.per_node = 8
        self.a2a = AllToAll(model.net, bw["nvlink"], bw["per_nic"], self.per_node)
        self._splits, self._search = {}, {}

    # -- one layout

    def compute(self, shape, load=1.0):
        return MoeCompute(shape, self.ref, self.ref_shape, self.m.rate, self.efficiency, self.a2a,
                          self.host, load if shape.ep > 1 else 1.0)

    def split(self, shape, parts):
        key = (shape.name, parts)
        if key not in self._splits:
            self._splits[key] = balance_stages(moe_block_costs(shape), parts)
        return self._splits[key]

    def groups(self, scale, pp, ep):
        """(GPUs, nodes) of a stage's data-parallel group (its ranks) and of an
        expert-data-parallel group (every E_p-th of them: 8 / E_p a node, or one every E_p / 8
        nodes)."""
        gpus, nodes = scale
        per_node = gpus // nodes
        stage = gpus // pp
        dp = (stage, max(1, stage // per_node))
        ed = stage // ep
        ed_per_node = max(1, min(stage, per_node) // ep)
        return dp, (ed, max(1, ed // ed_per_node))

    @staticmethod
    def parts(s, comp, blocks, ep, dp, ed):
        """[(PartView, (ranks, nodes))]: one engine without expert parallelism, else the dense
        parameters over the stage's ranks and the expert stacks over the expert-data ranks."""
        if ep == 1:
            return [(PartView(s, comp, blocks, lambda name: True), dp)]
        parts = [(PartView(s, comp, blocks, lambda name: not is_expert(name)), dp),
                 (PartView(s, comp, blocks, is_expert), ed)]
        return [(pv, sc) for pv, sc in parts if pv.numel()]  # a stage of no MoE layer: one

    def run(self, shape, scale, pp, ep, stage, ckpt, v, micro, seq, m, simulate=True, load=1.0,
            faster_than=math.inf):
        """One layout: `pp` stages of `v` virtual stages, E_p `ep`, ZeRO `stage`, checkpointing
        `ckpt`, `m` micro-batches (micro-steps without a pipeline) of `micro` sequences of `seq` a
        GPU. Memory always; the step where `simulate` and it fits (else None), and with a pipeline
        only where its busiest rank's compute alone is shorter than `faster_than` seconds (the step
        cannot be shorter than that)."""
        m_ = self.m
        net, opts = m_.net, m_.opts
        s = shape.with_layout(ep, micro, seq, ckpt)
        comp = self.compute(s, load)
        dp, ed = self.groups(scale, pp, ep)
        loss = m_.loss_chunk * GIB
        layer = moe_activation_bytes(s, 1, 0, 0) - moe_activation_bytes(s, 0, 0, 0)
        tokens = m * s.tokens() / pp  # a GPU a step
        loads = (1.0, self.load if ep > 1 else 1.0)  # memory: uniform, and the busiest rank's
        step = zero = None
        if stage == 3:
            if pp > 1:
                raise InputError("dstrain refuses ZeRO stage 3 with a pipeline")
            blocks = range(s.L + 2)
            parts = self.parts(s, comp, blocks, ep, dp, ed)
            states = sum(model_state_bytes(pv, 3, n, opts) for pv, (n, _) in parts)
            tl = Timeline(net, dp[0], dp[1], False)
            runs = []
            for k, (pv, group) in enumerate(parts):
                unit = Units(pv, group[0], opts["stage3_param_persistence_threshold"]).padded[1]
                runs.append(Stage3Run(tl, pv, pv, group[0], opts, self.prefetch * unit,
                                      None if k == 0 else group))
            GroupedStage3Run(runs, PartView(s, comp, blocks, lambda name: True)).run(m)
            acts = [moe_activation_bytes(s, s.L, 0, loss, f) for f in loads]
            memory = [states + tl.mem_peak + a for a in acts]
            step, zero = tl.t, tl.comm_busy
        else:
            layout = PipelineLayout(s, comp, pp, v, scale, self.split(shape, pp * v))
            one = boundary_bytes(s)
            transfer = [net.transfer_seconds(one, a) for a in layout.across]
            last = pp * v - 1
            memory = [0, 0]
            parts_of = []
            for p in range(pp):
                parts = self.parts(s, comp, layout.views[p].blocks, ep, dp, ed)
                parts_of.append(parts)
                states = sum(model_state_bytes(pv, stage, n, opts) for pv, (n, _) in parts)
                buffers = sum(transient_bytes(net, pv, pv, stage, sc, opts) for pv, sc in parts)
                held, nb = max(pipeline_held(layout, p, m), key=lambda h: h[0] * layer + h[1] * one)
                chunk = loss if p == layout.rank_of(last) else 0
                for i, f in enumerate(loads):
                    act = moe_activation_bytes(s, held, nb, chunk, f)
                    memory[i] = max(memory[i], states + buffers + act)
            busiest = m * max(sum(view.fwd) + sum(view.bwd) for view in layout.views)
            if simulate and memory[0] <= m_.memory and busiest < faster_than:
                def make_run(tl, p):
                    runs = []
                    for k, (pv, group) in enumerate(parts_of[p]):
                        runs.append(ShardedRun(tl, pv, pv, group[0], opts,
                                               None if k == 0 else group))
                    return GroupedShardedRun(runs, layout.views[p])

                tls = pipeline_step(net, layout, stage, dp, opts, m, transfer,
                                    min(pp, scale[1]), make_run)
                step = max(tl.t for tl in tls)
                zero = max(tl.comm_busy for tl in tls)
        if stage == 3:
            a2a = m * comp.a2a_seconds()
        else:  # the rank whose layers exchange the most
            a2a = m * max(sum(comp.a2a_fwd[b] + comp.a2a_bwd[b] for b in view.blocks)
                          for view in layout.views)
        fits = memory[0] <= m_.memory
        tps = tflops = mfu = None
        if step is not None:
            tps = tokens / step
            tflops = s.flops_per_token() * tps
            mfu = tflops / m_.peak
        return MoeRun(pp, ep, ed[0], stage, ckpt, v, m, tokens, step, a2a, zero, memory[0], fits,
                      tps, tflops, mfu, memory[1])

    # -- the search at tokens_per_gpu

    def search(self, shape, scale):
        """Every layout of `scale`: P, E_p, ZeRO stage (3 only without a pipeline), checkpointing
        and v; the step simulated where it fits and no faster layout of the same P, E_p and v
        fits with less (stage 1 before 2, no checkpointing before checkpointing)."""
        key = (shape.name, scale)
        if key in self._search:
            return self._search[key]
        gpus, _ = scale
        out = []
        best = collections.defaultdict(lambda: math.inf)  # each E_p's fastest step so far
        for pp in self.pp_sizes:
            if gpus % pp:
                continue
            for ep in self.sizes:
                if (gpus // pp) % ep or shape.E % ep:
                    continue
                if pp == 1:
                    micro, m, chunks = self.tokens // self.seq, 1, [1]
                else:
                    micro, m = self.pp_micro, self.tokens * pp // (self.pp_micro * self.seq)
                    chunks = [v for v in self.virtual if pp * v <= shape.L + 2 and
                              (v == 1 or m % pp == 0)]
                for v in chunks:
                    fitted = set()
                    order = [(False, 1), (False, 2), (True, 1), (True, 2)]
                    if pp == 1:
                        order += [(False, 3), (True, 3)]
                    for ckpt, stage in order:
                        dominated = ((not ckpt and stage == 2 and (False, 1) in fitted) or
                                     (ckpt and (False, stage) in fitted) or
                                     (ckpt and stage == 2 and (True, 1) in fitted))
                        if stage == 3 and ckpt and (False, 3) in fitted:
                            dominated = True
                        l = self.run(shape, scale, pp, ep, stage, ckpt, v, micro, self.seq, m,
                                     simulate=not dominated, faster_than=best[ep])
                        if l.fits:
                            fitted.add((ckpt, stage))
                            if l.step is not None:
                                best[ep] = min(best[ep], l.step)
                        out.append(l)
        self._search[key] = out
        return out

    @staticmethod
    def fastest(runs, ep=None):
        fit = [l for l in runs if l.fits and l.step is not None and ep in (None, l.ep)]
        return min(fit, key=lambda l: l.step) if fit else None

    # -- tables

    def inputs_table(self):
        inputs = self.m.inputs
        rows = []
        for key, what in (("grouped_gemm_efficiency",
                           "experts' grouped matrix products, share of the dense layer's "
                           "FLOP rate"),
                          ("host_round_trip_us", "host round trip of the counts' exchange, µs"),
                          ("all_to_all_busbw_gbs", "all-to-all: GB/s a rank sends, by link"),
                          ("busiest_rank_load", "busiest rank's routed rows against the mean "
                                                "(sensitivity)")):
            entry = inputs.get("expert_parallel", dict).get(key)
            if not isinstance(entry, dict) or not {"value", "kind", "where"} <= entry.keys():
                raise InputError(f"{inputs.path}: key 'expert_parallel.{key}' must be an object "
                                 "with value, kind, where and source")
            v = entry["value"]
            shown = (", ".join(f"{k}: {x}" for k, x in v.items()) if isinstance(v, dict)
                     else f"{v:,}")
            rows.append([what, shown, entry["kind"], entry["where"]])
        ref = self.ref_shape
        flops = 3 * ref.segment_forward_flops()[1] * self.ref["micro"] * self.ref["seq"]
        rate = flops / ((self.ref["forward_ms"] + self.ref["backward_ms"]) * 1e-3)
        rows.append([f"FLOP/s of attention and router (and of the experts before the factor above)",
                     f"{rate:.3g} ({fmt(100 * rate / self.m.peak)}% of peak)", "derived",
                     f"the {self.ref_name} layer's measured forward + backward"])
        advice = inputs.get("expert_parallel", dict).get("dispatcher_advice")
        if isinstance(advice, dict):
            rows.append(["all-to-all or DeepEP at E_p ≤ 8", advice.get("value", ""),
                         advice.get("kind", ""), advice.get("where", "")])
        return table(["input", "value", "kind", "where"], rows)

    def shapes_table(self):
        rows = []
        for shape in self.shapes:
            s = shape.with_layout(1, self.tokens // self.seq, self.seq, False)
            comp = self.compute(s)
            dense, experts = s.layer_numel()
            attention = 4 * s.heads * s.head_dim * s.seq
            work = 2 * dense + attention + 2 * experts / self.efficiency
            total = sum(n for _, n, _ in s.parameters(whole=True))
            rows.append([shape.name, f"{s.E} × top {s.k}, width {s.I}", f"{total / 1e9:.2f} B",
                         f"{s.expert_numel() / 1e9:.2f} B", f"{s.active_numel() / 1e9:.2f} B",
                         f"{s.flops_per_token() / 1e9:.2f}", f"{s.micro} × {s.seq}",
                         fmt((comp.fwd[1] + comp.bwd[1]) * 1e3, 2),
                         f"{100 * 2 * experts / self.efficiency / work:.0f}%",
                         fmt((comp.fwd[-1] + comp.bwd[-1]) * 1e3, 1),
                         fmt(comp.opt_per_element * total * 1e3, 0)])
        return table(["shape", "experts", "parameters", "of them experts", "active a token",
                      "GFLOP/token (active)", "tokens a GPU", "one layer fwd+bwd ms (E_p 1)",
                      "experts' share of its time", "head fwd+bwd ms",
                      "optimizer ms (all elements, one GPU)"], rows)

    def traffic_table(self):
        rows = []
        for shape in self.shapes:
            for ep in self.sizes:
                if ep == 1 or shape.E % ep:
                    continue
                s = shape.with_layout(ep, self.tokens // self.seq, self.seq, False)
                comp, busy = self.compute(s), self.compute(s, self.load)
                rows_bytes = s.tokens() * s.k * s.H * s.element_bytes
                local, remote = self.a2a.shares(ep)
                fwd, bwd = comp.layer_compute
                layer = comp.a2a_fwd[1] + comp.a2a_bwd[1]
                ck = shape.with_layout(ep, self.tokens // self.seq, self.seq, True)
                ck_comp = self.compute(ck)
                rows.append([shape.name, ep, self.a2a.nodes(ep), fmt(rows_bytes / 1e6, 0),
                             fmt(rows_bytes * local / 1e6, 0), fmt(rows_bytes * remote / 1e6, 0),
                             fmt(comp.one_a2a * 1e3, 2), fmt(comp.counts * 1e6, 0),
                             fmt(layer * 1e3, 2),
                             fmt((ck_comp.a2a_fwd[1] + ck_comp.a2a_bwd[1]) * 1e3, 2),
                             fmt((fwd + bwd) * 1e3, 2), f"{100 * layer / (fwd + bwd):.0f}%",
                             fmt((busy.a2a_fwd[1] + busy.a2a_bwd[1]) * 1e3, 2)])
        return table(["shape", "E_p", "nodes a group spans", "rows a rank sends, MB (all-to-all)",
                      "to its node's ranks MB", "to other nodes MB", "one all-to-all ms",
                      "counts' exchange µs", "a layer's all-to-alls ms (fwd + bwd)",
                      "with checkpointing ms", "a layer's compute ms", "all-to-alls / compute",
                      f"busiest rank ({self.load}×) ms"], rows)

    def layouts_table(self):
        """Each E_p's fastest layout at the scales of layouts_table_gpus."""
        rows = []
        for shape in self.shapes:
            for scale in self.scales:
                if scale[0] not in self.table_scales:
                    continue
                runs = self.search(shape, scale)
                base = self.fastest(runs, 1)
                for ep in self.sizes:
                    mine = [l for l in runs if l.ep == ep]
                    if not mine:
                        continue
                    best = self.fastest(mine)
                    count = f"{sum(l.fits for l in mine)} of {len(mine)}"
                    if best is None:
                        least = min(mine, key=lambda l: l.memory)
                        rows.append([shape.name, scale[0], ep,
                                     f"nothing fits (least: {moe_name(least)}, "
                                     f"{fmt(least.memory / GB)} GB)"] + [""] * 7 + [count, ""])
                        continue
                    rows.append([shape.name, scale[0], ep, moe_name(best), fmt(best.memory / GB),
                                 fmt(best.a2a * 1e3), fmt(best.zero * 1e3), fmt(best.step * 1e3),
                                 fmt(best.tokens_per_s, 0), fmt(best.tflops / 1e12, 0),
                                 f"{100 * best.mfu:.1f}%", count,
                                 gain(base.step, best.step) if base else "—"])
        return table(["shape", "GPUs", "E_p", "fastest that fits (P × E_p × expert-data, stage)",
                      "GB a GPU", "all-to-all ms (serial)", "ZeRO comm ms", "step ms",
                      "tokens/s per GPU", "TFLOP/s per GPU", "MFU", "layouts that fit",
                      "vs E_p 1"], rows)

    def busiest(self, shape, scale, l):
        """Layout l again with the busiest rank's load: its step (every rank waits for it)."""
        micro = l.tokens * l.p // (l.m * self.seq)
        return self.run(shape, scale, l.p, l.ep, l.stage, l.ckpt, l.v, micro, self.seq, l.m,
                        load=self.load)

    def best_table(self):
        rows = []
        for shape in self.shapes:
            for scale in self.scales:
                runs = self.search(shape, scale)
                best, flat = self.fastest(runs), self.fastest(runs, 1)
                row = [shape.name, scale[0]]
                if best is None:
                    least = min(runs, key=lambda l: l.memory)
                    row += [f"nothing fits (least: {moe_name(least)}, {fmt(least.memory / GB)} GB)"]
                    row += [""] * 10
                else:
                    busy = self.busiest(shape, scale, best)
                    row += [moe_name(best), fmt(best.step * 1e3), fmt(best.tokens_per_s, 0),
                            fmt(best.tflops / 1e12, 0), f"{100 * best.mfu:.1f}%",
                            fmt(best.memory / GB), fmt(best.a2a * 1e3),
                            fmt(busy.tokens_per_s, 0) if busy.step else "",
                            fmt(busy.memory_busiest / GB)]
                    row += [gain(best.step, busy.step) if busy.step else ""]
                if flat is None:
                    row += ["nothing fits", "", "", ""]
                else:
                    row += [moe_name(flat), fmt(flat.tokens_per_s, 0), fmt(flat.tflops / 1e12, 0),
                            gain(flat.step, best.step) if best else ""]
                rows.append(row)
        return table(["shape", "GPUs", "fastest that fits (P × E_p × expert-data, stage)",
                      "step ms", "tokens/s per GPU", "TFLOP/s per GPU", "MFU", "GB a GPU",
                      "all-to-all ms (serial)", f"busiest rank at {self.load}×: tokens/s per GPU",
                      "its GB", "its loss", "E_p 1: fastest", "tokens/s per GPU",
                      "TFLOP/s per GPU", "expert parallelism's gain"], rows)

    def published_table(self):
        rows = []
        by_name = {s.name: s for s in self.shapes}
        for i, r in enumerate(self.m.inputs.get("published_expert_parallel", list)):
            where = f"{self.m.inputs.path}: published_expert_parallel[{i}]"
            try:
                shape = by_name[r["shape"]]
                scale = (r["gpus"], r["nodes"])
                per_gpu = r["global_batch"] * r["seq"] // r["gpus"]
                vp = f" (VP {r['vp']})" if "vp" in r else ""
                layout = (f"TP {r['tp']} × PP {r['pp']}{vp} × EP {r['ep']}, "
                          f"{r['micro']} × {r['seq']} a micro-batch")
                if "tokens_per_s_per_gpu" in r:
                    tokens_s = r["tokens_per_s_per_gpu"]
                    published = f"{tokens_s:,}"
                elif "step_s" in r:
                    tokens_s = r["global_batch"] * r["seq"] / r["step_s"] / r["gpus"]
                    published = f"{tokens_s:,.0f} (from its {r['step_s']} s step)"
                else:
                    tokens_s, published = None, "—"
                ours = r["dstrain"]
            except (KeyError, TypeError) as e:
                raise InputError(f"{where}: missing or malformed {e}")
            for j, d in enumerate(ours):
                try:
                    pp, ep, stage, v = d["pp"], d["ep"], d["stage"], d.get("v", 1)
                except (KeyError, TypeError) as e:
                    raise InputError(f"{where}.dstrain[{j}]: missing or malformed {e}")
                micro = d.get("micro", r["micro"])  # sequences a GPU a micro-batch (TP 1)
                m = per_gpu * pp // (micro * r["seq"])
                if r["gpus"] % pp or (r["gpus"] // pp) % ep or per_gpu * pp % (micro * r["seq"]):
                    raise InputError(f"{where}.dstrain[{j}]: the layout or micro-batch does not "
                                     "divide")
                cands = [self.run(shape, scale, pp, ep, stage, ck, v, micro, r["seq"], m)
                         for ck in (False, True)]
                fit = [l for l in cands if l.fits and l.step is not None]
                l = min(fit, key=lambda x: x.step) if fit else min(cands, key=lambda x: x.memory)
                theirs = ""
                if l.step is not None and tokens_s:
                    theirs = fmt(l.tokens_per_s * r["tflops_per_gpu"] / tokens_s, 0)
                first = j == 0
                rows.append([r["name"] if first else "", r["gpus"] if first else "",
                             layout if first else "", f"{per_gpu:,}" if first else "",
                             published if first else "",
                             f"{r['tflops_per_gpu']}" if first else "",
                             f"{shape.name}, {moe_name(l)}, {l.m} micro-steps" if l.p == 1 else
                             f"{shape.name}, {moe_name(l)}, m {l.m}",
                             "yes" if l.fits else "**no**", fmt(l.memory / GB),
                             fmt(l.a2a * 1e3) if l.step else "",
                             fmt(l.zero * 1e3) if l.step else "",
                             fmt(l.step * 1e3) if l.step else "",
                             fmt(l.tokens_per_s, 0) if l.step else "",
                             fmt(l.tflops / 1e12, 0) if l.step else "", theirs])
        return table(["published run (H100, bf16)", "GPUs", "layout", "tokens a GPU a step",
                      "tokens/s per GPU", "TFLOP/s per GPU",
                      "dstrain, same GPUs and tokens (model)",
                      "fits", "GB a GPU", "all-to-all ms (serial)", "ZeRO comm ms", "step ms",
                      "tokens/s per GPU", "TFLOP/s per GPU (this page's FLOPs)",
                      "TFLOP/s per GPU (the run's FLOPs a token)"], rows)


# ----------------------------------------------------------------------------------------------
# The check: a real 2-rank CPU run's counters (its trace) against the formulas


def logged_steps(steps, log_interval):
    """Step 1, every log_interval-th and the last."""
    return sum(1 for s in range(1, steps + 1) if s == 1 or s % log_interval == 0 or s == steps)


def trainer_all_reduces(steps, log_interval):
    """The trainer's own 8-byte all-reduces besides the engine's norm: the stop vote after every
    step but the last and the loss at logged steps."""
    return (steps - 1) + logged_steps(steps, log_interval)


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
        # One gradient norm a step (the engine's) and the trainer's own 8-byte ones, its 16-byte
        # count of each step's labels and tokens, and at each logged step the fullest rank's
        # memory figures (on the CPU three float64s: RSS, peak RSS, model states).
        logged = logged_steps(steps, sets["training.log_interval"])
        small = steps + trainer_all_reduces(steps, sets["training.log_interval"])
        calls = small + steps + logged
        nbytes = (small * ring_bytes("all_reduce", 8, world) +
                  steps * ring_bytes("all_reduce", 16, world) +
                  logged * ring_bytes("all_reduce", 24, world))
        got = sorted({tuple(other[r]) for r in range(world)})
        ok = got == [(calls, nbytes)]
        if not ok:
            failures.append(f"stage {stage} small all_reduces: formula {calls} calls {nbytes} "
                            f"bytes, counters {got}")
        rows.append([stage, f"8-, 16- and 24-byte all_reduce, whole run of {steps} steps", calls,
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
