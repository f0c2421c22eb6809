"""dstrain's byte-level BPE tokenizer against Hugging Face `tokenizers` (the reference): the ids of
every document must be identical. Three tokenizer.json files are built here with the library itself
(Qwen2 and GPT-2 from the shared vocabularies, and a Llama-3-style one: Llama 3's split regex,
ignore_merges, its special tokens, on the Qwen2 vocabulary) and run over the shared corpus, a stress
corpus written here (scripts, emoji, NFD input, whitespace, code, very long words, inline special
tokens) and every Unicode scalar value in several contexts. A mismatch is a bug in lib/tokenizer;
there is no tolerance."""

import json
import os
import random
import unicodedata

import pytest

import reflib

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import (AddedToken, Regex, Tokenizer, models, normalizers,  # noqa: E402
                        pre_tokenizers)

TOKENIZERS_DIR = os.path.join(reflib.SHARED, "data", "tokenizers")
CORPUS_DIR = os.path.join(reflib.SHARED, "data", "corpus")

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>", "<|reserved_special_token_0|>"]
SPECIALS_INLINE = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + LLAMA3_SPECIALS
NAMES = ["qwen2", "gpt2", "llama3"]


def shared_path(*parts):
    path = os.path.join(reflib.SHARED, *parts)
    if not os.path.exists(path):
        pytest.skip(f"{path} is absent: this test needs the shared data directory "
                    f"(DSTRAIN_SHARED, default ../shared)")
    return path


def split_then_bytes(pattern):
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def add_specials(tok, contents, expected_ids=None):
    tok.add_special_tokens([AddedToken(c, special=True, normalized=False) for c in contents])
    for content, want in (expected_ids or {}).items():
        assert tok.token_to_id(content) == want, f"{content}: id {tok.token_to_id(content)}"


def build_qwen2():
    d = shared_path("data", "tokenizers", "qwen2")
    tok = Tokenizer(models.BPE.from_file(os.path.join(d, "vocab.json"),
                                         os.path.join(d, "merges.txt")))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = split_then_bytes(QWEN2_REGEX)
    with open(os.path.join(d, "added_tokens.json"), encoding="utf-8") as f:
        added = json.load(f)
    add_specials(tok, sorted(added, key=added.get), added)
    return tok


