"""dstrain's SentencePiece-style BPE tokenizer (the tokenizer.json of Llama 2, Mistral v0.1-v0.3 and
TinyLlama) against Hugging Face `tokenizers` (encode and decode) and `transformers` (the ids of
`tokenizer(text)`, with the bos its post-processor adds). A mismatch is a bug in lib/tokenizer; there
is no tolerance.

The vocabularies are real ones: the `mistral-common` wheel ships Mistral's SentencePiece models,
`tokenizer.model.v1` (Mistral 7B v0.1's 32,000 tokens: `<unk> <s> </s>`, the 256 `<0xXX>` byte tokens,
then the merged pieces, as Llama 2's) and `mistral_instruct_tokenizer_240323.model.v3` (Mistral 7B
v0.3's 32,768: v1's plus control tokens such as `[INST]`). transformers (`LlamaTokenizer`, from
`tokenizer.model`) converts each to tokenizer.json here, into a temporary directory; nothing is
downloaded or committed. The forms compared, as published files have them:

  metaspace-first    LlamaTokenizer's default (legacy=False): pre-tokenizer Metaspace with
                     prepend_scheme "first", split false; no normalizer
  metaspace-always   legacy=True: prepend_scheme "always"
  metaspace-never    add_prefix_space=False: prepend_scheme "never" (and no Strip in the decoder)
  metaspace-split    Metaspace with split true (its default when a file has no `split` key)
  legacy-normalizer  normalizer Sequence[Prepend("▁"), Replace(" ", "▁")] and no pre-tokenizer, as in
                     the Llama 2 and TinyLlama files; transformers' LlamaConverter writes this form
                     with legacy=True, but in transformers 5.23 it no longer runs (its
                     SentencePieceExtractor call fails), so the converted tokenizer gets that
                     normalizer and pre-tokenizer set here with the `tokenizers` API

Besides, two tokenizers trained here with `tokenizers` on the corpus, whose vocabularies lack most
characters, exercise the unk token, fuse_unk and partial byte fallback on real text."""

import json
import os
import random
import shutil
import struct

import pytest

import reflib
import test_tokenizers as bl

tokenizers = pytest.importorskip("tokenizers")
mistral_common = pytest.importorskip("mistral_common")
pytest.importorskip("sentencepiece")  # transformers reads tokenizer.model with it
transformers = pytest.importorskip("transformers")
from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers,  # noqa: E402
                        pre_tokenizers, trainers)

MISTRAL_DATA = os.path.join(os.path.dirname(mistral_common.__file__), "data")
MODELS = {"v1": "tokenizer.model.v1", "v3": "mistral_instruct_tokenizer_240323.model.v3"}
FORMS = ["metaspace-first", "metaspace-always", "metaspace-never", "metaspace-split",
         "legacy-normalizer"]
CONVERTED = [f"{v}/{form}" for v in MODELS for form in FORMS]
TRAINED = ["trained-fuse-unk", "trained-unk"]
LEGACY_NORMALIZER = normalizers.Sequence([normalizers.Prepend("▁"),
                                          normalizers.Replace(" ", "▁")])
EXTRA_FRAGMENTS = ["[INST] What is 2+2? [/INST] 4</s>", "<s>[INST]x[/INST]</s><unk>",
                   "  two leading spaces", " ▁ a literal ▁ and ▁▁ two", "tab\tand\u00a0nbsp",
                   "[TOOL_CALLS] [AVAILABLE_TOOLS][/AVAILABLE_TOOLS]", "\n\n", " ",
                   "text</s>after a special token", "</s> space after", "<s>\u2581x</s>\n y",
                   "안녕</s>하세요 [INST]질문[/INST] 답"]


def mistral_model(version):
    path = os.path.join(MISTRAL_DATA, MODELS[version])
    if not os.path.exists(path):
        pytest.skip(f"{path} is absent: this mistral-common has no SentencePiece model {version}")
    return path


