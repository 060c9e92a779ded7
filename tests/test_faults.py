"""Faults without Ray: corrupt checkpoints are named, not just skipped."""

from pathlib import Path

import pytest
import torch

from sweeps.launch.faults import report_storage_faults
from trainables.loop.checkpoints import CorruptCheckpointError, load_model
from trainables.model.vit import ViT
from trainables.config.run_config import RunConfig
from trainables.trial.lifecycle import close_unfinished


@pytest.fixture()
def checkpoint(tmp_path):
    cfg = RunConfig.for_dataset("shapes", preset="tiny", epochs=1, warmup_epochs=0)
    path = tmp_path / "state.pt"
    torch.save({"model": ViT(cfg.model).state_dict(), "config": cfg.to_flat(), "epoch": 1}, path)
    return path


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "not_a_checkpoint"])
def test_a_corrupt_checkpoint_is_named_with_its_path(checkpoint, damage):
    data = checkpoint.read_bytes()
    if damage == "truncate":
        checkpoint.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        checkpoint.write_bytes(b"\x00garbage" * 64)
    elif damage == "empty":
        checkpoint.write_bytes(b"")
    else:
        torch.save({"weights": 1}, checkpoint)
    with pytest.raises(CorruptCheckpointError, match=rf"^checkpoint file {checkpoint} is corrupt \(truncated, or not"):
        load_model(checkpoint)
    with pytest.raises(CorruptCheckpointError, match=r"^checkpoint file s3://b/state.pt is corrupt"):
        load_model(checkpoint, name="s3://b/state.pt")  # a downloaded copy is called by its URI


def test_the_analysis_status_of_a_corrupt_checkpoint_names_its_path(checkpoint, tmp_path):
    from analysis.measuring.job import Measurer

    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    measurer = Measurer(str(tmp_path / "results"), "demo", None, eval_size=8, batch_size=8, threads=1)
    out = measurer({"trial_id": ["t"], "epoch": [4], "path": [str(checkpoint)], "dataset": ["shapes"],
                    "data_root": [str(tmp_path)], "mlflow_run_id": [None], "final": [True]})
    status = str(out["status"][0])
    assert status.startswith(f"error: CorruptCheckpointError: checkpoint file {checkpoint} is corrupt"), status
    assert str(out["path"][0]) == str(checkpoint) and int(out["rows"][0]) == 0


def test_a_good_checkpoint_still_loads(checkpoint):
    model, cfg, epoch = load_model(checkpoint)
    assert epoch == 1 and cfg.dataset == "shapes" and isinstance(model, ViT)


def chattr(path, flag: str) -> None:
    import subprocess

    subprocess.run(["chattr", flag, str(path)], check=True, capture_output=True)


@pytest.fixture()
def freezable(tmp_path):
    """``freeze(folder)`` makes a folder immutable (``chattr +i``): no file can be created,
    renamed or removed in it, even by root, which ignores a read-only mode. Undone after."""
    import subprocess

    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        chattr(probe, "+i")
        chattr(probe, "-i")
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"needs chattr +i (root on ext4/xfs/btrfs): {exc}")
    frozen = []

    def freeze(folder):
        chattr(folder, "+i")
        frozen.append(folder)

    yield freeze
    for folder in frozen:
        chattr(folder, "-i")


def test_each_step_is_logged_once_across_attempts(tmp_path):
    from records import stores, tracking

    uri = stores.default_tracking_uri(str(tmp_path))
    experiment = tracking.ensure_experiment(uri, "demo")
    run_id = tracking.start_trial_run(uri, experiment, "t1", params={"lr": 1e-3})
    assert tracking.logged_steps(uri, run_id, "eval_acc") == set()
    for step in (1, 2):
        tracking.log_metrics(uri, run_id, {"eval_acc": 0.1 * step, "train_loss": 2.0}, step=step)
    assert tracking.logged_steps(uri, run_id, "eval_acc") == {1, 2}
    assert tracking.logged_steps(uri, run_id, "test_acc") == set()


