"""Helpers of the reference suite (tests/reference): running dstrain, building tiny random models
with transformers, comparing tensors. The references themselves (transformers, peft, tokenizers,
safetensors, deepspeed) are the project environment's pinned packages (pyproject.toml)."""

import json
import math
import os
import struct
import subprocess

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.environ.get("DSTRAIN_SHARED", os.path.join(REPO, "..", "shared"))

FP32_TOL = 1e-5

TINY = os.path.join(REPO, "configs", "tiny.yaml")  # the built-in tiny model and corpus


def dstrain_binary():
    path = os.environ.get("DSTRAIN_BINARY", os.path.join(REPO, "build", "apps", "dstrain", "dstrain"))
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path}: no dstrain binary (build first, or set DSTRAIN_BINARY)")
    return path


def device():
    """Where both sides compute: DSTRAIN_REF_DEVICE (cpu in CI, cuda on a GPU machine)."""
    return os.environ.get("DSTRAIN_REF_DEVICE", "cpu")


def run(args, cwd=None, env=None, timeout=600, check=True):
    """Runs dstrain with `args`; returns the CompletedProcess (stdout and stderr together)."""
    full_env = dict(os.environ)
    full_env.setdefault("DSTRAIN_DEVICE", device())
    full_env.update(env or {})
    r = subprocess.run([dstrain_binary()] + [str(a) for a in args], cwd=cwd, env=full_env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                       check=False, text=True, errors="replace")
    if check and r.returncode != 0:
        raise AssertionError(f"dstrain {' '.join(map(str, args))} exited {r.returncode}:\n"
                             f"{r.stdout[-4000:]}")
    return r


def train(config, world=1):
    """Trains with `config`: `dstrain train` on one rank, `dstrain launch --nproc <world>` on more."""
    if world == 1:
        return run(["train", config])
    return run(["launch", "--nproc", str(world), config])


def tiny_run_overrides(out, **extra):
    """`--set` arguments for a short run of TINY (12 steps, logs every 2, eval every 6) writing under
    `out`; `extra` adds or replaces keys."""
    sets = {"training.max_steps": 12, "training.log_interval": 2, "training.eval_interval": 6,
            "logging.out_dir": out, "checkpoint.dir": os.path.join(out, "ckpt"),
            "logging.progress": "false"}
    sets.update(extra)
    args = []
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    return args


def flatten(node, prefix=""):
    """A nested dict (a loaded YAML config) as {"a.b.c": value}."""
    out = {}
    for k, v in node.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def write_packed_corpus(path, words, batches, micro, seq, stride, lengths):
    """Writes text lines of `words` (line i: 3 + i % lengths of them, every third from position
    i·stride) until they fill `batches` batches, and returns the batches dstrain packs of them with
    the byte tokenizer (UTF-8 bytes, eos 256): [(input_ids, labels)], each [micro, seq]."""
    docs, total, i = [], 0, 0
    while total <= batches * micro * seq + seq:
        line = " ".join(words[(i * stride + k * 3) % len(words)] for k in range(3 + i % lengths))
        docs.append(list(line.encode("utf-8")))
        total += len(docs[-1]) + 1
        i += 1
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(bytes(d).decode("utf-8") for d in docs) + "\n")
    inp, lab = pack_samples(docs, 256, seq)
    return [(inp[s * micro:(s + 1) * micro], lab[s * micro:(s + 1) * micro]) for s in range(batches)]


def _yaml_value(v):
    return str(v).lower() if isinstance(v, bool) else str(v)


def line_corpus_data(corpus, max_length, **keys):
    """A run's data section for a text file of one document a line, packed, without an eval split;
    `keys` add to it or replace its keys."""
    return dict({"train_path": corpus, "format": "text", "document": "line",
                 "max_length": max_length, "packing": True, "eval_split": 0}, **keys)


def write_run_config(path, model_dir, run_dir, data, training, stage=0, save_final=False,
                     init="pretrained", more=None):
    """Writes the YAML config of a dstrain run to `path` and returns `path`: the Hugging Face model
    directory `model_dir` (`init`, None to leave it out) with the byte tokenizer in float32, `data`
    and `training` as those sections' keys, ZeRO `stage`, metrics in run_dir and checkpoints in
    run_dir/checkpoints; `more` maps further section names (lora) to their keys. Values are written
    as given, booleans as true / false."""
    model = {"name_or_path": model_dir, "init": init, "tokenizer": "byte", "dtype": "float32"}
    sections = {"model": {k: v for k, v in model.items() if v is not None},
                "data": data, "training": training, "zero": {"stage": stage},
                "logging": {"out_dir": run_dir, "progress": False},
                "checkpoint": {"dir": f"{run_dir}/checkpoints", "save_final": save_final}}
    sections.update(more or {})
    with open(path, "w", encoding="utf-8") as f:
        for name, keys in sections.items():
            f.write(f"{name}:\n" + "".join(f"  {k}: {_yaml_value(v)}\n" for k, v in keys.items()))
    return path


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


