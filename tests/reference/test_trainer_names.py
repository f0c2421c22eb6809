"""The Hugging Face Trainer names dstrain answers with its own key (lib/config/merge.cpp,
trainer_argument_keys; docs/migrating.md) against the real `transformers.TrainingArguments`: each is
a field of the pinned transformers, or one of the few that older releases had and users still bring
in their configs (then it must really be gone from the pinned one, so the list stays true). And the
error a user gets for one of them, from the dstrain binary."""

import dataclasses
import os
import re
import subprocess
import tempfile

import transformers

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Fields of TrainingArguments in transformers 4.x that the pinned release no longer has.
OLDER_RELEASES = {"evaluation_strategy", "logging_dir"}


def dstrain_names():
    with open(os.path.join(REPO, "lib", "config", "merge.cpp"), encoding="utf-8") as f:
        text = f.read()
    block = text[text.index("trainer_argument_keys()"):]
    block = block[:block.index("};")]
    names = re.findall(r'\{"([a-z_0-9]+)",', block)
    assert len(names) >= 15, names
    return names


def test_every_name_is_a_trainer_argument_of_the_pinned_or_an_older_transformers():
    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    for name in dstrain_names():
        if name in OLDER_RELEASES:
            assert name not in fields, f"{name} is a field again in transformers {transformers.__version__}"
        else:
            assert name in fields, f"{name} is not a TrainingArguments field in transformers {transformers.__version__}"


def test_the_binary_names_the_dstrain_key():
    binary = os.environ.get("DSTRAIN_BINARY", os.path.join(REPO, "build", "apps", "dstrain", "dstrain"))
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "run.yaml")
        with open(config, "w", encoding="utf-8") as f:
            f.write(f"model:\n  name_or_path: {REPO}/configs/models/tiny\n"
                    f"data:\n  train_path: {REPO}/configs/data/tiny_corpus.txt\n"
                    "training:\n  save_steps: 500\n")
        r = subprocess.run([binary, "train", "--print-config", config], capture_output=True, text=True,
                           timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert ("training.save_steps: unknown key; the Hugging Face Trainer's save_steps is "
            "checkpoint.interval in dstrain") in r.stderr + r.stdout, r.stderr
