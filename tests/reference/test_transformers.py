"""dstrain against transformers (AutoModelForCausalLM) on tiny random models of every supported
family: logits, loss and every parameter gradient of one forward/backward, and 20 training steps
(AdamW, clipping, warmup + cosine) against a transformers + torch.optim.AdamW loop."""

import os
import statistics

import pytest
import torch

import reflib

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {name: reflib.save_tiny_model(str(root / name), cfg)
            for name, cfg in reflib.TINY_CONFIGS.items()}


@pytest.mark.parametrize("name", sorted(reflib.TINY_CONFIGS))
def test_forward_backward_matches_fp32(models, tmp, name):
    cfg = reflib.TINY_CONFIGS[name]
    ids, labels = batch(cfg)
    want = reflib.hf_forward(reflib.load_hf(models[name]), ids, labels)
    got = reflib.dstrain_forward(tmp, models[name], ids, "float32", labels)
    if cfg.get("tie_word_embeddings"):
        assert "grad.lm_head.weight" not in want
    reflib.compare_all(got, want, reflib.FP32_TOL)


@pytest.mark.parametrize("name", sorted(reflib.TINY_CONFIGS))
def test_forward_backward_bf16_as_accurate_as_transformers(models, tmp, name):
    """bf16 has no exact answer to compare with: both sides round differently. The measure is the
    error against transformers in fp32, tensor by tensor (logits, loss, every gradient): dstrain's
    bf16 error must stay within BF16_TENSOR_FACTOR of transformers' own bf16 error (or under
    BF16_FLOOR), and over all tensors its median ratio within BF16_MEDIAN_FACTOR. Rounding noise of
    one sample moves single ratios by 2x either way (seen: 0.4-2.3); a systematic loss of
    precision (an op in bf16 that transformers runs in fp32) moves the median."""
    cfg = reflib.TINY_CONFIGS[name]
    ids, labels = batch(cfg)
    exact = reflib.hf_forward(reflib.load_hf(models[name]), ids, labels)
    ref = reflib.hf_forward(reflib.load_hf(models[name], torch.bfloat16), ids, labels)
    got = reflib.dstrain_forward(tmp, models[name], ids, "bfloat16", labels)
    assert sorted(got) == sorted(exact)
    ratios = []
    for key, want in exact.items():
        ours, theirs = reflib.rel_diff(got[key], want), reflib.rel_diff(ref[key], want)
        assert ours <= max(BF16_TENSOR_FACTOR * theirs, BF16_FLOOR), (
            f"{key}: dstrain bf16 error {ours:.3g} vs transformers bf16 error {theirs:.3g}")
        if theirs > 0:
            ratios.append(ours / theirs)
    median = statistics.median(ratios)
    assert median <= BF16_MEDIAN_FACTOR, f"median error ratio dstrain/transformers {median:.3g}"


BF16_TENSOR_FACTOR, BF16_MEDIAN_FACTOR, BF16_FLOOR = 4.0, 1.5, 1e-2

MOE_CONFIGS = sorted(n for n, c in reflib.TINY_CONFIGS.items()
                     if c["model_type"] in ("qwen2_moe", "qwen3_moe", "mixtral"))


@pytest.mark.parametrize("name", MOE_CONFIGS)
def test_moe_matches_both_experts_implementations(models, tmp, name):
    """transformers computes the experts by one grouped product per projection (its default,
    `grouped_mm`, the other tests' reference) or by a loop over the experts (`eager`): dstrain's
    logits, loss (with the load-balancing loss where on) and every gradient equal both."""
    ids, labels = batch(reflib.TINY_CONFIGS[name])
    got = reflib.dstrain_forward(tmp, models[name], ids, "float32", labels)
    for impl in ("grouped_mm", "eager"):
        model = reflib.load_hf(models[name], experts_implementation=impl)
        assert model.config._experts_implementation == impl
        try:
            reflib.compare_all(got, reflib.hf_forward(model, ids, labels), reflib.FP32_TOL)
        except AssertionError as e:
            raise AssertionError(f"experts_implementation={impl}: {e}") from None


def batch(cfg):
    ids = reflib.random_ids(cfg["vocab_size"], 2, reflib.TEST_SEQ, seed=5)
    labels = ids.clone()
    labels[0, :7] = -100  # ignored positions count as in HF's mean
    return ids, labels


# Packed rows of TEST_SEQ tokens: documents of these lengths back to back (the last, 11 tokens of
# padding-like filler in row 0, is a document too).
PACKED_DOCUMENTS = [[9, 3, 25, 11], [48]]


