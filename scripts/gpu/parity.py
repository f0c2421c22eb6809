#!/usr/bin/env python3
"""dstrain against Hugging Face, on the GPU machine (docs/gpu.md, "Parity with Hugging Face").

  scripts/gpu/parity.py [BUILD_DIR] [--log-dir DIR] [--device cuda|cpu] [--only forward,train,tokenizer]
  scripts/gpu/parity.py [BUILD_DIR] --self-test      (python3 + torch only; no transformers)

Needs python3 with torch, transformers and tokenizers (the GPU machine). Checks, each a table row:
  forward    tiny random qwen2/llama/qwen3 (tied and untied) saved with save_pretrained: logits,
             loss (model(ids, labels=ids).loss) and every parameter gradient of transformers (SDPA)
             vs `dstrain debug forward`, fp32 (tolerance 1e-5) and bf16 (2e-2); the measure is
             max|a - b| / max|b| per tensor.
  train      20 AdamW steps (fp32, constant lr, no clipping, ZeRO stage 0, one rank) of `dstrain
             train` vs a plain transformers + torch.optim.AdamW loop on the same packed batches;
             losses within 1e-3 (absolute).
  tokenizer  `dstrain data tokenize` vs transformers' fast tokenizer (tokenizers) on the corpus
             and on a list of hard strings, for the qwen2 and gpt2 tokenizers; ids equal.
--self-test runs what this machine can: a second PyTorch implementation (parity_ref.py) against
`dstrain debug forward` on CPU, the byte tokenizer, and the helpers themselves.
Exit status 0 when every row is ok, 1 on any mismatch, 2 on bad arguments. Logs: --log-dir.
"""

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)

try:
    import torch  # noqa: E402
except ImportError:  # ctest reads 77 as "skipped"
    print("parity.py: this python3 has no torch", file=sys.stderr)
    sys.exit(77)

import parity_lib as lib  # noqa: E402

FP32_TOL = 1e-5
BF16_TOL = 2e-2
TRAIN_TOL = 1e-3


def random_ids(vocab, batch, seq, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g, dtype=torch.int64)


def dstrain_forward(ctx, model_dir, ids_path, out_path, dtype, device):
    rc = lib.run([ctx.dstrain, "debug", "forward", "--model", model_dir, "--ids", ids_path,
                  "--out", out_path, "--dtype", dtype, "--device", device], ctx.log)
    return lib.read_safetensors(out_path) if rc == 0 else None


def add_forward_rows(ctx, name, dtype, got, want, tol):
    """Rows for logits, loss and the worst gradient of one (model, dtype)."""
    if got is None:
        ctx.table.add(f"forward {name}", f"{dtype}: dstrain failed (see log)", float("inf"), tol,
                      False)
        return
    rows = lib.compare_dumps(got, want, tol)
    with open(os.path.join(ctx.log_dir, f"forward-{name}-{dtype}.txt"), "w") as f:
        for r in rows:
            f.write(f"{r[0]}\t{r[1]:.6g}\t{'ok' if r[2] else 'MISMATCH'}\n")
    for key in ("logits", "loss"):
        ctx.table.add(f"forward {name}", f"{dtype} {key}", lib.rel_diff(got[key], want[key])
                      if key in got else float("inf"), tol, all(r[2] for r in rows if r[0] == key))
    grads = [r for r in rows if r[0].startswith("grad.") or r[0].endswith("(extra)")]
    worst, where, ok = lib.summarize(grads)
    ctx.table.add(f"forward {name}", f"{dtype} grads ({len(grads)}; worst {where})", worst, tol, ok)


# --- on the GPU machine: transformers ---------------------------------------------------------

def hf_model_dir(ctx, name, cfg):
    """save_pretrained of a random transformers model of `cfg` (fp32, safetensors)."""
    import transformers
    out = os.path.join(ctx.tmp, name)
    if not os.path.isdir(out):
        torch.manual_seed(1234)
        config = transformers.AutoConfig.for_model(**cfg)
        model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
        with torch.no_grad():  # norms away from 1 and biases away from 0, so their gradients show
            for p in model.parameters():
                if p.dim() == 1:
                    p.add_(0.1 * torch.randn_like(p))
        model.save_pretrained(out, safe_serialization=True)
    return out


