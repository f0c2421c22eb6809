"""Helpers of scripts/gpu/parity.py that need nothing beyond python3 and torch (any 1.x/2.x).

safetensors and dstrain token files are read and written here in plain Python, so the comparison
code also runs (in --self-test) where neither transformers nor the safetensors package exists.

safetensors: u64 little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data;
offsets are relative to the end of the header.
"""

import json
import math
import os
import struct
import subprocess

import torch

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def read_safetensors(path):
    """{name: CPU tensor} of a .safetensors file (metadata dropped)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = _DTYPES[info["dtype"]]
        shape = info["shape"]
        if end == begin:
            out[name] = torch.zeros(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype)
        out[name] = flat.reshape(shape).clone()
    return out


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} (any dtype above) as one .safetensors file, in the given order."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = metadata or {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def read_token_file(path):
    """Documents of a dstrain token file (docs/data.md, version 1) as lists of ids."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"DSTOKENS":
        raise ValueError(f"{path}: not a dstrain token file")
    version, width = struct.unpack("<II", data[8:16])
    _vocab, count, docs = struct.unpack("<QQQ", data[16:40])
    if version != 1 or width not in (2, 4):
        raise ValueError(f"{path}: version {version}, width {width} not understood")
    offsets = struct.unpack(f"<{docs + 1}Q", data[40:48 + 8 * docs])
    start = 48 + 8 * docs
    tokens = struct.unpack(f"<{count}{'H' if width == 2 else 'I'}",
                           data[start:start + width * count])
    return [list(tokens[offsets[i]:offsets[i + 1]]) for i in range(docs)]


def rel_diff(got, want):
    """max|got - want| / max|want| over the tensor, in float64 (0/0 counts as 0)."""
    got = got.detach().double().cpu()
    want = want.detach().double().cpu()
    if got.shape != want.shape:
        return math.inf
    num = (got - want).abs().max().item() if got.numel() else 0.0
    den = want.abs().max().item() if want.numel() else 0.0
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def compare_dumps(got, want, tol):
    """Rows (tensor, rel diff, ok) for every tensor of `want`; a tensor missing from `got`, or one
    `got` has that `want` lacks, is a failed row."""
    rows = []
    for name, w in want.items():
        d = rel_diff(got[name], w) if name in got else math.inf
        rows.append((name, d, d <= tol))
    for name in got:
        if name not in want:
            rows.append((name + " (extra)", math.inf, False))
    return rows


def summarize(rows):
    """(worst rel diff, worst name, all ok) over comparison rows."""
    worst = max(rows, key=lambda r: r[1]) if rows else ("-", 0.0, True)
    return worst[1], worst[0], all(r[2] for r in rows)


class Table:
    """Result rows printed as a fixed-width table; `failed` is true once any row failed."""

    def __init__(self):
        self.rows = []

    def add(self, check, detail, value, tol, ok):
        self.rows.append((check, detail, value, tol, "ok" if ok else "MISMATCH"))

    @property
    def failed(self):
        return any(r[4] != "ok" for r in self.rows)

    def render(self):
        head = ("check", "detail", "value", "tolerance", "result")
        cells = [head] + [tuple(_fmt(c) for c in r) for r in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


def _fmt(c):
    if isinstance(c, float):
        return "inf" if math.isinf(c) else f"{c:.3g}"
    return str(c)


def pack_samples(documents, eos, seq_len):
    """dstrain's packing (docs/data.md): documents + eos form one stream; sample k is stream
    tokens [k·T, k·T + T] (T + 1 tokens); floor((L - 1) / T) samples. Returns (input_ids, labels)
    int64 tensors [N, T]."""
    stream = []
    for doc in documents:
        stream.extend(doc)
        stream.append(eos)
    n = (len(stream) - 1) // seq_len
    windows = torch.tensor([stream[k * seq_len:k * seq_len + seq_len + 1] for k in range(n)],
                           dtype=torch.int64)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def takes_no_decay(name, dim):
    """dstrain's rule (lib/zero/no_decay.cpp): 1-D tensors, biases and norms take no weight decay."""
    return dim == 1 or name.endswith(".bias") or "norm" in name.lower()


def hf_param_shapes(cfg):
    """{Hugging Face parameter name: shape} of a llama/qwen2/qwen3 config dict."""
    c, v, ff = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or c // h
    qwen2, qwen3 = cfg["model_type"] == "qwen2", cfg["model_type"] == "qwen3"
    bias = qwen2 or cfg.get("attention_bias", False)
    shapes = {"model.embed_tokens.weight": [v, c]}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for proj, out in (("q", h * d), ("k", kv * d), ("v", kv * d)):
            shapes[f"{p}self_attn.{proj}_proj.weight"] = [out, c]
            if bias:
                shapes[f"{p}self_attn.{proj}_proj.bias"] = [out]
        shapes[f"{p}self_attn.o_proj.weight"] = [c, h * d]
        if bias and not qwen2:
            shapes[f"{p}self_attn.o_proj.bias"] = [c]
        if qwen3:
            shapes[f"{p}self_attn.q_norm.weight"] = [d]
            shapes[f"{p}self_attn.k_norm.weight"] = [d]
        shapes[f"{p}mlp.gate_proj.weight"] = [ff, c]
        shapes[f"{p}mlp.up_proj.weight"] = [ff, c]
        shapes[f"{p}mlp.down_proj.weight"] = [c, ff]
        shapes[f"{p}input_layernorm.weight"] = [c]
        shapes[f"{p}post_attention_layernorm.weight"] = [c]
    shapes["model.norm.weight"] = [c]
    if not cfg.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = [v, c]
    return shapes


def tiny_configs(vocab=1000):
    """The tiny random configs compared (name → config.json dict): qwen2 tied and untied, llama with
    GQA, qwen3 with explicit head_dim and q/k norms."""
    base = {"vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "initializer_range": 0.02, "hidden_act": "silu", "torch_dtype": "float32",
            "bos_token_id": 1, "eos_token_id": 2}
    return {
        "qwen2-tied": dict(base, model_type="qwen2", architectures=["Qwen2ForCausalLM"],
                           tie_word_embeddings=True, rope_theta=1e6),
        "qwen2-untied": dict(base, model_type="qwen2", architectures=["Qwen2ForCausalLM"],
                             tie_word_embeddings=False),
        "llama-untied": dict(base, model_type="llama", architectures=["LlamaForCausalLM"],
                             tie_word_embeddings=False, attention_bias=False, mlp_bias=False),
        "llama-tied": dict(base, model_type="llama", architectures=["LlamaForCausalLM"],
                           tie_word_embeddings=True, num_key_value_heads=4),
        "qwen3-tied": dict(base, model_type="qwen3", architectures=["Qwen3ForCausalLM"],
                           tie_word_embeddings=True, head_dim=32, attention_bias=False),
    }


def run(cmd, log, env=None, timeout=600):
    """Runs `cmd`, appending its command line and output to the open file `log`; returns the exit
    code (124 on timeout)."""
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                           timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        log.write(f"timed out after {timeout} s\n")
        return 124
    log.write(r.stdout.decode("utf-8", "replace"))
    log.write(f"exit {r.returncode}\n")
    log.flush()
    return r.returncode


def dstrain_binary(build_dir):
    path = os.path.join(build_dir, "apps", "dstrain", "dstrain")
    if not os.access(path, os.X_OK):
        raise SystemExit(f"{path}: no dstrain binary (build it first: ninja -C {build_dir} dstrain)")
    return path