def packed_batch(cfg):
    """Rows of packed documents: position ids restart at 0 in each, and every document's first
    label is -100, so that no document is scored against the one before it."""
    ids = reflib.random_ids(cfg["vocab_size"], len(PACKED_DOCUMENTS), reflib.TEST_SEQ, seed=7)
    labels = ids.clone()
    position_ids = torch.empty_like(ids)
    for row, lengths in enumerate(PACKED_DOCUMENTS):
        start = 0
        for n in lengths:
            position_ids[row, start:start + n] = torch.arange(n)
            labels[row, start] = -100
            start += n
    return ids, labels, position_ids


@pytest.mark.parametrize("name", sorted(reflib.TINY_CONFIGS))
def test_packed_documents_match_fp32(models, tmp, name):
    """Each document attends only to itself at positions from 0, as transformers' packed-sequence
    attention computes it (every family; mistral-window's window is shorter than a document)."""
    cfg = reflib.TINY_CONFIGS[name]
    ids, labels, position_ids = packed_batch(cfg)
    want = reflib.hf_forward(reflib.load_hf(models[name]), ids, labels, position_ids)
    got = reflib.dstrain_forward(tmp, models[name], ids, "float32", labels,
                                 position_ids=position_ids)
    reflib.compare_all(got, want, reflib.FP32_TOL)
    # Not what an unpacked forward of the same rows gives: the documents do attend apart.
    unpacked = reflib.dstrain_forward(tmp, models[name], ids, "float32", labels)
    assert reflib.rel_diff(unpacked["logits"], want["logits"]) > 100 * reflib.FP32_TOL


TRAIN_STEPS, MICRO, SEQ, LR, WD, WARMUP, CLIP = 20, 2, 32, 2e-3, 0.01, 5, 0.5


def training_corpus(path, steps, micro, seq):
    """Text lines (several scripts, so that many byte ids occur) and the packed batches dstrain forms
    of them with the byte tokenizer (UTF-8 bytes, eos 256)."""
    words = ["the", "quick", "brown", "fox", "jumps", "über", "naïve", "中文", "テスト", "한국어",
             "مرحبا", "code()", "x=1;", "42", "3.14"]
    return reflib.write_packed_corpus(path, words, steps, micro, seq, stride=7, lengths=9)


def write_train_config(path, model_dir, corpus, run_dir):
    training = {"max_steps": TRAIN_STEPS, "per_device_train_batch_size": MICRO,
                "gradient_accumulation_steps": 1, "lr": LR, "betas": "[0.9, 0.999]",
                "eps": "1.0e-8", "weight_decay": WD, "lr_scheduler": "cosine",
                "warmup_steps": WARMUP, "gradient_clipping": CLIP, "seed": 3, "log_interval": 1}
    return reflib.write_run_config(path, model_dir, run_dir,
                                   reflib.line_corpus_data(corpus, SEQ, shuffle=False), training)


def hf_training_losses(model_dir, batches):
    model = reflib.load_hf(model_dir)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if reflib.takes_no_decay(name, p.dim()) else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.999), eps=1e-8)
    sched = transformers.get_cosine_schedule_with_warmup(opt, WARMUP, TRAIN_STEPS)
    losses = []
    for inp, lab in batches:
        out = model(input_ids=inp.to(model.device))
        logits = out.logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 lab.to(model.device).reshape(-1))
        if getattr(out, "aux_loss", None) is not None:  # output_router_logits: as model(labels=)
            loss = loss + model.config.router_aux_loss_coef * out.aux_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", ["qwen2-untied", "llama-mha-tied", "qwen3-tied", "mistral-window",
                                  "qwen3-moe-dense-layer", "qwen3-moe-aux-loss", "mixtral"])
def test_training_matches_transformers_adamw_loop(tmp, name):
    cfg = dict(reflib.TINY_CONFIGS[name], vocab_size=258 + 6)  # byte tokenizer ids 0..257
    model_dir = reflib.save_tiny_model(os.path.join(tmp, "model"), cfg)
    corpus = os.path.join(tmp, "train.txt")
    batches = training_corpus(corpus, TRAIN_STEPS, MICRO, SEQ)
    run_dir = os.path.join(tmp, "run")
    reflib.train(write_train_config(os.path.join(tmp, "train.yaml"), model_dir, corpus, run_dir))
    got = reflib.read_losses(run_dir)
    ours = [got[k] for k in sorted(got)]
    want = hf_training_losses(model_dir, batches)
    assert len(ours) == len(want) == TRAIN_STEPS
    rel = [abs(a - b) / abs(b) for a, b in zip(ours, want)]
    worst = max(range(TRAIN_STEPS), key=lambda i: rel[i])
    assert rel[worst] <= 1e-5, (f"step {worst + 1}: dstrain {ours[worst]:.8f} vs transformers "
                                f"{want[worst]:.8f} (relative {rel[worst]:.3g})")
    assert want[-1] < want[0] * 0.9  # the run learned something: the comparison is not vacuous
