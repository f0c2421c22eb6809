#!/usr/bin/env python3
"""The `ranks` step of gpu-bundle/run (scripts/gpu/run, docs/gpu.md): many ranks on one GPU.

  ranks.py --bundle DIR --work DIR --table OUT.md --figure FILE --limit SECONDS [--cpu] [--full]
           [--tensor-parallel | --pipeline-parallel | --expert-parallel]

Every rank of a job computes on the one GPU (`dstrain launch --share-gpu`; DSTRAIN_SHARE_GPU=1 for
`dstrain resume`), so NCCL runs its real collectives between the ranks over its socket transport.
With --cpu (the rehearsal) the ranks run on the CPU and talk Gloo: the same script, a shorter case
list (--full runs the GPU's list there too, but for the GPU-only case).

  1. Equivalence: the tiny model (configs/models/tiny, the CPU suite's integration settings:
     micro 2, sequence 32, lr 3e-3 cosine, seed 7, every step logged) at 2 and 4 ranks, fp32 and
     bf16: ZeRO 0-3, stage 3 with offload_optimizer or offload_param, LoRA at stage 3, sequence
     parallelism 2 and 4, and 2 data-parallel x 2 sequence-parallel ranks, each against one rank
     with the same global batch (accumulation = world x accumulation; with sequence parallelism
     the group of P ranks reads one rank's batch). fp32 at 2 ranks, ZeRO 0-3 without offload: the
     losses bit for bit (a sum of two gradients does not depend on its order), the gradient norms
     within the tolerance; every other case: each step's loss and gradient norm within a relative
     tolerance (TOLERANCE below). One case with the
     Qwen2.5-0.5B shape (scripts/bench/gpu-train's config), sequence 256: GPU only.
  2. Checkpoints and failures: a checkpoint of 4 ranks resumed on 2 and on 1 rank gives the
     uninterrupted run's losses (within the fp32 tolerance); a rank SIGKILLed after the first
     commit under --max-restarts 1: the job comes back and logs the uninterrupted run's losses bit
     for bit; a SIGSTOPped rank (rank 0 and the last rank) with DSTRAIN_COMM_TIMEOUT=8: the
     launcher names that rank within 8 + 5 s, and afterwards no process of the job is left (found
     by a marker in /proc/*/environ) and, on a GPU, none holds GPU memory (nvidia-smi).
  3. Collectives per step, fp32, ZeRO 0-3 and sequence parallelism at 2 and 4 ranks: calls and
     bytes per step from the communicator's trace spans (logging.trace; the byte counts are its
     ring formulas, the model); on a GPU these come from the same job over Gloo on the CPU (the
     NCCL communicator records no spans), and the measured times are the NCCL kernels' device
     times in logging.profile_steps (steps 3-4 of rank 0). Over Gloo the time is the collective's
     span on the communicator's thread.

--tensor-parallel (the `tensor-parallel` step): parts 1 and 3 for tensor parallelism instead
(parallel.tensor_parallel_size T): T = 2 with and without the region's sequence parallelism, T = 4
(the tiny model with 4 key/value heads and a vocabulary of 260), 2 data-parallel x 2 tensor-
parallel ranks at ZeRO 1-3, and 2 tensor-parallel x 2 sequence-parallel ranks, fp32 and bf16,
each against one rank with the same global batch (a group of T ranks reads one rank's batch); the
collectives per step of the fp32 cases.

--pipeline-parallel (the `pipeline-parallel` step): part 1 for pipeline parallelism
(parallel.pipeline_parallel_size P, the step's micro-batches its accumulation of 4 or 8): P = 2
under 1F1B and interleaved (2 virtual stages a rank), P = 4, 2 stages x 2 tensor-parallel ranks,
2 stages x 2 data-parallel ranks at ZeRO 1, fp32 and bf16, each against one rank with the same
global batch (a pipeline reads one rank's batch). No collectives table: the stages' transfers are
point to point.

--expert-parallel (the `expert-parallel` step): part 1 for expert parallelism
(parallel.expert_parallel_size E_p) on the tiny model made a Qwen3-MoE of 4 experts (top 2):
E_p = 2 on 2 ranks at ZeRO 1, E_p = 2 x 2 data-parallel ranks at ZeRO 3 (each expert on 2 ranks),
E_p = 4 at ZeRO 2, E_p = 2 x 2 pipeline stages, fp32 and bf16, each against one rank with the same
global batch. No collectives table: the all-to-alls move what the routing sends.

Jobs run side by side (8 ranks at a time on a GPU, one job at a time on 2 CPU cores); no new job
starts when its estimate would pass the limit, and the table says which did not run. Writes the
tables to OUT.md and stdout, one line of key figures to FILE; exit 0 when every case ran and passed.
Standard library only.
"""

import argparse
import importlib.machinery
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid

# Relative tolerance on each step's loss and gradient norm where bit equality is not expected:
# fp32 as the CPU suite (tests/integration/train_equivalence_test.cpp); bf16 as its
# sequence-parallel bf16 case (tests/integration/sequence_parallel_test.cpp).
TOLERANCE = {"fp32": 1e-5, "bf16": 2e-2}
STOP_TIMEOUT_S = 8  # DSTRAIN_COMM_TIMEOUT of the SIGSTOP cases
STOP_SLACK_S = 5    # the launcher must name the stopped rank within the timeout + this


class Ctx:
    pass


CTX = Ctx()  # the step's one context (main() fills it)


RUNNING = set()  # the launchers of the jobs running now (their process groups)


def stop_running(signum, _frame):
    """SIGTERM (the step's `timeout`): our launchers run in their own sessions, out of reach of the
    signal to our process group, so end them (their ranks follow the launcher) before exiting."""
    for proc in list(RUNNING):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    sys.exit(128 + signum)


# ---------------------------------------------------------------- processes


def marker_pids(token):
    """Live processes whose environment holds DSTRAIN_TEST_MARKER=<token>, as {pid: environ}."""
    needle = f"DSTRAIN_TEST_MARKER={token}".encode()
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != "Z":
            found[int(name)] = env
    return found