def assert_close(got, want, tol, what):
    d = rel_diff(got, want)
    assert d <= tol, f"{what}: relative difference {d:.3g} > {tol:g}"
    return d


def compare_all(got, want, tol):
    """{name: rel diff} for every tensor of `want`; fails naming the worst tensor over `tol`, and
    any tensor one side has and the other lacks."""
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    assert not missing and not extra, f"tensors only in the reference: {missing}; only in dstrain: {extra}"
    diffs = {name: rel_diff(got[name], w) for name, w in want.items()}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= tol, f"{worst}: relative difference {diffs[worst]:.3g} > {tol:g}"
    return diffs


BASE = {"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "initializer_range": 0.02, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}

# The test sequences' length (test_transformers.py): the windows below are a quarter of it, the
# original contexts of the yarn and dynamic configs shorter than it.
TEST_SEQ = 48

# name → transformers config arguments: every family, GQA, tied and untied embeddings, qwen3's q/k
# norms and explicit head_dim, llama3 rope scaling, Mistral's sliding window as released (longer than
# the test sequences) and shorter than them (on every layer; on Qwen2's layers from
# max_window_layers on; on the layers Qwen3's layer_types names), yarn (Qwen2.5's long-context
# recipe, and with every optional key) and dynamic NTK scaling.
WINDOW = TEST_SEQ // 4
TINY_CONFIGS = {
    "llama-gqa-untied": dict(BASE, model_type="llama", tie_word_embeddings=False),
    "llama-mha-tied": dict(BASE, model_type="llama", tie_word_embeddings=True,
                           num_key_value_heads=4),
    "llama3-rope-scaling": dict(BASE, model_type="llama", tie_word_embeddings=True,
                                rope_theta=500000.0, max_position_embeddings=512,
                                rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 64}),
    "mistral-gqa": dict(BASE, model_type="mistral", tie_word_embeddings=False,
                        sliding_window=4096),
    "mistral-window": dict(BASE, model_type="mistral", tie_word_embeddings=False,
                           sliding_window=WINDOW),
    "qwen2-window-upper-layers": dict(BASE, model_type="qwen2", tie_word_embeddings=True,
                                      num_hidden_layers=3, use_sliding_window=True,
                                      sliding_window=WINDOW, max_window_layers=1),
    "qwen3-window-layer-types": dict(BASE, model_type="qwen3", tie_word_embeddings=False,
                                     head_dim=16, attention_bias=False, use_sliding_window=True,
                                     sliding_window=WINDOW,
                                     layer_types=["sliding_attention", "full_attention"]),
    "qwen2-yarn": dict(BASE, model_type="qwen2", tie_word_embeddings=True, rope_theta=1e6,
                       max_position_embeddings=128,
                       rope_scaling={"type": "yarn", "factor": 4.0,
                                     "original_max_position_embeddings": 32}),
    "llama-yarn-options": dict(BASE, model_type="llama", tie_word_embeddings=False,
                               max_position_embeddings=128,
                               rope_scaling={"rope_type": "yarn", "factor": 8.0,
                                             "original_max_position_embeddings": 16,
                                             "beta_fast": 8.0, "beta_slow": 2.0,
                                             "mscale": 1.0, "mscale_all_dim": 0.5,
                                             "truncate": False}),
    "llama-dynamic": dict(BASE, model_type="llama", tie_word_embeddings=True,
                          max_position_embeddings=32,
                          rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
    "qwen2-tied": dict(BASE, model_type="qwen2", tie_word_embeddings=True, rope_theta=1e6),
    "qwen2-untied": dict(BASE, model_type="qwen2", tie_word_embeddings=False),
    "qwen3-tied": dict(BASE, model_type="qwen3", tie_word_embeddings=True, head_dim=32,
                       attention_bias=False),
    "qwen3-untied": dict(BASE, model_type="qwen3", tie_word_embeddings=False, head_dim=16,
                         attention_bias=False),
    # Mixture-of-Experts: Qwen3-MoE with a dense layer among its MoE layers and renormalised top-k
    # weights; Qwen2-MoE with its gated shared expert (top-k weights not renormalised); Mixtral.
    "qwen3-moe-dense-layer": dict(BASE, model_type="qwen3_moe", tie_word_embeddings=False,
                                  head_dim=16, attention_bias=False, num_hidden_layers=3,
                                  num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                  norm_topk_prob=True, mlp_only_layers=[1]),
    # The load-balancing loss (output_router_logits) pooled over the layers, weighted enough to
    # move the routers' gradients well beyond the tolerance.
    "qwen3-moe-aux-loss": dict(BASE, model_type="qwen3_moe", tie_word_embeddings=False,
                               head_dim=16, attention_bias=False, num_experts=4,
                               num_experts_per_tok=2, moe_intermediate_size=32,
                               output_router_logits=True, router_aux_loss_coef=0.5),
    "qwen2-moe-shared-expert": dict(BASE, model_type="qwen2_moe", tie_word_embeddings=False,
                                    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                    shared_expert_intermediate_size=48),
    "mixtral": dict(BASE, model_type="mixtral", tie_word_embeddings=False, num_local_experts=4,
                    num_experts_per_tok=2, intermediate_size=32),
}


def save_tiny_model(out_dir, cfg, seed=1234):
    """save_pretrained of a random transformers model (fp32 safetensors); 1-D parameters are moved
    away from 1 and 0 so that their gradients show. Returns the directory."""
    import transformers
    if os.path.isdir(out_dir):
        return out_dir
    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model(**cfg)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
            # A MoE router's weights (transformers may start them at zero): distinct scores, so
            # that every token's top-k experts are one choice, not a tie.
            if name.endswith("mlp.gate.weight") and p.abs().max() == 0:
                p.normal_(0.0, 0.5)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def load_hf(model_dir, dtype=torch.float32, **kwargs):
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=dtype, attn_implementation="sdpa", **kwargs).to(device())
    model.train()  # dropout is 0 in these configs; train mode as in training
    return model


