"""Sequence parallelism against transformers: `dstrain debug forward --sequence-parallel P` run as
a group of P processes (`dstrain launch --nproc P --exec`), each holding T/P tokens of every
sequence at their global positions, must give the whole sequences' logits, the loss and every
gradient of transformers' single forward/backward (fp32). Heads are split P ways (GQA; one key/value
head replicated when there are fewer than P), sliding windows and dynamic RoPE span the slices, the
label shift crosses the slice boundaries (the last token of a slice predicts the next slice's
first), and a MoE model's load-balancing loss is the whole sequences'."""

import os

import pytest
import torch

import reflib

transformers = pytest.importorskip("transformers")

CONFIGS = {
    "llama-gqa-untied": reflib.TINY_CONFIGS["llama-gqa-untied"],          # KV 2
    "llama-mha-tied": reflib.TINY_CONFIGS["llama-mha-tied"],              # KV 4
    "llama-mqa": dict(reflib.BASE, model_type="llama", num_key_value_heads=1,
                      tie_word_embeddings=False),                         # KV 1
    "mistral-window": reflib.TINY_CONFIGS["mistral-window"],              # window < T/P
    "qwen3-window-layer-types": reflib.TINY_CONFIGS["qwen3-window-layer-types"],
    "llama-dynamic": reflib.TINY_CONFIGS["llama-dynamic"],                # T > max positions
    # the load-balancing loss: counts and probability sums over every slice before the product
    "qwen3-moe-aux-loss": reflib.TINY_CONFIGS["qwen3-moe-aux-loss"],
}

CASES = [("llama-gqa-untied", 2), ("llama-gqa-untied", 4), ("llama-mha-tied", 4),
         ("llama-mqa", 2), ("llama-mqa", 4), ("mistral-window", 2),
         ("qwen3-window-layer-types", 4), ("llama-dynamic", 2), ("qwen3-moe-aux-loss", 2)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {name: reflib.save_tiny_model(str(root / name), cfg) for name, cfg in CONFIGS.items()}


def sequence_parallel_forward(tmp, model_dir, ids, labels, p):
    from safetensors.torch import load_file
    ids_path = os.path.join(tmp, "ids.safetensors")
    out = os.path.join(tmp, "dstrain-sp.safetensors")
    reflib.write_ids(ids_path, ids, labels)
    reflib.run(["launch", "--nproc", p, "--exec", "--", reflib.dstrain_binary(), "debug",
                "forward", "--model", model_dir, "--ids", ids_path, "--out", out,
                "--sequence-parallel", p], env={"DSTRAIN_DEVICE": "cpu"})
    return load_file(out)


@pytest.mark.parametrize("name,p", CASES, ids=[f"{n}-P{p}" for n, p in CASES])
def test_sequence_parallel_forward_backward_matches_transformers(models, tmp, name, p):
    cfg = CONFIGS[name]
    ids = reflib.random_ids(cfg["vocab_size"], 2, reflib.TEST_SEQ, seed=9)
    labels = ids.clone()
    labels[0, :7] = -100
    labels[1, reflib.TEST_SEQ // p] = -100  # the label the first slice's last token predicts
    model = transformers.AutoModelForCausalLM.from_pretrained(
        models[name], dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    want = reflib.hf_forward(model, ids, labels)
    got = sequence_parallel_forward(tmp, models[name], ids, labels, p)
    reflib.compare_all(got, want, reflib.FP32_TOL)


def test_sequence_length_not_divisible_is_an_input_error(models, tmp):
    ids = reflib.random_ids(1000, 1, 30, seed=1)
    ids_path = os.path.join(tmp, "ids.safetensors")
    reflib.write_ids(ids_path, ids)
    r = reflib.run(["launch", "--nproc", 4, "--exec", "--", reflib.dstrain_binary(), "debug",
                    "forward", "--model", models["llama-gqa-untied"], "--ids", ids_path, "--out",
                    os.path.join(tmp, "out.safetensors"), "--sequence-parallel", 4], check=False)
    assert r.returncode != 0
    assert "not divisible by --sequence-parallel 4" in r.stdout
