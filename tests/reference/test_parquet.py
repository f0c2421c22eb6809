"""Parquet datasets: files written by pyarrow and by DuckDB, read by dstrain through Arrow's own C++
Parquet reader. The token ids dstrain writes (`dstrain data tokenize`) must equal those of the
`tokenizers` library on the same tokenizer.json for every non-NULL, non-empty text in row order,
and those of the same texts given to dstrain as JSON Lines. Writer settings: snappy, zstd, gzip and
uncompressed; dictionary and plain (and DuckDB's delta) encodings; data pages v1 and v2; several row
groups; NULLs; long and multilingual texts; string, large_string and dictionary columns; a
differently named text column beside other columns; 0 rows. Damaged files and wrong columns exit 2
naming the file and the fault, and write nothing. A short `dstrain train` runs on the seed config's
path form (data/03_primary/train.parquet) with the same losses as on JSON Lines, and a second run
reads its tokens from the cache."""

import functools
import json
import os
import struct

import pytest

import reflib

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
duckdb = pytest.importorskip("duckdb")
tokenizers = pytest.importorskip("tokenizers")
from tokenizers import decoders, models, pre_tokenizers, trainers  # noqa: E402


def sample_texts(n=300):
    """n rows: NULLs, empty strings, several scripts, emoji, code, and a few long texts."""
    words = ["the", "quick", "brown", "fox", "naïve", "café", "Straße", "中文字符", "日本語", "한국어",
             "Привет", "مرحبا", "שלום", "हिन्दी", "😀", "👍🏽", "x = y[i] + 1;", "3.14159", "\t", "\n"]
    texts = []
    for i in range(n):
        if i % 13 == 4:
            texts.append(None)
        elif i % 17 == 9:
            texts.append("")
        elif i % 61 == 30:
            texts.append(" ".join(words[(i + k) % len(words)] for k in range(40000)))  # ~250 kB
        else:
            texts.append(" ".join(words[(i * 7 + k * 3) % len(words)] for k in range(2 + i % 23)))
    return texts


TEXTS = sample_texts()
SHORTER_TEXTS = [t[:50000] if t else t for t in TEXTS]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A byte-level BPE tokenizer.json trained with the `tokenizers` library on the texts."""
    d = str(tmp_path_factory.mktemp("tokenizer"))
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([t for t in TEXTS if t], trainer)
    tok.save(os.path.join(d, "tokenizer.json"))
    return d


@functools.lru_cache(maxsize=None)
def reference_ids(tokenizer_dir, texts):
    """`tokenizers`' ids of each non-NULL, non-empty text (`texts` a tuple, for the cache)."""
    tok = tokenizers.Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    return [tok.encode(t, add_special_tokens=False).ids for t in texts if t]