def rank_pid(pids, rank):
    want = f"RANK={rank}".encode()
    return next((p for p, env in pids.items() if want in env), None)


def kill_leftovers(token):
    """SIGKILLs what is left of one of our jobs (found by its marker); returns how many."""
    left = marker_pids(token)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(left)


def wait_until(done, timeout, poll=0.02):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if done():
            return True
        time.sleep(poll)
    return done()


def gpu_apps():
    """{pid: MiB} of the GPU's compute processes (nvidia-smi), or None without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    apps = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            apps[int(parts[0])] = parts[1]
    return apps


class Job:
    """One `dstrain launch` or `dstrain resume`, its output in <work>/logs/<name>.log, bounded by
    a timeout and the step's deadline; marked with its own DSTRAIN_TEST_MARKER."""

    def __init__(self, ctx, name, args, env=None):
        self.ctx, self.name, self.args = ctx, name, args
        self.token = uuid.uuid4().hex
        self.env = dict(ctx.env, DSTRAIN_TEST_MARKER=self.token, **(env or {}))
        self.log = os.path.join(ctx.work, "logs", name + ".log")
        self.lines, self.lock = [], threading.Lock()
        self.rc, self.seconds, self.left = None, 0.0, 0

    def start(self):
        os.makedirs(os.path.dirname(self.log), exist_ok=True)
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen([self.ctx.dstrain] + self.args, env=self.env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        RUNNING.add(self.proc)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        return self

    def _read(self):
        with open(self.log, "wb") as log:
            log.write(("$ dstrain " + " ".join(self.args) + "\n").encode())
            for raw in self.proc.stdout:
                log.write(raw)
                log.flush()
                with self.lock:
                    self.lines.append((time.monotonic(), raw.decode(errors="replace")))

    def find_line(self, pattern):
        """(time, line) of the first output line matching `pattern`, or None."""
        with self.lock:
            return next(((t, l) for t, l in self.lines if re.search(pattern, l)), None)

    def wait(self, timeout):
        limit = max(1.0, min(timeout, self.ctx.deadline - time.monotonic()))
        try:
            self.rc = self.proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the launcher's group; its ranks follow it
            self.proc.wait()
            self.rc = "timeout"
        RUNNING.discard(self.proc)
        self.reader.join(timeout=5)
        self.seconds = time.monotonic() - self.t0
        # Whatever is still marked after the launcher ended was left behind by the job.
        wait_until(lambda: not marker_pids(self.token), 3, poll=0.1)
        self.left = kill_leftovers(self.token)
        return self

    def run(self, timeout):
        return self.start().wait(timeout)

    def tail(self, n=25):
        with self.lock:
            return "".join(l for _, l in self.lines[-n:])


def launch_args(ctx, nproc, config, sets, extra=()):
    args = ["launch", "--nproc", str(nproc)] + (["--share-gpu"] if ctx.share_flag else [])
    args += list(extra) + [config]
    for s in sets:
        args += ["--set", s]
    return args


def read_metrics(path):
    """{step: (loss, grad_norm)} of a metrics.jsonl."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                if "train/loss" in rec:
                    out[rec["step"]] = (rec["train/loss"], rec.get("grad_norm"))
    except (OSError, ValueError):
        pass
    return out


# ---------------------------------------------------------------- configs


def write_config(ctx, run_dir, stage=0, micro=2, accum=1, clip=0.0, steps=12, interval=0):
    """The CPU suite's integration config (tests/integration/train_util.cpp) for the tiny model,
    with absolute paths into the bundle; logging.out_dir <run_dir>/run, checkpoints
    <run_dir>/ckpt; no evaluation."""
    os.makedirs(run_dir, exist_ok=True)
    text = f"""model:
  name_or_path: {ctx.configs}/models/tiny
  init: random
  tokenizer: byte
data:
  train_path: {ctx.configs}/data/tiny_corpus.txt
  document: line
  max_length: 32
  eval_split: 0
training:
  max_steps: {steps}
  per_device_train_batch_size: {micro}
  gradient_accumulation_steps: {accum}
  lr: 3.0e-3
  weight_decay: 0.01
  lr_scheduler: cosine
  warmup_ratio: 0.1
  gradient_clipping: {clip}
  seed: 7
  log_interval: 1
zero:
  stage: {stage}
logging:
  out_dir: {run_dir}/run
  progress: false
checkpoint:
  dir: {run_dir}/ckpt
  interval: {interval}
  save_final: false
"""
    path = os.path.join(run_dir, "run.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def dtype_sets(dtype):
    return ["training.bf16=true"] if dtype == "bf16" else []


LORA = ["lora.enabled=true", "lora.dropout=0", "training.lr=1e-2"]
STAGE3 = ["zero.stage3_param_persistence_threshold=1000"]  # shard the tiny model's matrices too


# ---------------------------------------------------------------- equivalence cases


class Case:
    """A multi-rank run against a reference run (both plain jobs, see `jobs`)."""

    def __init__(self, name, world, dtype, sets, ref, exact, stage=0, traced=False):
        self.name, self.world, self.dtype, self.sets = name, world, dtype, sets
        self.ref, self.exact, self.stage, self.traced = ref, exact, stage, traced


def equivalence_cases(ctx):
    """The GPU's list; on --cpu (without --full) the rehearsal's reduced one."""
    cases = []
    for dtype in ("fp32", "bf16"):
        for world in (2, 4):
            for stage in (0, 1, 2, 3):
                cases.append(Case(f"zero{stage}", world, dtype,
                                  [f"zero.stage={stage}"] + (STAGE3 if stage == 3 else []),
                                  ("plain", dtype, world), dtype == "fp32" and world == 2,
                                  stage=stage, traced=dtype == "fp32"))
            for what in ("offload_optimizer", "offload_param"):
                cases.append(Case(f"zero3+{what}", world, dtype,
                                  ["zero.stage=3", f"zero.{what}.device=cpu"] + STAGE3,
                                  ("plain", dtype, world), False, stage=3))
            cases.append(Case("lora zero3", world, dtype, ["zero.stage=3"] + STAGE3 + LORA,
                              ("lora", dtype, world), False, stage=3))
        for name, world, p in (("sp2", 2, 2), ("sp4", 4, 4), ("dp2 x sp2", 4, 2)):
            cases.append(Case(name, world, dtype, [f"parallel.sequence_parallel_size={p}"],
                              ("plain", dtype, world // p), False, traced=dtype == "fp32"))
    if ctx.cpu and not ctx.full:
        keep = {("zero0", 2, "fp32"), ("zero3", 2, "fp32"), ("sp2", 2, "fp32")}
        cases = [c for c in cases if (c.name, c.world, c.dtype) in keep]
    return cases


def kv4_model(ctx):
    """The tiny model with 4 key/value heads and a vocabulary of 260 (T = 4 divides every count),
    written once under the work directory; the override that trains it."""
    path = os.path.join(ctx.work, "models", "kv4")
    if not os.path.exists(os.path.join(path, "config.json")):
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(ctx.configs, "models", "tiny", "config.json")) as f:
            config = json.load(f)
        config.update(num_key_value_heads=4, vocab_size=260)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f, indent=1)
    return f"model.name_or_path={path}"


def moe_model(ctx):
    """The tiny model as a Qwen3-MoE of 4 experts, top 2, written once under the work directory;
    the override that trains it."""
    path = os.path.join(ctx.work, "models", "moe")
    if not os.path.exists(os.path.join(path, "config.json")):
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(ctx.configs, "models", "tiny", "config.json")) as f:
            config = json.load(f)
        config.update(model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=64, norm_topk_prob=True, head_dim=32,
                      tie_word_embeddings=False)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f, indent=1)
    return f"model.name_or_path={path}"


def expert_parallel_cases(ctx):
    """--expert-parallel: the GPU's list; on --cpu (without --full) the rehearsal's reduced one."""
    e2, e4, model = ("parallel.expert_parallel_size=2", "parallel.expert_parallel_size=4",
                     moe_model(ctx))
    cases = []
    for dtype in ("fp32", "bf16"):
        cases += [Case("e2", 2, dtype, [e2, model, "zero.stage=1"], ("moe", dtype, 2), False,
                       stage=1),
                  Case("zero3 e2 x dp2", 4, dtype, [e2, model, "zero.stage=3"] + STAGE3,
                       ("moe", dtype, 4), False, stage=3),
                  Case("zero2 e4", 4, dtype, [e4, model, "zero.stage=2"], ("moe", dtype, 4),
                       False, stage=2),
                  Case("e2 x p2", 4, dtype,
                       [e2, model, "parallel.pipeline_parallel_size=2",
                        "training.gradient_accumulation_steps=2"], ("moe", dtype, 4), False)]
    if ctx.cpu and not ctx.full:
        keep = {("e2", 2, "fp32")}
        cases = [c for c in cases if (c.name, c.world, c.dtype) in keep]
    return cases


def tensor_parallel_cases(ctx):
    """--tensor-parallel: the GPU's list; on --cpu (without --full) the rehearsal's reduced one."""
    tp2, tp4 = "parallel.tensor_parallel_size=2", "parallel.tensor_parallel_size=4"
    cases = []
    for dtype in ("fp32", "bf16"):
        traced = dtype == "fp32"
        cases += [Case("tp2", 2, dtype, [tp2], ("plain", dtype, 1), False, traced=traced),
                  Case("tp2 no region sp", 2, dtype,
                       [tp2, "parallel.tensor_sequence_parallel=false"], ("plain", dtype, 1),
                       False, traced=traced),
                  Case("tp4", 4, dtype, [tp4, kv4_model(ctx)], ("kv4", dtype, 1), False,
                       traced=traced)]
        for stage in (1, 2, 3):
            cases.append(Case(f"zero{stage} dp2 x tp2", 4, dtype,
                              [f"zero.stage={stage}", tp2] + (STAGE3 if stage == 3 else []),
                              ("plain", dtype, 2), False, stage=stage, traced=traced))
        cases.append(Case("tp2 x sp2", 4, dtype, [tp2, "parallel.sequence_parallel_size=2"],
                          ("plain", dtype, 1), False))
    if ctx.cpu and not ctx.full:
        keep = {("tp2", 2, "fp32"), ("zero3 dp2 x tp2", 4, "fp32")}
        cases = [c for c in cases if (c.name, c.world, c.dtype) in keep]
    return cases


def pipeline_parallel_cases(ctx):
    """--pipeline-parallel: the GPU's list; on --cpu (without --full) the rehearsal's reduced one."""
    p2, p4 = "parallel.pipeline_parallel_size=2", "parallel.pipeline_parallel_size=4"
    accum = lambda m: f"training.gradient_accumulation_steps={m}"
    cases = []
    for dtype in ("fp32", "bf16"):
        cases += [Case("p2", 2, dtype, [p2, accum(4)], ("plain", dtype, 4), False),
                  Case("p2 interleaved", 2, dtype,
                       [p2, accum(4), "parallel.pipeline_virtual_stages=2"], ("plain", dtype, 4),
                       False),
                  Case("p4", 4, dtype, [p4, accum(8)], ("plain", dtype, 8), False),
                  Case("p2 x tp2", 4, dtype, [p2, accum(4), "parallel.tensor_parallel_size=2"],
                       ("plain", dtype, 4), False),
                  Case("zero1 p2 x dp2", 4, dtype, [p2, accum(4), "zero.stage=1"],
                       ("plain", dtype, 8), False, stage=1)]
    if ctx.cpu and not ctx.full:
        keep = {("p2", 2, "fp32"), ("p2 x tp2", 4, "fp32")}
        cases = [c for c in cases if (c.name, c.world, c.dtype) in keep]
    return cases


def reference_sets(ref):
    kind, dtype, global_accum = ref
    return (["zero.stage=0", f"training.gradient_accumulation_steps={global_accum}"] +
            dtype_sets(dtype) + (LORA if kind == "lora" else []) +
            ([f"model.name_or_path={os.path.join(CTX.work, 'models', kind)}"]
             if kind in ("kv4", "moe") else []))


def case_key(case):
    return f"{case.name.replace(' ', '')}-w{case.world}-{case.dtype}"


def ref_key(ref):
    return f"ref-{ref[0]}-{ref[1]}-accum{ref[2]}"


def plain_job_task(ctx, key, nproc, sets, timeout, traced=False, profile=False, device=None):
    """A task that runs one job to its end and keeps its metrics (and trace) under ctx.results."""
    def run():
        run_dir = os.path.join(ctx.work, key)
        cfg = write_config(ctx, run_dir)
        more = list(sets)
        if traced:
            more.append("logging.trace=true")
        if profile:
            more.append("logging.profile_steps=2")
        env = {"DSTRAIN_DEVICE": device, "OMP_NUM_THREADS": "1"} if device else None
        job = Job(ctx, key, launch_args(ctx, nproc, cfg, more), env=env).run(timeout)
        ctx.results[key] = {"rc": job.rc, "metrics": read_metrics(f"{run_dir}/run/metrics.jsonl"),
                            "dir": f"{run_dir}/run", "seconds": job.seconds, "left": job.left,
                            "tail": job.tail() if job.rc != 0 else ""}
        if job.rc != 0:
            print(f"[{key}] exit {job.rc}:\n{job.tail()}", flush=True)
    return run


def compare(got, want, exact, tol):
    """(max |Δloss|, verdict, ok) of two {step: (loss, grad_norm)}. exact: the losses must be
    equal bit for bit and the gradient norms within `tol` (the norm's sum runs over the shards in
    another grouping); else both within `tol`, relative."""
    if not want or not got:
        return None, "no losses" + (" (reference)" if not want else ""), False
    if sorted(got) != sorted(want):
        return None, f"steps differ ({len(got)} vs {len(want)})", False
    dloss = max(abs(got[s][0] - want[s][0]) for s in want)
    loss_same = all(got[s][0] == want[s][0] for s in want)
    gn_same = all(got[s][1] == want[s][1] for s in want)
    loss_rel = max(abs(got[s][0] - l) / max(abs(l), 1e-12) for s, (l, _) in want.items())
    gn_rel = max([abs(got[s][1] - g) / max(abs(g), 1e-12) for s, (_, g) in want.items()
                  if g is not None and got[s][1] is not None] or [0.0])
    if loss_same and gn_same:
        return dloss, "bit for bit", True
    if exact and not loss_same:
        return dloss, f"FAIL: losses not bit for bit (rel {loss_rel:.1e})", False
    if exact:
        ok = gn_rel <= tol
        return dloss, (f"losses bit for bit, grad norm rel {gn_rel:.1e}" +
                       ("" if ok else f" > {tol:g}: FAIL")), ok
    rel = max(loss_rel, gn_rel)
    if rel <= tol:
        return dloss, (f"losses bit for bit, grad norm rel {gn_rel:.1e} <= {tol:g}" if loss_same
                       else f"ok, rel {rel:.1e} <= {tol:g}"), True
    return dloss, f"FAIL: rel {rel:.1e} > {tol:g}", False


def learns(metrics):
    steps = sorted(metrics)
    return len(steps) >= 2 and metrics[steps[-1]][0] < metrics[steps[0]][0] - 0.1


# ---------------------------------------------------------------- the Qwen-shaped case


def qwen_task(ctx, world):
    """2 ranks at stage 3 against one rank at stage 0, the benchmark's Qwen2.5-0.5B shape, fp32,
    sequence 256, 3 steps."""
    def run():
        loader = importlib.machinery.SourceFileLoader(
            "gpu_train", os.path.join(ctx.bundle, "scripts", "bench", "gpu-train"))
        bench = importlib.util.module_from_spec(importlib.util.spec_from_loader("gpu_train",
                                                                                loader))
        loader.exec_module(bench)
        base = os.path.join(ctx.work, "qwen")
        model = os.path.join(base, "model")
        os.makedirs(model, exist_ok=True)
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump(bench.QWEN25_05B, f, indent=1)
        tokens = os.path.join(base, "random.tok")
        bench.write_token_file(tokens, docs=4, doc_len=4096, vocab=258)
        sets = [f"model.name_or_path={model}", "model.init=random", "model.tokenizer=byte",
                f"data.train_path={tokens}", "data.format=tokens", "data.max_length=256",
                "training.per_device_train_batch_size=1", "training.max_steps=3",
                "training.lr_scheduler=constant", "training.lr=1e-4"]
        ref = ["zero.stage=0", f"training.gradient_accumulation_steps={world}"]
        threads = []
        for key, nproc, more in ((f"qwen-w{world}", world, ["zero.stage=3"]),
                                 ("qwen-ref", 1, ref)):
            threads.append(threading.Thread(target=plain_job_task(ctx, key, nproc, sets + more,
                                                                  timeout=120)))
            threads[-1].start()
        for t in threads:
            t.join()
    return run


# ---------------------------------------------------------------- checkpoints and failures


def resume_task(ctx):
    """4 ranks at stage 3 with a checkpoint at step 6 of 12; resumed on 2 and on 1 rank with the
    same global batch."""
    def run():
        base = os.path.join(ctx.work, "resume")
        cfg = write_config(ctx, base, stage=3, interval=6)
        full = Job(ctx, "resume-w4", launch_args(ctx, 4, cfg, STAGE3)).run(120)
        out = {"rc": full.rc, "full": read_metrics(f"{base}/run/metrics.jsonl"), "left": full.left}
        for nproc in (2, 1):
            d = os.path.join(base, f"on{nproc}")
            job = Job(ctx, f"resume-on{nproc}",
                      ["resume", f"{base}/ckpt/step_00000006", "--nproc", str(nproc),
                       "--set", f"training.gradient_accumulation_steps={4 // nproc}",
                       "--set", f"logging.out_dir={d}", "--set", f"checkpoint.dir={d}/ckpt",
                       "--set", "checkpoint.interval=0"]).run(120)
            out[nproc] = {"rc": job.rc, "metrics": read_metrics(f"{d}/metrics.jsonl"),
                          "left": job.left, "tail": job.tail() if job.rc != 0 else ""}
        ctx.results["resume"] = out
    return run


def restart_task(ctx, world, steps):
    """A rank SIGKILLed after the first commit under --max-restarts 1 (the reference is the
    plain job `restart-ref`)."""
    def run():
        base = os.path.join(ctx.work, "restart")
        cfg = write_config(ctx, base, stage=2, accum=2, clip=1.0, steps=steps, interval=10)
        job = Job(ctx, "restart", launch_args(ctx, world, cfg, [], ["--max-restarts", "1",
                                                                    "--restart-backoff", "0.2"]))
        job.start()
        res = {"victim": world - 1}
        if wait_until(lambda: os.path.exists(f"{base}/ckpt/latest") or job.proc.poll() is not None,
                      120, poll=0.01):
            pid = rank_pid(marker_pids(job.token), world - 1)
            if pid and job.proc.poll() is None:
                os.kill(pid, signal.SIGKILL)
                res["killed_at"] = max(read_metrics(f"{base}/run/metrics.jsonl") or [0])
        job.wait(180)
        res.update(rc=job.rc, left=job.left, restarted=bool(job.find_line(r"restart 1\b")),
                   metrics=read_metrics(f"{base}/run/metrics.jsonl"), tail=job.tail())
        ctx.results["restart"] = res
    return run


def stop_task(ctx, world, victim):
    """SIGSTOP of `victim` after a few steps; the launcher must name it within the timeout + 5 s,
    then nothing of the job may be left (processes, GPU memory)."""
    def run():
        base = os.path.join(ctx.work, f"stop-rank{victim}")
        cfg = write_config(ctx, base, steps=100000)
        job = Job(ctx, f"stop-rank{victim}", launch_args(ctx, world, cfg, []),
                  env={"DSTRAIN_COMM_TIMEOUT": str(STOP_TIMEOUT_S)}).start()
        res = {"world": world, "victim": victim, "at_step": random.randint(3, 8)}
        ctx.results[f"stop{victim}"] = res
        metrics = f"{base}/run/metrics.jsonl"
        wait_until(lambda: len(read_metrics(metrics)) >= res["at_step"] or
                   job.proc.poll() is not None, 90, poll=0.05)
        if job.proc.poll() is not None or len(read_metrics(metrics)) < res["at_step"]:
            job.wait(5)
            res.update(error=f"the job did not reach step {res['at_step']} (exit {job.rc})",
                       tail=job.tail())
            return
        pids = marker_pids(job.token)
        apps = gpu_apps() if not ctx.cpu else None
        res["job_pids"] = sorted(pids)
        res["gpu_listed"] = sorted(set(apps or {}) & set(pids)) if apps is not None else None
        pid = rank_pid(pids, victim)
        if pid is None:
            job.proc.kill()
            job.wait(10)
            res.update(error=f"no process of the job has RANK={victim}", tail=job.tail())
            return
        t0 = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: job.find_line(r"failed on host") or job.proc.poll() is not None,
                   STOP_TIMEOUT_S + STOP_SLACK_S + 10, poll=0.05)
        first = job.find_line(r"rank \d+ failed on host")
        if first:
            res["named"] = (int(re.search(r"rank (\d+) failed", first[1]).group(1)),
                            first[0] - t0, "stopped responding" in first[1], first[1].strip())
        if job.proc.poll() is None and not first:
            os.kill(pid, signal.SIGKILL)  # not detected: end it (the launcher then tears down)
        job.wait(30)
        res.update(rc=job.rc, left=job.left, tail=job.tail())
        if apps is not None:
            wait_until(lambda: not set(gpu_apps() or {}) & set(pids), 5, poll=0.5)
            res["gpu_after"] = sorted(set(gpu_apps() or {}) & set(pids))
    return run


# ---------------------------------------------------------------- collectives


COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "barrier")


def comm_spans(trace_path):
    """(steps, {collective: [(step, bytes, dur_us)]}) of the communicator's spans in one rank's
    trace, each given the step whose span holds its start (0: outside every step)."""
    try:
        with open(trace_path) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError):
        return None
    steps = sorted((e["ts"], e["ts"] + e["dur"], e.get("args", {}).get("step", 0)) for e in events
                   if e.get("ph") == "X" and e["name"] == "step")
    out = {}
    for e in events:
        if e.get("ph") != "X" or e["name"] not in COLLECTIVES or e.get("cat") != "comm":
            continue
        step = next((s for a, b, s in steps if a <= e["ts"] <= b), 0)
        out.setdefault(e["name"], []).append((step, e.get("args", {}).get("bytes_sent", 0),
                                              e["dur"]))
    return len(steps), out


def typical_step(spans, nsteps):
    """Median calls and bytes over steps 2 .. N-1 (the first sets up, the last ends the run)."""
    inner = range(2, max(nsteps, 3))
    calls = [sum(1 for s, _, _ in spans if s == k) for k in inner]
    nbytes = [sum(b for s, b, _ in spans if s == k) for k in inner]
    return statistics.median(calls), statistics.median(nbytes)


NCCL_NAMES = {"AllReduce": "all_reduce", "ReduceScatter": "reduce_scatter",
              "AllGather": "all_gather", "Broadcast": "broadcast", "SendRecv": "all_to_all"}


def nccl_kernels(profile_path, steps=2):
    """{collective: (kernels per step, median ms)} of the NCCL kernels in a logging.profile_steps
    profile of `steps` steps."""
    try:
        with open(profile_path) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError):
        return None
    durs = {}
    for e in events:
        m = re.match(r"nccl(?:Dev)?Kernel_([A-Za-z]+)", e.get("name", ""))
        if e.get("ph") == "X" and e.get("cat") == "kernel" and m:
            name = NCCL_NAMES.get(m.group(1), m.group(1))
            durs.setdefault(name, []).append(e["dur"])
    return {k: (len(v) / steps, statistics.median(v) / 1e3) for k, v in durs.items()}


def collective_rows(ctx, cases):
    """Rows (stage, world, collective, calls/step, bytes/step, kernels/step, median ms)."""
    rows = []
    for c in cases:
        if not c.traced:
            continue
        key = case_key(c)
        counted = ctx.results.get(("twin-" if not ctx.cpu else "") + key)
        traced = comm_spans(f"{counted['dir']}/trace/rank-0.json") if counted else None
        nsteps, spans = traced or (0, {})
        timed = {}
        if not ctx.cpu and key in ctx.results:
            timed = nccl_kernels(f"{ctx.results[key]['dir']}/profile/rank-0.json") or {}
        label = c.name if c.name.startswith("zero") else f"zero0 {c.name}"
        # NCCL may run grouped collectives as one kernel of another name: shown as it is.
        for name in COLLECTIVES + tuple(sorted(set(timed) - set(COLLECTIVES))):
            mine, kern = spans.get(name, []), timed.get(name)
            if not mine and not kern:
                continue
            counted = traced and name in COLLECTIVES
            calls, nbytes = typical_step(mine, nsteps) if counted else (None, None)
            ms = kern[1] if kern else None
            if ctx.cpu:
                inner = [d for s, _, d in mine if 2 <= s < nsteps]
                ms = statistics.median(inner) / 1e3 if inner else None
            rows.append((label, c.world, name, calls, nbytes, kern[0] if kern else None, ms))
    return rows


# ---------------------------------------------------------------- scheduling


class Task:
    def __init__(self, name, ranks, est, fn, pool="main"):
        self.name, self.ranks, self.est, self.fn, self.pool = name, ranks, est, fn, pool
        self.state = "pending"


def schedule(ctx, tasks):
    """Runs the tasks in their order, side by side within each pool's capacity of ranks; a task
    whose estimate would pass the deadline is not started (state "not run")."""
    used, lock, threads = {}, threading.Lock(), []

    def body(task):
        try:
            task.fn()
            task.state = "done"
        except Exception as e:  # a bug in one task must not hide the others' results
            task.state = f"error: {e!r}"
            print(f"[{task.name}] {task.state}", flush=True)
        with lock:
            used[task.pool] -= task.ranks

    pending = list(tasks)
    while pending or any(t.is_alive() for t in threads):
        now = time.monotonic()
        for task in list(pending):
            if now + task.est > ctx.deadline:
                task.state = "not run (time)"
                pending.remove(task)
                continue
            with lock:
                busy = used.get(task.pool, 0)
                if busy and busy + task.ranks > ctx.capacity[task.pool]:
                    continue
                used[task.pool] = busy + task.ranks
            task.state = "running"
            print(f"[{time.monotonic() - ctx.t0:5.1f} s] start {task.name}", flush=True)
            pending.remove(task)
            threads.append(threading.Thread(target=body, args=(task,), daemon=True))
            threads[-1].start()
        time.sleep(0.05)


def build_tasks(ctx, cases):
    est = (lambda n: 6 + 4 * n) if ctx.cpu else (lambda n: 12 + 2 * n)
    tasks, refs = [], []
    for c in cases:
        if c.ref not in refs:
            refs.append(c.ref)
    for r in refs:
        tasks.append(Task(ref_key(r), 1, est(1),
                          plain_job_task(ctx, ref_key(r), 1, reference_sets(r), 120)))
    for c in cases:
        # On a GPU the counts come from the Gloo twin below; the job itself is profiled.
        sets = c.sets + dtype_sets(c.dtype)
        tasks.append(Task(case_key(c), c.world, est(c.world),
                          plain_job_task(ctx, case_key(c), c.world, sets, 120,
                                         traced=c.traced and ctx.cpu,
                                         profile=c.traced and not ctx.cpu)))
        if c.traced and not ctx.cpu:  # the counters, from the same job over Gloo
            tasks.append(Task("twin-" + case_key(c), c.world, 8 + 2 * c.world,
                              plain_job_task(ctx, "twin-" + case_key(c), c.world,
                                             sets + ["training.max_steps=4"], 90, traced=True,
                                             device="cpu"), pool="cpu"))
    if ctx.tensor_parallel or ctx.pipeline_parallel or ctx.expert_parallel:
        return tasks  # the references first: the cases compare against them
    stop_est = STOP_TIMEOUT_S + STOP_SLACK_S + est(2)
    restart_steps = 30 if ctx.cpu else 60
    failure = [Task("stop-rank0", 2, stop_est, stop_task(ctx, 2, 0)),
               Task("restart-ref", 2, est(2), plain_job_task(
                   ctx, "restart-ref", 2, ["zero.stage=2", "training.gradient_accumulation_steps=2",
                                           "training.gradient_clipping=1.0",
                                           f"training.max_steps={restart_steps}"], 120)),
               Task("restart", 2, 2 * est(2), restart_task(ctx, 2, restart_steps))]
    if not ctx.cpu or ctx.full:
        failure += [Task("resume", 4, 3 * est(4), resume_task(ctx)),
                    Task("stop-rank3", 4, stop_est, stop_task(ctx, 4, 3))]
    if not ctx.cpu:
        failure.insert(0, Task("qwen", 3, 60, qwen_task(ctx, 2)))
    # Priority order: what the limit cuts first comes last (the 4-rank and bf16 cases).
    first = [t for t in failure if t.name in ("qwen", "stop-rank0")]
    core = len(refs) + 4  # the references and the first fp32 cases at 2 ranks
    return first + tasks[:core] + [t for t in failure if t not in first] + tasks[core:]


# ---------------------------------------------------------------- report


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit, size in (("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def equivalence_table(ctx, cases, states):
    lines = ["| case | world | dtype | criterion | max abs Δloss | verdict |",
             "|---|---|---|---|---|---|"]
    passed = failed = missing = exact = 0
    for c in cases:
        crit = "bit for bit" if c.exact else f"rel {TOLERANCE[c.dtype]:g}"
        got, want = ctx.results.get(case_key(c)), ctx.results.get(ref_key(c.ref))
        if got is None or want is None:
            verdict, dl = states.get(case_key(c)) or states.get(ref_key(c.ref), "not run"), None
            missing += 1
        elif got["rc"] != 0 or want["rc"] != 0:
            verdict, dl = f"FAIL: exit {got['rc']} (reference {want['rc']})", None
            failed += 1
        else:
            dl, verdict, ok = compare(got["metrics"], want["metrics"], c.exact,
                                      TOLERANCE[c.dtype])
            if ok and not learns(want["metrics"]):
                verdict, ok = "FAIL: the reference did not learn", False
            passed, failed = passed + ok, failed + (not ok)
            exact += ok and verdict.startswith(("bit for bit", "losses bit for bit"))
        lines.append(f"| {c.name} | {c.world} | {c.dtype} | {crit} | "
                     f"{'-' if dl is None else f'{dl:.2e}'} | {verdict} |")
    return lines, passed, failed, missing, exact


def qwen_check(ctx):
    label = "Qwen2.5-0.5B shape"
    head = f"- {label}, 2 ranks stage 3 vs 1 rank, fp32, sequence 256, 3 steps: "
    if ctx.cpu:
        return label, head + "skipped on --cpu (GPU only: a 0.5B model)", None
    got, want = ctx.results.get("qwen-w2"), ctx.results.get("qwen-ref")
    if not got or not want:
        return label, head + "not run", False
    if got["rc"] != 0 or want["rc"] != 0:
        return label, head + f"FAIL: exit {got['rc']} (reference {want['rc']})", False
    dl, verdict, ok = compare(got["metrics"], want["metrics"], False, TOLERANCE["fp32"])
    return label, head + f"max abs Δloss {'-' if dl is None else f'{dl:.2e}'}: {verdict}", ok


def resume_check(ctx):
    label = "resume 4 -> 2, 1"
    r = ctx.results.get("resume")
    if r is None:
        cpu_only = ctx.cpu and not ctx.full
        return label, f"- {label}: " + ("not in the --cpu list" if cpu_only else "not run"), \
            None if cpu_only else False
    full = {s: v for s, v in r["full"].items() if s > 6}
    ok = r["rc"] == 0 and len(full) == 6 and not r["left"]
    lines = [] if ok else [f"- 4-rank run with a checkpoint: FAIL (exit {r['rc']}, "
                           f"{len(full)} steps after 6, {r['left']} process(es) left)"]
    for nproc in (2, 1):
        got = r[nproc]
        dl, verdict, good = compare(got["metrics"], full, False, TOLERANCE["fp32"])
        ok = ok and good and got["rc"] == 0 and not got["left"]
        lines.append(f"- checkpoint of 4 ranks (stage 3, step 6 of 12) resumed on {nproc}: "
                     f"steps 7-12 {verdict}" + ("" if dl is None else f", max abs Δloss {dl:.2e}")
                     + ("" if got["rc"] == 0 else f", exit {got['rc']}"))
    return label, "\n".join(lines), ok


def restart_check(ctx):
    label = "SIGKILL restart"
    r, ref = ctx.results.get("restart"), ctx.results.get("restart-ref")
    if not r or not ref:
        return label, f"- {label}: not run", False
    dl, verdict, ok = compare(r["metrics"], ref["metrics"], True, 0)
    ok = ok and r["rc"] == 0 and r["restarted"] and "killed_at" in r and not r["left"]
    what = (f"rank {r['victim']} of 2 SIGKILLed after step {r['killed_at']}" if "killed_at" in r
            else "NOT KILLED (the job ended first)")
    return label, (f"- {what} (first commit at step 10), --max-restarts 1: exit {r['rc']}, "
                   f"{'restarted' if r['restarted'] else 'NO RESTART'}, {len(r['metrics'])} "
                   f"steps against the uninterrupted run: {verdict}; {r['left']} process(es) "
                   "left"), ok


def stop_check(ctx, victim):
    label = f"SIGSTOP rank {victim}"
    r = ctx.results.get(f"stop{victim}")
    if r is None:
        cpu_only = ctx.cpu and not ctx.full and victim
        return label, f"- {label}: " + ("not in the --cpu list" if cpu_only else "not run"), \
            None if cpu_only else False
    if "error" in r or "rc" not in r:
        return label, f"- {label} of {r['world']}: FAIL: {r.get('error', 'did not finish')}", False
    limit = STOP_TIMEOUT_S + STOP_SLACK_S
    named = r.get("named")
    ok = bool(named) and named[0] == victim and named[1] <= limit and named[2] and not r["left"]
    text = (f"- {label} of {r['world']} after step {r['at_step']}, "
            f"DSTRAIN_COMM_TIMEOUT={STOP_TIMEOUT_S}: ")
    if named:
        text += (f"rank {named[0]} named after {named[1]:.1f} s (limit {limit} s)"
                 f"{'' if named[2] else ', not as stopped responding'}: `{named[3]}`; ")
    else:
        text += f"NO RANK NAMED within {limit + 10} s; "
    text += f"launcher exit {r['rc']}, {r['left']} process(es) of the job left"
    if r.get("gpu_listed") is not None:
        if r["gpu_listed"]:
            text += (f"; nvidia-smi listed {len(r['gpu_listed'])} of its processes while it ran, "
                     f"{len(r['gpu_after'])} after")
            ok = ok and not r["gpu_after"]
        else:
            text += "; nvidia-smi lists none of its processes by pid (see the end-of-step check)"
    return label, text, ok


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--figure", required=True)
    p.add_argument("--limit", type=float, required=True, help="seconds for the whole step")
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--full", action="store_true", help="the GPU's case list on --cpu too")
    p.add_argument("--gpu-ranks", type=int, default=8, help="ranks side by side on the GPU")
    p.add_argument("--tensor-parallel", action="store_true",
                   help="the tensor-parallel cases instead (the `tensor-parallel` step)")
    p.add_argument("--pipeline-parallel", action="store_true",
                   help="the pipeline-parallel cases instead (the `pipeline-parallel` step)")
    p.add_argument("--expert-parallel", action="store_true",
                   help="the expert-parallel cases instead (the `expert-parallel` step)")
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, stop_running)
    ctx = CTX
    ctx.tensor_parallel = a.tensor_parallel
    ctx.pipeline_parallel = a.pipeline_parallel
    ctx.expert_parallel = a.expert_parallel
    ctx.t0 = time.monotonic()
    ctx.deadline = ctx.t0 + a.limit - 12  # the tables and the teardown of a late job
    ctx.bundle, ctx.work, ctx.cpu, ctx.full = a.bundle, a.work, a.cpu, a.full
    ctx.dstrain = os.path.join(a.bundle, "dstrain")
    ctx.configs = os.path.join(a.bundle, "configs")
    ctx.capacity = {"main": os.cpu_count() or 2, "cpu": 4} if a.cpu else {"main": a.gpu_ranks,
                                                                          "cpu": 4}
    if a.cpu:
        ctx.capacity["main"] = min(ctx.capacity["main"], 2)
    ctx.results = {}
    shutil.rmtree(ctx.work, ignore_errors=True)
    os.makedirs(ctx.work)
    help_text = subprocess.run([ctx.dstrain, "launch", "--help"], capture_output=True,
                               text=True).stdout
    ctx.share_flag = "--share-gpu" in help_text
    # A hung collective ends within a minute instead of the default 300 s.
    ctx.env = dict(os.environ, DSTRAIN_DEVICE="cpu" if a.cpu else "cuda", DSTRAIN_SHARE_GPU="1",
                   DSTRAIN_COMM_TIMEOUT="60")
    if not ctx.share_flag:
        print("this dstrain has no `launch --share-gpu`" +
              (": the ranks run on the CPU anyway" if a.cpu else ""), flush=True)
        if not a.cpu:
            ctx.env.pop("DSTRAIN_SHARE_GPU")
    cases = (tensor_parallel_cases(ctx) if a.tensor_parallel else
             pipeline_parallel_cases(ctx) if a.pipeline_parallel else
             expert_parallel_cases(ctx) if a.expert_parallel else equivalence_cases(ctx))
    tasks = build_tasks(ctx, cases)
    print(f"{len(tasks)} tasks, {len(cases)} equivalence cases, limit {a.limit:.0f} s, "
          f"{'CPU (Gloo)' if a.cpu else 'one GPU (NCCL)'}", flush=True)
    schedule(ctx, tasks)
    states = {t.name: t.state for t in tasks}
    return report(ctx, a, cases, tasks, states)


def report(ctx, a, cases, tasks, states):
    eq, passed, failed, missing, exact = equivalence_table(ctx, cases, states)
    checks = [] if ctx.tensor_parallel or ctx.pipeline_parallel or ctx.expert_parallel else [
        qwen_check(ctx), resume_check(ctx), restart_check(ctx), stop_check(ctx, 0),
        stop_check(ctx, 3)]
    if not ctx.cpu:
        apps = gpu_apps()
        checks.append(("GPU empty at the end", "- at the end nvidia-smi lists "
                       f"{'no' if apps is None else len(apps)} compute process(es)"
                       + (" (no nvidia-smi)" if apps is None else ""), apps == {}))
    leaks = sorted(k for k, v in ctx.results.items() if isinstance(v, dict) and v.get("left"))
    if leaks:
        checks.append(("processes left", "- processes left behind by a job (killed by this "
                       f"step): {', '.join(leaks)}", False))
    rows = collective_rows(ctx, cases)
    coll = ["| stage | world | collective | calls/step | bytes/step |" +
            ("" if ctx.cpu else " NCCL kernels/step |") + " median ms |",
            "|---|---|---|---|---|---|" + ("" if ctx.cpu else "---|")]
    for stage, world, name, calls, nbytes, kern, ms in rows:
        coll.append(f"| {stage} | {world} | {name} | {'-' if calls is None else f'{calls:g}'} | "
                    f"{fmt_bytes(nbytes)} |" +
                    ("" if ctx.cpu else f" {'-' if kern is None else f'{kern:g}'} |") +
                    f" {'-' if ms is None else f'{ms:.3f}'} |")
    not_run = [t.name for t in tasks if t.state == "not run (time)"]
    errors = [f"{t.name}: {t.state}" for t in tasks if t.state.startswith("error")]
    where = "on the CPU over Gloo (rehearsal)" if ctx.cpu else "sharing one GPU over NCCL"
    source = ("; median ms: the Gloo collective's span" if ctx.cpu else
              ", from the same job over Gloo on the CPU; NCCL kernels and median ms: their "
              "device time in the profile of steps 3-4")
    text = "\n".join(
        [f"Ranks {where}, {time.monotonic() - ctx.t0:.0f} s", "",
         "### Each case against one rank with the same global batch", ""] + eq +
        (["", "### Checkpoints, restarts, frozen ranks", ""] + [c[1] for c in checks]
         if checks else []) +
        ([] if ctx.pipeline_parallel or ctx.expert_parallel else
         ["", f"### Collectives per step (fp32, rank 0; calls and bytes: the communicator's "
          f"counters{source})", ""] + (coll if rows else ["no traced run finished"])) +
        ([""] + [f"not run (time): {', '.join(not_run)}"] if not_run else []) +
        ([""] + errors if errors else [])) + "\n"
    print("\n" + text, flush=True)
    with open(a.table, "w") as f:
        f.write(text)
    ok = (failed == 0 and missing == 0 and not not_run and not errors and
          (bool(rows) or ctx.pipeline_parallel or ctx.expert_parallel) and
          all(c[2] is not False for c in checks))
    figure = "; ".join(
        [f"{passed}/{len(cases)} cases equal 1 rank ({exact} with losses bit for bit)" +
         (f", {failed} FAILED" if failed else "") + (f", {missing} not run" if missing else "")] +
        [f"{label} {'ok' if good else 'FAIL'}" for label, _, good in checks if good is not None] +
        ([] if ctx.pipeline_parallel or ctx.expert_parallel else
         [f"collectives: {len(rows)} rows"]) +
        ([f"not run (time): {', '.join(not_run)}"] if not_run else []))
    with open(a.figure, "w") as f:
        f.write(figure)
    print(figure)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