def random_ids(vocab, batch, seq, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g, dtype=torch.int64)


def write_ids(path, ids, labels=None, position_ids=None):
    from safetensors.torch import save_file
    tensors = {"input_ids": ids.contiguous()}
    if labels is not None:
        tensors["labels"] = labels.contiguous()
    if position_ids is not None:
        tensors["position_ids"] = position_ids.contiguous()
    save_file(tensors, path)


def dstrain_forward(tmp, model_dir, ids, dtype="float32", labels=None, extra=(),
                    position_ids=None):
    """`dstrain debug forward`: {"logits", "loss", "grad.<name>"} as fp32 CPU tensors. With
    `position_ids` restarting at 0 per document, the rows are packed documents."""
    from safetensors.torch import load_file
    ids_path = os.path.join(tmp, "ids.safetensors")
    out = os.path.join(tmp, f"dstrain-{dtype}.safetensors")
    write_ids(ids_path, ids, labels, position_ids)
    run(["debug", "forward", "--model", model_dir, "--ids", ids_path, "--out", out,
         "--dtype", dtype, "--device", device(), *extra])
    return load_file(out)


def hf_forward(model, ids, labels=None, position_ids=None):
    """The same dump from a transformers model: logits, loss (model(ids, labels=...)) and every
    parameter gradient, fp32 on the CPU. With `position_ids` (no attention mask and no cache),
    transformers reads the rows as packed documents wherever the positions restart."""
    extra = {} if position_ids is None else {"position_ids": position_ids.to(model.device),
                                             "use_cache": False}
    out = model(input_ids=ids.to(model.device),
                labels=(ids if labels is None else labels).to(model.device), **extra)
    out.loss.backward()
    dump = {"logits": out.logits.detach().float().cpu(), "loss": out.loss.detach().float().cpu()}
    if getattr(out, "aux_loss", None) is not None:  # a MoE model's load-balancing loss
        dump["aux_loss"] = out.aux_loss.detach().float().cpu()
    for name, p in model.named_parameters():
        if p.requires_grad:
            dump["grad." + name] = p.grad.detach().float().cpu()
    return dump


def read_token_file(path, with_prompts=False):
    """Documents of a dstrain token file (docs/data.md, versions 1 and 2) as lists of ids; with
    `with_prompts`, (documents, prompt lengths), the lengths all 0 for version 1."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"DSTOKENS":
        raise ValueError(f"{path}: not a dstrain token file")
    version, width = struct.unpack("<II", data[8:16])
    _vocab, count, docs = struct.unpack("<QQQ", data[16:40])
    if version not in (1, 2) or width not in (2, 4):
        raise ValueError(f"{path}: version {version}, width {width} not understood")
    offsets = struct.unpack(f"<{docs + 1}Q", data[40:48 + 8 * docs])
    start = 48 + 8 * docs
    end = start + width * count
    tokens = struct.unpack(f"<{count}{'H' if width == 2 else 'I'}", data[start:end])
    documents = [list(tokens[offsets[i]:offsets[i + 1]]) for i in range(docs)]
    prompts = list(struct.unpack(f"<{docs}Q", data[end:end + 8 * docs])) if version == 2 else [0] * docs
    if len(data) != end + (8 * docs if version == 2 else 0):
        raise ValueError(f"{path}: {len(data)} bytes, not what its header says")
    return (documents, prompts) if with_prompts else documents


def pack_samples(documents, eos, seq_len):
    """dstrain's packing (docs/data.md): documents + eos form one stream; sample k is stream
    tokens [k·T, k·T + T] (T + 1 tokens); floor((L - 1) / T) samples. (input_ids, labels) [N, T]."""
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


def read_losses(run_dir):
    """{step: train/loss} of a run's metrics.jsonl."""
    got = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if "train/loss" in rec:
                got[rec["step"]] = rec["train/loss"]
    return got