def hf_forward(model_dir, ids, dtype, device):
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, torch_dtype=dtype, attn_implementation="sdpa").to(device)
    model.train()  # dropout is 0 in these configs; train mode as in training
    ids = ids.to(device)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    dump = {"logits": out.logits.detach().float().cpu(), "loss": out.loss.detach().float().cpu()}
    for pname, p in model.named_parameters():
        dump["grad." + pname] = p.grad.detach().float().cpu()
    return dump


def check_forward(ctx):
    for name, cfg in lib.tiny_configs().items():
        model_dir = hf_model_dir(ctx, name, cfg)
        ids = random_ids(cfg["vocab_size"], 2, 64, seed=5)
        ids_path = os.path.join(ctx.tmp, f"{name}-ids.safetensors")
        lib.write_safetensors(ids_path, {"input_ids": ids})
        for dtype, tdtype, tol in (("float32", torch.float32, FP32_TOL),
                                   ("bfloat16", torch.bfloat16, BF16_TOL)):
            want = hf_forward(model_dir, ids, tdtype, ctx.device)
            out = os.path.join(ctx.tmp, f"{name}-{dtype}-dstrain.safetensors")
            got = dstrain_forward(ctx, model_dir, ids_path, out, dtype, ctx.device)
            add_forward_rows(ctx, name, dtype, got, want, tol)


def train_config(model_dir, corpus, run_dir, steps, micro, seq, lr, wd):
    """The dstrain run whose batches pack_samples() reproduces: byte tokenizer, one document per
    line, packing, no shuffle, no eval split, constant lr without warmup, no clipping, fp32."""
    return f"""model:
  name_or_path: {model_dir}
  init: pretrained
  tokenizer: byte
  dtype: float32
data:
  train_path: {corpus}
  format: text
  document: line
  max_length: {seq}
  packing: true
  shuffle: false
  eval_split: 0
training:
  max_steps: {steps}
  per_device_train_batch_size: {micro}
  gradient_accumulation_steps: 1
  lr: {lr}
  betas: [0.9, 0.999]
  eps: 1.0e-8
  weight_decay: {wd}
  lr_scheduler: constant
  warmup_steps: 0
  gradient_clipping: 0
  seed: 3
  log_interval: 1
zero:
  stage: 0
logging:
  out_dir: {run_dir}
  progress: false
checkpoint:
  dir: {run_dir}/checkpoints
  save_final: false
"""


def adamw(named_params, lr, wd):
    """torch.optim.AdamW with dstrain's decay groups (norms, biases and 1-D tensors: none)."""
    decay, no_decay = [], []
    for pname, p in named_params:
        (no_decay if lib.takes_no_decay(pname, p.dim()) else decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.999), eps=1e-8)


def hf_peer(model_dir, device):
    """(named parameters, ids → logits) of the transformers model in `model_dir`, fp32."""
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, torch_dtype=torch.float32, attn_implementation="sdpa").to(device)
    model.train()
    return list(model.named_parameters()), lambda ids: model(input_ids=ids.to(device)).logits


def ref_peer(cfg, weights):
    """The same for parity_ref's plain-PyTorch forward (self-test)."""
    import parity_ref
    w = {k: v.detach().float().clone().requires_grad_(True) for k, v in weights.items()}
    return list(w.items()), lambda ids: parity_ref.forward(cfg, w, ids)


