"""records/ (stores, client, tracking, provenance, server) against real MLflow stores: SQLite files and a real
`mlflow server`.

No mocks: every test writes through MLflow and reads back what MLflow stored.
The module-scoped ``uri`` store is shared (one schema migration for the file);
each test uses its own experiment name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing
import os
import shutil
import socket
import sqlite3
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import server
from mlflow.tracking import MlflowClient
from mlflow_runs import search_trial_runs

from records import client, measurements, provenance, stores, tracking
from records.stores import TrackingError


@pytest.fixture(scope="module")
def uri(tmp_path_factory) -> str:
    return stores.default_tracking_uri(tmp_path_factory.mktemp("results"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(uri: str, run_id: str):
    return MlflowClient(tracking_uri=uri).get_run(run_id)


# Test-only shorthands over records.tracking: the product opens and closes a trial's run in
# trainables.trial.lifecycle and logs a checkpoint's measurements through analysis.measuring.trial_record.
@dataclasses.dataclass(frozen=True)
class TrialRun:
    """One trial's run with its uri and run_id bound."""

    uri: str
    run_id: str

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        tracking.log_metrics(self.uri, self.run_id, metrics, step)

    def log_artifact_dict(self, name: str, obj: Any) -> None:
        tracking.log_artifact_dict(self.uri, self.run_id, name, obj)


@contextlib.contextmanager
def trial_run(uri: str, experiment_id: str, trial_id: str, *, params: Mapping[str, Any],
              tags: Mapping[str, Any] | None = None) -> Iterator[TrialRun]:
    """``start_trial_run`` as a context manager, ended as a trial's run is: FINISHED when the block
    completes, FAILED when it raises an Exception (its type and message in tag ``vitsweep.error``),
    KILLED on KeyboardInterrupt / SystemExit; the exception is re-raised."""
    run = TrialRun(uri, tracking.start_trial_run(uri, experiment_id, trial_id, params=params, tags=tags))
    try:
        yield run
    except BaseException as e:
        tracking.set_tags(uri, run.run_id, {tracking.ERROR_TAG: f"{type(e).__name__}: {e}"[:4000]})
        tracking.end_trial_run(uri, run.run_id, "FAILED" if isinstance(e, Exception) else "KILLED")
        raise
    tracking.end_trial_run(uri, run.run_id, "FINISHED")


def _given(x: Any) -> bool:
    """A level / layer / head_index that is set: not None, not NaN (pandas reads nulls as NaN)."""
    return x is not None and x == x


def measurement_metric_key(intervention: str, level: float | None, layer: int | None, head_index: int | None,
                           metric: str) -> str:
    """MLflow metric key of one measurements row, grouped in the UI by intervention:
    ('clean', None, None, None, 'acc') -> 'clean/acc'; ('jpeg', 5.0, None, None, 'fs') -> 'jpeg_5/fs';
    ('clean', None, 3, 2, 'mad') -> 'clean/mad/layer3/head2'. Null (None or NaN): not per layer / head."""
    key = f"{intervention}{f'_{float(level):g}' if _given(level) else ''}/{metric}"
    key += f"/layer{int(layer)}" if _given(layer) else ""
    return key + (f"/head{int(head_index)}" if _given(head_index) else "")


def log_measurements(uri: str, run_id: str, rows: pd.DataFrame, *, per_head: bool = False) -> int:
    """Measurements rows as metrics at step = checkpoint_epoch, keyed by ``measurement_metric_key``;
    per-head rows (head_index set) only with ``per_head``. Returns the number of points logged."""
    by_step: dict[int, dict[str, float]] = {}
    for row in rows.to_dict("records"):
        head = row.get("head_index")
        if _given(head) and not per_head:
            continue
        key = measurement_metric_key(row["intervention"], row.get("level"), row.get("layer"), head, row["metric"])
        by_step.setdefault(int(row["checkpoint_epoch"]), {})[key] = row["value"]
    for step, metrics in sorted(by_step.items()):
        tracking.log_metrics(uri, run_id, metrics, step)
    return sum(len(m) for m in by_step.values())


# ------------------------------------------------------------------------------- URIs