def build_gpt2():
    d = shared_path("data", "tokenizers", "gpt2")
    tok = Tokenizer(models.BPE.from_file(os.path.join(d, "encoder.json"),
                                         os.path.join(d, "vocab.bpe")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    add_specials(tok, ["<|endoftext|>"], {"<|endoftext|>": 50256})
    return tok


def build_llama3():
    d = shared_path("data", "tokenizers", "qwen2")
    tok = Tokenizer(models.BPE.from_file(os.path.join(d, "vocab.json"),
                                         os.path.join(d, "merges.txt"), ignore_merges=True))
    tok.pre_tokenizer = split_then_bytes(LLAMA3_REGEX)
    add_specials(tok, LLAMA3_SPECIALS)
    return tok


BUILDERS = {"qwen2": build_qwen2, "gpt2": build_gpt2, "llama3": build_llama3}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{name: (directory holding tokenizer.json, the reference Tokenizer)}, built on first use."""
    root = tmp_path_factory.mktemp("tokenizers")
    cache = {}

    def get(name):
        if name not in cache:
            tok = BUILDERS[name]()
            out = root / name
            out.mkdir()
            tok.save(str(out / "tokenizer.json"))
            cache[name] = (str(out), Tokenizer.from_file(str(out / "tokenizer.json")))
        return cache[name]
    return get


def dstrain_ids(tokenizer_dir, docs, workdir, tag):
    """dstrain's ids of each document (documents go through JSON Lines, so any text survives)."""
    src = os.path.join(workdir, f"{tag}.jsonl")
    out = os.path.join(workdir, f"{tag}.tokens")
    with open(src, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    reflib.run(["data", "tokenize", "--tokenizer", tokenizer_dir, "--input", src, "--output", out,
                "--format", "jsonl"])
    got = reflib.read_token_file(out)
    assert len(got) == len(docs), f"dstrain wrote {len(got)} documents for {len(docs)}"
    return got


def reference_ids(tok, docs):
    # encode_batch_fast: the same ids as encode(doc, add_special_tokens=False), without offsets.
    return [e.ids for e in tok.encode_batch_fast(docs, add_special_tokens=False)]


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def assert_same_ids(name, docs, got, want, what):
    bad = [i for i in range(len(docs)) if got[i] != want[i]]
    if not bad:
        return
    lines = []
    for i in bad[:5]:
        k = first_difference(got[i], want[i])
        lines.append(f"  document {i} {docs[i][:80]!r}: first difference at token {k}: "
                     f"dstrain {got[i][k:k + 6]} reference {want[i][k:k + 6]}")
    pytest.fail(f"{name}: {len(bad)} of {len(docs)} {what} documents differ\n" + "\n".join(lines))


# ---- the shared corpus ----------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_shared_corpus_ids_match(built, tmp, name):
    corpus = shared_path("data", "corpus")
    docs = []
    for fname in sorted(os.listdir(corpus)):
        with open(os.path.join(corpus, fname), encoding="utf-8") as f:
            docs += [line.rstrip("\r\n") for line in f if line.strip("\r\n")]
    assert docs, f"{corpus}: no documents"
    tok_dir, tok = built(name)
    assert_same_ids(name, docs, dstrain_ids(tok_dir, docs, tmp, "corpus"),
                    reference_ids(tok, docs), "shared corpus")


# ---- the stress corpus ----------------------------------------------------------------------

FRAGMENTS = [
    # Korean, CJK, Japanese, Arabic, Hebrew, Devanagari, Thai, Cyrillic, Greek
    "안녕하세요, 세계! 한국어 문장입니다.", "오늘은 2024년 3월 15일입니다.",
    "中文分词测试：我们在北京。", "日本語のテキスト、カタカナとひらがな。", "漢字𠀋𪚲𫝀",
    "مرحبا بالعالم، هذا نص عربي.", "الْعَرَبِيَّةُ مَعَ التَّشْكِيلِ", "שָׁלוֹם עוֹלָם",
    "नमस्ते दुनिया। हिन्दी", "สวัสดีชาวโลก", "Привет, мир! ЁЖИК", "Γειά σου Κόσμε ΣΊΣΥΦΟΣ",
    # emoji, ZWJ sequences, flags, skin tones, keycaps, variation selectors
    "👩‍👩‍👧‍👦 family", "👨🏽‍💻 coder 🧑🏿‍🚀", "🇰🇷🇯🇵🇺🇸 flags", "1️⃣ #️⃣ ❤️ ☺︎", "🏳️‍🌈🏴‍☠️",
    "emoji😀inside😃words", "🙂" * 30,
    # NFD and other unnormalized input; combining marks in odd orders
    unicodedata.normalize("NFD", "Ünïcödé façade naïve résumé Ångström"),
    unicodedata.normalize("NFD", "한국어 자모 분리"), "e\u0301\u0323 a\u0323\u0301 q\u0307\u0323",
    "\u1100\u1161\u11a8 \u1100\u1161 \uac00\u11a8", "Å Ω K ﬁ ① ｶ ｶﾞ",
    # whitespace: \r\n, runs, tabs, unusual spaces
    "line one\r\nline two\r\n\r\nline four", "  leading and trailing  ", "a\t\tb \t c",
    "x" + " " * 37 + "y", "\n\n\n   \n\t\n", "nbsp\u00a0thin\u2009ideo\u3000nel\u0085end",
    "mongolian\u180evowel\u2028line\u2029para", "\r\r\n\n\r",
    # contractions, also in upper case
    "I'M SURE YOU'LL SEE WE'RE RIGHT, DON'T YOU? THEY'VE SAID IT'S HE'D",
    "i'm you'll we're don't they've it's he'd", "O'NEIL'S 'S 'T 'RE 'VE 'M 'LL 'D 'ſ",
    "rock'n'roll ''quoted'' '''", "’curly’ apostrophes’s",
    # code
    "def f(x):\n    return x ** 2  # square\n", "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
    "if x != None and y >= 3.14e-10:\n\tprint(f\"{x!r:>10}\")", "<div class=\"a\">&amp;</div>",
    "SELECT * FROM t WHERE id IN (1,2,3);", "$ ls -la | grep '\\.py$' > out.txt 2>&1",
    # numbers
    "3.14159 2,718 1e10 0x1F 12345678901234567890 ١٢٣٤ ۴۵۶ ߁߂ ༢༣",
    # special tokens written inline, adjacent, and cut short
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<|endoftext|><|endoftext|>",
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nhi<|eot_id|>",
    "<|im_start <|endoftext| |im_end|> <|reserved_special_token_0|>",
]
LONG_WORDS = ["a" * 10000, "가" * 10000, "中" * 10000, "9" * 10000, "!" * 10000, " " * 10000,
              "\n" * 10000, "😀" * 3000, "ab1" * 3400, ("x" * 9999) + " y", "é" * 10000,
              unicodedata.normalize("NFD", "é" * 5000), "'s" * 5000, "\u0345" * 10000]


def stress_documents():
    rng = random.Random(20240611)
    docs = list(FRAGMENTS) + list(LONG_WORDS)
    docs += [s for s in SPECIALS_INLINE]
    joiners = ["", " ", "\n", "\r\n", "  ", "\t", "'", "-"]
    for _ in range(3000):
        parts = rng.sample(FRAGMENTS, rng.randint(2, 6))
        docs.append("".join(p + rng.choice(joiners) for p in parts))
    return docs


@pytest.mark.parametrize("name", NAMES)
def test_stress_corpus_ids_match(built, tmp, name):
    docs = stress_documents()
    tok_dir, tok = built(name)
    want = reference_ids(tok, docs)
    for doc, ids in zip(docs[:len(FRAGMENTS)], want):  # the batch API agrees with encode()
        assert tok.encode(doc, add_special_tokens=False).ids == ids, doc
    assert_same_ids(name, docs, dstrain_ids(tok_dir, docs, tmp, "stress"), want, "stress corpus")


# ---- every code point -----------------------------------------------------------------------

SCALARS = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
PER_DOCUMENT = 512


def in_word_and_after_space(c):
    ch = chr(c)
    return f"a{ch}b {ch}\n"


def every_context(c):
    """Code point c inside a word and after a space (the split classes), after an apostrophe (the
    case-insensitive contractions), and after a mark of class 240 (NFC's canonical ordering; 'a'
    before c already tests composition)."""
    ch = chr(c)
    return f"a{ch}b {ch}'{ch}x\u0345{ch}\n"


def byte_pair_probe(pre_tokenizer, normalizer=None):
    """A tokenizer whose ids show every pre-token boundary: the 256 byte symbols and a merge of
    every pair of them, so a pre-token becomes byte pairs that never reach across its ends and a
    boundary moved by one character changes the ids. (With a real vocabulary most characters
    outside its scripts come out as the same byte tokens whatever the split.)"""
    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(symbols)}
    merges = [(x, y) for x in symbols for y in symbols]
    for x, y in merges:
        vocab[x + y] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        tok.normalizer = normalizer
    return tok


BUILDERS["probe-qwen2"] = lambda: byte_pair_probe(split_then_bytes(QWEN2_REGEX), normalizers.NFC())
BUILDERS["probe-gpt2"] = lambda: byte_pair_probe(
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))


def sweep(built, workdir, name, context):
    """Every scalar value in `context`, PER_DOCUMENT to a document; fails naming the code points
    whose own document (`context` alone) gets other ids than from the reference."""
    blocks = [SCALARS[i:i + PER_DOCUMENT] for i in range(0, len(SCALARS), PER_DOCUMENT)]
    docs = ["".join(context(c) for c in block) for block in blocks]
    tok_dir, tok = built(name)
    got = dstrain_ids(tok_dir, docs, workdir, "sweep")
    want = reference_ids(tok, docs)
    bad_blocks = [i for i in range(len(blocks)) if got[i] != want[i]]
    if not bad_blocks:
        return
    suspects = [c for i in bad_blocks for c in blocks[i]]
    singles = [context(c) for c in suspects]
    got = dstrain_ids(tok_dir, singles, workdir, "sweep-narrow")
    want = reference_ids(tok, singles)
    bad = [(c, g, w) for c, g, w in zip(suspects, got, want) if g != w]
    ranges = ", ".join(f"U+{blocks[i][0]:04X}..U+{blocks[i][-1]:04X}" for i in bad_blocks[:5])
    unnamed = f"(no name in Python's Unicode {unicodedata.unidata_version})"
    shown = "\n".join(f"  U+{c:04X} {unicodedata.name(chr(c), unnamed)}: {context(c)!r}: "
                      f"dstrain {g} reference {w}" for c, g, w in bad[:12])
    pytest.fail(f"{name}: {len(bad_blocks)} of {len(blocks)} sweep documents differ ({ranges}); "
                f"{len(bad)} of {len(SCALARS)} code points differ on their own:\n{shown}")


@pytest.mark.parametrize("name", NAMES)
def test_every_code_point_ids_match(built, tmp, name):
    sweep(built, tmp, name, in_word_and_after_space)


@pytest.mark.parametrize("name", ["probe-qwen2", "probe-gpt2"])
def test_every_code_point_splits_and_normalizes_as_reference(built, tmp, name):
    sweep(built, tmp, name, every_context)