def peer_train(peer, batches, lr, wd):
    """Losses of a plain training loop: peer forward + torch.optim.AdamW, same batches."""
    named, forward = peer
    opt = adamw(named, lr, wd)
    losses = []
    for inp, lab in batches:
        logits = forward(inp)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 lab.to(logits.device).reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def train_corpus(ctx, steps, micro, seq):
    """A corpus file of enough corpus lines for `steps` batches, and those batches as dstrain
    forms them (byte tokenizer: UTF-8 bytes, eos 256)."""
    with open(ctx.corpus, "rb") as f:
        lines = [ln for ln in f.read().decode("utf-8").split("\n") if ln]
    need = steps * micro * seq + 1
    docs, total = [], 0
    for ln in lines:
        docs.append(list(ln.encode("utf-8")))
        total += len(docs[-1]) + 1
        if total > need + seq:
            break
    corpus = os.path.join(ctx.tmp, "train.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join(bytes(d).decode("utf-8") for d in docs) + "\n")
    inp, lab = lib.pack_samples(docs, 256, seq)
    batches = [(inp[s * micro:(s + 1) * micro], lab[s * micro:(s + 1) * micro])
               for s in range(steps)]
    return corpus, batches


def check_train(ctx, label, model_dir, make_peer, steps=20, micro=2, seq=32, lr=1e-3, wd=0.01):
    corpus, batches = train_corpus(ctx, steps, micro, seq)
    run_dir = os.path.join(ctx.tmp, "train-run-" + label)
    yaml = os.path.join(ctx.tmp, f"train-{label}.yaml")
    with open(yaml, "w") as f:
        f.write(train_config(model_dir, corpus, run_dir, steps, micro, seq, lr, wd))
    # Both sides on the CPU: this compares the training arithmetic, not devices.
    saved = os.environ.get("DSTRAIN_DEVICE")
    os.environ["DSTRAIN_DEVICE"] = "cpu"
    try:
        rc = lib.run([ctx.dstrain, "train", yaml], ctx.log)
    finally:
        if saved is None:
            del os.environ["DSTRAIN_DEVICE"]
        else:
            os.environ["DSTRAIN_DEVICE"] = saved
    got = {}
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if rc == 0 and os.path.exists(metrics):
        with open(metrics) as f:
            for line in f:
                rec = json.loads(line)
                if "train/loss" in rec:
                    got[rec["step"]] = rec["train/loss"]
    want = peer_train(make_peer(), batches, lr, wd)
    ours = [got[k] for k in sorted(got)]
    with open(os.path.join(ctx.log_dir, f"train-losses-{label}.txt"), "w") as f:
        f.write("step\tdstrain\tpeer\n")
        for i, w in enumerate(want):
            f.write(f"{i + 1}\t{ours[i] if i < len(ours) else 'missing'}\t{w}\n")
    diff = max((abs(a - b) for a, b in zip(ours, want)), default=float("inf"))
    ok = rc == 0 and len(ours) == len(want) and diff <= TRAIN_TOL
    ctx.table.add(f"train {label}", f"{steps} steps fp32, |loss diff| max", diff, TRAIN_TOL, ok)


def check_train_hf(ctx):
    """dstrain trains on the CPU here (DSTRAIN_DEVICE=cpu), and so does the peer."""
    name = "qwen2-untied"
    cfg = dict(lib.tiny_configs()[name], vocab_size=258 + 6)  # byte tokenizer ids 0..257
    model_dir = hf_model_dir(ctx, "train-" + name, cfg)
    check_train(ctx, name, model_dir, lambda: hf_peer(model_dir, "cpu"))


HARD_STRINGS = [
    "Hello, world!", "  leading and trailing  ", "tabs\tand\t\ttabs", "many     spaces   here",
    "line one\nline two\r\nline three\n\n\n", "numbers 1234567890 3.14159 1,000,000 -42",
    "emoji 😀🎉👩‍👩‍👧‍👦 and flags 🇩🇪🇯🇵", "CJK 中文字符测试 日本語のテキスト 한국어 텍스트",
    "accents: café naïve Ångström façade", "combining: e\u0301 vs \u00e9 (NFC)",
    "Arabic مرحبا بالعالم and Hebrew שלום", "zero\u200bwidth\u200djoiner", "I'm you're we've they'll it's",
    "<|endoftext|>", "text<|im_start|>user\nhi<|im_end|>more", "<|im_start|><|im_end|>",
    "code: def f(x):\n    return x**2  # comment", "URL https://example.com/a?b=c&d=e#f",
    "ALL CAPS SHOUTING AND MiXeD cAsE", "\u00a0non-breaking\u00a0spaces\u2003em space",
]


def tokenizer_dirs(ctx):
    """(name, directory) of the shared tokenizers in a form both sides read: gpt2's encoder.json
    and vocab.bpe are copied to vocab.json and merges.txt for transformers."""
    import shutil
    out = []
    for name in ("qwen2", "gpt2"):
        src = os.path.join(ctx.tokenizers, name)
        if not os.path.isdir(src):
            continue
        dst = os.path.join(ctx.tmp, "tok-" + name)
        shutil.copytree(src, dst, dirs_exist_ok=True)
        if os.path.exists(os.path.join(dst, "encoder.json")):
            shutil.copy(os.path.join(dst, "encoder.json"), os.path.join(dst, "vocab.json"))
            shutil.copy(os.path.join(dst, "vocab.bpe"), os.path.join(dst, "merges.txt"))
        out.append((name, dst))
    return out


def check_tokenizers(ctx):
    import transformers
    dirs = tokenizer_dirs(ctx)
    if not dirs:
        ctx.table.add("tokenizer", f"no tokenizers under {ctx.tokenizers}", 0, 0, False)
        return
    with open(ctx.corpus, encoding="utf-8") as f:
        corpus_docs = [ln for ln in f.read().split("\n") if ln]
    hard = os.path.join(ctx.tmp, "hard.jsonl")
    with open(hard, "w", encoding="utf-8") as f:
        for s in HARD_STRINGS:
            f.write(json.dumps({"text": s}, ensure_ascii=False) + "\n")
    for name, tok_dir in dirs:
        if name == "gpt2":  # no tokenizer_config.json: name the class
            ref = transformers.GPT2TokenizerFast(vocab_file=os.path.join(tok_dir, "vocab.json"),
                                                 merges_file=os.path.join(tok_dir, "merges.txt"))
        else:
            ref = transformers.AutoTokenizer.from_pretrained(tok_dir, use_fast=True)
        for label, path, fmt, docs in (("corpus", ctx.corpus, "text", corpus_docs),
                                       ("hard strings", hard, "jsonl", HARD_STRINGS)):
            out = os.path.join(ctx.tmp, f"{name}-{label.replace(' ', '_')}.tok")
            rc = lib.run([ctx.dstrain, "data", "tokenize", "--tokenizer", tok_dir, "--input", path,
                          "--output", out, "--format", fmt, "--document", "line"], ctx.log)
            got = lib.read_token_file(out) if rc == 0 else []
            want = [ref(d, add_special_tokens=False)["input_ids"] for d in docs]
            bad = [i for i in range(len(want)) if i >= len(got) or got[i] != want[i]]
            bad += list(range(len(want), len(got)))
            with open(os.path.join(ctx.log_dir, f"tokenizer-{name}.txt"), "a") as f:
                for i in bad[:50]:
                    f.write(f"{label} doc {i}: {docs[i] if i < len(docs) else ''!r}\n"
                            f"  dstrain      {got[i] if i < len(got) else None}\n"
                            f"  transformers {want[i] if i < len(want) else None}\n")
            ctx.table.add(f"tokenizer {name}", f"{label}: {len(want)} docs, mismatched",
                          float(len(bad)), 0, rc == 0 and not bad)


# --- self-test: this machine, python3 + torch only ----------------------------------------------

def self_test_model_dir(ctx, name, cfg):
    """config.json + random weights written with our own safetensors writer."""
    out = os.path.join(ctx.tmp, name)
    os.makedirs(out)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f)
    g = torch.Generator().manual_seed(99)
    weights = {}
    for pname, shape in lib.hf_param_shapes(cfg).items():
        if len(shape) == 1:  # norms near 1, biases near 0
            base = 0.0 if pname.endswith(".bias") else 1.0
            weights[pname] = base + 0.1 * torch.randn(shape, generator=g)
        else:
            weights[pname] = 0.02 * torch.randn(shape, generator=g)
    lib.write_safetensors(os.path.join(out, "model.safetensors"), weights)
    return out, weights