def test_default_tracking_uri_is_an_absolute_sqlite_file_under_results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    expected = f"sqlite:///{(tmp_path / 'results').resolve().as_posix()}/mlflow.db"
    assert stores.default_tracking_uri("results") == expected
    assert stores.default_tracking_uri(tmp_path / "results") == expected
    assert stores.default_tracking_uri((tmp_path / "results").as_uri()) == expected
    assert expected.startswith("sqlite:////")  # four slashes: absolute, same for every Ray worker


@pytest.mark.parametrize("results", ["s3://bucket/results", "gs://bucket/results", "abfs://c@a/r"])
def test_default_tracking_uri_refuses_object_storage(results):
    with pytest.raises(ValueError, match="--mlflow-uri") as info:
        stores.default_tracking_uri(results)
    assert results in str(info.value) and "SQLite" in str(info.value)


@pytest.mark.parametrize(
    "bad, words",
    [
        ("sqllite:////tmp/x/mlflow.db", ["'sqllite'", "sqlite, http, https"]),
        ("htp://127.0.0.1:5000", ["'htp'", "sqlite, http, https"]),
        ("file:///tmp/mlruns", ["file store", "sqlite:////"]),
        ("/tmp/mlruns", ["file store"]),
        ("sqlite:///relative/mlflow.db", ["relative", "sqlite:////"]),
        ("sqlite://", ["in-memory"]),
        ("", ["empty"]),
    ],
)
def test_check_tracking_uri_rejects_misspelt_or_unusable_uris(bad, words):
    with pytest.raises(ValueError) as info:
        stores.check_tracking_uri(bad)
    message = str(info.value)
    assert bad in message
    for word in words:
        assert word in message


def test_check_tracking_uri_database_errors_hide_the_password():
    # Either the driver is missing (ValueError) or nothing listens on port 1 (TrackingError).
    with pytest.raises((ValueError, TrackingError)) as info:
        stores.check_tracking_uri("postgresql://user:s3cret@127.0.0.1:1/mlflow", timeout_s=1)
    assert "postgresql://user:***@127.0.0.1:1/mlflow" in str(info.value)
    assert "s3cret" not in str(info.value)


def test_check_tracking_uri_sqlite_folder(tmp_path):
    good = f"sqlite:///{tmp_path}/new/deeper/mlflow.db"
    stores.check_tracking_uri(good)
    assert (tmp_path / "new" / "deeper").is_dir()  # created, ready for the database

    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    uncreatable = f"sqlite:///{blocker}/sub/mlflow.db"
    with pytest.raises(ValueError, match="cannot create the folder") as info:
        stores.check_tracking_uri(uncreatable)
    assert uncreatable in str(info.value)

    not_sqlite = tmp_path / "notes.db"
    not_sqlite.write_text("hello")
    with pytest.raises(ValueError, match="not a SQLite database"):
        stores.check_tracking_uri(f"sqlite:///{not_sqlite}")


def test_check_tracking_uri_fails_fast_when_no_server_listens():
    down = f"http://127.0.0.1:{_free_port()}"
    start = time.monotonic()
    with pytest.raises(TrackingError, match="not reachable") as info:
        stores.check_tracking_uri(down)
    assert down in str(info.value)
    assert time.monotonic() - start < 3  # refused at once, not MLflow's minutes of retries


def test_check_tracking_uri_times_out_on_a_hung_server():
    # A socket that accepts TCP connections (backlog) but never answers: a wedged server.
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        wedged = f"http://127.0.0.1:{hung.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(TrackingError, match="not reachable within 1 s") as info:
            stores.check_tracking_uri(wedged, timeout_s=1.0)
        elapsed = time.monotonic() - start
    assert wedged in str(info.value)
    assert 0.9 < elapsed < 5


# ------------------------------------------------------------------------- experiments


def test_ensure_experiment_is_idempotent_and_keeps_artifacts_beside_the_db(uri):
    first = tracking.ensure_experiment(uri, "idempotent")
    assert tracking.ensure_experiment(uri, "idempotent") == first
    client = MlflowClient(tracking_uri=uri)
    assert [e.experiment_id for e in client.search_experiments() if e.name == "idempotent"] == [first]
    location = client.get_experiment(first).artifact_location
    db_folder = Path(uri.removeprefix("sqlite:///")).parent
    assert location == (db_folder / "mlartifacts" / "idempotent").as_uri()
    with pytest.raises(ValueError, match="'idempotnet'.*idempotent"):  # lists what exists
        search_trial_runs(uri, "idempotnet")


