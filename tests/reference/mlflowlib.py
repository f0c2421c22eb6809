"""A real `mlflow server` for the tracking tests (test_mlflow*.py): started from the project
environment on a free loopback port in a session of its own, waited for within a bound, killed at
the end; and the checks that compare what a run logged with what MLflow recorded."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

MLFLOW = os.path.join(os.path.dirname(sys.executable), "mlflow")
SERVER_START_S = 180  # a cold start imports a lot: about 30-45 s on 2 busy cores


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(cond, timeout, what):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@contextlib.contextmanager
def mlflow_server(directory, store_args, env=None):
    """`mlflow server <store_args>` run in `directory` (its log: server.log there), with none of our
    MLFLOW_* variables but those in `env`; yields {"uri", "proc", "answers"} (wait_for_servers).
    `store_args` choose the backend and artifact stores."""
    import mlflow

    port = free_port()
    server_env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    server_env.update(env or {})
    log_path = os.path.join(directory, "server.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [MLFLOW, "server", *store_args, "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1"],
            cwd=directory, env=server_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        uri = f"http://127.0.0.1:{port}"

        def answers():
            assert proc.poll() is None, f"mlflow server exited:\n{open(log_path).read()[-3000:]}"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    pass
                mlflow.MlflowClient(uri).search_experiments(max_results=1)
                return True
            except Exception:
                return False

        try:
            yield {"uri": uri, "proc": proc, "answers": answers}
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=30)


def wait_for_servers(*servers):
    """Waits (bounded) until every server answers; servers started together start in parallel."""
    wait_until(lambda: all(s["answers"]() for s in servers), SERVER_START_S, "the mlflow server")


def jsonl_series(path):
    """{key: [(step, value), ...]} of metrics.jsonl, without the nulls (NaN/Inf)."""
    series = {}
    for line in open(path):
        rec = json.loads(line)
        for k, v in rec.items():
            if k not in ("step", "time") and v is not None:
                series.setdefault(k, []).append((rec["step"], v))
    return series


def assert_metrics_match(client, run_id, jsonl_path):
    want = jsonl_series(jsonl_path)
    got_keys = set(client.get_run(run_id).data.metrics)
    assert got_keys == set(want), f"metric keys differ: {got_keys ^ set(want)}"
    for key, series in want.items():
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
        assert [(m.step, m.value) for m in history] == series, key
