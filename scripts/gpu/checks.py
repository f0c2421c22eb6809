#!/usr/bin/env python3
"""The checks behind gpu-bundle/run's steps (scripts/gpu/run), each printing one line of key
figures for the summary table and exiting non-zero when the check fails:

  checks.py versions SHORT_OUT            the device's torch, CUDA, NCCL and reference packages
                                          (one line of them also written to SHORT_OUT)
  checks.py tiny-run FIRST RESUMED FROM HF DSTRAIN DEVICE
                                          loss falls; the resumed run's losses after step FROM equal
                                          the first run's bit for bit; the export in HF gives
                                          dstrain's logits, loss and gradients in transformers
  checks.py bench-figures TABLE.md        the benchmark table in one line
  checks.py wheels WHEELS TARGET          unpacks the bundle's benchmark wheels into TARGET: always
                                          deepspeed and liger-kernel, their dependencies only where
                                          this python3 lacks a version that satisfies them
  checks.py trace-top TRACE N TABLE_OUT   the N phases with the most time in a merged trace
  checks.py profile-top PROFILE STEPS N TABLE_OUT
                                          the N kernels (on the CPU: operators) with the most time
                                          in a logging.profile_steps profile of STEPS steps, and how
                                          busy the GPU was
  checks.py resume-compare FIRST RESUMED FROM
                                          the resumed run's losses after step FROM equal the first
                                          run's bit for bit (two metrics.jsonl)
  checks.py graphs-compare OFF ON ON_LOG MICRO_STEPS NAME
                                          runs without and with CUDA graphs (their out_dirs): losses
                                          bit-identical, graphs in use (ON_LOG, and their pools in
                                          ON's metrics), launches and kernels per micro-step of
                                          their profiled step
  checks.py graphs-auto OFF AUTO AUTO_LOG NAME
                                          training.cuda_graphs: auto against off: losses
                                          bit-identical, and auto kept the graphs (the tiny model
                                          is bound by launches); its first-use timings
  checks.py moe-compare GROUPED PER_EXPERT
                                          the moe step's runs (their out_dirs): each loss fell,
                                          tokens/s, how far their losses are apart

Only the standard library is needed for bench-figures, trace-top, profile-top, resume-compare,
graphs-compare, graphs-auto and moe-compare; wheels needs
packaging (DeepSpeed needs it too); versions and tiny-run import torch, transformers and
safetensors of the device's python3.
"""

import json
import os
import statistics
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
BUNDLE = os.path.dirname(os.path.dirname(HERE))