def self_test(ctx):
    import parity_ref
    # Helpers: safetensors round trip (bf16 and scalar included), rel_diff, packing.
    path = os.path.join(ctx.tmp, "rt.safetensors")
    t = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.tensor(2.5),
         "c": torch.ones(3, dtype=torch.bfloat16), "d": torch.tensor([[1, -100]])}
    lib.write_safetensors(path, t)
    back = lib.read_safetensors(path)
    ok = list(back) == list(t) and all(torch.equal(back[k], t[k]) for k in t)
    ctx.table.add("self-test helpers", "safetensors round trip", 0.0, 0, ok)
    inp, lab = lib.pack_samples([[1, 2, 3], [4, 5]], 9, 3)
    ok = inp.tolist() == [[1, 2, 3], [9, 4, 5]] and lab.tolist() == [[2, 3, 9], [4, 5, 9]]
    ok = ok and lib.rel_diff(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.2])) > 0.09
    ctx.table.add("self-test helpers", "packing, rel_diff", 0.0, 0, ok)

    configs = lib.tiny_configs(vocab=300)
    for name in ("qwen2-tied", "llama-untied", "qwen3-tied"):
        cfg = configs[name]
        model_dir, weights = self_test_model_dir(ctx, name, cfg)
        ids = random_ids(cfg["vocab_size"], 2, 16, seed=5)
        ids_path = os.path.join(ctx.tmp, f"{name}-ids.safetensors")
        lib.write_safetensors(ids_path, {"input_ids": ids})
        want = parity_ref.forward_backward(cfg, weights, ids)
        out = os.path.join(ctx.tmp, f"{name}-dstrain.safetensors")
        got = dstrain_forward(ctx, model_dir, ids_path, out, "float32", "cpu")
        add_forward_rows(ctx, name + " vs parity_ref", "float32", got, want, FP32_TOL)

    # Training: 20 steps of `dstrain train` against parity_ref + torch.optim.AdamW.
    if not os.path.exists(ctx.corpus):  # no ../shared here: a generated corpus
        ctx.corpus = os.path.join(ctx.tmp, "generated.txt")
        with open(ctx.corpus, "w", encoding="utf-8") as f:
            for i in range(400):
                f.write(f"line {i}: {HARD_STRINGS[i % 12].splitlines()[0]} {i * i}\n")
    cfg = dict(configs["qwen2-untied"], vocab_size=258 + 6)
    model_dir, weights = self_test_model_dir(ctx, "train-qwen2-untied", cfg)
    check_train(ctx, "qwen2-untied vs parity_ref", model_dir, lambda: ref_peer(cfg, weights))

    # Byte tokenizer: `dstrain data tokenize` ids are the UTF-8 bytes of each line.
    text = os.path.join(ctx.tmp, "bytes.txt")
    lines = [s for s in HARD_STRINGS if "\n" not in s and "\r" not in s]
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    tok = os.path.join(ctx.tmp, "bytes.tok")
    rc = lib.run([ctx.dstrain, "data", "tokenize", "--tokenizer", "byte", "--input", text,
                  "--output", tok, "--format", "text", "--document", "line"], ctx.log)
    got = lib.read_token_file(tok) if rc == 0 else []
    want = [list(s.encode("utf-8")) for s in lines]
    bad = sum(1 for i, w in enumerate(want) if i >= len(got) or got[i] != w)
    ctx.table.add("self-test tokenizer byte", f"{len(want)} lines, mismatched", float(bad), 0,
                  rc == 0 and bad == 0 and len(got) == len(want))