def convert(version, form, out):
    """tokenizer.json (+ tokenizer_config.json) of Mistral's SentencePiece model `version` in
    `form`, written by transformers into `out`."""
    src = out + ".src"
    os.makedirs(src)
    shutil.copy(mistral_model(version), os.path.join(src, "tokenizer.model"))
    kwargs = {"add_bos_token": True}  # as the published Llama 2 / Mistral files
    if form == "metaspace-always":
        kwargs["legacy"] = True
    if form == "metaspace-never":
        kwargs["add_prefix_space"] = False
    tok = transformers.LlamaTokenizer.from_pretrained(src, **kwargs)
    backend = tok.backend_tokenizer
    if form == "metaspace-split":
        backend.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme="first", split=True)
    if form == "legacy-normalizer":
        backend.normalizer = LEGACY_NORMALIZER
        backend.pre_tokenizer = None
    tok.save_pretrained(out)
    return json.load(open(os.path.join(out, "tokenizer.json"), encoding="utf-8"))


def train(fuse_unk, out):
    """A BPE tokenizer trained on the shared corpus with a small alphabet, Metaspace (split) and
    the Llama decoder; its vocabulary gets the byte tokens of ASCII only, so an unknown ASCII
    character falls back to bytes and an unknown Korean one becomes <unk>."""
    model = models.BPE(unk_token="<unk>", fuse_unk=fuse_unk, byte_fallback=True)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme="first", split=True)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=400, limit_alphabet=40, show_progress=False,
                                  special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(corpus_documents()[:4000], trainer=trainer)
    doc = json.loads(tok.to_str())
    vocab = doc["model"]["vocab"]
    for b in range(128):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    os.makedirs(out)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    return doc


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{name: (directory with tokenizer.json, the reference Tokenizer)}, built on first use."""
    root = tmp_path_factory.mktemp("sentencepiece")
    cache = {}

    def get(name):
        if name not in cache:
            out = str(root / name.replace("/", "-"))
            if name in TRAINED:
                train(name == "trained-fuse-unk", out)
            else:
                convert(*name.split("/"), out)
            cache[name] = (out, Tokenizer.from_file(os.path.join(out, "tokenizer.json")))
        return cache[name]
    return get


def corpus_documents():
    """The shared corpus and configs/data, line by line, and the Korean and English seed
    documents, whole and line by line."""
    docs = []
    paths = [os.path.join(reflib.REPO, "configs", "data", "tiny_corpus.txt")]
    corpus = os.path.join(reflib.SHARED, "data", "corpus")
    if os.path.isdir(corpus):
        paths += [os.path.join(corpus, f) for f in sorted(os.listdir(corpus))]
    for path in paths:
        with open(path, encoding="utf-8") as f:
            docs += [line.rstrip("\r\n") for line in f if line.strip("\r\n")]
    seeds = os.path.join(reflib.SHARED, "seeds")
    if os.path.isdir(seeds):
        for name in sorted(os.listdir(seeds)):
            with open(os.path.join(seeds, name), encoding="utf-8") as f:
                text = f.read()
            docs.append(text)
            docs += [line for line in text.splitlines() if line.strip()]
    return docs


def dstrain_ids(tokenizer_dir, docs, workdir, tag, add_bos="false"):
    """dstrain's ids of each document (`data tokenize`), and the token file it wrote."""
    src = os.path.join(workdir, f"{tag}.jsonl")
    out = os.path.join(workdir, f"{tag}.tokens")
    with open(src, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    reflib.run(["data", "tokenize", "--tokenizer", tokenizer_dir, "--input", src, "--output", out,
                "--format", "jsonl", "--add-bos", add_bos])
    got = reflib.read_token_file(out)
    assert len(got) == len(docs), f"dstrain wrote {len(got)} documents for {len(docs)}"
    return got, out


def write_token_file(path, docs, vocab_size):
    """A dstrain token file (docs/data.md, version 1) holding `docs` (lists of ids)."""
    width = 2 if vocab_size <= 65536 else 4
    offsets = [0]
    for d in docs:
        offsets.append(offsets[-1] + len(d))
    tokens = [t for d in docs for t in d]
    with open(path, "wb") as f:
        f.write(b"DSTOKENS" + struct.pack("<IIQQQ", 1, width, vocab_size, len(tokens), len(docs)))
        f.write(struct.pack(f"<{len(offsets)}Q", *offsets))
        f.write(struct.pack(f"<{len(tokens)}{'H' if width == 2 else 'I'}", *tokens))


def dstrain_decode(tokenizer_dir, token_file, workdir, tag):
    out = os.path.join(workdir, f"{tag}.decoded.jsonl")
    reflib.run(["debug", "decode", "--tokenizer", tokenizer_dir, "--input", token_file,
                "--out", out])
    with open(out, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def assert_same_texts(name, ids, got, want, what):
    bad = [i for i in range(len(want)) if got[i] != want[i]]
    if bad:
        shown = "\n".join(f"  ids {ids[i][:12]}...: dstrain {got[i][:60]!r} reference "
                          f"{want[i][:60]!r}" for i in bad[:5])
        pytest.fail(f"{name}: {len(bad)} of {len(want)} {what} decode differently\n{shown}")


def check_encode_and_decode(built, workdir, name, docs, what):
    tok_dir, tok = built(name)
    want = bl.reference_ids(tok, docs)
    got, token_file = dstrain_ids(tok_dir, docs, workdir, "docs")
    bl.assert_same_ids(name, docs, got, want, what)
    decoded = [tok.decode(ids, skip_special_tokens=False) for ids in want]
    assert_same_texts(name, want, dstrain_decode(tok_dir, token_file, workdir, "docs"), decoded,
                      what + " documents")


# ---- the converted files are the forms named above -------------------------------------------


@pytest.mark.parametrize("name", CONVERTED)
def test_converted_file_has_the_form(built, name):
    tok_dir, _ = built(name)
    with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
        doc = json.load(f)
    form = name.split("/")[1]
    pre, norm, model = doc["pre_tokenizer"], doc["normalizer"], doc["model"]
    assert model["type"] == "BPE" and model["byte_fallback"] and model["fuse_unk"], model.keys()
    assert all(f"<0x{b:02X}>" in model["vocab"] for b in range(256)) and model["vocab"]["<s>"] == 1
    if form == "legacy-normalizer":
        assert pre is None
        assert [n["type"] for n in norm["normalizers"]] == ["Prepend", "Replace"], norm
    else:
        assert norm is None and pre["type"] == "Metaspace", (norm, pre)
        scheme = {"metaspace-always": "always", "metaspace-never": "never"}.get(form, "first")
        assert (pre["prepend_scheme"], pre["split"]) == (scheme, form == "metaspace-split"), pre
    assert doc["post_processor"]["single"][0] == {"SpecialToken": {"id": "<s>", "type_id": 0}}


def test_known_ids_of_mistral_v1(built, tmp):
    tok_dir, tok = built("v1/metaspace-first")
    got, _ = dstrain_ids(tok_dir, ["Hello world", "Hello world  x"], tmp, "known")
    assert got == [[22557, 1526], [22557, 1526, 259, 28744]]
    assert got == bl.reference_ids(tok, ["Hello world", "Hello world  x"])


# ---- encode and decode on the corpora ---------------------------------------------------------


@pytest.mark.parametrize("name", CONVERTED + TRAINED)
def test_corpus_and_seeds_match(built, tmp, name):
    docs = corpus_documents()
    if os.path.isdir(os.path.join(reflib.SHARED, "seeds")):
        assert any("\uac00" <= ch <= "\ud7a3" for d in docs for ch in d), "no Korean seed text"
    check_encode_and_decode(built, tmp, name, docs, "corpus")


@pytest.mark.parametrize("name", CONVERTED + TRAINED)
def test_stress_corpus_matches(built, tmp, name):
    docs = bl.stress_documents() + EXTRA_FRAGMENTS
    check_encode_and_decode(built, tmp, name, docs, "stress corpus")


@pytest.mark.parametrize("name", ["v1/metaspace-first", "v1/legacy-normalizer",
                                  "v3/metaspace-split", "trained-fuse-unk"])
def test_every_code_point_matches(built, tmp, name):
    blocks = [bl.SCALARS[i:i + bl.PER_DOCUMENT]
              for i in range(0, len(bl.SCALARS), bl.PER_DOCUMENT)]
    docs = ["".join(f"a{chr(c)}b {chr(c)}\n" for c in block) for block in blocks]
    check_encode_and_decode(built, tmp, name, docs, "every-code-point")


@pytest.mark.parametrize("name", ["v3/metaspace-first", "v1/legacy-normalizer",
                                  "v1/metaspace-never", "trained-unk"])
def test_decode_of_any_ids_matches(built, tmp, name):
    """Random ids over the whole vocabulary (byte tokens cut inside characters, special tokens,
    '▁' runs), and runs of byte tokens only."""
    tok_dir, tok = built(name)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    rng = random.Random(7)
    byte_ids = [tok.token_to_id(f"<0x{b:02X}>") for b in range(256)]
    byte_ids = [i for i in byte_ids if i is not None]
    docs = [[rng.randrange(vocab) for _ in range(rng.randint(1, 40))] for _ in range(1500)]
    docs += [[rng.choice(byte_ids) for _ in range(rng.randint(1, 8))] for _ in range(1500)]
    token_file = os.path.join(tmp, "random.tokens")
    write_token_file(token_file, docs, vocab)
    want = [tok.decode(d, skip_special_tokens=False) for d in docs]
    assert_same_texts(name, docs, dstrain_decode(tok_dir, token_file, tmp, "random"), want,
                      "random id lists")


# ---- bos as transformers adds it ---------------------------------------------------------------


def hf_input_ids(tokenizer_dir, docs, as_file=False):
    """transformers' `tokenizer(text)["input_ids"]`. AutoTokenizer gives a LlamaTokenizer, which in
    transformers 5 rebuilds its pipeline (Metaspace "first") whatever the file says; `as_file`
    loads the file's own pipeline (TokenizersBackend), as for the legacy-normalizer form."""
    cls = transformers.TokenizersBackend if as_file else transformers.AutoTokenizer
    hf = cls.from_pretrained(tokenizer_dir)
    return [hf(d)["input_ids"] for d in docs]


@pytest.mark.parametrize("name", ["v1/legacy-normalizer", "v3/metaspace-first"])
def test_documents_are_transformers_input_ids_with_bos(built, tmp, name):
    tok_dir, _ = built(name)
    docs = bl.FRAGMENTS + EXTRA_FRAGMENTS + corpus_documents()[:300]
    want = hf_input_ids(tok_dir, docs, as_file="legacy" in name)
    assert all(ids[0] == 1 for ids in want), "transformers added no bos"
    got, _ = dstrain_ids(tok_dir, docs, tmp, "auto", add_bos="auto")
    bl.assert_same_ids(name, docs, got, want, "tokenizer(text) (data.add_bos: auto)")
    forced, _ = dstrain_ids(tok_dir, docs, tmp, "true", add_bos="true")
    assert forced == got


def test_qwen2_documents_are_transformers_input_ids_without_bos(tmp):
    qwen2 = bl.shared_path("data", "tokenizers", "qwen2")
    docs = bl.FRAGMENTS + corpus_documents()[:300]
    want = hf_input_ids(qwen2, docs)
    got, _ = dstrain_ids(qwen2, docs, tmp, "qwen2", add_bos="auto")
    bl.assert_same_ids("qwen2", docs, got, want, "tokenizer(text) (data.add_bos: auto)")
    r = reflib.run(["data", "tokenize", "--tokenizer", qwen2, "--input",
                    os.path.join(tmp, "qwen2.jsonl"), "--output", os.path.join(tmp, "x.tokens"),
                    "--add-bos", "true"], check=False)
    assert r.returncode == 2 and "no bos token" in r.stdout, (r.returncode, r.stdout)