def test_ensure_experiment_refuses_a_deleted_experiment(uri):
    experiment_id = tracking.ensure_experiment(uri, "deleted")
    MlflowClient(tracking_uri=uri).delete_experiment(experiment_id)
    with pytest.raises(ValueError, match="deleted") as info:
        tracking.ensure_experiment(uri, "deleted")
    assert "mlflow experiments restore" in str(info.value)


# -------------------------------------------------------------------------------- runs


def test_same_trial_id_continues_one_run(uri):
    experiment_id = tracking.ensure_experiment(uri, "resume")
    config = {"study": "study_l", "pe": "rope2d", "lr": 0.001, "depth": 8, "rpt": True, "seed": 3}
    tags = tracking.trial_tags(config, code_version="abc123")
    assert tags == {"study": "study_l", "pe": "rope2d", "rpt": "True", "seed": "3",
                    "code_version": "abc123"}

    run_id = tracking.start_trial_run(uri, experiment_id, "trial-a", params=config, tags=tags)
    tracking.log_metrics(uri, run_id, {"train_loss": 2.0, "eval_acc": 0.1}, step=1)
    tracking.end_trial_run(uri, run_id, "FAILED")  # e.g. a preempted node

    # The retry: same trial id, one param changed, one added.
    changed = dict(config, lr=0.002, epochs=100)
    again = tracking.start_trial_run(uri, experiment_id, "trial-a", params=changed, tags=tags)
    assert again == run_id
    assert _run(uri, run_id).info.status == "RUNNING"
    tracking.log_metrics(uri, run_id, {"train_loss": 1.5, "eval_acc": 0.3}, step=2)
    tracking.end_trial_run(uri, run_id)

    run = _run(uri, run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "trial-a"
    assert run.data.params == {"study": "study_l", "pe": "rope2d", "lr": "0.001", "depth": "8",
                               "rpt": "True", "seed": "3", "epochs": "100"}
    assert run.data.tags["vitsweep.changed_param.lr"] == "0.002"
    assert run.data.tags[tracking.ATTEMPT_TAG] == "2"
    assert run.data.tags["pe"] == "rope2d"
    history = MlflowClient(tracking_uri=uri).get_metric_history(run_id, "eval_acc")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.1), (2, 0.3)]

    runs = search_trial_runs(uri, "resume")
    assert len(runs) == 1
    row = runs.iloc[0]
    assert (row.trial_id, row.status, row["params.lr"], row["metrics.eval_acc"]) == (
        "trial-a", "FINISHED", "0.001", 0.3)


def test_trial_run_marks_failed_on_exception_and_finished_otherwise(uri):
    experiment_id = tracking.ensure_experiment(uri, "context")
    with pytest.raises(RuntimeError, match="boom"):
        with trial_run(uri, experiment_id, "bad", params={"lr": 1}) as run:
            run.log_metrics({"train_loss": 9.0}, step=1)
            raise RuntimeError("boom: loss diverged")
    failed = _run(uri, run.run_id)
    assert failed.info.status == "FAILED"
    assert failed.data.tags["vitsweep.error"] == "RuntimeError: boom: loss diverged"
    assert failed.info.end_time is not None

    with pytest.raises(KeyboardInterrupt):
        with trial_run(uri, experiment_id, "interrupted", params={"lr": 1}) as run:
            raise KeyboardInterrupt
    assert _run(uri, run.run_id).info.status == "KILLED"

    with trial_run(uri, experiment_id, "good", params={"lr": 1}) as run:
        run.log_metrics({"train_loss": 1.0}, step=1)
    assert _run(uri, run.run_id).info.status == "FINISHED"

    with trial_run(uri, experiment_id, "bad", params={"lr": 1}) as retried:  # Ray's retry
        retried.log_metrics({"train_loss": 0.5}, step=1)
    assert retried.run_id == failed.info.run_id
    data = _run(uri, retried.run_id).data
    assert tracking.ERROR_TAG not in data.tags and data.tags[tracking.ATTEMPT_TAG] == "2"
    statuses = search_trial_runs(uri, "context").set_index("trial_id").status.to_dict()
    assert statuses == {"bad": "FINISHED", "interrupted": "KILLED", "good": "FINISHED"}


