"""MLflow tracking against a real `mlflow server` (sqlite backend, local artifact root, started on
a free loopback port): rank 0's run is read back with mlflow.MlflowClient — params (the flattened
resolved config), every metric value and step of metrics.jsonl, tags, artifacts, status, the
parent/child link, continuing a run by MLFLOW_RUN_ID — and a server that dies or never answers
does not stop or slow training."""

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import uuid

import pytest
import yaml

from mlflowlib import MLFLOW, assert_metrics_match, mlflow_server, wait_for_servers, wait_until
from reflib import REPO, TINY, dstrain_binary, flatten, run
from reflib import tiny_run_overrides as overrides

mlflow = pytest.importorskip("mlflow")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not os.access(MLFLOW, os.X_OK):
        pytest.skip(f"no mlflow executable at {MLFLOW}")
    d = tmp_path_factory.mktemp("mlflow")
    with mlflow_server(d, ["--backend-store-uri", f"sqlite:///{d}/db.sqlite",
                           "--artifacts-destination", str(d / "artifacts"),
                           "--serve-artifacts"]) as s:
        wait_for_servers(s)
        yield s


def mlflow_env(server, **extra):
    env = {"MLFLOW_TRACKING_URI": server["uri"]}
    env.update(extra)
    return env


def run_id_of(out):
    return open(os.path.join(out, "mlflow_run_id")).read().strip()


def test_run_records_config_metrics_artifacts_and_finishes(server, tmp):
    out = os.path.join(tmp, "run")
    experiment = f"dstrain-{uuid.uuid4().hex[:8]}"
    args = overrides(out)
    run(["launch", "--nproc", "2", TINY] + args, cwd=REPO, timeout=300,
        env=mlflow_env(server, MLFLOW_EXPERIMENT_NAME=experiment))
    client = mlflow.MlflowClient(server["uri"])
    r = client.get_run(run_id_of(out))
    assert r.info.status == "FINISHED"
    assert r.info.end_time is not None and r.info.end_time >= r.info.start_time
    assert client.get_experiment(r.info.experiment_id).name == experiment

    printed = run(["train", TINY, "--print-config"] + args, cwd=REPO).stdout
    want = flatten(yaml.safe_load(printed))
    assert set(r.data.params) == set(want)
    for key, value in want.items():
        got = r.data.params[key]
        if isinstance(value, str):
            assert got == value, key
        else:
            assert yaml.safe_load(got) == value, key

    version = run(["version"]).stdout.split()[1]
    tags = r.data.tags
    assert tags["dstrain.world_size"] == "2"
    assert tags["dstrain.zero_stage"] == str(yaml.safe_load(printed)["zero"]["stage"])
    assert tags["dstrain.host"] == socket.gethostname()
    assert tags["dstrain.version"] == version
    assert tags["mlflow.runName"] == "run"

    assert_metrics_match(client, r.info.run_id, os.path.join(out, "metrics.jsonl"))

    artifacts = {a.path for a in client.list_artifacts(r.info.run_id)}
    assert artifacts == {"config.yaml", "summary.json"}
    dl = client.download_artifacts(r.info.run_id, "", os.path.join(tmp, "dl"))
    assert open(os.path.join(dl, "config.yaml")).read() == printed
    assert open(os.path.join(dl, "summary.json")).read() == open(os.path.join(out, "summary.json")).read()


def test_nested_run_from_config_keys(server, tmp):
    client = mlflow.MlflowClient(server["uri"])
    experiment = f"pipeline-{uuid.uuid4().hex[:8]}"
    exp_id = client.create_experiment(experiment)
    parent = client.create_run(exp_id, run_name="pipeline-step").info.run_id
    out = os.path.join(tmp, "child")
    run(["train", TINY] + overrides(out, **{
        "training.max_steps": 4, "logging.mlflow.tracking_uri": server["uri"],
        "logging.mlflow_experiment": experiment, "logging.mlflow.parent_run_id": parent}),
        cwd=REPO, timeout=300)
    child = client.get_run(run_id_of(out))
    assert child.info.experiment_id == exp_id
    assert child.data.tags["mlflow.parentRunId"] == parent
    assert child.info.status == "FINISHED"
    assert client.get_run(parent).info.status == "RUNNING"  # the pipeline's run is its own business
    children = client.search_runs([exp_id], f"tags.mlflow.parentRunId = '{parent}'")
    assert [c.info.run_id for c in children] == [child.info.run_id]