def read_token_file(path):
    """Documents of a dstrain token file (docs/data.md, version 1) as lists of ids."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"DSTOKENS"
    version, width, _vocab, count, docs = struct.unpack_from("<IIQQQ", data, 8)
    assert version == 1 and width in (2, 4)
    offsets = struct.unpack_from(f"<{docs + 1}Q", data, 40)
    base = 40 + 8 * (docs + 1)
    tokens = struct.unpack_from(f"<{count}{'H' if width == 2 else 'I'}", data, base)
    assert len(data) == base + width * count
    return [list(tokens[offsets[i]:offsets[i + 1]]) for i in range(docs)]


def tokenize(tokenizer_dir, inp, out, *extra, check=True):
    return reflib.run(["data", "tokenize", "--tokenizer", tokenizer_dir, "--input", inp,
                       "--output", out, *extra], check=check)


def text_table(texts, column="text", string_type=pa.string()):
    return pa.table({"id": pa.array(range(len(texts)), pa.int64()),
                     column: pa.array(texts, string_type)})


DICTIONARY = {"RLE_DICTIONARY", "PLAIN_DICTIONARY"}  # the v2 and v1 names


def column_encodings(path, column):
    meta = pq.ParquetFile(path).metadata
    col = meta.schema.names.index(column)
    return {e for g in range(meta.num_row_groups) for e in meta.row_group(g).column(col).encodings}


def write_duckdb(path, texts, compression, version):
    con = duckdb.connect()
    con.register("t", text_table(texts))
    con.execute(f"COPY (SELECT id, text FROM t ORDER BY id) TO '{path}' (FORMAT parquet, "
                f"COMPRESSION {compression}, ROW_GROUP_SIZE 2048, PARQUET_VERSION {version})")
    con.close()


def check_tokens(tokenizer_dir, path, texts, tmp, *extra):
    out = os.path.join(tmp, os.path.basename(path) + ".tok")
    r = tokenize(tokenizer_dir, path, out, *extra)
    nulls = sum(t is None for t in texts)
    assert f"{nulls} NULL rows skipped" in r.stdout, r.stdout
    got = read_token_file(out)
    want = reference_ids(tokenizer_dir, tuple(texts))
    assert len(got) == len(want)
    bad = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
    assert not bad, f"{path}: document {bad[0]} differs from tokenizers"
    return got


CODECS = ["snappy", "zstd", "gzip", "none"]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("dictionary", [True, False])
@pytest.mark.parametrize("page_version", ["1.0", "2.0"])
def test_pyarrow_files_match_tokenizers(tokenizer_dir, tmp, codec, dictionary, page_version):
    path = os.path.join(tmp, "d.parquet")
    pq.write_table(text_table(TEXTS), path, compression=codec, use_dictionary=dictionary,
                   data_page_version=page_version, row_group_size=37)
    assert pq.ParquetFile(path).metadata.num_row_groups == 9
    assert bool(column_encodings(path, "text") & DICTIONARY) == dictionary
    check_tokens(tokenizer_dir, path, TEXTS, tmp)


@pytest.mark.parametrize("codec", ["snappy", "zstd", "gzip", "uncompressed"])
@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("repeated", [True, False])
def test_duckdb_files_match_tokenizers(tokenizer_dir, tmp, codec, version, repeated):
    # 5000 rows: DuckDB's row groups have at least 2048 rows. Repeated texts make DuckDB choose
    # dictionary encoding; distinct ones plain (v1) or delta-length byte arrays (v2).
    texts = [SHORTER_TEXTS[i % len(SHORTER_TEXTS)] for i in range(5000)]
    if not repeated:
        texts = [f"{t} {i}" if t else t for i, t in enumerate(texts)]
    path = os.path.join(tmp, "d.parquet")
    write_duckdb(path, texts, codec, version)
    assert pq.ParquetFile(path).metadata.num_row_groups >= 2
    assert pq.ParquetFile(path).metadata.created_by.startswith("DuckDB")
    encodings = column_encodings(path, "text")
    assert bool(encodings & DICTIONARY) == repeated, encodings
    if version == "v2" and not repeated:
        assert "DELTA_LENGTH_BYTE_ARRAY" in encodings, encodings
    check_tokens(tokenizer_dir, path, texts, tmp)


def test_string_types_and_a_differently_named_column(tokenizer_dir, tmp):
    for name, typ in [("large", pa.large_string()), ("dict", pa.dictionary(pa.int32(), pa.string())),
                      ("view", pa.string_view())]:
        arr = pa.array(TEXTS, pa.string())
        arr = arr.dictionary_encode() if name == "dict" else arr.cast(typ)
        table = pa.table({"score": pa.array([0.5] * len(TEXTS)),
                          "tags": pa.array([["a", "b"]] * len(TEXTS), pa.list_(pa.string())),
                          "meta": pa.array([{"text": "not this"}] * len(TEXTS)),
                          "content": arr})
        path = os.path.join(tmp, f"{name}.parquet")
        pq.write_table(table, path, row_group_size=50)
        assert pq.read_schema(path).field("content").type == arr.type
        check_tokens(tokenizer_dir, path, TEXTS, tmp, "--text-field", "content")


def test_parquet_equals_jsonl_through_dstrain(tokenizer_dir, tmp):
    pq_path = os.path.join(tmp, "d.parquet")
    pq.write_table(text_table(TEXTS), pq_path, row_group_size=40)
    jsonl = os.path.join(tmp, "d.jsonl")
    with open(jsonl, "w", encoding="utf-8") as f:
        for t in TEXTS:
            if t is not None:
                f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    tokenize(tokenizer_dir, jsonl, os.path.join(tmp, "j.tok"))
    assert check_tokens(tokenizer_dir, pq_path, TEXTS, tmp) == read_token_file(
        os.path.join(tmp, "j.tok"))


def test_directory_and_glob_of_parts_and_zero_rows(tokenizer_dir, tmp):
    parts = os.path.join(tmp, "parts")
    os.makedirs(parts)
    chunks = [TEXTS[:100], [], TEXTS[100:]]
    for i, chunk in enumerate(chunks):
        pq.write_table(text_table(chunk), os.path.join(parts, f"part-{i}.parquet"))
    open(os.path.join(parts, "_SUCCESS"), "w").close()
    assert pq.read_table(os.path.join(parts, "part-1.parquet")).num_rows == 0
    whole = check_tokens(tokenizer_dir, parts, TEXTS, tmp)
    assert check_tokens(tokenizer_dir, os.path.join(parts, "part-*.parquet"), TEXTS, tmp) == whole
    out = os.path.join(tmp, "empty.tok")
    r = tokenize(tokenizer_dir, os.path.join(parts, "part-1.parquet"), out, check=False)
    assert r.returncode == 2 and "the dataset is empty" in r.stdout, r.stdout
    assert not os.path.exists(out)


def damaged(tmp, kind):
    """(path, expected message parts) of a damaged or unsuitable file."""
    path = os.path.join(tmp, f"{kind}.parquet")
    good = os.path.join(tmp, "good.parquet")
    pq.write_table(text_table(TEXTS), good, compression="zstd")
    data = bytearray(open(good, "rb").read())
    if kind == "truncated":
        data = data[:len(data) * 2 // 3]
        expect = ["truncated"]
    elif kind == "bad_magic":
        data[:4] = b"PK\x03\x04"
        expect = ["not a Parquet file", 'no "PAR1" magic at byte 0', "50 4b 03 04"]
    elif kind == "bad_end_magic":
        data[-4:] = b"PAR0"
        expect = ['does not end with "PAR1"', "50 41 52 30"]
    elif kind == "footer_too_long":
        data[-8:-4] = struct.pack("<I", len(data) + 100)
        expect = ["bad Parquet footer length", str(len(data) + 100)]
    elif kind == "footer_too_short":
        (n,) = struct.unpack("<I", bytes(data[-8:-4]))
        data[-8:-4] = struct.pack("<I", n - 7)
        expect = ["Parquet footer"]
    elif kind == "no_text_column":
        pq.write_table(pa.table({"body": ["a", "b"]}), path)
        return path, ['no column "text"', '"body"']
    elif kind == "int_column":
        pq.write_table(pa.table({"text": pa.array([1, 2], pa.int64())}), path)
        return path, ['column "text" has type int64', "expected a string column"]
    elif kind == "struct_column":
        pq.write_table(pa.table({"text": [{"a": "x"}, {"a": "y"}]}), path)
        return path, ['column "text" has type struct']
    elif kind == "binary_column":
        pq.write_table(pa.table({"text": pa.array([b"a", b"b"], pa.binary())}), path)
        return path, ['column "text" has type binary']
    with open(path, "wb") as f:
        f.write(bytes(data))
    return path, expect


# pyarrow refuses these too, except a bad leading magic: Arrow looks only at the file's end, while
# the format (and dstrain) require "PAR1" at both ends.
DAMAGED = ["truncated", "bad_magic", "bad_end_magic", "footer_too_long", "footer_too_short"]


@pytest.mark.parametrize("kind", DAMAGED + ["no_text_column", "int_column", "struct_column",
                                            "binary_column"])
def test_bad_files_exit_2_naming_the_file_and_fault(tokenizer_dir, tmp, kind):
    path, expect = damaged(tmp, kind)
    if kind in DAMAGED and kind != "bad_magic":
        with pytest.raises(Exception):
            pq.read_table(path)  # pyarrow refuses the file too
    out = os.path.join(tmp, "out.tok")
    r = tokenize(tokenizer_dir, path, out, check=False)
    assert r.returncode == 2, r.stdout
    for part in [path] + expect:
        assert part in r.stdout, f"{part!r} not in: {r.stdout}"
    assert not os.path.exists(out)


SEQ, MICRO, STEPS = 32, 2, 6


def write_train_config(path, model_dir, train_path, eval_path, run_dir):
    data = {"train_path": train_path, "eval_path": eval_path, "text_field": "text",
            "max_length": SEQ, "shuffle": True}
    training = {"max_steps": STEPS, "per_device_train_batch_size": MICRO,
                "gradient_accumulation_steps": 2, "lr": "1.0e-3", "seed": 42, "log_interval": 1,
                "eval_interval": 3}
    return reflib.write_run_config(path, model_dir, run_dir, data, training, init=None)


def run_training(tmp, name, train_path, eval_path):
    model_dir = reflib.save_tiny_model(os.path.join(tmp, "model"),
                                       dict(reflib.TINY_CONFIGS["qwen2-tied"], vocab_size=264))
    run_dir = os.path.join(tmp, "runs", name)
    yaml = write_train_config(os.path.join(tmp, f"{name}.yaml"), model_dir, train_path, eval_path,
                              run_dir)
    r = reflib.run(["train", yaml], cwd=tmp)
    return r.stdout, reflib.read_losses(run_dir), run_dir


def test_train_on_the_seed_config_path_form(tmp):
    texts = [t[:2000] if t else t for t in TEXTS]  # keep the run short
    primary = os.path.join(tmp, "data", "03_primary")
    os.makedirs(primary)
    con = duckdb.connect()
    con.register("t", text_table(texts[:250]))
    con.execute(f"COPY (SELECT * FROM t ORDER BY id) TO '{primary}/train.parquet' "
                f"(FORMAT parquet, COMPRESSION zstd)")
    con.close()
    pq.write_table(text_table(texts[250:]), os.path.join(primary, "valid.parquet"))
    for split, rows in [("train", texts[:250]), ("valid", texts[250:])]:
        with open(os.path.join(primary, f"{split}.jsonl"), "w", encoding="utf-8") as f:
            for t in rows:
                if t is not None:
                    f.write(json.dumps({"text": t, "id": 1}, ensure_ascii=False) + "\n")

    out, parquet_losses, run_dir = run_training(tmp, "parquet", "data/03_primary/train.parquet",
                                                "data/03_primary/valid.parquet")
    nulls = sum(t is None for t in texts[:250])
    assert f"({nulls} NULL rows skipped)" in out, out
    assert "tokens cached in" in out, out
    _, jsonl_losses, _ = run_training(tmp, "jsonl", "data/03_primary/train.jsonl",
                                      "data/03_primary/valid.jsonl")
    assert len(parquet_losses) == STEPS
    assert parquet_losses == jsonl_losses  # same tokens, same batches, same run

    again, again_losses, _ = run_training(tmp, "parquet", "data/03_primary/train.parquet",
                                          "data/03_primary/valid.parquet")
    assert again.count("tokens from the cache") == 2, again  # train and eval
    assert again_losses == parquet_losses
    assert os.listdir(os.path.join(run_dir, "data_cache"))
