"""The analysis job's faults without Ray: the driver's loop (``analysis.measuring.job.measure_checkpoints``) fed by a
real ``Measurer`` in this process, as the actor pool feeds it, one checkpoint at a time.

A full disk under MLflow's SQLite store (a real tmpfs, filled) ends the analysis at its first checkpoint
in one ``error: storage fault`` line: no later checkpoint is loaded, no SQL reaches the console, the lock
is released and the heartbeat says why it ended. A skipped checkpoint's progress line is one line, its
whole error in the analysis log. A finished trial whose checkpoint and snapshot folders were deleted is
missing in the plan, in ``vitsweep analyze``'s output and exit status, in ``vitsweep status`` and on the
report."""

import errno
import logging
import shutil
import sqlite3
from pathlib import Path

import pytest
import torch

from analysis.measuring import job
from records import manifest, stores, tables, tracking
from records.client import StorageError, storage_fault
from sweeps import cli
from sweeps import run as launcher
from sweeps.launch import faults, status
from trainables.loop.train import snapshot_epochs
from trainables.model.vit import ViT
from trainables.config.run_config import RunConfig

EPOCHS = 2  # snapshots at epochs 0, 1, 2: with --checkpoints all, 3 checkpoints a trial (the last is its checkpoint)


def _study(results: Path, trial_ids: list[str], uri: str | None = None) -> None:
    """Finished trials as training leaves them: a checkpoint and the log-spaced snapshots each, a trials
    row, and, given ``uri``, a trial run in MLflow."""
    for seed, trial_id in enumerate(trial_ids):
        torch.manual_seed(seed)  # the same weights every run
        cfg = RunConfig.for_dataset("shapes", preset="tiny", epochs=EPOCHS, warmup_epochs=0, study="demo", seed=seed,
                                    data_root=str(results / "data"))
        checkpoint, snapshots = (results / "storage" / "demo" / kind / trial_id
                                 for kind in ("checkpoints", "snapshots"))
        checkpoint.mkdir(parents=True)
        snapshots.mkdir(parents=True)
        state = {"model": ViT(cfg.model).state_dict(), "config": cfg.to_flat(), "epoch": EPOCHS}
        torch.save(state, checkpoint / "state.pt")
        for epoch in snapshot_epochs(EPOCHS):
            torch.save({**state, "epoch": epoch}, snapshots / f"epoch_{epoch:04d}.pt")
        tables.write_trial(str(results), "demo", cfg.to_flat(), {
            "trial_id": trial_id, "study": "demo", "status": "finished", "epochs_completed": EPOCHS,
            "checkpoint_path": str(checkpoint), "snapshot_dir": str(snapshots)})
        if uri:
            tracking.start_trial_run(uri, tracking.ensure_experiment(uri, "demo"), trial_id, params={})


def _in_process(measurer: job.Measurer, rows: list[dict], pulled: list[dict]):
    """What the actor pool yields to the driver, one row at a time; ``pulled``: the rows handed out."""
    for row in rows:
        pulled.append(row)
        out = measurer({k: [v] for k, v in row.items()})
        yield {k: v[0].item() for k, v in out.items()}


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """An MLflow SQLite file with its schema and no experiment: its migrations take seconds, a copy none."""
    from records.client import with_retries

    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    with_retries("build the store", f"sqlite:///{path}", lambda c: c.search_experiments())
    return path