def test_parent_run_from_environment(server, tmp):
    client = mlflow.MlflowClient(server["uri"])
    parent = client.create_run("0").info.run_id
    out = os.path.join(tmp, "child")
    run(["train", TINY] + overrides(out, **{"training.max_steps": 2}), cwd=REPO, timeout=300,
        env=mlflow_env(server, MLFLOW_PARENT_RUN_ID=parent))
    assert client.get_run(run_id_of(out)).data.tags["mlflow.parentRunId"] == parent


def test_mlflow_run_id_continues_an_existing_run_and_resume_keeps_it(server, tmp):
    client = mlflow.MlflowClient(server["uri"])
    existing = client.create_run("0", run_name="made-by-the-pipeline")
    client.set_terminated(existing.info.run_id, "KILLED")
    out = os.path.join(tmp, "run")
    run(["train", TINY] + overrides(out, **{"training.max_steps": 6, "training.eval_interval": 0}),
        cwd=REPO, timeout=300, env=mlflow_env(server, MLFLOW_RUN_ID=existing.info.run_id))
    assert run_id_of(out) == existing.info.run_id
    r = client.get_run(existing.info.run_id)
    assert r.info.status == "FINISHED"
    assert r.data.params["training.max_steps"] == "6"
    # Resuming (without MLFLOW_RUN_ID) continues the run recorded in <out_dir>/mlflow_run_id;
    # training.max_steps cannot change in MLflow's params, which a warning says.
    ckpt = os.path.join(out, "ckpt", "step_00000006")
    res = run(["train", TINY, "--resume-from", ckpt] +
              overrides(out, **{"training.max_steps": 10, "training.eval_interval": 0}),
              cwd=REPO, timeout=300, env=mlflow_env(server))
    assert "training.max_steps" in res.stdout and "cannot change" in res.stdout, res.stdout[-3000:]
    assert run_id_of(out) == existing.info.run_id
    assert client.get_run(existing.info.run_id).info.status == "FINISHED"
    assert_metrics_match(client, existing.info.run_id, os.path.join(out, "metrics.jsonl"))
    steps = [m.step for m in client.get_metric_history(existing.info.run_id, "train/loss")]
    assert steps == [1, 2, 4, 6, 8, 10]