def test_epilogue_closes_every_run_despite_a_read_only_trials_folder(tmp_path, freezable, capsys):
    """The launcher's epilogue after a storage fault: rows it cannot write are reported,
    and every MLflow run still ends (FAILED), instead of a raw OSError leaving them RUNNING."""
    from mlflow_runs import search_trial_runs

    from records import stores, tables, tracking

    results = str(tmp_path / "results")
    uri = stores.default_tracking_uri(results)
    experiment = tracking.ensure_experiment(uri, "demo")
    runs = {t: tracking.start_trial_run(uri, experiment, t, params={"lr": 1e-3}) for t in ("a", "b", "c")}
    for t in ("a", "b"):  # two rows "running"; c never got a row (its write failed)
        tables.write_trial(results, "demo", {"lr": 1e-3}, {"trial_id": t, "study": "demo", "status": "running"})
    freezable(tmp_path / "results" / "demo" / "trials")

    faults = close_unfinished(results, "demo", uri, experiment, stopped=set())
    assert [f.split(":")[0] for f in faults] == ["cannot write the trials row of a", "cannot write the trials row of b"]
    statuses = search_trial_runs(uri, "demo").set_index("trial_id")["status"].to_dict()
    assert statuses == {"a": "FAILED", "b": "FAILED", "c": "FAILED"}
    assert set(runs) == set(statuses)

    runs = search_trial_runs(uri, "demo").set_index("trial_id")
    assert runs.loc["a", "tags.vitsweep.error"] == "the launch ended before the trial finished"

    report_storage_faults(faults, "/x/launch.log")
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "error" in x]  # (MLflow logs there too)
    assert line.startswith("error: storage fault: cannot write the trials row of a: ")
    assert "(and 1 more); details in /x/launch.log; fix the storage, then launch again with --resume" in line


def test_records_say_what_happened_whichever_was_closed_first(tmp_path):
    """Only a scheduler's stop is "stopped"; an unfinished trial is failed with its reason in its row and
    its run; a trial whose row says finished has its run FINISHED even when the run was left RUNNING or
    an earlier epilogue called it an orphan; a continued run loses the stopped-early tag."""
    from mlflow_runs import search_trial_runs

    from records import stores, tables, tracking

    results = str(tmp_path / "results")
    uri = stores.default_tracking_uri(results)
    experiment = tracking.ensure_experiment(uri, "demo")
    runs = {t: tracking.start_trial_run(uri, experiment, t, params={"lr": 1e-3})
            for t in ("done", "orphaned_done", "cut", "asha", "broken")}
    rows = {"done": "finished", "orphaned_done": "finished", "cut": "running", "asha": "running", "broken": "failed"}
    for t, status in rows.items():
        tables.write_trial(results, "demo", {"lr": 1e-3}, {"trial_id": t, "study": "demo", "status": status,
                                                          "mlflow_run_id": runs[t],
                                                          "error": "loss is nan" if t == "broken" else None})
    tracking.set_tags(uri, runs["orphaned_done"], {tracking.ERROR_TAG: "orphaned: ..."})
    tracking.end_trial_run(uri, runs["orphaned_done"], "FAILED")  # what the old epilogue did
    tracking.end_trial_run(uri, runs["broken"], "FAILED")

    assert close_unfinished(results, "demo", uri, experiment, stopped={"asha"},
                            reason="storage fault: OSError: [Errno 28] No space left on device") == []
    got = {r["trial_id"]: r for r in tables.read_table(results, "demo", "trials").to_pylist()}
    assert {t: r["status"] for t, r in got.items()} == {
        "done": "finished", "orphaned_done": "finished", "cut": "failed", "asha": "stopped", "broken": "failed"}
    assert (got["cut"]["error"].startswith("storage fault: OSError: [Errno 28]")
            and got["broken"]["error"] == "loss is nan")
    mlflow = search_trial_runs(uri, "demo").set_index("trial_id")
    assert mlflow["status"].to_dict() == {"done": "FINISHED", "orphaned_done": "FINISHED", "cut": "FAILED",
                                          "asha": "FINISHED", "broken": "FAILED"}
    assert mlflow.loc["cut", "tags.vitsweep.error"].startswith("storage fault: OSError: [Errno 28]")
    assert mlflow.loc["asha", "tags.vitsweep.stopped_early"] == "true"
    assert mlflow.get("tags.vitsweep.error", {}).get("orphaned_done") in (None, "") or \
        pd_isna(mlflow.loc["orphaned_done", "tags.vitsweep.error"])

    again = tracking.start_trial_run(uri, experiment, "asha", params={"lr": 1e-3})  # a later launch continues it
    assert again == runs["asha"]
    tags = search_trial_runs(uri, "demo").set_index("trial_id").loc["asha"]
    assert tags["status"] == "RUNNING" and pd_isna(tags.get("tags.vitsweep.stopped_early"))