def test_end_orphaned_runs_fails_only_dead_running_runs(uri):
    experiment_id = tracking.ensure_experiment(uri, "orphans")
    dead = tracking.start_trial_run(uri, experiment_id, "dead", params={})  # process SIGKILLed
    alive = tracking.start_trial_run(uri, experiment_id, "alive", params={})
    done = tracking.start_trial_run(uri, experiment_id, "done", params={})
    tracking.end_trial_run(uri, done)
    assert tracking.end_orphaned_runs(uri, experiment_id, keep_trial_ids=["alive"]) == ["dead"]
    assert [_run(uri, r).info.status for r in (dead, alive, done)] == ["FAILED", "RUNNING", "FINISHED"]


def test_log_metrics_batches_past_mlflow_limits_and_checks_values(uri):
    experiment_id = tracking.ensure_experiment(uri, "batches")
    run_id = tracking.start_trial_run(uri, experiment_id, "wide",
                                      params={f"p{i}": i for i in range(250)})  # > 100 per batch
    metrics = {f"m{i}": float(i) for i in range(2500)}  # > 1000 per batch
    tracking.log_metrics(uri, run_id, dict(metrics, optional=None, nan=float("nan")), step=0)
    data = _run(uri, run_id).data
    assert len(data.params) == 250
    assert {k: v for k, v in data.metrics.items() if k != "nan"} == metrics  # None skipped
    assert data.metrics["nan"] != data.metrics["nan"]
    with pytest.raises(ValueError, match="'acc'"):
        tracking.log_metrics(uri, run_id, {"acc": "high"}, step=0)
    with pytest.raises(ValueError, match="FINSHED"):
        tracking.end_trial_run(uri, run_id, "FINSHED")


def test_measurements_become_grouped_metrics_at_the_checkpoint_step(uri):
    key = measurement_metric_key
    assert key("clean", None, None, None, "acc") == "clean/acc"
    assert key("jpeg", 5.0, None, float("nan"), "fs") == "jpeg_5/fs"
    assert key("pe_scale", 0.5, 1, None, "ssdc") == "pe_scale_0.5/ssdc/layer1"
    assert key("clean", float("nan"), 3, 2, "mad") == "clean/mad/layer3/head2"

    rows = pd.DataFrame({
        "trial_id": "t", "study": "s", "checkpoint_epoch": [10, 10, 10, 20],
        "intervention": ["clean", "clean", "blur", "clean"], "level": [None, None, 2.5, None],
        "layer": [None, 0, None, None], "head_index": [None, 4, None, None], "metric": ["acc", "mad", "acc", "acc"],
        "value": [0.5, 1.7, 0.25, 0.75],
    })
    experiment_id = tracking.ensure_experiment(uri, "measurements")
    tracking.end_trial_run(uri, tracking.start_trial_run(uri, experiment_id, "measured", params={}))
    run_id = tracking.find_trial_run(uri, experiment_id, "measured")  # as the analysis job does
    assert log_measurements(uri, run_id, rows) == 3  # the per-head row stays in Parquet
    client = MlflowClient(tracking_uri=uri)
    def history(key):
        return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]

    assert history("clean/acc") == [(10, 0.5), (20, 0.75)]
    assert history("blur_2.5/acc") == [(10, 0.25)]
    assert client.get_metric_history(run_id, "clean/mad/layer0/head4") == []
    assert log_measurements(uri, run_id, rows.iloc[[1]], per_head=True) == 1
    assert client.get_metric_history(run_id, "clean/mad/layer0/head4")[0].value == 1.7