def test_sigterm_marks_the_run_killed(server, tmp):
    out = os.path.join(tmp, "run")
    env = dict(os.environ, DSTRAIN_DEVICE="cpu", **mlflow_env(server))
    proc = subprocess.Popen([dstrain_binary(), "train", TINY] +
                            overrides(out, **{"training.max_steps": 100000, "training.log_interval": 1}),
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        metrics = os.path.join(out, "metrics.jsonl")
        wait_until(lambda: os.path.exists(os.path.join(out, "mlflow_run_id")) and
                   os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 3, 120, "training")
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGTERM, output[-3000:]
    r = mlflow.MlflowClient(server["uri"]).get_run(run_id_of(out))
    assert r.info.status == "KILLED", output[-3000:]
    assert r.info.end_time is not None


def test_a_longer_grace_gives_a_stalled_server_time_to_record_the_status(server, tmp):
    # The server is stopped (SIGSTOP) around the SIGTERM for 6 s: longer than the 2.5 s a rank
    # takes with the default --grace of 5 s (the status would stay RUNNING), well within the
    # 17.5 s that --grace 20 gives.
    out = os.path.join(tmp, "run")
    env = dict(os.environ, DSTRAIN_DEVICE="cpu", **mlflow_env(server))
    proc = subprocess.Popen([dstrain_binary(), "launch", "--nproc", "1", "--grace", "20", TINY] +
                            overrides(out, **{"training.max_steps": 100000, "training.log_interval": 1}),
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    stopped = False
    try:
        metrics = os.path.join(out, "metrics.jsonl")
        wait_until(lambda: os.path.exists(os.path.join(out, "mlflow_run_id")) and
                   os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 3, 120, "training")
        os.killpg(server["proc"].pid, signal.SIGSTOP)
        stopped = True
        proc.send_signal(signal.SIGTERM)
        time.sleep(6)
        os.killpg(server["proc"].pid, signal.SIGCONT)
        stopped = False
        output, _ = proc.communicate(timeout=60)
    finally:
        if stopped:
            os.killpg(server["proc"].pid, signal.SIGCONT)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    r = mlflow.MlflowClient(server["uri"]).get_run(run_id_of(out))
    assert r.info.status == "KILLED", output[-3000:]


def test_a_failing_rank_marks_the_run_failed(server, tmp):
    out = os.path.join(tmp, "run")
    # A learning rate this large makes the loss NaN within a few steps: every rank fails with
    # "training diverged" and the launcher reports it.
    r = run(["launch", "--nproc", "2", TINY] +
            overrides(out, **{"training.max_steps": 50, "training.lr": 1e4,
                              "training.gradient_clipping": 0, "training.log_interval": 1}),
            cwd=REPO, timeout=300, env=mlflow_env(server), check=False)
    assert r.returncode != 0 and "diverged" in r.stdout, r.stdout[-3000:]
    run_info = mlflow.MlflowClient(server["uri"]).get_run(run_id_of(out)).info
    assert run_info.status == "FAILED"
    assert run_info.end_time is not None


def rank_pid(marker, rank):
    """pid of the rank process whose environment holds `marker` and RANK=`rank`, or None."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if marker.encode() in env and f"RANK={rank}".encode() in env:
            return int(d)
    return None


def launch_and_kill_rank_1(server, launch_flags, overrides_, ready, timeout):
    """`dstrain launch --nproc 2 <launch_flags> TINY <overrides_>`, SIGKILL to rank 1 once
    `ready()` holds, then the launcher's exit code and output (waiting at most `timeout` s)."""
    marker = f"DSTRAIN_TEST_MARKER={uuid.uuid4().hex}"
    env = dict(os.environ, DSTRAIN_DEVICE="cpu", DSTRAIN_TEST_MARKER=marker.split("=", 1)[1],
               **mlflow_env(server))
    proc = subprocess.Popen([dstrain_binary(), "launch", "--nproc", "2"] + launch_flags + [TINY] +
                            overrides_, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_until(ready, 120, "the moment to kill rank 1")
        victim = rank_pid(marker, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, output


def test_a_rank_killed_by_sigkill_marks_the_run_failed(server, tmp):
    # Rank 1 dies without a word; the launcher stops rank 0 (which holds the MLflow run) with a
    # SIGTERM that says a rank failed, so the run ends FAILED, not KILLED.
    out = os.path.join(tmp, "run")
    metrics = os.path.join(out, "metrics.jsonl")
    code, output = launch_and_kill_rank_1(
        server, [], overrides(out, **{"training.max_steps": 100000, "training.log_interval": 1}),
        lambda: os.path.exists(os.path.join(out, "mlflow_run_id")) and
        os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 3, 60)
    assert code != 0, output[-3000:]
    r = mlflow.MlflowClient(server["uri"]).get_run(run_id_of(out))
    assert r.info.status == "FAILED", output[-3000:]
    assert r.info.end_time is not None


def test_a_restarted_job_stays_one_run_tagged_with_its_restarts(server, tmp):
    # --max-restarts: rank 1 killed after the first checkpoint; the launcher restarts the job from
    # it, and the restarted rank 0 continues the same MLflow run, which ends FINISHED with every
    # step and the tag dstrain.restarts.
    out = os.path.join(tmp, "run")
    first = {}

    def checkpointed():
        if not os.path.exists(os.path.join(out, "ckpt", "latest")):
            return False
        first["run_id"] = run_id_of(out)  # the run before the failure
        return True

    code, output = launch_and_kill_rank_1(
        server, ["--max-restarts", "1", "--restart-backoff", "0"],
        overrides(out, **{"training.max_steps": 12, "training.log_interval": 1,
                          "checkpoint.interval": 4}), checkpointed, 180)
    assert code == 0, output[-3000:]
    assert "dstrain launch: restart 1" in output, output[-3000:]
    run_id = first["run_id"]
    assert run_id_of(out) == run_id
    client = mlflow.MlflowClient(server["uri"])
    r = client.get_run(run_id)
    assert r.info.status == "FINISHED", output[-3000:]
    assert r.data.tags.get("dstrain.restarts") == "1", r.data.tags
    history = client.get_metric_history(run_id, "train/loss")
    steps = sorted(m.step for m in history)
    assert sorted(set(steps)) == list(range(1, 13)), steps
    # MLflow keeps every point it was sent: the steps after the checkpoint that rank 0 had logged
    # before rank 1 was killed (how many depends on when the kill lands) come again from the
    # restarted job, with the same values, since it resumes from the checkpoint on the same data.
    with open(os.path.join(out, "restarts.json"), encoding="utf-8") as f:
        failure = json.load(f)["restarts"][0]
    resumed = int(re.search(r"(\d+)$", failure["resumed_from"]).group(1))
    again = sorted({s for s in steps if steps.count(s) > 1})
    assert all(resumed < s <= failure["step"] and steps.count(s) == 2 for s in again), (again,
                                                                                       failure)
    for s in again:
        assert len({m.value for m in history if m.step == s}) == 1, (s, history)


class BlackHole:
    """A TCP server that accepts connections and never answers: an MLflow server that hangs."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def test_a_server_that_never_answers_does_not_slow_training(tmp):
    hole = BlackHole()
    try:
        out = os.path.join(tmp, "run")
        start = time.time()
        r = run(["train", TINY] + overrides(out, **{"training.log_interval": 1}), cwd=REPO,
                timeout=300, env={"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{hole.port}"})
        elapsed = time.time() - start
    finally:
        hole.close()
    # Requests time out after 10 s on the worker thread; no training step waits for one.
    steps = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if "step_time_s" in l]
    assert len(steps) == 12
    assert max(s["step_time_s"] for s in steps) < 5, steps
    assert "MLflow:" in r.stdout and "Timeout" in r.stdout, r.stdout[-3000:]
    assert elapsed < 120


def test_server_killed_mid_run_training_finishes_with_a_warning(server, tmp):
    # Last in this file: it kills the module's server.
    out = os.path.join(tmp, "run")
    env = dict(os.environ, DSTRAIN_DEVICE="cpu", **mlflow_env(server))
    proc = subprocess.Popen([dstrain_binary(), "train", TINY] +
                            overrides(out, **{"training.max_steps": 80, "training.log_interval": 1,
                                              "training.eval_interval": 0}),
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        metrics = os.path.join(out, "metrics.jsonl")
        wait_until(lambda: os.path.exists(os.path.join(out, "mlflow_run_id")) and
                   os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 3, 120, "training")
        os.killpg(server["proc"].pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-3000:]
    assert json.load(open(os.path.join(out, "summary.json")))["status"] == "completed"
    assert sum(1 for l in open(metrics) if "train/loss" in l) == 80
    warnings = [l for l in output.splitlines() if "MLflow:" in l and "warn" in l.lower()]
    assert any(server["uri"] in l and "Couldn't connect" in l for l in warnings), output[-3000:]