def pd_isna(value) -> bool:
    import pandas as pd

    return value is None or bool(pd.isna(value))


@pytest.mark.parametrize("command", ["analyze", "report"])
def test_an_unknown_study_lists_the_studies_that_exist(command, tmp_path, capsys):
    from records import tables
    from sweeps import cli

    results = tmp_path / "results"
    tables.write_trial(str(results), "demo", {"lr": 1e-3}, {"trial_id": "t", "study": "demo", "status": "finished"})
    for neighbour in ("storage/demo/train", "mlartifacts/1"):  # what a sweep also leaves there
        (results / neighbour).mkdir(parents=True)
    assert cli.main([command, "nosuchstudy", "--results", str(results)]) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert "nosuchstudy" in line and "['demo']" in line and "storage" not in line.split("'nosuchstudy'")[-1], line


def test_a_moved_copy_of_the_results_reads_and_writes_only_the_copy(tmp_path, monkeypatch, caplog):
    """Paths under the results root are stored relative to it, and an older row's absolute path is
    re-rooted under the folder being read: analyze on a copy reads the copy, also once the original moved;
    the copy's MLflow store, checked as every command checks it, keeps its artifacts in the copy."""
    import shutil

    from analysis.measuring.job import Measurer, list_checkpoints
    from records import stores, tables, tracking

    original = tmp_path / "results"
    cfg = RunConfig.for_dataset("shapes", preset="tiny", epochs=1, warmup_epochs=0, study="demo",
                                data_root=str(tmp_path / "data"))
    for trial_id in ("old", "new"):
        storage = original / "storage" / "demo"
        (storage / "checkpoints" / trial_id).mkdir(parents=True)
        torch.save({"model": ViT(cfg.model).state_dict(), "config": cfg.to_flat(), "epoch": 1},
                   storage / "checkpoints" / trial_id / "state.pt")
        (storage / "snapshots" / trial_id).mkdir(parents=True)
        shutil.copy(storage / "checkpoints" / trial_id / "state.pt", storage / "snapshots" / trial_id / "epoch_0000.pt")
        outcome = {"trial_id": trial_id, "study": "demo", "status": "finished", "epochs_completed": 1,
                   "checkpoint_path": str(storage / "checkpoints" / trial_id),
                   "snapshot_dir": str(storage / "snapshots" / trial_id)}
        with monkeypatch.context() as m:
            if trial_id == "old":  # a row of today's tables: absolute paths
                m.setattr(tables, "relative_path", lambda results, value: value)
            tables.write_trial(str(original), "demo", cfg.to_flat(), outcome)
    uri = stores.default_tracking_uri(str(original))
    tracking.start_trial_run(uri, tracking.ensure_experiment(uri, "demo"), "old", params={"lr": 1e-3})
    import pyarrow.parquet as pq

    stored = {r["trial_id"]: r for r in pq.read_table(original / "demo" / "trials").to_pylist()}
    assert stored["new"]["checkpoint_path"] == "storage/demo/checkpoints/new"
    assert stored["old"]["checkpoint_path"] == str(original / "storage/demo/checkpoints/old")

    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    for moment in ("original still there", "original moved away"):
        paths = [r["path"] for r in list_checkpoints(str(copy), "demo", "all")]
        assert len(paths) == 4 and all(p.startswith(f"{copy}/storage/demo/") for p in paths), (moment, paths)
        assert tables.read_trial(str(copy), "demo", "old")["snapshot_dir"] == f"{copy}/storage/demo/snapshots/old"
        if original.exists():
            original.rename(tmp_path / "moved")
    moved = sorted(p.relative_to(tmp_path / "moved") for p in (tmp_path / "moved").rglob("*"))
    copy_uri = stores.default_tracking_uri(str(copy))
    stores.check_tracking_uri(copy_uri)  # as `vitsweep analyze` and `report` check it first
    assert f"now keep their artifacts at {(copy / 'mlartifacts').as_uri()}" in caplog.text
    measurer = Measurer(str(copy), "demo", copy_uri, eval_size=8, batch_size=8, threads=1)
    row = next(r for r in list_checkpoints(str(copy), "demo") if r["trial_id"] == "old")
    out = measurer({k: [v] for k, v in row.items()})
    assert str(out["status"][0]) == "ok" and int(out["rows"][0]) > 0, out["status"][0]
    assert list(copy.glob("mlartifacts/*/*/artifacts/figures/layers_epoch_0001.png"))  # the figure, in the copy
    assert not original.exists()  # nothing written where the original was...
    assert sorted(p.relative_to(tmp_path / "moved") for p in (tmp_path / "moved").rglob("*")) == moved  # ...or is
    stores.check_tracking_uri(copy_uri)
    assert caplog.text.count("now keep their artifacts") == 1  # re-rooted once


