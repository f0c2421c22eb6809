"""Files crossing between dstrain and the Hugging Face libraries: a model saved by transformers
trains in dstrain; `dstrain export` output loads with from_pretrained and gives the logits of the
trained weights; every safetensors file dstrain writes loads with the safetensors package."""

import glob
import json
import os

import pytest
import torch

import reflib

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

STEPS = 6


def write_train_config(path, model_dir, corpus, run_dir, stage, world):
    training = {"max_steps": STEPS, "per_device_train_batch_size": 4 // world, "lr": "3.0e-3",
                "lr_scheduler": "constant", "log_interval": 1}
    return reflib.write_run_config(path, model_dir, run_dir, reflib.line_corpus_data(corpus, 32),
                                   training, stage=stage, save_final=True)


def write_corpus(path):
    with open(path, "w", encoding="utf-8") as f:
        for i in range(300):
            f.write(f"line {i}: the quick brown fox {i * 7 % 13} jumps over {i % 5} lazy dogs\n")


@pytest.mark.parametrize("name,stage,world", [("qwen2-untied", 0, 1), ("llama-mha-tied", 3, 2),
                                              ("qwen3-untied", 2, 2), ("mistral-window", 3, 2),
                                              ("qwen3-moe-aux-loss", 3, 2), ("mixtral", 0, 1)])
def test_trained_export_loads_in_transformers(tmp, name, stage, world):
    cfg = dict(reflib.TINY_CONFIGS[name], vocab_size=258 + 6)
    model_dir = reflib.save_tiny_model(os.path.join(tmp, "model"), cfg)
    corpus = os.path.join(tmp, "train.txt")
    write_corpus(corpus)
    run_dir = os.path.join(tmp, "run")
    yaml = write_train_config(os.path.join(tmp, "run.yaml"), model_dir, corpus, run_dir, stage,
                              world)
    reflib.train(yaml, world)
    losses = reflib.read_losses(run_dir)
    assert len(losses) == STEPS and losses[STEPS] < losses[1]

    # Every safetensors file of the checkpoint loads with the safetensors package.
    ckpt = os.path.join(run_dir, "checkpoints", "latest")
    with open(ckpt) as f:
        tag_dir = os.path.join(run_dir, "checkpoints", f.read().strip())
    shards = glob.glob(os.path.join(tag_dir, "*.safetensors"))
    assert shards
    for path in shards:
        assert safetensors_torch.load_file(path), path

    out = os.path.join(tmp, "hf")
    reflib.run(["export", ckpt, "--out", out, "--dtype", "float32"])
    exported = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    original = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assert json.load(open(os.path.join(out, "config.json")))["model_type"] == cfg["model_type"]
    # The export holds the trained weights (they moved), under transformers' names and shapes.
    want_names = dict(original.named_parameters())
    got_names = dict(exported.named_parameters())
    assert sorted(got_names) == sorted(want_names)
    moved = [n for n in want_names if not torch.equal(got_names[n], want_names[n])]
    assert len(moved) == len(want_names), f"unchanged after training: {set(want_names) - set(moved)}"

    # Logits of the exported model equal dstrain's own forward of the same export.
    ids = reflib.random_ids(cfg["vocab_size"], 2, 24, seed=9)
    want = exported(input_ids=ids).logits.detach()
    got = reflib.dstrain_forward(tmp, out, ids)["logits"]
    reflib.assert_close(got, want, reflib.FP32_TOL, "logits of the exported model")


def test_safetensors_written_by_dstrain_load_with_metadata(tmp):
    """`dstrain debug forward` writes with lib/model's writer: names, dtypes, shapes and metadata
    must read back through the safetensors package exactly."""
    cfg = reflib.TINY_CONFIGS["qwen2-tied"]
    model_dir = reflib.save_tiny_model(os.path.join(tmp, "model"), cfg)
    ids = reflib.random_ids(cfg["vocab_size"], 1, 8, seed=1)
    reflib.write_ids(os.path.join(tmp, "ids.safetensors"), ids)
    out = os.path.join(tmp, "out.safetensors")
    reflib.run(["debug", "forward", "--model", model_dir, "--ids",
                os.path.join(tmp, "ids.safetensors"), "--out", out, "--dtype", "bfloat16"])
    from safetensors import safe_open
    with safe_open(out, framework="pt") as f:
        assert f.metadata()["dtype"] == "bfloat16"
        names = list(f.keys())
        logits = f.get_tensor("logits")
    assert "loss" in names and logits.shape == (1, 8, cfg["vocab_size"])
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
