"""MLflow servers that do not proxy artifacts: the run's artifact URI is a directory, as with
`mlflow server --default-artifact-root /nfs/mlruns` (the usual setup on a shared file system) or a
server whose backend store is a directory (a file store: file:// artifact URIs). MLflow's own client
writes such artifacts straight into the directory, and so does dstrain when the directory is
reachable; when it is not (a share not mounted on this node), one warning says so and the run's
metrics, params and status are recorded all the same. Every check reads back with MLflow's client."""

import os
import uuid

import pytest

from mlflowlib import MLFLOW, assert_metrics_match, mlflow_server, wait_for_servers
from reflib import REPO, TINY, run
from reflib import tiny_run_overrides as overrides

mlflow = pytest.importorskip("mlflow")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two servers started together: sqlite + a plain-path artifact root, and a file store."""
    if not os.access(MLFLOW, os.X_OK):
        pytest.skip(f"no mlflow executable at {MLFLOW}")
    plain = tmp_path_factory.mktemp("mlflow-plain")
    root = plain / "shared-fs" / "mlruns"  # what an administrator creates on the share
    root.mkdir(parents=True)
    files = tmp_path_factory.mktemp("mlflow-filestore")
    with mlflow_server(plain, ["--backend-store-uri", f"sqlite:///{plain}/db.sqlite",
                               "--default-artifact-root", str(root)]) as a, \
         mlflow_server(files, ["--backend-store-uri", f"file://{files}/mlruns",
                               "--no-serve-artifacts"],
                       # MLflow 3.x keeps its file store in maintenance mode, behind this switch.
                       env={"MLFLOW_ALLOW_FILE_STORE": "true"}) as b:
        wait_for_servers(a, b)
        yield {"plain": dict(a, dir=plain, root=root), "filestore": dict(b, dir=files)}


def train(server, out, experiment, steps=6):
    """A short single-rank run of the tiny model logging to `server`; returns (run, output)."""
    r = run(["train", TINY] + overrides(out, **{"training.max_steps": steps,
                                                "training.log_interval": 1,
                                                "training.eval_interval": 0}),
            cwd=REPO, timeout=300,
            env={"MLFLOW_TRACKING_URI": server["uri"], "MLFLOW_EXPERIMENT_NAME": experiment})
    run_id = open(os.path.join(out, "mlflow_run_id")).read().strip()
    return mlflow.MlflowClient(server["uri"]).get_run(run_id), r.stdout


def assert_artifacts_as_mlflow_reads_them(server, mlflow_run, out, tmp):
    client = mlflow.MlflowClient(server["uri"])
    run_id = mlflow_run.info.run_id
    assert {a.path for a in client.list_artifacts(run_id)} == {"config.yaml", "summary.json"}
    dl = mlflow.artifacts.download_artifacts(run_id=run_id, dst_path=os.path.join(tmp, "dl"),
                                             tracking_uri=server["uri"])
    assert open(os.path.join(dl, "config.yaml")).read() == open(os.path.join(out, "config.yaml")).read()
    assert (open(os.path.join(dl, "summary.json")).read() ==
            open(os.path.join(out, "summary.json")).read())
    # An artifact MLflow's own client logs lands beside them, in the same directory.
    extra = os.path.join(tmp, "note.txt")
    open(extra, "w").write("logged by mlflow\n")
    client.log_artifact(run_id, extra)
    assert {a.path for a in client.list_artifacts(run_id)} == {"config.yaml", "summary.json",
                                                               "note.txt"}
    assert mlflow_run.info.status == "FINISHED"
    assert_metrics_match(client, run_id, os.path.join(out, "metrics.jsonl"))


def test_plain_path_artifact_root_gets_the_artifacts(servers, tmp):
    server = servers["plain"]
    out = os.path.join(tmp, "run")
    r, output = train(server, out, f"plain-{uuid.uuid4().hex[:8]}")
    assert r.info.artifact_uri.startswith(str(server["root"]) + "/"), r.info.artifact_uri
    assert "not stored" not in output and "MLflow:" in output, output[-3000:]
    assert os.path.isfile(os.path.join(r.info.artifact_uri, "config.yaml"))
    assert_artifacts_as_mlflow_reads_them(server, r, out, tmp)


def test_file_uri_experiment_location_gets_the_artifacts(servers, tmp):
    server = servers["plain"]
    client = mlflow.MlflowClient(server["uri"])
    location = server["dir"] / "file-uri-root" / "team"
    location.parent.mkdir()
    experiment = f"fileuri-{uuid.uuid4().hex[:8]}"
    client.create_experiment(experiment, artifact_location=f"file://{location}")
    out = os.path.join(tmp, "run")
    r, output = train(server, out, experiment)
    assert r.info.artifact_uri.startswith(f"file://{location}/"), r.info.artifact_uri
    assert "not stored" not in output, output[-3000:]
    assert_artifacts_as_mlflow_reads_them(server, r, out, tmp)


def test_file_store_server_gets_the_artifacts(servers, tmp):
    server = servers["filestore"]
    out = os.path.join(tmp, "run")
    r, output = train(server, out, f"filestore-{uuid.uuid4().hex[:8]}")
    assert r.info.artifact_uri.startswith(f"file://{server['dir']}/mlruns/"), r.info.artifact_uri
    assert "not stored" not in output, output[-3000:]
    assert_artifacts_as_mlflow_reads_them(server, r, out, tmp)


def test_unreachable_artifact_root_is_one_warning_and_the_run_is_recorded(servers, tmp):
    # The experiment's artifacts live on a share this machine does not have: nothing is created
    # here, one warning per batch of artifacts names the location, and metrics flow as usual.
    server = servers["plain"]
    client = mlflow.MlflowClient(server["uri"])
    missing = server["dir"] / "not-mounted"
    experiment = f"unmounted-{uuid.uuid4().hex[:8]}"
    client.create_experiment(experiment, artifact_location=str(missing / "team"))
    out = os.path.join(tmp, "run")
    r, output = train(server, out, experiment)
    warnings = [l for l in output.splitlines() if "artifacts not stored" in l]
    assert len(warnings) == 2, output[-3000:]  # config.yaml at the start, summary.json at the end
    assert "config.yaml" in warnings[0] and "summary.json" in warnings[1], warnings
    assert all("not reachable" in w and str(missing) in w for w in warnings), warnings
    assert "training goes on" not in output, output[-3000:]  # no outage: the server answered
    assert not missing.exists()
    assert r.info.status == "FINISHED"
    assert client.list_artifacts(r.info.run_id) == []
    assert_metrics_match(client, r.info.run_id, os.path.join(out, "metrics.jsonl"))