def test_measuring_again_logs_no_second_value_and_the_parquet_file_comes_last(tmp_path, monkeypatch, capsys):
    """A checkpoint measured again (``--force``, or after its Parquet write failed) adds no second MLflow
    value at any (key, step); a value the new measurement changes is named in one note, and the
    measurements table has the new one. The Parquet file, written last, is what marks it measured."""
    import errno

    import mlflow

    from analysis.measuring import evaluate
    from analysis.measuring.job import Measurer, list_checkpoints
    from records import stores, tables, tracking

    results = tmp_path / "results"
    cfg = RunConfig.for_dataset("shapes", preset="tiny", epochs=1, warmup_epochs=0, study="demo",
                                data_root=str(tmp_path / "data"))
    (results / "storage" / "ckpt").mkdir(parents=True)
    torch.save({"model": ViT(cfg.model).state_dict(), "config": cfg.to_flat(), "epoch": 1},
               results / "storage" / "ckpt" / "state.pt")
    tables.write_trial(str(results), "demo", cfg.to_flat(), {
        "trial_id": "t", "study": "demo", "status": "finished", "epochs_completed": 1,
        "checkpoint_path": str(results / "storage" / "ckpt")})
    uri = stores.default_tracking_uri(str(results))
    run_id = tracking.start_trial_run(uri, tracking.ensure_experiment(uri, "demo"), "t", params={})
    measurer = Measurer(str(results), "demo", uri, eval_size=8, batch_size=8, threads=1)
    (row,) = list_checkpoints(str(results), "demo")
    batch = {k: [v] for k, v in row.items()}

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:  # the disk fills between the MLflow record and the Parquet file
        m.setattr(tables, "write_measurements", full_disk)
        with pytest.raises(OSError, match="No space left"):  # a storage fault ends the analysis, not "skipped"
            measurer(batch)
    assert tables.measured(str(results), "demo") == set()  # so the rerun measures it again
    assert str(measurer(batch)["note"][0]) == ""  # the same values: nothing changed, nothing logged twice
    assert tables.measured(str(results), "demo") == {("t", 1)}

    measure = evaluate.evaluate_checkpoint
    monkeypatch.setattr(evaluate, "evaluate_checkpoint", lambda *a, **k: [
        {**r, "value": r["value"] + 0.125} if (r["intervention"], r["metric"]) == ("clean", "acc") else r
        for r in measure(*a, **k)])
    note = str(measurer(batch)["note"][0])  # --force, with a value that changed
    assert f"MLflow run {run_id} keeps the earlier value of 1 metric point(s)" in note and "acc_clean" in note
    assert str(results / "demo" / "measurements") in note
    client = mlflow.MlflowClient(tracking_uri=uri)
    for key in client.get_run(run_id).data.metrics:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)), (key, steps)
    (kept,) = client.get_metric_history(run_id, "Headline/acc_clean")
    new = tables.read_table(str(results), "demo", "measurements").to_pandas().query(
        "intervention == 'clean' and metric == 'acc'")["value"]
    assert list(new) == [pytest.approx(kept.value + 0.125)]

    # A checkpoint not measured yet is refused at another number of images than the study's rows have.
    from analysis.measuring.job import check_n_images

    todo = [{"trial_id": "t2", "epoch": 1, "dataset": "shapes"}]
    check_n_images(str(results), "demo", todo, 8)
    for size, gives in ((500, 500), (None, 2000)):
        with pytest.raises(ValueError, match=f"measured so far are on 8 images, .* gives {gives}: .*--eval-size 8"):
            check_n_images(str(results), "demo", todo, size)

    # A full disk when the summary table is written ends `vitsweep analyze` in one line, last on stderr.
    from sweeps import cli

    monkeypatch.setattr(tables, "write_summary", full_disk)
    assert cli.main(["analyze", "demo", "--results", str(results), "--eval-size", "8"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: storage fault: OSError: [Errno 28] No space left on device; details in ")
    assert err[-1].endswith("; fix the storage, then run the same command again")
    assert sum(line.startswith("error:") for line in err) == 1 and not any("Traceback" in line for line in err)
    assert "Traceback" in Path(err[-1].split("; details in ")[1].split(";")[0]).read_text()


def test_resume_of_a_study_without_records_says_it_starts_fresh(tmp_path):
    from records import tables
    from sweeps import run as launcher

    results = str(tmp_path / "results")
    assert launcher._resume_line(results, "demo", 4, 4) == (
        f"--resume: study 'demo' has no records in {results}; starting it fresh")
    tables.write_trial(results, "demo", {}, {"trial_id": "t", "study": "demo", "status": "finished"})
    assert launcher._resume_line(results, "demo", 4, 3).startswith("--resume: 3 of 4 trials unfinished")


@pytest.mark.parametrize("exc, words", [
    (OSError(28, "No space left on device"), "No space left on device"),
    (OSError(30, "Read-only file system"), "Read-only file system"),
    (OSError("[Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device"), "errno 28"),
    (EOFError("Ran out of input"), "a Tune state file is truncated (EOFError"),
    (__import__("pickle").UnpicklingError("pickle data was truncated"), "a Tune state file is truncated"),
    (RuntimeError("Traceback ...\n  File x\nOSError: [Errno 122] Disk quota exceeded: '/r/t'"), "Disk quota exceeded"),
    (RuntimeError("TrackingError: log_metrics on MLflow 'http://h' still failing"), "MLflow unreachable: log_metrics"),
])
def test_storage_faults_are_recognised_wherever_they_hide(exc, words):
    from records.stores import TrackingError
    from sweeps.launch import faults

    wrapped = RuntimeError("Tune failed")
    wrapped.__cause__ = exc
    for e in (exc, wrapped):
        assert words in faults.classify(e), e
    assert faults.classify(ValueError("a bug")) is None and faults.classify(KeyError("trial_id")) is None
    assert faults.classify(TrackingError("down")).startswith("MLflow unreachable: down")


def test_a_tracking_server_that_stops_answering_stops_the_sweep_after_the_budget(monkeypatch):
    """The launcher's probe: a server gone for the retry budget is a storage fault, and the Tune
    stopper then stops the whole experiment (the trials' own calls give up within the same budget)."""
    import pickle
    import socket
    import time

    from sweeps.launch import faults

    with socket.socket() as s:  # a port nobody listens on: a killed server
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setattr(faults, "PROBE_INTERVAL_S", 0.2)
    watch = faults.FaultWatch(uri, budget_s=1.0)
    stopper = watch.stopper()
    assert not stopper.stop_all()
    start = time.monotonic()
    with watch:
        while not watch.found and time.monotonic() - start < 10:
            time.sleep(0.05)
    (line,) = watch.found
    assert line.startswith(f"MLflow tracking server '{uri}' did not answer for ") and "(budget 1 s)" in line
    assert stopper.stop_all() and not stopper("t", {}) and watch.tracking_down
    assert pickle.loads(pickle.dumps(watch)).found == watch.found  # Tune pickles it with its state


def test_with_the_tracking_server_gone_the_epilogue_closes_rows_and_leaves_mlflow_alone(tmp_path):
    from records import tables

    results = str(tmp_path / "results")
    tables.write_trial(results, "demo", {}, {"trial_id": "a", "study": "demo", "status": "running"})
    faults = close_unfinished(results, "demo", "http://127.0.0.1:9", "0", set(), "storage fault: gone",
                              tracking_down=True)  # port 9: a call would be refused, and retried
    assert faults == ["the MLflow runs of the unfinished trials are left for the next launch to close "
                      "(the tracking server does not answer)"]
    row = tables.read_trial(results, "demo", "a")
    assert row["status"] == "failed" and row["error"] == "storage fault: gone"


def test_a_really_full_disk_is_a_storage_fault_and_the_log_moves_off_it(small_disk, monkeypatch, caplog):
    import logging
    import time

    from records import tables
    from sweeps.launch import faults
    from sweeps.launch import lock as lock_module
    from sweeps.launch.lock import LaunchLock

    monkeypatch.setattr(lock_module, "HEARTBEAT_S", 0.05)  # the lock renews its lease while the disk is full
    mount, fill = small_disk
    results = str(mount / "results")
    tables.write_trial(results, "demo", {}, {"trial_id": "a", "study": "demo", "status": "running"})
    launch_log = faults.LaunchLog(results, "demo")
    assert launch_log.path.startswith(results)
    lock = LaunchLock(results, "demo")
    lock.acquire()
    fill()
    with pytest.raises(OSError) as info:  # pyarrow's own wording of ENOSPC
        tables.write_trial(results, "demo", {}, {"trial_id": "a", "study": "demo", "status": "failed"})
    assert "No space left on device" in faults.classify(info.value)
    launch_log.emit(logging.LogRecord("ray.tune", logging.ERROR, __file__, 0, "%s", ("x" * 100_000,), None))
    assert not launch_log.path.startswith(results)  # the tracebacks of the fault itself are kept
    assert "x" * 1000 in open(launch_log.path).read()
    launch_log.close()
    caplog.set_level(logging.WARNING, logger="vitsweep")
    deadline = time.monotonic() + 10
    while "could not renew the launch lock" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "No space left on device" in caplog.text
    assert [p.name for p in (mount / "results" / "demo").glob(".launch.lock*")] == [".launch.lock"]  # no temp
    lock.release()
    assert not list((mount / "results" / "demo").glob(".launch.lock*"))


def test_a_truncated_train_checkpoint_list_is_set_aside_so_the_trial_starts_over(tmp_path):
    """A full disk leaves Ray Train's checkpoint list empty; Train then fails the trial on every retry."""
    import json

    from sweeps.launch import faults

    storage = tmp_path / "storage"
    for name, text in (("cut", ""), ("half", '{"checkpoint_results": [{"che'), ("good", json.dumps({"a": 1}))):
        (storage / "demo" / "train" / name).mkdir(parents=True)
        (storage / "demo" / "train" / name / faults.TRAIN_SNAPSHOT).write_text(text)
    lines = faults.set_aside_truncated_train_state(str(storage), "demo", ["cut", "half", "good", "never-ran", "cut"])
    assert [line.split(": run ")[-1] for line in lines] == ["cut starts over", "half starts over"]
    for name in ("cut", "half"):
        assert not (storage / "demo" / "train" / name / faults.TRAIN_SNAPSHOT).exists()
        assert len(list((storage / "demo" / "train" / name).glob(f"{faults.TRAIN_SNAPSHOT}.truncated-*"))) == 1
    assert (storage / "demo" / "train" / "good" / faults.TRAIN_SNAPSHOT).read_text() == '{"a": 1}'


def test_analyze_continues_with_the_studys_own_choices_unless_given(tmp_path, monkeypatch):
    from sweeps import cli
    from sweeps.studies import demo

    seen = []
    monkeypatch.setattr(cli, "analyze_command", lambda args, results, uri: seen.append(args) or 0)
    results = str(tmp_path / "results")
    assert cli.main(["analyze", "demo", "--results", results]) == 0
    assert cli.main(["analyze", "demo", "--results", results, "--checkpoints", "final", "--eval-size", "0"]) == 0
    assert [(a.checkpoints, a.eval_size) for a in seen] == [(demo.CHECKPOINTS, demo.EVAL_SIZE), ("final", 0)]


def test_an_unreachable_ray_address_is_refused_in_one_line_before_anything_is_planned(tmp_path, capsys):
    import socket

    from sweeps import run as launcher
    from sweeps.launch import options

    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    parser = launcher.argparse.ArgumentParser()
    options.add_arguments(parser)
    args = parser.parse_args(["demo", "--address", f"127.0.0.1:{port}", "--gpus-per-trial", "0",
                              "--results", str(tmp_path / "results")])
    assert launcher.run(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: --address '127.0.0.1:{port}': nothing accepts a connection at 127.0.0.1:{port}")
    assert not (tmp_path / "results").exists()  # nothing planned, no folder made


def test_trial_temp_folders_are_swept_and_the_fallback_log_folder_is_private(tmp_path, monkeypatch):
    import stat
    import tempfile

    from sweeps.launch import faults

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    left = [tempfile.mkdtemp(prefix=f"vitsweep-{name}-") for name in ("pack-1", "t-s0-1a2b3c4d", "t-s0-1a2b3c4d-x")]
    faults.remove_trial_temp_folders(["pack-1", "t-s0-1a2b3c4d"])
    assert [Path(p).exists() for p in left] == [False, False, True]  # another run's folder stays
    monkeypatch.setattr(faults, "_PRIVATE", [])
    folder = faults.private_log_folder()
    assert folder == faults.private_log_folder() and Path(folder).parent == tmp_path
    assert stat.S_IMODE(Path(folder).stat().st_mode) == 0o700


def test_sighup_and_sigterm_stop_tune_as_ctrl_c_does_and_raise_outside_it():
    import os
    import signal
    import threading

    from sweeps.launch.faults import FaultWatch
    from sweeps.launch.interrupt import Interrupts

    watch = FaultWatch("sqlite:////nowhere/mlflow.db", 1.0)
    before = signal.getsignal(signal.SIGTERM)
    closed = threading.Event()
    with Interrupts() as interrupts:
        with interrupts.stopping(watch, closed.set):  # while Tune runs: its stopper stops every trial
            os.kill(os.getpid(), signal.SIGHUP)
            assert watch.interrupted == "the launch was interrupted (SIGHUP)" and watch.stopper().stop_all()
            assert closed.wait(5)  # the records are closed at once, before Tune has stopped anything
            os.kill(os.getpid(), signal.SIGHUP)  # the same signal again at once (the keeper's copy): counted once
            assert interrupts.received == ["SIGHUP"]
        with pytest.raises(KeyboardInterrupt):  # anywhere else: as Ctrl-C
            os.kill(os.getpid(), signal.SIGTERM)
    assert interrupts.received == ["SIGHUP", "SIGTERM"] and signal.getsignal(signal.SIGTERM) is before


def test_printed_commands_paste_into_a_shell_and_mlflows_own_links_leave_the_console():
    from sweeps.launch import progress

    lines = progress.closing_lines("/tmp/my results", "s", "sqlite:////tmp/my results/mlflow.db", report=False)
    assert "vitsweep status s --results '/tmp/my results'" in lines
    assert "mlflow ui --backend-store-uri 'sqlite:////tmp/my results/mlflow.db' --workers 1" in lines
    assert progress.classify_line("🏃 View run t0 at: http://127.0.0.1:5000/#/experiments/1/runs/ab\n")
    assert progress.classify_line("🧪 View experiment at: http://127.0.0.1:5000/#/experiments/1\n")