class Context:
    def __init__(self, args, tmp):
        self.dstrain = lib.dstrain_binary(args.build_dir)
        self.device = args.device
        self.corpus = args.corpus
        self.tokenizers = args.tokenizers
        self.log_dir = args.log_dir
        self.tmp = tmp
        self.table = lib.Table()
        self.log = open(os.path.join(args.log_dir, "commands.log"), "a")


def parse_args(argv):
    shared = os.path.join(REPO, "..", "shared", "data")
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("build_dir", nargs="?", default=os.path.join(REPO, "build-gpu"))
    p.add_argument("--log-dir", default=os.path.join(
        REPO, "gpu-logs", "parity-" + time.strftime("%Y%m%d-%H%M%S")))
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--corpus", default=os.path.join(shared, "corpus", "tinyshakespeare.txt"))
    p.add_argument("--tokenizers", default=os.path.join(shared, "tokenizers"))
    p.add_argument("--only", default="forward,train,tokenizer",
                   help="comma-separated subset of forward,train,tokenizer")
    p.add_argument("--self-test", action="store_true")
    args = p.parse_args(argv)
    only = set(args.only.split(","))
    if not only <= {"forward", "train", "tokenizer"}:
        p.error(f"--only: unknown check(s) {sorted(only - {'forward', 'train', 'tokenizer'})}")
    args.only = only
    if not args.self_test and not os.path.exists(args.corpus) and only & {"train", "tokenizer"}:
        p.error(f"--corpus {args.corpus}: no such file")
    return args


def main(argv):
    args = parse_args(argv)
    os.makedirs(args.log_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dstrain-parity-") as tmp:
        ctx = Context(args, tmp)
        if args.self_test:
            self_test(ctx)
        else:
            if "forward" in args.only:
                check_forward(ctx)
            if "train" in args.only:
                check_train_hf(ctx)
            if "tokenizer" in args.only:
                check_tokenizers(ctx)
        ctx.log.close()
    table = ctx.table.render()
    with open(os.path.join(args.log_dir, "table.txt"), "w") as f:
        f.write(table + "\n")
    print(table)
    print(f"logs: {args.log_dir}")
    return 1 if ctx.table.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