@pytest.fixture()
def quiet_mlflow():
    """MLflow logs the error it raises, SQL included: in an actor, whose log stays off the console; the
    Measurer runs in this process here."""
    logger = logging.getLogger("mlflow")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def test_a_full_mlflow_disk_ends_the_analysis_at_its_first_checkpoint_in_one_line(tmp_path, small_disk, empty_store,
                                                                                   quiet_mlflow, capsys):
    mount, fill = small_disk
    shutil.copy(empty_store, mount / "mlflow.db")
    results, uri = tmp_path / "results", f"sqlite:///{mount}/mlflow.db"  # the store on its own disk (--mlflow-uri)
    _study(results, ["shapes-a", "shapes-b"], uri)
    rows, gone, before, total = job.plan_analysis(str(results), "demo", "all", eval_size=8)
    assert (len(rows), gone, before, total) == (6, [], 0, 6)
    measurer = job.Measurer(str(results), "demo", uri, eval_size=8, batch_size=8, threads=1)
    pulled: list[dict] = []
    fill()

    def work(_):
        return job.measure_checkpoints(str(results), "demo", rows, _in_process(measurer, rows, pulled), total=total,
                                       choices={"checkpoints": "all", "eval_size": 8})

    assert launcher.guarded(str(results), "demo", False, lambda: None, work, what="analysis",
                            then="run the same command again") == 1
    out, err = capsys.readouterr()
    first = rows[0]
    fault = (f"measuring {first['trial_id']} epoch {first['epoch']}: MLflow store {uri!r}: "
             "(sqlite3.OperationalError) database or disk is full")
    (line,) = [line for line in err.splitlines() if line.strip()]
    assert line.startswith(f"error: storage fault: StorageError: {fault}; details in "), line
    assert line.endswith("; fix the storage, then run the same command again")
    assert "SQL" not in out + err and "[1/6]" not in out  # no skipped checkpoint, no statement
    assert len(pulled) == 1  # no checkpoint loaded after the first fault
    assert not list((results / "demo").glob(".launch.lock*"))  # released
    beat = manifest.read_heartbeat(str(results), "demo")
    assert beat["ended"] and beat["stage"] == "analyze" and beat["outcome"] == f"storage fault: {fault}"
    text = status.format_status(status.study_status(str(results), "demo"))
    assert f"in its analyze stage: storage fault: {fault}" in text
    assert (f"analysis unfinished: 0 of 6 checkpoints measured; `vitsweep analyze demo --results {results} "
            "--checkpoints all --eval-size 8` continues it") in text


def test_a_skipped_checkpoints_progress_line_is_one_line_and_its_whole_error_goes_to_the_log(tmp_path, capsys):
    results = tmp_path / "results"
    _study(results, ["shapes-a"])
    state = results / "storage" / "demo" / "checkpoints" / "shapes-a" / "state.pt"
    blob = torch.load(state, weights_only=True)
    blob["model"] = {k: v for k, v in blob["model"].items() if k != "head.weight"}  # load_state_dict: 3 lines
    torch.save(blob, state)
    rows, _, _, total = job.plan_analysis(str(results), "demo", "final", eval_size=8)
    measurer = job.Measurer(str(results), "demo", None, eval_size=8, batch_size=8, threads=1)
    (got,) = job.measure_checkpoints(str(results), "demo", rows, _in_process(measurer, rows, []), total=total)
    assert got["status"] == "error: RuntimeError: Error(s) in loading state_dict for ViT:"
    out = capsys.readouterr().out
    assert out.strip() == "[1/1] checkpoints: shapes-a epoch 2 skipped (error: RuntimeError: Error(s) in loading " \
                          "state_dict for ViT:)"
    (log,) = (results / "demo" / "logs").glob("analysis-*.log")
    assert 'Missing key(s) in state_dict: "head.weight"' in log.read_text() and "Traceback" in log.read_text()


