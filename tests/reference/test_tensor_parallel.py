"""Tensor parallelism against transformers: `dstrain debug forward --tensor-parallel T` run as a
group of T processes (`dstrain launch --nproc T --exec`), each holding its slice of every layer,
the embedding and the head (Megatron-LM's split), must give the whole logits, the loss (computed
across the vocabulary slices) and every parameter's gradient (gathered whole from the slices) of
transformers' single forward/backward (fp32, within TP_TOL), with and without the region's
sequence parallelism.
Biases (Qwen2's q/k/v, Llama's o_proj and down_proj), Qwen3's q/k norms, sliding windows and tied
embeddings; a LoRA adapter on every projection (its A and B split to match)."""

import os

import pytest
import torch

import reflib

transformers = pytest.importorskip("transformers")

FOUR_KV = dict(num_key_value_heads=4)  # T = 4 divides every count
# fp32: the group's partial products (and the parts of each gradient) are summed over the ranks,
# in another order than one process's matmuls; measured up to 1.25e-5 (a k_proj gradient at T = 4),
# against the suite's 1e-5 for one process.
TP_TOL = 3e-5
CONFIGS = {
    "llama-biases": dict(reflib.BASE, model_type="llama", tie_word_embeddings=False,
                         attention_bias=True, mlp_bias=True, **FOUR_KV),
    "mistral-window": dict(reflib.TINY_CONFIGS["mistral-window"], **FOUR_KV),
    "qwen2-tied": dict(reflib.TINY_CONFIGS["qwen2-tied"], **FOUR_KV),
    "qwen3-untied": dict(reflib.TINY_CONFIGS["qwen3-untied"], **FOUR_KV),
}

CASES = [("llama-biases", 2, True), ("llama-biases", 4, False), ("mistral-window", 2, True),
         ("qwen2-tied", 4, True), ("qwen3-untied", 2, False), ("qwen3-untied", 4, True)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {name: reflib.save_tiny_model(str(root / name), cfg) for name, cfg in CONFIGS.items()}


def tensor_parallel_forward(tmp, model_dir, ids, labels, t, region_sp, adapter=None):
    from safetensors.torch import load_file
    ids_path = os.path.join(tmp, "ids.safetensors")
    out = os.path.join(tmp, "dstrain-tp.safetensors")
    reflib.write_ids(ids_path, ids, labels)
    args = ["launch", "--nproc", t, "--exec", "--", reflib.dstrain_binary(), "debug", "forward",
            "--model", model_dir, "--ids", ids_path, "--out", out, "--tensor-parallel", t,
            "--tensor-sequence-parallel", "true" if region_sp else "false"]
    if adapter:
        args += ["--adapter", adapter, "--eval"]
    reflib.run(args, env={"DSTRAIN_DEVICE": "cpu"})
    return load_file(out)


def labelled_ids(cfg):
    ids = reflib.random_ids(cfg["vocab_size"], 2, reflib.TEST_SEQ, seed=9)
    labels = ids.clone()
    labels[0, :7] = -100
    return ids, labels


@pytest.mark.parametrize("name,t,region_sp", CASES,
                         ids=[f"{n}-T{t}{'-region-sp' if s else ''}" for n, t, s in CASES])
def test_tensor_parallel_forward_backward_matches_transformers(models, tmp, name, t, region_sp):
    ids, labels = labelled_ids(CONFIGS[name])
    model = transformers.AutoModelForCausalLM.from_pretrained(
        models[name], dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    want = reflib.hf_forward(model, ids, labels)
    got = tensor_parallel_forward(tmp, models[name], ids, labels, t, region_sp)
    reflib.compare_all(got, want, TP_TOL)


def test_tensor_parallel_lora_matches_peft(models, tmp):
    """A PEFT adapter on every projection (B non-zero), applied by each rank to its slice: the
    logits, the loss and every lora_A/lora_B gradient of PEFT's forward/backward."""
    peft = pytest.importorskip("peft")
    name = "llama-biases"
    model = transformers.AutoModelForCausalLM.from_pretrained(
        models[name], dtype=torch.float32, attn_implementation="sdpa")
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear",
                             init_lora_weights=True)
    lora = peft.get_peft_model(model, config)
    torch.manual_seed(3)
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    adapter = os.path.join(tmp, "adapter")
    lora.save_pretrained(adapter)
    lora.eval()
    ids, labels = labelled_ids(CONFIGS[name])
    out = lora(input_ids=ids, labels=labels)
    out.loss.backward()
    want = {"logits": out.logits.detach(), "loss": out.loss.detach()}
    for n, p in lora.named_parameters():
        if p.grad is not None:
            want["grad." + n.removeprefix("base_model.model.").replace(".default", "")] = p.grad
    got = tensor_parallel_forward(tmp, models[name], ids, labels, 2, True, adapter=adapter)
    reflib.compare_all(got, want, TP_TOL)


def test_a_model_that_does_not_split_is_refused_naming_the_count(tmp, tmp_path_factory):
    model_dir = reflib.save_tiny_model(str(tmp_path_factory.mktemp("kv2") / "model"),
                                       reflib.TINY_CONFIGS["llama-gqa-untied"])  # 2 KV heads
    ids = reflib.random_ids(1000, 1, 16, seed=1)
    ids_path = os.path.join(tmp, "ids.safetensors")
    reflib.write_ids(ids_path, ids)
    r = reflib.run(["launch", "--nproc", 4, "--exec", "--", reflib.dstrain_binary(), "debug",
                    "forward", "--model", model_dir, "--ids", ids_path, "--out",
                    os.path.join(tmp, "out.safetensors"), "--tensor-parallel", 4], check=False)
    assert r.returncode == 2, r.stdout
    assert "num_key_value_heads (2) is not divisible by --tensor-parallel (4)" in r.stdout