def versions(short_out):
    import importlib
    info = {}
    try:
        import torch
        info["torch"] = torch.__version__
        info["CUDA"] = torch.version.cuda or "none"
        if torch.cuda.is_available():
            nccl = torch.cuda.nccl.version()
            info["NCCL"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
            info["device"] = (f"{torch.cuda.get_device_name(0)} (sm_"
                              f"{''.join(map(str, torch.cuda.get_device_capability(0)))})")
        else:
            info["device"] = "no CUDA device"
    except Exception as e:  # report, do not stop: the rest of the environment is still of use
        info["torch"] = f"not importable: {e}"
    for name in ("transformers", "peft", "tokenizers", "safetensors", "pyarrow", "pytest"):
        try:
            info[name] = importlib.import_module(name).__version__
        except Exception:
            info[name] = "missing"
    for k, v in info.items():
        print(f"{k}: {v}")
    keys = ("device", "torch", "CUDA", "NCCL", "transformers", "pyarrow")
    with open(short_out, "w") as f:
        f.write(", ".join(f"{k} {info[k]}" for k in keys if k in info))
    return 0 if not info["torch"].startswith("not importable") else 1


def read_records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_losses(path):
    losses = {}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "train/loss" in rec:
                losses[rec["step"]] = rec["train/loss"]
    return losses


def resumed_same(first, resumed, from_step):
    """(ok, figure): the losses of the run resumed from `from_step` equal the first run's after it,
    bit for bit (both metrics.jsonl)."""
    a, b = read_losses(first), read_losses(resumed)
    after = [s for s in sorted(a) if s > from_step]
    same = [s for s in after if s in b and b[s] == a[s]]
    if len(same) != len(after):
        diff = [s for s in after if s not in same][:3]
        print("resume differs at steps " + ", ".join(
            f"{s}: {a[s]!r} vs {b.get(s)!r}" for s in diff), file=sys.stderr)
    ok = bool(after) and len(same) == len(after)
    return ok, f"resume from {from_step}: {len(same)}/{len(after)} losses bit-identical"


def tiny_run(first, resumed, from_step, hf_dir, dstrain, device):
    a = read_losses(first)
    steps = sorted(a)
    figures, ok = [], True
    tail = [a[s] for s in steps[-5:]]
    falls = len(steps) >= 10 and sum(tail) / len(tail) < 0.75 * a[steps[0]]
    ok &= falls
    figures.append(f"loss {a[steps[0]]:.3f} -> {tail[-1]:.3f} in {len(steps)} steps"
                   + ("" if falls else " (NOT FALLING)"))
    resumed_ok, figure = resumed_same(first, resumed, from_step)
    ok &= resumed_ok
    figures.append(figure)

    os.environ["DSTRAIN_BINARY"], os.environ["DSTRAIN_REF_DEVICE"] = dstrain, device
    sys.path.insert(0, os.path.join(BUNDLE, "tests", "reference"))
    import reflib
    with open(os.path.join(hf_dir, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    ids = reflib.random_ids(vocab, 2, 64, seed=3)
    with tempfile.TemporaryDirectory() as tmp:
        got = reflib.dstrain_forward(tmp, hf_dir, ids, "float32")
    want = reflib.hf_forward(reflib.load_hf(hf_dir), ids)
    diffs = {k: reflib.rel_diff(got[k], w) for k, w in want.items() if k in got}
    worst = max(diffs, key=diffs.get) if diffs else "nothing compared"
    same_keys = sorted(got) == sorted(want)
    export_ok = same_keys and diffs[worst] <= reflib.FP32_TOL
    ok &= export_ok
    figures.append(f"export in transformers: {len(diffs)} tensors, worst {worst} "
                   f"{diffs.get(worst, float('nan')):.2g} (tol {reflib.FP32_TOL:g})"
                   + ("" if same_keys else ", tensor names differ"))
    print("; ".join(figures))
    return 0 if ok else 1


def launches(profile_path, micro_steps):
    """Kernel launches (the runtime's and driver's launch calls, a graph's launch counting one) and
    kernels run, per micro-step, in a PyTorch profiler trace of `micro_steps` micro-steps."""
    with open(profile_path) as f:
        events = json.load(f)["traceEvents"]
    calls = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
             and "Launch" in e.get("name", "")]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    graphs = [e for e in calls if "Graph" in e["name"]]
    return len(calls) / micro_steps, len(kernels) / micro_steps, len(graphs) / micro_steps


def graphs_compare(off_dir, on_dir, on_log, micro_steps, name):
    """One case of the graphs step: the losses of the run without CUDA graphs and with them,
    bit-identical at every step; the recordings the run with them logged (no layer eager); the
    launches per micro-step of each (their profiled step)."""
    a, b = read_losses(os.path.join(off_dir, "metrics.jsonl")), read_losses(
        os.path.join(on_dir, "metrics.jsonl"))
    same = [s for s in a if s in b and a[s] == b[s]]
    ok = bool(a) and len(same) == len(a) == len(b)
    with open(on_log) as f:
        said = [l.strip() for l in f if "CUDA graphs:" in l and "recordings" in l]
    recorded = bool(said) and " 0 layer calls run eagerly" in said[0] and "stopped" not in said[0]
    pools = [rec["memory/graph_pools_mb"] for rec in read_records(os.path.join(on_dir, "metrics.jsonl"))
             if "memory/graph_pools_mb" in rec]
    recorded &= bool(pools) and pools[-1] > 0
    ok &= recorded
    parts = [f"{name}: {len(same)}/{len(a)} losses bit-identical",
             f"graphs recorded, pools {pools[-1]:.0f} MB" if recorded else
             f"graphs NOT in use ({said[0] if said else 'no line'}; pools {pools[-1:] or 'none'} MB)"]
    for label, d in (("off", off_dir), ("on", on_dir)):
        prof = os.path.join(d, "profile", "rank-0.json")
        if os.path.exists(prof):
            calls, kernels, graph_calls = launches(prof, micro_steps)
            parts.append(f"{label} {calls:.0f} launches ({graph_calls:.0f} graphs) and "
                         f"{kernels:.0f} kernels per micro-step")
    if len(same) != len(a):
        diff = [s for s in sorted(a) if s not in same][:3]
        print("differs at steps " + ", ".join(f"{s}: {a[s]!r} vs {b.get(s)!r}" for s in diff),
              file=sys.stderr)
    print("; ".join(parts))
    return 0 if ok else 1


def graphs_auto(off_dir, auto_dir, auto_log, name):
    """training.cuda_graphs: auto on the tiny model: the losses of off's, bit for bit, the graphs
    recorded and kept after the first step (its replays timed faster than eager), the timings."""
    a, b = read_losses(os.path.join(off_dir, "metrics.jsonl")), read_losses(
        os.path.join(auto_dir, "metrics.jsonl"))
    same = [s for s in a if s in b and a[s] == b[s]]
    with open(auto_log) as f:
        lines = [l.strip() for l in f]
    first = [l for l in lines if "CUDA graphs:" in l and "recordings" in l]
    dropped = [l for l in lines if "CUDA graphs off" in l]
    timing = first[0].split("first use, all layers: ")[-1] if first and "first use" in first[0] \
        else "no timing"
    kept = bool(first) and not dropped
    ok = bool(a) and len(same) == len(a) == len(b) and kept
    print(f"{name} auto: {len(same)}/{len(a)} losses as off's; " +
          (f"graphs kept ({timing})" if kept else
           f"graphs NOT kept ({(dropped or first or ['no line'])[0]})"))
    return 0 if ok else 1


SHORT_NAMES = {"dstrain, fused kernels off": "dstrain eager", "PyTorch + transformers": "peer",
               "transformers + Liger": "liger", "transformers + Liger + PEFT": "liger",
               "transformers + Liger, gradient checkpointing": "liger ckpt",
               "dstrain (checkpointing, tiled MLP)": "dstrain ckpt",
               "dstrain (offloaded checkpointing, tiled MLP)": "dstrain offload",
               "dstrain (the users' train.yaml)": "dstrain",
               "dstrain (the users' train.yaml, CUDA graphs on)": "dstrain graphs",
               "transformers + PEFT + DeepSpeed (the users' stack)": "users' stack"}


def bench_figures(*tables):
    """One line from gpu-train's markdown tables: each row's system, tokens/s, MFU and the
    allocator's peak (nvidia-smi's where there is none)."""
    rows = []
    for table in tables:
        with open(table) as f:
            for line in f:
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if len(cells) == 8 and cells[0] not in ("mode", "---"):
                    rows.append(cells)
    if not rows:
        print("no benchmark rows")
        return 1
    parts = []
    for mode, seq, system, micro, tps, mfu, peak, alloc in rows:
        name = SHORT_NAMES.get(system, system)
        if "auto" in system:  # what auto chose
            name += f" ({micro})"
        where = mode if seq == "2048" else f"{mode} {seq}"
        if mfu == "-":  # not measured: the tokens/s column holds why (fail, oom, no GPU, ...)
            parts.append(f"{where} {name}: {tps}")
        else:
            memory = f"allocator {alloc}" if alloc != "-" else f"nvidia-smi {peak}"
            parts.append(f"{where} {name}: {tps} tok/s, MFU {mfu}, {memory}")
    print("; ".join(parts))
    return 0


def wheel_meta(path):
    """(distribution name, version, [Requires-Dist]) from a wheel's METADATA."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().split("\n\n", 1)[0].splitlines()
    fields = [line.split(": ", 1) for line in lines if ": " in line]
    name = next(v for k, v in fields if k == "Name")
    version = next(v for k, v in fields if k == "Version")
    return name, version, [v for k, v in fields if k == "Requires-Dist"]


def wheel_fits(filename):
    """Pure Python, or this CPython on x86-64 Linux."""
    tags = filename[:-len(".whl")].split("-")[-3:]
    if tags[1:] == ["none", "any"]:
        return "py3" in tags[0].split(".")
    cp = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return tags[0] == cp and tags[1] == cp and "linux" in tags[2] and tags[2].endswith("x86_64")


def wheels(wheel_dir, target):
    """Unpacks deepspeed and liger-kernel into target, and each of their requirements (followed
    through the bundle's wheels) that this python3 does not already satisfy; a requirement that
    neither satisfies is a failure naming it. Unpacking is what pip does for these wheels (no
    compiled parts to build); their *.data/ scripts are left out."""
    from importlib import metadata
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    carried = {}
    for f in sorted(os.listdir(wheel_dir)):
        if f.endswith(".whl") and wheel_fits(f):
            name, version, requires = wheel_meta(os.path.join(wheel_dir, f))
            carried[canonicalize_name(name)] = (f, version, requires)
    todo = [Requirement(f"{n}=={carried[n][1]}") for n in ("deepspeed", "liger-kernel")
            if n in carried]
    if len(todo) != 2:
        print(f"{wheel_dir}: no deepspeed or liger-kernel wheel for this python3")
        return 1
    unpack, device, problems, seen = [], [], [], set()
    while todo:
        req = todo.pop(0)
        key = canonicalize_name(req.name)
        if key in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(key)
        primary = key in ("deepspeed", "liger-kernel")
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            have = None
        if not primary and have is not None and req.specifier.contains(have, prereleases=True):
            device.append(f"{req.name} {have}")
            continue
        if key not in carried or not req.specifier.contains(carried[key][1], prereleases=True):
            problems.append(f"{req} (this python3 has {have or 'none'}, the bundle "
                            f"{carried[key][1] if key in carried else 'none'})")
            continue
        f, version, requires = carried[key]
        unpack.append(f)
        todo += [Requirement(r) for r in requires]
    if problems:
        print("missing: " + "; ".join(problems))
        return 1
    os.makedirs(target, exist_ok=True)
    for f in unpack:
        with zipfile.ZipFile(os.path.join(wheel_dir, f)) as z:
            z.extractall(target, [n for n in z.namelist() if ".data/" not in n.split("/")[0] + "/"])
    print(f"unpacked into {target}: {', '.join(f.split('-')[0] + ' ' + f.split('-')[1] for f in unpack)}; "
          f"from this python3: {', '.join(sorted(device))}")
    return 0


def trace_top(trace_path, n, table_out):
    """Sums the complete events of a merged trace by (track, name): the parent `step` spans give
    the total; the others are ranked by their time."""
    with open(trace_path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    totals, counts, step_us, steps = {}, {}, 0.0, 0
    for e in events:
        if e.get("ph") != "X":
            continue
        if e["name"] == "step":
            step_us += e["dur"]
            steps += 1
            continue
        key = (threads.get((e["pid"], e["tid"]), str(e["tid"])), e["name"])
        totals[key] = totals.get(key, 0.0) + e["dur"]
        counts[key] = counts.get(key, 0) + 1
    if steps == 0:
        print("no step spans in the trace")
        return 1
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:n]
    with open(table_out, "w") as f:
        f.write("| phase | track | count | total ms | ms per step | % of step time |\n"
                "|---|---|---|---|---|---|\n")
        for (track, name), us in top:
            f.write(f"| {name} | {track} | {counts[(track, name)]} | {us / 1e3:.1f} | "
                    f"{us / 1e3 / steps:.1f} | {100 * us / step_us:.1f}% |\n")
    head = ", ".join(f"{name} {100 * us / step_us:.0f}%" for (_, name), us in top[:4])
    print(f"{steps} steps, {step_us / 1e3 / steps:.0f} ms per step; {head}")
    return 0


def busy_us(intervals):
    """Length of the union of (start, end) intervals."""
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def profile_top(profile_path, steps, n, table_out):
    """Sums a PyTorch profiler trace (Chrome format) by kernel name: device time per step, share of
    the GPU's busy time, and busy time against the profiled wall time (idle = launch-bound or
    waiting on the host). Without kernels (a CPU run) the host operators stand in, by total
    (inclusive) time."""
    with open(profile_path) as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    kernels = [e for e in spans if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    what = "kernel" if kernels else "operator"
    ranked = kernels or [e for e in spans if e.get("cat") == "cpu_op"]
    if not ranked:
        print("no kernels or operators in the profile")
        return 1
    wall = (max(e["ts"] + e["dur"] for e in spans) - min(e["ts"] for e in spans))
    busy = busy_us([(e["ts"], e["ts"] + e["dur"]) for e in ranked]) if kernels else wall
    totals, counts = {}, {}
    for e in ranked:
        name = e["name"] if len(e["name"]) <= 90 else e["name"][:87] + "..."
        totals[name] = totals.get(name, 0.0) + e["dur"]
        counts[name] = counts.get(name, 0) + 1
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:n]
    with open(table_out, "w") as f:
        f.write(f"| {what} | count per step | ms per step | % of {'GPU busy' if kernels else 'wall'}"
                " time |\n|---|---|---|---|\n")
        for name, us in top:
            f.write(f"| `{name.replace('|', '/')}` | {counts[name] / steps:.0f} | "
                    f"{us / 1e3 / steps:.2f} | {100 * us / busy:.1f}% |\n")
    head = ", ".join(f"{name[:40]} {100 * us / busy:.0f}%" for name, us in top[:3])
    if kernels:
        print(f"{steps} steps, {wall / 1e3 / steps:.0f} ms per step, GPU busy "
              f"{100 * busy / wall:.0f}%, {len(kernels) / steps:.0f} kernels per step; {head}")
    else:
        print(f"{steps} steps, {wall / 1e3 / steps:.0f} ms per step on the CPU; {head}")
    return 0


def moe_compare(grouped_dir, loop_dir):
    """The moe step's two runs (metrics.jsonl under each): each one's first and last loss and
    median tokens/s after the first 3 steps, and the largest relative difference of their losses.
    Fails when a run is missing a step or its loss did not fall."""
    figures, curves, ok = [], [], True
    for name, d in (("grouped", grouped_dir), ("per expert", loop_dir)):
        recs = read_records(os.path.join(d, "metrics.jsonl"))
        losses = read_losses(os.path.join(d, "metrics.jsonl"))
        tps = [r["tokens_per_s"] for r in recs if "tokens_per_s" in r and r["step"] > 3]
        steps = sorted(losses)
        if not steps:
            return print(f"{name}: no losses") or 1
        fell = losses[steps[-1]] < losses[steps[0]]
        ok = ok and fell
        speed = f", {statistics.median(tps):.0f} tokens/s" if tps else ""
        figures.append(f"{name}: loss {losses[steps[0]]:.4f} -> {losses[steps[-1]]:.4f}{speed}")
        curves.append(losses)
    common = sorted(set(curves[0]) & set(curves[1]))
    ok = ok and len(common) == len(curves[0]) == len(curves[1])
    worst = max((abs(curves[0][s] - curves[1][s]) / abs(curves[1][s]) for s in common), default=0)
    print("; ".join(figures) + f"; losses within {worst:.2e} relative")
    return 0 if ok else 1


def main(argv):
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "versions" and len(rest) == 1:
        return versions(rest[0])
    if cmd == "tiny-run" and len(rest) == 6:
        return tiny_run(rest[0], rest[1], int(rest[2]), rest[3], rest[4], rest[5])
    if cmd == "resume-compare" and len(rest) == 3:
        ok, figure = resumed_same(rest[0], rest[1], int(rest[2]))
        print(figure)
        return 0 if ok else 1
    if cmd == "graphs-compare" and len(rest) == 5:
        return graphs_compare(rest[0], rest[1], rest[2], int(rest[3]), rest[4])
    if cmd == "graphs-auto" and len(rest) == 4:
        return graphs_auto(rest[0], rest[1], rest[2], rest[3])
    if cmd == "moe-compare" and len(rest) == 2:
        return moe_compare(rest[0], rest[1])
    if cmd == "bench-figures" and rest:
        return bench_figures(*rest)
    if cmd == "wheels" and len(rest) == 2:
        return wheels(rest[0], rest[1])
    if cmd == "trace-top" and len(rest) == 3:
        return trace_top(rest[0], int(rest[1]), rest[2])
    if cmd == "profile-top" and len(rest) == 4:
        return profile_top(rest[0], int(rest[1]), int(rest[2]), rest[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
