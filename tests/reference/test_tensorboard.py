"""TensorBoard event files written by rank 0, read back with TensorBoard's own reader
(EventAccumulator from the `tensorboard` package): every scalar of metrics.jsonl under the same tag
and step, the resolved config in the Text tab, the flattened config in the HParams tab, and a
resumed run that replaces the steps it logs again instead of duplicating them."""

import glob
import json
import math
import os

import numpy as np
import pytest
import yaml

from reflib import REPO, TINY, flatten, run
from reflib import tiny_run_overrides as overrides

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing import event_accumulator  # noqa: E402
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2  # noqa: E402


def load(tb_dir):
    acc = event_accumulator.EventAccumulator(
        tb_dir, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    acc.Reload()
    return acc


def jsonl_values(path):
    """{tag: {step: value}} of metrics.jsonl; a step logged twice (a resumed run) keeps the later
    line, as TensorBoard keeps the resumed run's event."""
    values = {}
    for line in open(path):
        rec = json.loads(line)
        for k, v in rec.items():
            if k not in ("step", "time"):
                values.setdefault(k, {})[rec["step"]] = v
    return values


def assert_scalars_match(acc, jsonl):
    assert set(acc.Tags()["scalars"]) == set(jsonl), "TensorBoard tags differ from metrics.jsonl"
    for tag, by_step in jsonl.items():
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        assert len(steps) == len(set(steps)), f"{tag}: duplicated steps {steps}"
        assert steps == sorted(by_step), f"{tag}: steps {steps} != {sorted(by_step)}"
        for e in events:
            want = by_step[e.step]
            if want is None:  # metrics.jsonl writes NaN/Inf as null
                assert not math.isfinite(e.value), f"{tag} step {e.step}"
            else:
                # simple_value is a float32: the value must be exactly the float32 of the double.
                assert np.float32(e.value) == np.float32(want), f"{tag} step {e.step}: {e.value} != {want}"


def hparams(acc, tag):
    content = acc.PluginTagToContent("hparams")[tag]
    return plugin_data_pb2.HParamsPluginData.FromString(content)


def test_two_rank_run_writes_every_metric_config_and_hparams(tmp):
    out = os.path.join(tmp, "run")
    args = overrides(out)
    r = run(["launch", "--nproc", "2", TINY] + args, cwd=REPO, timeout=300)
    files = glob.glob(os.path.join(out, "tb", "events.out.tfevents.*"))
    assert len(files) == 1, f"rank 0 alone writes one event file, found {files}\n{r.stdout[-2000:]}"
    acc = load(os.path.join(out, "tb"))
    jsonl = jsonl_values(os.path.join(out, "metrics.jsonl"))
    for tag in ("train/loss", "train/ppl", "lr", "grad_norm", "tokens_per_s", "memory/rss_mb",
                "time/fwd_bwd_s", "eval/loss", "eval/ppl"):
        assert tag in jsonl, tag
    assert_scalars_match(acc, jsonl)

    # The config: the same YAML as --print-config prints, in a Markdown code block.
    printed = run(["train", TINY, "--print-config"] + args, cwd=REPO).stdout
    text = acc.Tensors("config")[0].tensor_proto.string_val[0].decode()
    assert text == "```yaml\n" + printed + "```\n"

    # HParams: every setting of the flattened config, typed, and world_size; the session ended well.
    want = flatten(yaml.safe_load(printed))
    start = hparams(acc, "_hparams_/session_start_info").session_start_info
    assert set(start.hparams) == set(want) | {"world_size"}
    assert start.hparams["world_size"].number_value == 2
    for key, value in want.items():
        got = start.hparams[key]
        kind = got.WhichOneof("kind")
        if isinstance(value, bool):
            assert kind == "bool_value" and got.bool_value == value, key
        elif isinstance(value, list):
            assert kind == "string_value" and yaml.safe_load(got.string_value) == value, key
        elif kind == "number_value":  # PyYAML reads "1e-08" as a string: compare as numbers
            assert got.number_value == float(value), key
        else:
            assert kind == "string_value" and got.string_value == str(value), key
            assert isinstance(value, str), f"{key}: {value!r} is written as text"
    end = hparams(acc, "_hparams_/session_end_info").session_end_info
    assert end.status == api_pb2.STATUS_SUCCESS


def test_resumed_run_appends_without_duplicating_steps(tmp):
    out = os.path.join(tmp, "run")
    run(["train", TINY] + overrides(out, **{"checkpoint.interval": 4}), cwd=REPO, timeout=300)
    first = jsonl_values(os.path.join(out, "metrics.jsonl"))
    first_lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    # Resume from step 8: steps 10 and 12 and the eval at 12 are logged a second time.
    ckpt = os.path.join(out, "ckpt", "step_00000008")
    run(["train", TINY, "--resume-from", ckpt] + overrides(out), cwd=REPO, timeout=300)
    files = sorted(glob.glob(os.path.join(out, "tb", "events.out.tfevents.*")))
    assert len(files) == 2, files
    # metrics.jsonl: the first run's lines up to step 8 kept as they were, its later lines
    # replaced by the resumed run's, so each step is there once.
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    assert [l for l in lines if l["step"] <= 8] == [l for l in first_lines if l["step"] <= 8]
    steps = [l["step"] for l in lines if "train/loss" in l]
    assert steps == sorted(set(steps)) and steps[-1] == 12, steps

    acc = load(os.path.join(out, "tb"))
    final = jsonl_values(os.path.join(out, "metrics.jsonl"))
    assert_scalars_match(acc, final)
    # Steps up to the checkpoint come from the first run, later ones from the resumed run.
    tps = {e.step: e.value for e in acc.Scalars("tokens_per_s")}
    assert np.float32(tps[8]) == np.float32(first["tokens_per_s"][8])
    assert np.float32(tps[12]) == np.float32(final["tokens_per_s"][12])
    assert [e.step for e in acc.Scalars("eval/loss")] == [6, 12]


def test_tensorboard_can_be_switched_off_or_moved(tmp):
    out = os.path.join(tmp, "off")
    run(["train", TINY] + overrides(out, **{"training.max_steps": 2, "logging.tensorboard": "false"}),
        cwd=REPO, timeout=300)
    assert not os.path.exists(os.path.join(out, "tb"))
    out = os.path.join(tmp, "moved")
    tb = os.path.join(tmp, "elsewhere")
    run(["train", TINY] + overrides(out, **{"training.max_steps": 2, "logging.tensorboard_dir": tb}),
        cwd=REPO, timeout=300)
    assert [e.step for e in load(tb).Scalars("train/loss")] == [1, 2]