def test_provenance_artifacts_and_tags(uri, tmp_path):
    experiment_id = tracking.ensure_experiment(uri, "provenance")
    config = {"study": "demo", "lr": 0.001, "pe": "ape"}
    run_id = tracking.start_trial_run(uri, experiment_id, "prov", params=config)
    info = tracking.log_provenance(uri, run_id, config)
    figure = tmp_path / "curve.png"
    figure.write_bytes(b"\x89PNG fake")
    tracking.log_artifact_file(uri, run_id, figure, "figures")
    tracking.end_trial_run(uri, run_id)

    client = MlflowClient(tracking_uri=uri)
    listed = {f.path for f in client.list_artifacts(run_id)} | {
        f.path for f in client.list_artifacts(run_id, "provenance")}
    assert {"config.json", "provenance/environment.json", "provenance/requirements.txt",
            "figures"} <= listed
    local = Path(client.download_artifacts(run_id, "", str(tmp_path / "down")))
    assert json.loads((local / "config.json").read_text()) == config
    environment = json.loads((local / "provenance/environment.json").read_text())
    assert environment["hostname"] == socket.gethostname() == info["hostname"]
    import mlflow
    import torch

    assert environment["packages"]["mlflow"] == mlflow.__version__
    assert environment["torch"]["version"] == torch.__version__
    assert f"mlflow=={mlflow.__version__}\n" in (local / "provenance/requirements.txt").read_text()
    assert (local / "figures/curve.png").read_bytes() == b"\x89PNG fake"
    assert _run(uri, run_id).data.tags["code_version"] == info["code_version"] == provenance.code_version()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_code_version_reads_the_commit_and_dirty_flag(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("commit", "-qm", "first")
    commit = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    assert provenance.code_version(tmp_path) == commit[:12]
    (tmp_path / "untracked.txt").write_text("results do not make the code dirty")
    assert provenance.code_version(tmp_path) == commit[:12]
    (tmp_path / "code.py").write_text("x = 2\n")
    assert provenance.code_version(tmp_path) == commit[:12] + "-dirty"
    # outside a checkout: tests/test_version.py (the version is pyproject.toml's)


# ----------------------------------------------------------------------- concurrency

WRITERS, STEPS, METRICS = 4, 30, 5


def _writer(uri: str, trial_id: str, barrier) -> None:
    """One trial process: all start together on a fresh SQLite file, so the schema
    migration, the experiment creation and every metric write contend."""
    import mlflow.tracking  # noqa: F401  (import before the barrier: contend on writes, not imports)

    from records import tracking

    barrier.wait()
    experiment_id = tracking.ensure_experiment(uri, "concurrent")
    with trial_run(uri, experiment_id, trial_id, params={"trial": trial_id}) as run:
        for step in range(STEPS):
            run.log_metrics({f"m{k}": step * 100 + k for k in range(METRICS)}, step=step)


def test_concurrent_writers_on_one_fresh_sqlite_file_lose_no_metric(tmp_path):
    uri = stores.default_tracking_uri(tmp_path)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(WRITERS)
    workers = [context.Process(target=_writer, args=(uri, f"w{i}", barrier)) for i in range(WRITERS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [w.exitcode for w in workers] == [0] * WRITERS

    client = MlflowClient(tracking_uri=uri)
    assert [e.name for e in client.search_experiments()].count("concurrent") == 1
    runs = search_trial_runs(uri, "concurrent")
    assert sorted(runs.trial_id) == [f"w{i}" for i in range(WRITERS)]
    assert set(runs.status) == {"FINISHED"}
    for run_id in runs.run_id:
        for k in range(METRICS):
            history = client.get_metric_history(run_id, f"m{k}")
            assert sorted((m.step, m.value) for m in history) == [(s, s * 100 + k) for s in range(STEPS)]


def test_writes_retry_a_locked_database_and_give_up_after_the_budget(uri, tmp_path, monkeypatch):
    # A real SQLite lock: another connection holds the file EXCLUSIVE, so a write with no
    # busy wait fails with "database is locked" until the holder commits.
    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    attempts = []

    def write(client):
        attempts.append(time.monotonic())
        with contextlib.closing(sqlite3.connect(path, timeout=0)) as db:
            db.execute("INSERT INTO t VALUES (1)")
            db.commit()
        return "written"

    holder.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(0.5, holder.execute, ["COMMIT"])
    release.start()
    assert client.with_retries("locked write", uri, write) == "written"
    release.join()
    assert len(attempts) > 2 and attempts[-1] - attempts[0] >= 0.4

    monkeypatch.setattr(client, "RETRY_BUDGET_S", 0.5)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(TrackingError, match="locked write.*database is locked") as info:
            client.with_retries("locked write", uri, write)
    finally:
        holder.execute("COMMIT")
    assert uri in str(info.value)

    def not_transient(client):
        attempts.append("bad")
        raise ValueError("a bug, not a lock")

    with pytest.raises(ValueError, match="a bug"):
        client.with_retries("buggy write", uri, not_transient)
    assert attempts.count("bad") == 1


# ------------------------------------------------------------------------ real server


def _group_rss_bytes(pgid: int) -> tuple[int, int]:
    """(summed RSS, process count) of a process group, from /proc."""
    total, count = 0, 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            rss_kb = next(int(line.split()[1]) for line in (entry / "status").read_text().splitlines()
                          if line.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError):
            continue
        total, count = total + rss_kb * 1024, count + 1
    return total, count


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads RSS from /proc")
def test_real_mlflow_server_roundtrip(tmp_path, monkeypatch):
    uri, process = server.start_local_server(
        f"sqlite:///{tmp_path}/server/mlflow.db", tmp_path / "server" / "artifacts",
        log_path=tmp_path / "server.log",
    )
    try:
        stores.check_tracking_uri(uri)
        # Same server, addressed by a name MLflow 3's Host check does not allow ("127.1" is
        # 127.0.0.1): /health would answer, every API call gets 403. The check must say so.
        with pytest.raises(TrackingError, match="--allowed-hosts '127.1'"):
            stores.check_tracking_uri(uri.replace("127.0.0.1", "127.1"))
        rss, processes = _group_rss_bytes(process.pid)
        print(f"mlflow server: {processes} processes, RSS {rss / 2**20:.0f} MiB")
        assert rss < 1.5 * 2**30  # MLflow 3 defaults take ~3 GB; one worker, no job runners ~0.6 GB

        experiment_id = tracking.ensure_experiment(uri, "served")
        assert tracking.ensure_experiment(uri, "served") == experiment_id
        with trial_run(uri, experiment_id, "served-trial",
                                params={"pe": "sincos2d", "lr": 0.001}, tags={"study": "demo"}) as run:
            for epoch in (1, 2):
                run.log_metrics({"eval_acc": 0.25 * epoch}, step=epoch)
            run.log_artifact_dict("config.json", {"pe": "sincos2d", "lr": 0.001})
        same = tracking.start_trial_run(uri, experiment_id, "served-trial", params={"pe": "sincos2d"})
        assert same == run.run_id
        tracking.end_trial_run(uri, same)

        def rest(endpoint: str, **query) -> dict:
            with urllib.request.urlopen(f"{uri}/api/2.0/mlflow/{endpoint}?{urllib.parse.urlencode(query)}",
                                        timeout=10) as response:
                return json.load(response)

        got = rest("runs/get", run_id=run.run_id)["run"]
        assert got["info"]["status"] == "FINISHED" and got["info"]["run_name"] == "served-trial"
        assert {p["key"]: p["value"] for p in got["data"]["params"]} == {"pe": "sincos2d", "lr": "0.001"}
        history = rest("metrics/get-history", run_id=run.run_id, metric_key="eval_acc")["metrics"]
        assert sorted((m["step"], m["value"]) for m in history) == [(1, 0.25), (2, 0.5)]
        # Artifacts went through the server's proxy into --artifacts-destination.
        assert got["info"]["artifact_uri"].startswith("mlflow-artifacts:")
        assert list((tmp_path / "server" / "artifacts").rglob("config.json"))
        local = MlflowClient(tracking_uri=uri).download_artifacts(run.run_id, "config.json", str(tmp_path))
        assert json.loads(Path(local).read_text()) == {"pe": "sincos2d", "lr": 0.001}
    finally:
        server.stop_local_server(process)
    assert _group_rss_bytes(process.pid)[1] == 0  # no uvicorn worker left behind
    with pytest.raises(TrackingError, match="not reachable"):
        stores.check_tracking_uri(uri)
    # The server is gone (killed mid-sweep): a vitsweep call, all retries included, ends within the budget
    # (here 12 s: a few retries, then none starts that could end past it with a 10 s request timeout).
    monkeypatch.setattr(client, "RETRY_BUDGET_S", 12.0)
    start = time.monotonic()
    with pytest.raises(TrackingError, match=r"log_metrics\(step=3\) on MLflow .* still failing after"):
        tracking.log_metrics(uri, run.run_id, {"eval_acc": 0.9}, step=3)
    assert time.monotonic() - start <= client.RETRY_BUDGET_S + 1


def test_a_hung_tracking_server_fails_each_call_within_the_budget(monkeypatch):
    """A server that accepts connections and never answers: MLflow's own retries (7, backoff up to
    120 s per request) are off, each request times out, and no attempt starts past the budget."""
    import socket

    assert {k: os.environ[k] for k in client.HTTP_SETTINGS} == client.HTTP_SETTINGS
    monkeypatch.setattr(client, "RETRY_BUDGET_S", 3.0)
    monkeypatch.setattr(client, "REQUEST_TIMEOUT_S", 1)
    client.bound_http_requests()
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)  # the kernel completes the handshakes; nobody reads
        uri = f"http://127.0.0.1:{hung.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(TrackingError, match="still failing after [2-9] attempts"):
            tracking.set_tags(uri, "0" * 32, {"a": "b"})
        took = time.monotonic() - start
    monkeypatch.undo()
    client.bound_http_requests()
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == str(client.REQUEST_TIMEOUT_S)
    assert took <= 3.0 + 0.5, took


def test_a_full_or_read_only_store_is_not_retried_but_a_lock_is():
    from sweeps.launch import faults

    full = sqlite3.OperationalError("database or disk is full")
    assert not client._is_transient(full) and client._is_transient(sqlite3.OperationalError("database is locked"))
    assert not client._is_transient(sqlite3.OperationalError("attempt to write a readonly database"))
    assert faults.classify(full) == "database or disk is full"  # ends the sweep as a storage fault


def test_the_report_run_has_its_own_experiment_linked_from_the_studys(uri):
    study = tracking.ensure_experiment(uri, "linked")
    tracking.describe_experiment(uri, study, "vitsweep study linked")
    trial = tracking.start_trial_run(uri, study, "t-1", params={"lr": 1e-3})
    report = tracking.study_run(uri, study, "linked-report")
    assert tracking.study_run(uri, study, "linked-report") == report  # found again, not a second run
    c = MlflowClient(tracking_uri=uri)
    reports = c.get_experiment_by_name("linked-reports")
    assert c.get_run(report).info.experiment_id == reports.experiment_id != study
    assert [r.info.run_id for r in c.search_runs([study])] == [trial]  # trial charts: trials only
    assert c.get_experiment(study).tags[tracking.REPORT_RUN_TAG] == f"{reports.experiment_id}/{report}"
    # A later launch rewrites the description and keeps the link to the report.
    tracking.describe_experiment(uri, study, "vitsweep study linked, launched again")
    note = c.get_experiment(study).tags["mlflow.note.content"]
    assert "launched again" in note and note.count("**Report**") == 1
    # Links inside the UI are relative (whatever port serves it) and open the report's index.html.
    index = f"(#/experiments/{reports.experiment_id}/runs/{report}/artifacts/index.html?workflowType=machine_learning)"
    assert index in note and index in reports.tags["mlflow.note.content"]
    assert "http" not in note + reports.tags["mlflow.note.content"]
    assert reports.tags["mlflow.experimentKind"] == "custom_model_development"


def test_ui_addresses_open_the_training_layout():
    assert tracking.experiment_url("http://u:secret@head:5000/", "7") == \
        "http://u:***@head:5000/#/experiments/7/runs?workflowType=machine_learning"
    assert tracking.run_url("sqlite:////r/mlflow.db", "7", "abc") == \
        "http://127.0.0.1:5000/#/experiments/7/runs/abc?workflowType=machine_learning"


def test_a_trials_data_set_is_its_runs_input(uri):
    exp = tracking.ensure_experiment(uri, "inputs")
    run_id = tracking.start_trial_run(uri, exp, "t-in", params={})
    record = {"name": "shapes", "digest": "41134077fb73", "source": "/data", "train_images": 9500, "eval_images": 2000}
    tracking.log_dataset_input(uri, run_id, record)
    tracking.log_dataset_input(uri, run_id, record)  # a retried trial: still one input
    (got,) = MlflowClient(tracking_uri=uri).get_run(run_id).inputs.dataset_inputs
    assert (got.dataset.name, got.dataset.digest) == ("shapes", "41134077fb73")
    assert json.loads(got.dataset.profile) == {"train_images": 9500, "eval_images": 2000}
    assert {t.key: t.value for t in got.tags} == {"mlflow.data.context": "training"}


def test_the_run_charts_open_on_the_headline_numbers_then_the_training_curves_then_one_per_layer_section(uri):
    """MLflow 3.17's charts put a key in the section named by what precedes its last '/', named sections
    sorted by code point, then the unprefixed keys ("Model metrics"), each section's charts by key: the
    headline numbers must come first, the training curves next with no count or time among them, every
    per-layer curve in one section after them, and the counts and times last."""
    from analysis.measuring.trial_record import layer_profiles, summarize

    run_id = tracking.start_trial_run(uri, tracking.ensure_experiment(uri, "charts"), "t-1", params={})
    epoch = {"train_loss": 2.0, "train_acc": 0.2, "eval_loss": 2.1, "eval_acc": 0.1, "eval_images": 500, "lr": 1e-3,
             "images_per_s": 900.0, "wall_time_s": 4.0}
    tracking.log_epoch_metrics(uri, run_id, epoch, 1)
    rows = [{"intervention": iv, "metric": m, "layer": layer, "head_index": head, "value": 0.5, "level": None}
            for layer in range(2) for iv, m, head in (("clean", "ssdc", None), ("rpi", "ssdc", None),
                                                      ("clean", "mad", 0), ("clean", "entropy", 0))]
    rows += [{"intervention": "clean", "metric": "acc", "layer": None, "head_index": None, "value": 0.4, "level": None,
              "n_images": 500}, {"intervention": "rpi", "metric": "dssdc", "layer": None, "head_index": None,
                                 "value": 0.3, "level": None}]
    series = {key: {100: value} for key, value in summarize(rows).items()}
    measurements.log_metric_series(uri, run_id, {**series, **layer_profiles(rows, 100)})
    tracking.log_metrics(uri, run_id, {tracking.headline_key("test_acc"): 0.5}, step=1)
    keys = set(MlflowClient(tracking_uri=uri).get_run(run_id).data.metrics)

    def section(key: str) -> str:  # the UI's extractChartSectionName: the key up to its last '/'
        return key.rsplit("/", 1)[0] if "/" in key else ""

    named = sorted({section(k) for k in keys} - {""})  # JavaScript's default sort: by UTF-16 code unit
    assert named == ["Headline", "epochs", "layers", "progress"] and "" not in {section(k) for k in keys}
    assert {k for k in keys if section(k) == "Headline"} == {
        "Headline/test_acc", "Headline/acc_clean", "Headline/mad_min", "Headline/dssdc_rpi"}
    first_row = sorted(k for k in keys if section(k) == "epochs")[:6]
    assert first_row == ["epochs/eval_acc", "epochs/eval_loss", "epochs/lr", "epochs/train_acc", "epochs/train_loss"]
    assert {k for k in keys if section(k) == "progress"} == {
        "progress/eval_images", "progress/images_per_s", "progress/wall_time_s", "progress/n_images"}
    assert "layers/ssdc_rpi_epoch_0100" in keys and "layers/mad_min_epoch_0100" in keys
    assert tracking.layer_key("ssdc", 7) == "layers/ssdc_epoch_0007" and tracking.epoch_key("lr") == "epochs/lr"


def test_an_experiment_description_starts_with_a_plain_line_for_the_experiments_list(uri):
    """MLflow's experiments list shows the description tag unrendered, cut to a line: a first line with
    Markdown marks is refused, before anything is written; the rest is Markdown for the experiment page."""
    study = tracking.ensure_experiment(uri, "described")
    with pytest.raises(ValueError, match=r"plain text.*\*\*vitsweep"):
        tracking.describe_experiment(uri, study, "**vitsweep study `described`**\n\nmore")
    assert "mlflow.note.content" not in MlflowClient(tracking_uri=uri).get_experiment(study).tags
    tracking.describe_experiment(uri, study, "vitsweep study described: 2 trials.\n\nLaunched by `vitsweep sweep`.")
    tracking.study_run(uri, study, "described-report")
    c = MlflowClient(tracking_uri=uri)
    for experiment in (c.get_experiment(study), c.get_experiment_by_name("described-reports")):
        first = experiment.tags["mlflow.note.content"].split("\n", 1)[0]
        assert first and not any(mark in first for mark in tracking.MARKDOWN_MARKS), first


def test_an_empty_tag_is_not_set(uri):
    run_id = tracking.start_trial_run(uri, tracking.ensure_experiment(uri, "tags"), "t-1", params={})
    tracking.set_tags(uri, run_id, {tracking.ERROR_TAG: "", "vitsweep.note": None, "kept": "x"})
    tags = MlflowClient(tracking_uri=uri).get_run(run_id).data.tags
    assert tracking.ERROR_TAG not in tags and "vitsweep.note" not in tags and tags["kept"] == "x"