def test_deleted_checkpoint_folders_are_missing_in_the_plan_the_exit_status_status_and_the_report(
        tmp_path, empty_store, capsys):
    from analysis.reporting.report import missing_checkpoints_note

    results = tmp_path / "results"
    _study(results, ["shapes-a", "shapes-b"])
    shutil.copy(empty_store, results / "mlflow.db")  # the study's default store, as `vitsweep analyze` checks it
    measurer = job.Measurer(str(results), "demo", None, eval_size=8, batch_size=8, threads=1)
    (row, _) = job.list_checkpoints(str(results), "demo", "final")
    assert [s["status"] for s in _in_process(measurer, [row], [])] == ["ok"]  # shapes-a's, measured
    for kind in ("checkpoints", "snapshots"):  # shapes-b's files are gone; its row says finished
        shutil.rmtree(results / "storage" / "demo" / kind / "shapes-b")

    rows, missing = job.plan_checkpoints(str(results), "demo", "all")
    assert [(m["trial_id"], m["epoch"]) for m in missing] == [("shapes-b", 2), ("shapes-b", 0), ("shapes-b", 1)]
    assert missing[1]["path"] == f"{results}/storage/demo/snapshots/shapes-b/epoch_0000.pt"
    assert [(r["trial_id"], r["epoch"]) for r in rows] == [("shapes-a", 2), ("shapes-a", 0), ("shapes-a", 1)]
    # Nothing left to measure: `vitsweep analyze` starts no Ray, says what is missing and exits 1.
    assert cli.main(["analyze", "demo", "--results", str(results), "--checkpoints", "final", "--eval-size", "8"]) == 1
    out = capsys.readouterr().out
    assert "analysis of demo: 1 planned checkpoint(s) missing, their files gone, not measured: shapes-b epoch 2" in out
    plan = manifest.read_analysis_plan(str(results), "demo")
    assert plan["planned"] == [["shapes-a", 2], ["shapes-b", 2]] and plan["checkpoints"] == "final"
    assert plan["missing"] == [{"trial_id": "shapes-b", "epoch": 2,
                                "path": f"{results}/storage/demo/checkpoints/shapes-b/state.pt"}]
    got = status.study_status(str(results), "demo")
    assert got["analysis"]["measured"] == 1 and len(got["analysis"]["missing"]) == 1
    assert ("analysis unfinished: 1 checkpoint missing (shapes-b epoch 2), their files gone; 1 of 2 checkpoints "
            "measured") in status.format_status(got)
    note = missing_checkpoints_note(str(results), "demo")
    assert (note.startswith("Missing checkpoints: 1 planned checkpoint(s) were not measured")
            and "shapes-b epoch 2" in note)


def test_storage_faults_of_mlflows_store_are_one_line_and_a_lock_past_the_budget_says_so():
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    def mlflow_error(words: str) -> Exception:  # as MLflow raises SQLite's error: with the SQL after it
        try:
            try:
                raise sqlite3.OperationalError(words)
            except sqlite3.OperationalError as exc:
                raise sqlalchemy.exc.OperationalError("INSERT INTO metrics ...", [(1,)], exc) from exc
        except sqlalchemy.exc.OperationalError as exc:
            return MlflowException(f"(raised as a result of Query-invoked autoflush)\n{exc}")

    assert storage_fault(mlflow_error("database or disk is full")) == (
        "(sqlite3.OperationalError) database or disk is full", errno.ENOSPC)
    assert storage_fault(mlflow_error("attempt to write a readonly database"))[1] == errno.EROFS
    assert storage_fault(mlflow_error("no such table: metrics")) is None
    assert storage_fault(FileNotFoundError(errno.ENOENT, "gone")) is None  # the checkpoint's fault
    locked = stores.TrackingError("log_batch on MLflow 'sqlite:///r/mlflow.db' still failing after 9 attempts over "
                                  "29.6 s: OperationalError: (sqlite3.OperationalError) database is locked")
    assert storage_fault(locked) == (str(locked), None)
    assert faults.classify(locked) == f"MLflow database stayed locked: {locked}"
    assert (faults.classify(StorageError(errno.ENOSPC, "measuring t epoch 2: full"))
            == "StorageError: measuring t epoch 2: full")
    # Through Ray, the actor's one line arrives inside the remote traceback's text, after the errors it wraps.
    remote = RuntimeError("ray::MapWorker(MapBatches(Measurer)).submit()\nsqlite3.OperationalError: database or disk "
                          "is full\n\nThe above exception was the direct cause of the following exception:\n\n"
                          "records.client.StorageError: measuring t epoch 2: MLflow store 's': database or disk "
                          "is full")
    assert storage_fault(remote) == ("measuring t epoch 2: MLflow store 's': database or disk is full", errno.ENOSPC)
