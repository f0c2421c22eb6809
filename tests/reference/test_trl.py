"""dstrain's prompt/completion data (data.format: prompt_completion, docs/data.md) against TRL's
completion-only masking: for the same rows and the real Qwen2 tokenizer, the ids of each pair (with
the eos TRL appends) and the prompt tokens TRL's completion mask leaves out are dstrain's, and the
labels dstrain trains on (its shifted labels, -100 on the prompt's) are TRL's labels shifted by one,
pairs whose tokens merge across the prompt's end included."""

import json
import os

import pytest

import reflib

TOKENIZERS = os.path.join(reflib.SHARED, "data", "tokenizers")

ROWS = [
    {"prompt": "Translate to French: cheese\n", "completion": "fromage"},
    {"prompt": "Q: What is 2 + 2?\nA:", "completion": " 4"},
    {"prompt": "", "completion": "A completion without a prompt."},
    {"prompt": "Résumé: naïve café, 日本語 ", "completion": "— done. 😀"},
    # A token spans the boundary: "hel" + "lo" tokenize as "hello".
    {"prompt": "Say hel", "completion": "lo world"},
    {"prompt": "Multiple\n\nlines\n", "completion": "and\ttabs\n"},
]


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    """A Qwen2 tokenizer directory (tokenizer.json, tokenizer_config.json) built from the shared
    vocabulary and merges with the tokenizers library, as test_tokenizers.py builds it."""
    if not os.path.exists(os.path.join(TOKENIZERS, "qwen2")):
        pytest.skip(f"{TOKENIZERS}/qwen2 is absent: this test needs the shared data directory "
                    "(DSTRAIN_SHARED, default ../shared)")
    import test_tokenizers
    out = tmp_path_factory.mktemp("qwen2")
    test_tokenizers.build_qwen2().save(str(out / "tokenizer.json"))
    with open(out / "tokenizer_config.json", "w") as f:
        json.dump({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    return str(out)


def trl_examples(tokenizer_dir, rows, workdir):
    """TRL's prepared train dataset for `rows`: input_ids and labels (completion_only_loss)."""
    import datasets
    import transformers
    from trl import SFTConfig, SFTTrainer
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    config = transformers.Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1)
    model = transformers.Qwen2ForCausalLM(config)
    args = SFTConfig(output_dir=str(workdir), completion_only_loss=True, max_length=None,
                     report_to=[], use_cpu=True, packing=False)
    trainer = SFTTrainer(model=model, args=args, processing_class=tok,
                         train_dataset=datasets.Dataset.from_list(rows))
    return [dict(e) for e in trainer.train_dataset], tok.eos_token_id


def test_prompt_completion_labels_are_trls(qwen2_dir, tmp_path):
    src = tmp_path / "sft.jsonl"
    with open(src, "w", encoding="utf-8") as f:
        for r in ROWS:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    out = tmp_path / "sft.tokens"
    reflib.run(["data", "tokenize", "--tokenizer", qwen2_dir, "--input", src, "--output", out,
                "--format", "prompt_completion"])
    docs, prompts = reflib.read_token_file(out, with_prompts=True)
    examples, eos = trl_examples(qwen2_dir, ROWS, tmp_path / "trl")
    assert len(docs) == len(examples) == len(ROWS)
    for i, (doc, prompt, ex) in enumerate(zip(docs, prompts, examples)):
        sequence = doc + [eos]  # dstrain appends the eos to every document
        assert sequence == ex["input_ids"], f"row {i}: ids differ"
        trl_prompt = next((k for k, label in enumerate(ex["labels"]) if label != -100),
                          len(ex["labels"]))
        assert prompt == trl_prompt, f"row {i}: dstrain's prompt has {prompt} tokens, TRL's {trl_prompt}"
        assert all(label != -100 for label in ex["labels"][trl_prompt:]), f"row {i}"
        # dstrain's label of position k is the token k + 1, -100 where that token is the prompt's
        # (docs/data.md); the model shifts TRL's labels by one the same way.
        mine = [sequence[k + 1] if k + 1 >= prompt else -100 for k in range(len(sequence) - 1)]
        assert mine == ex["labels"][1:], f"row {i}: labels differ"
    # The boundary-spanning row really spans: its prompt alone tokenizes to more than the common
    # prefix (the case TRL and dstrain both cut at the divergence).
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(qwen2_dir)
    assert len(tok(text=ROWS[4]["prompt"])["input_ids"]) > prompts[4], "row 4 does not span"
    assert sum(p > 0 for p in prompts) == 5, prompts
