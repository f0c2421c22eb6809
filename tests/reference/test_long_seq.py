"""scripts/bench/long-seq --device cuda, what a CPU can check: the fit-then-confirm procedure
against scripted runs (the real runs need a GPU), and its memory-model prediction against
`dstrain estimate` itself (the real binary)."""

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import types

import pytest

import reflib

SCRIPT = os.path.join(reflib.REPO, "scripts", "bench", "long-seq")
GIB = 1 << 30


@pytest.fixture(scope="module")
def long_seq():
    loader = importlib.machinery.SourceFileLoader("long_seq", SCRIPT)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("long_seq", loader))
    loader.exec_module(module)
    return module


class Scripted:
    """Runs whose allocator peak is fixed + per_token · T; a run whose peak passes `limit` (the
    allocator's cap less its fragmentation) runs out of memory."""

    def __init__(self, long_seq, fixed, per_token, limit, fail_at=None, model=None):
        self.m, self.fixed, self.per_token, self.limit = long_seq, fixed, per_token, limit
        self.fail_at, self.model, self.lengths = fail_at, model, []

    def model_prediction(self, name):
        return self.model, f"memory model predicts {self.model}" if self.model else ""

    def run(self, name, seq):
        self.lengths.append(seq)
        if seq == self.fail_at:
            return self.m.Run(False, 0, note="fail")
        peak = self.fixed + self.per_token * seq
        if peak > self.limit:
            return self.m.Run(False, 0, note="out of memory")
        return self.m.Run(True, int(peak), 1000.0)


def options(**kw):
    base = dict(fit_lens=[8192, 16384, 32768], budget=16 * GIB, max_len=1 << 20, retries=1,
                dry_run=False)
    base.update(kw)
    return types.SimpleNamespace(**base)


def test_the_confirming_run_is_at_the_fits_prediction(long_seq):
    runs = Scripted(long_seq, 8 * GIB, 50_000, 16 * GIB)
    rows, best_seq, best, text = long_seq.longest_gpu("tiled", runs, options())
    expected = int((16 * GIB - 8 * GIB) / 50_000) // 1024 * 1024
    assert runs.lengths == [8192, 16384, 32768, expected]
    assert best_seq == expected and best.fits, text
    assert best.peak <= 16 * GIB < 8 * GIB + 50_000 * (expected + 1024)
    assert f"predicts {expected}" in text


def test_out_of_memory_at_the_prediction_is_retried_ten_percent_shorter(long_seq):
    # Fragmentation: the allocator's cap is hit 5% before the line reaches the budget.
    runs = Scripted(long_seq, 8 * GIB, 50_000, 0.95 * 16 * GIB)
    rows, best_seq, best, text = long_seq.longest_gpu("tiled", runs, options())
    first = runs.lengths[3]
    assert runs.lengths[4] == int(first * 0.9) // 1024 * 1024
    assert best_seq == runs.lengths[4] and best.fits
    assert f"{first} did not fit (out of memory)" in text
    # Without retries the longest fitting run stands.
    runs = Scripted(long_seq, 8 * GIB, 50_000, 0.95 * 16 * GIB)
    _, best_seq, _, _ = long_seq.longest_gpu("tiled", runs, options(retries=0))
    assert best_seq == 32768 and len(runs.lengths) == 4


def test_a_second_retry_goes_half_way_from_the_longest_run_that_fitted(long_seq):
    # The runs' peaks bend upwards past 64K (another phase sets them): the line overshoots by far.
    runs = Scripted(long_seq, 8 * GIB, 50_000, 16 * GIB)
    line_run = runs.run

    def bent(name, seq):
        if seq <= 65536:
            return line_run(name, seq)
        runs.lengths.append(seq)
        return long_seq.Run(False, 0, note="out of memory")
    runs.run = bent
    _, best_seq, _, text = long_seq.longest_gpu("liger", runs, options(retries=3))
    first = runs.lengths[3]
    second = int(first * 0.9) // 1024 * 1024
    third = (32768 + second) // 2 // 1024 * 1024
    fourth = (32768 + third) // 2 // 1024 * 1024
    assert runs.lengths[3:] == [first, second, third, fourth]
    assert third > 65536 >= fourth == best_seq, runs.lengths
    assert f"{third} did not fit (out of memory)" in text


def test_a_prediction_beyond_max_len_is_confirmed_at_the_cap(long_seq):
    runs = Scripted(long_seq, 8 * GIB, 10_000, 16 * GIB)
    _, best_seq, _, text = long_seq.longest_gpu("offload", runs, options(max_len=196608))
    assert runs.lengths[-1] == 196608 and best_seq == 196608
    assert "capped at --max-len 196608" in text


def test_a_shorter_memory_model_prediction_is_the_one_tried(long_seq):
    # The line through the short runs says 171,008; the memory model (another phase sets the peak
    # at long lengths) 120,832: that is tried, and the line's is not.
    runs = Scripted(long_seq, 8 * GIB, 50_000, 16 * GIB, model=120_832)
    _, best_seq, _, text = long_seq.longest_gpu("tiled", runs, options())
    assert runs.lengths == [8192, 16384, 32768, 120_832] and best_seq == 120_832
    assert "tried the memory model's 120832, the smaller" in text
    # A larger model prediction leaves the line's.
    runs = Scripted(long_seq, 8 * GIB, 50_000, 16 * GIB, model=400_000)
    long_seq.longest_gpu("tiled", runs, options())
    assert runs.lengths[-1] == int(8 * GIB / 50_000) // 1024 * 1024


def test_a_failed_run_is_not_an_answer_and_not_retried(long_seq):
    runs = Scripted(long_seq, 8 * GIB, 50_000, 16 * GIB, fail_at=16384)
    rows, best_seq, best, text = long_seq.longest_gpu("liger", runs, options())
    assert runs.lengths == [8192, 16384] and best_seq == 8192
    assert "16384 did not fit (fail)" in text


def test_the_memory_model_prediction_is_what_dstrain_estimate_says(long_seq, tmp):
    """--dry-run's prediction for the Qwen2.5-0.5B shape: `dstrain estimate` at that length is
    within the budget and 1024 tokens more are not (the estimate is linear in the length)."""
    script = subprocess.run(
        [sys.executable, SCRIPT, "--device", "cuda", "--dry-run", "--dstrain",
         reflib.dstrain_binary(), "--systems", "tiled,offload", "--log-dir", tmp],
        capture_output=True, text=True, timeout=600, check=False)
    assert script.returncode == 0, script.stdout + script.stderr
    predicted = {}
    for line in script.stdout.splitlines():
        if "memory model" in line and "predicts" in line:
            predicted[line.split()[0]] = int(line.split("predicts ")[1].split()[0])
    assert set(predicted) == {"tiled", "offload"}, script.stdout
    args = types.SimpleNamespace(mode="full", dstrain=reflib.dstrain_binary())
    bench = types.SimpleNamespace(args=args, ctx=types.SimpleNamespace(tmp=tmp))
    model = os.path.join(tmp, "model")
    os.makedirs(model)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(long_seq.load_gpu_train().QWEN25_05B, f)
    bench.ctx.model_dir, bench.ctx.tokens = model, os.path.join(tmp, "unused.tok")
    for system, seq in predicted.items():
        at = long_seq.GpuBench.estimate_peak(bench, system, seq)
        beyond = long_seq.GpuBench.estimate_peak(bench, system, seq + 1024)
        assert at <= 16 * GIB < beyond, (system, seq, at, beyond)
    # Plain checkpointing keeps every layer's input on the GPU; offload moves them to the host.
    assert predicted["offload"] > predicted["tiled"]
