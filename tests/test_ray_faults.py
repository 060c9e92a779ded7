"""A launch interrupted, killed and out of storage mid-sweep on a real local Ray, each launcher a real
process with its own Ray, then the analysis stage under the same faults. The faults of one sweep take
turns as named phases over one module fixture (``sweep``; each launch of it costs a Ray start and Train
workers), each phase skipped if the one before it failed.

A real SIGTERM mid-training ends the launch as Ctrl-C does: exit code 130, every unfinished trial
``failed`` with the reason, no MLflow run RUNNING, the closing lines, and ``vitsweep status`` says
the launch was interrupted. A resumed launch SIGKILLed while a trial's checkpoint lags its epochs
table leaves its lock to the next launch; a second launch meanwhile is refused before its Ray, and
every socket of the running one listens on loopback only. A storage wrapper
(``tests/faultfs/sitecustomize.py``, in every process of the sweep) makes each Parquet write under the
results folder raise ``OSError(ENOSPC)`` from the moment the test says so: the launcher ends with one
``error: storage fault`` line, last on stderr, naming the log that keeps Ray's and Tune's tracebacks,
exit code 1, no MLflow run RUNNING, no trial called stopped. With the storage fixed (and Tune's and
Train's own state truncated), ``--resume`` in packs finishes exactly the unfinished trials from their
own checkpoints, each epoch and MLflow step recorded once. ``vitsweep analyze`` on a full disk ends in
the same one line; run again, it measures every checkpoint once, each MLflow point logged once."""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import FAST_EVAL_SIZE
from mlflow_runs import search_trial_runs
from test_ray_resume import assert_listens_on_loopback_only, kill_ray_under

from records import layout, stores, tables, tracking

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parent.parent
# Checkpoints at epochs 2 and 4 only: during epoch 4 the epochs table (3) runs ahead of the checkpoint (2),
# as with GPU checkpoints throttled by checkpoint_interval_s.
SWEEP = ["demo", "--set", "epochs=4", "--set", "checkpoint_every=2", "--set", "max_train_images=1024",
         "--max-concurrent", "2", "--max-failures", "0"]


def finished(results: Path) -> dict:
    table = tables.read_table(str(results), "demo", "trials")
    return {} if table is None else {r["trial_id"]: r for r in table.to_pylist() if r["status"] == "finished"}


def lagging(results: Path) -> dict[str, int]:
    """Unfinished trials whose epochs table runs ahead of their stored checkpoint (epoch >= 2):
    trial id -> the checkpoint's epoch."""
    from records import files, layout
    from trainables.loop import checkpoints

    table = tables.read_table(str(results), "demo", "epochs")
    if table is None:
        return {}
    done, storage, lag = finished(results), str(results / "storage"), {}
    for trial_id in set(table.column("trial_id").to_pylist()) - set(done):
        ran = max(e for t, e in zip(table.column("trial_id").to_pylist(), table.column("epoch").to_pylist())
                  if t == trial_id)
        stored = files.read_json(checkpoints.epoch_file(layout.checkpoint_dir(storage, "demo", trial_id)))
        if stored and 2 <= stored["epoch"] < ran:
            lag[trial_id] = stored["epoch"]
    return lag


def _launch(results: Path, *extra: str, ray_tmp: str, out: Path,
            command: tuple[str, ...] = ("sweeps/run.py", *SWEEP)) -> subprocess.Popen:
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": f"{ROOT / 'tests' / 'faultfs'}{os.pathsep}{ROOT}", "VITSWEEP_TEST_FAULT_DIR": str(results)}
    return subprocess.Popen([sys.executable, *command, "--results", str(results), *extra], cwd=ROOT,
                            env=env, start_new_session=True, stdout=open(out.with_suffix(".out"), "w"),  # noqa: SIM115
                            stderr=open(out.with_suffix(".err"), "w"))  # noqa: SIM115


def _assert_one_fault_line(out: Path, words: str, then: str = "launch again with --resume") -> str:
    err = out.with_suffix(".err").read_text().strip().splitlines()
    last = err[-1]
    assert last.startswith("error: storage fault: ") and words in last, err[-20:]
    assert last.endswith(f"fix the storage, then {then}")
    assert sum(line.startswith("error:") for line in err) == 1 and not any("Traceback" in x for x in err), err
    log = Path(re.search(r"; details in (\S+);", last).group(1))
    text = log.read_text()
    assert words in text and "Traceback" in text  # Ray's and Tune's tracebacks are kept, in the log
    return last


def _no_run_running(results: Path) -> None:
    runs = search_trial_runs(stores.default_tracking_uri(str(results)), "demo")
    assert "RUNNING" not in set(runs["status"]), runs[["trial_id", "status"]]
    table = tables.read_table(str(results), "demo", "trials")
    assert table is None or "stopped" not in set(table.column("status").to_pylist())  # no scheduler here


def _written_after(results: Path, table: str, since: float) -> bool:
    return any(p.stat().st_mtime > since for p in (results / "demo" / table).glob("*.parquet"))


def _forget_measurements(folder: Path, units: set[tuple[str, int]]) -> None:
    """As if those checkpoints had never been measured: their own files gone, and their rows (and their
    entries in the footer that lists what a compacted file holds) out of the compacted files."""
    import json

    for trial_id, epoch in units:
        (folder / layout.unit_file(trial_id, epoch)).unlink(missing_ok=True)
    for part in folder.glob("compacted-*.parquet"):
        rows = pq.read_table(part)
        pairs = zip(rows["trial_id"].to_pylist(), rows["checkpoint_epoch"].to_pylist())
        keep = [pair not in units for pair in pairs]
        held = [u for u in json.loads(pq.read_metadata(part).metadata[tables.UNITS_KEY]) if tuple(u) not in units]
        pq.write_table(rows.filter(keep).replace_schema_metadata({tables.UNITS_KEY: json.dumps(held)}), part)


def _launcher_of(keeper: subprocess.Popen) -> int:
    """The pid of the launch process that ``sweeps.launch.supervise`` keeps (the keeper's one child)."""
    import psutil

    (child,) = psutil.Process(keeper.pid).children()
    return child.pid


def _output(out: Path) -> str:
    return out.with_suffix(".out").read_text() + out.with_suffix(".err").read_text()


class Sweep:
    """One sweep's state across its launches (the phases below run in file order, each after the last)."""

    def __init__(self, folder: Path):
        self.folder, self.results = folder, folder / "results"
        self.fault = self.results / ".fault"
        self.temps = [tempfile.mkdtemp(prefix="vsf-", dir="/tmp") for _ in range(5)]
        self.passed: set[str] = set()

    def after(self, phase: str) -> None:
        if phase not in self.passed:
            pytest.skip(f"the phase before ({phase}) did not pass")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    state = Sweep(tmp_path_factory.mktemp("faults"))
    yield state
    for temp in state.temps:
        kill_ray_under(temp)


def test_sigterm_mid_sweep_exits_130_with_every_unfinished_trial_failed_and_why(sweep):
    # SIGTERM (what `timeout`, systemd and SLURM send) once trials train (their rows say running).
    from sweeps.launch import status

    results, tmp = sweep.results, sweep.folder
    proc = _launch(results, ray_tmp=sweep.temps[0], out=tmp / "term")
    deadline = time.time() + 420
    while proc.poll() is None and time.time() < deadline and not _written_after(results, "trials", 0):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 130, (tmp / "term.err").read_text()[-3000:]
    err = (tmp / "term.err").read_text()
    assert "Traceback" not in err and "the launch was interrupted (SIGTERM)" in err, err[-3000:]
    assert "vitsweep demo: results in" in (tmp / "term.out").read_text()  # the closing lines
    _no_run_running(results)
    rows = tables.read_table(str(results), "demo", "trials").to_pylist()
    assert "running" not in {r["status"] for r in rows}
    assert all(r["error"] == "the launch was interrupted (SIGTERM)" for r in rows if r["status"] == "failed")
    assert "in its train stage: the launch was interrupted (SIGTERM)" in status.format_status(
        status.study_status(str(results), "demo"))
    sweep.passed.add("sigterm")


def test_a_second_launch_is_refused_and_a_sigkill_leaves_a_checkpoint_lagging_its_epochs_table(sweep):
    # Resumed, then SIGKILLed once a trial finished and a running trial's checkpoint (epoch 2) lags its
    # epochs table (epoch 3): every process of the launch at once, keeper, launcher and Ray, as a
    # scheduler's cgroup kill does (a SIGKILL of the keeper alone is a signal to the launcher).
    sweep.after("sigterm")
    results, tmp, temps = sweep.results, sweep.folder, sweep.temps
    sweep.deadline = deadline = time.time() + 420
    proc = _launch(results, "--resume", ray_tmp=temps[1], out=tmp / "killed")
    while not finished(results) and proc.poll() is None and time.time() < deadline:
        time.sleep(1)
    assert proc.poll() is None, f"it ended before it could be killed:\n{_output(tmp / 'killed')[-3000:]}"
    # While it runs: a second launch of the study is refused at once, before its Ray...
    second = _launch(results, ray_tmp=temps[2], out=tmp / "refused")
    assert second.wait(timeout=120) == 2, _output(tmp / "refused")[-3000:]
    out = _output(tmp / "refused")
    launcher = _launcher_of(proc)
    assert f"another launch of study 'demo' into {results} is running" in out and f"pid {launcher}," in out
    assert not Path(temps[2], "ray").exists()  # no Ray was started
    # ...and every socket the launch's Ray listens on is bound to loopback.
    assert_listens_on_loopback_only(proc.pid)
    assert not (Path.home() / ".ray" / "auth_token").stat().st_mode & 0o077  # the token is private
    while not lagging(results) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    for group in (proc.pid, launcher):
        os.killpg(group, signal.SIGKILL)
    proc.wait()
    sweep.killed = launcher
    kill_ray_under(temps[1])
    done_before, sweep.lag = finished(results), lagging(results)
    assert 1 <= len(done_before) < 4 and sweep.lag, (done_before.keys(), sweep.lag)
    sweep.stamps = {t: row["ended_at"] for t, row in done_before.items()}  # (their files get compacted)
    sweep.trained = pq.read_table(results / "demo" / "epochs").to_pandas().set_index(["trial_id", "epoch"])
    sweep.passed.add("sigkill")


def test_a_full_disk_ends_the_resumed_launch_in_one_line_and_it_took_the_killed_launchs_lock(sweep):
    # Resumed; the disk fills up once a trial of this launch has opened its row (the next write fails).
    sweep.after("sigkill")
    results, tmp = sweep.results, sweep.folder
    started = time.time()
    proc = _launch(results, "--resume", ray_tmp=sweep.temps[3], out=tmp / "full")
    while proc.poll() is None and time.time() < sweep.deadline + 300:
        if _written_after(results, "trials", started):
            sweep.fault.write_text("ENOSPC")
            break
        time.sleep(0.2)
    assert proc.wait(timeout=420) == 1
    _assert_one_fault_line(tmp / "full", "No space left on device")
    _no_run_running(results)
    assert f"pid {sweep.killed} is no longer running" in _output(tmp / "full")  # the killed launch's lock, taken
    sweep.passed.add("full disk")


def test_with_the_storage_fixed_a_packed_resume_finishes_exactly_the_unfinished_trials(sweep):
    sweep.after("full disk")
    results, tmp = sweep.results, sweep.folder
    # Fixed; Tune's own experiment state is truncated as a full disk leaves it: --resume needs none.
    sweep.fault.unlink()
    states = list((results / "storage" / "demo").glob("tune-*/experiment_state-*.json"))
    assert states
    for state in states:
        state.write_bytes(state.read_bytes()[: len(state.read_bytes()) // 3])
    # ... and so is Ray Train's checkpoint list of a trial that did not finish (it would fail every retry).
    unfinished = {r["trial_id"] for r in tables.read_table(str(results), "demo", "trials").to_pylist()
                  if r["status"] != "finished"}
    lists = [p for p in (results / "storage" / "demo" / "train").glob("*/checkpoint_manager_snapshot.json")
             if p.parent.name in unfinished]
    for cut in lists[:1]:
        cut.write_bytes(b"")
    before = {r["trial_id"] for r in tables.read_table(str(results), "demo", "trials").to_pylist()
              if r["status"] == "finished"}
    # Resumed in packs of two: the unfinished trials, trained alone so far, re-form by the epoch of
    # their checkpoints (not of the epochs table) and each finds its own checkpoint.
    proc = _launch(results, "--resume", "--pack", "2", ray_tmp=sweep.temps[4], out=tmp / "fixed")
    assert proc.wait(timeout=600) == 0, (tmp / "fixed.err").read_text()[-3000:]
    kill_ray_under(sweep.temps[4])

    err = (tmp / "fixed.err").read_text()
    assert all(f"set aside as {cut}.truncated-" in err for cut in lists[:1])
    assert f"--resume: {4 - len(before)} of 4 trials unfinished" in err
    assert f"demo: {4 - len(before)} of {4 - len(before)} trials ended" in (tmp / "fixed.out").read_text()
    trials = pq.read_table(results / "demo" / "trials").to_pandas()
    assert len(trials) == 4 and set(trials["status"]) == {"finished"}
    for t, stamp in sweep.stamps.items():  # trials finished before the kill were not run again
        assert trials.set_index("trial_id").loc[t, "ended_at"] == stamp
    epochs = pq.read_table(results / "demo" / "epochs").to_pandas()
    assert not epochs.duplicated(["trial_id", "epoch"]).any()
    assert epochs.groupby("trial_id")["epoch"].apply(sorted).map(list).tolist() == [[1, 2, 3, 4]] * 4
    by_epoch = epochs.set_index(["trial_id", "epoch"])
    for trial_id, stored in sweep.lag.items():  # nothing restarted from epoch 1: the checkpointed epochs stay
        for epoch in range(1, stored + 1):
            assert by_epoch.loc[(trial_id, epoch), "wall_time_s"] == sweep.trained.loc[(trial_id, epoch),
                                                                                       "wall_time_s"]
    sweep.trial_ids = sorted(trials["trial_id"])
    sweep.passed.add("resume")


def test_each_mlflow_step_is_logged_once_across_the_four_launches_and_no_lock_is_left(sweep):
    sweep.after("resume")
    import mlflow

    uri = stores.default_tracking_uri(str(sweep.results))
    runs = search_trial_runs(uri, "demo")
    assert sorted(runs["trial_id"]) == sweep.trial_ids and set(runs["status"]) == {"FINISHED"}
    client = mlflow.MlflowClient(tracking_uri=uri)
    for run_id in runs["run_id"]:  # each step once, across the four launches (concurrent trials on SQLite)
        assert [m.step for m in client.get_metric_history(run_id, "epochs/eval_acc")] == [1, 2, 3, 4]
        assert [m.step for m in client.get_metric_history(run_id, "Headline/test_acc")] == [4]
    assert not list((sweep.results / "demo").glob(".launch.lock*"))  # no lock, no half-written lock file


def test_the_analysis_of_a_copy_on_a_full_disk_ends_in_one_line_and_the_rerun_measures_each_checkpoint_once(
        demo_results, ray_local, tmp_path):
    """On a copy of the demo's results (its MLflow store re-rooted into the copy), two final checkpoints to
    measure again: on a full disk (the wrapper, in the measuring actors too) ``vitsweep analyze`` ends in the
    one line; after the space is freed, the same command measures each once, no MLflow point twice, and
    nothing of the original changes."""
    import shutil

    import mlflow

    from sweeps import cli

    def original_state():
        return sorted((str(p.relative_to(demo_results)), p.stat().st_mtime_ns) for p in demo_results.rglob("*")
                      if p.is_file() and "/logs/" not in str(p) and not p.name.endswith(".txt"))

    before = original_state()
    results = tmp_path / "copy"
    shutil.copytree(demo_results, results, ignore=shutil.ignore_patterns(".launch.lock*"))
    trials = pq.read_table(results / "demo" / "trials").to_pandas()
    redo = {(t, int(e)) for t, e in zip(trials["trial_id"][:2], trials["epochs_completed"][:2])}
    _forget_measurements(results / "demo" / "measurements", redo)
    (results / ".fault").write_text("ENOSPC")
    ray_tmp = tempfile.mkdtemp(prefix="vsa-", dir="/tmp")
    analyze = ("-m", "sweeps.cli", "analyze", "demo", "--checkpoints", "final", "--eval-size", str(FAST_EVAL_SIZE))
    try:
        proc = _launch(results, ray_tmp=ray_tmp, out=tmp_path / "analyze", command=analyze)
        assert proc.wait(timeout=420) == 1, (tmp_path / "analyze.err").read_text()[-3000:]
    finally:
        kill_ray_under(ray_tmp)
    _assert_one_fault_line(tmp_path / "analyze", "No space left on device", then="run the same command again")
    assert not redo & tables.measured(str(results), "demo")

    (results / ".fault").unlink()  # the space freed: the same command (here on the suite's Ray) completes it
    assert cli.main(["analyze", "demo", "--results", str(results), "--checkpoints", "final",
                     "--eval-size", str(FAST_EVAL_SIZE)]) == 0
    assert redo <= tables.measured(str(results), "demo")
    uri = stores.default_tracking_uri(str(results))
    client = mlflow.MlflowClient(tracking_uri=uri)
    for run_id in search_trial_runs(uri, "demo")["run_id"]:
        for key in client.get_run(run_id).data.metrics:
            steps = [m.step for m in client.get_metric_history(run_id, key)]
            assert len(steps) == len(set(steps)), (run_id, key, steps)
    assert original_state() == before


def test_a_missing_data_set_in_a_worker_fails_the_trial_without_retries(ray_local, tmp_path):
    """Data a retry cannot bring (the node's data root is a file): the Train worker
    reports it instead of raising, so neither Train nor Tune retries the trial."""
    from ray import tune

    from records import tables
    from trainables.config.run_config import RunConfig
    from trainables.trial.lifecycle import LaunchSettings
    from trainables.trial.ray_start import DRIVER_RESOURCES
    from trainables.trial.ray_trial import UNRETRIABLE, run_trial

    not_a_folder = tmp_path / "data"
    not_a_folder.write_text("")
    cfg = RunConfig.for_dataset("cifar10", preset="tiny", study="demo", data_root=str(not_a_folder),
                                epochs=1, warmup_epochs=0)
    results = str(tmp_path / "results")
    uri = stores.default_tracking_uri(results)
    settings = LaunchSettings(study="demo", results=results, storage=str(tmp_path / "storage"), mlflow_uri=uri,
                              experiment_id=tracking.ensure_experiment(uri, "demo"), max_failures=2)
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, settings=settings, trials={cfg.trial_id: cfg}), DRIVER_RESOURCES)
    grid = tune.Tuner(
        trainable, param_space={"trial_id": cfg.trial_id},
        run_config=tune.RunConfig(storage_path=str(tmp_path / "tune"), failure_config=tune.FailureConfig(2)),
    ).fit()
    (result,) = grid
    assert result.error is None and "is a file; expected a folder" in result.metrics[UNRETRIABLE]
    (run,) = search_trial_runs(uri, "demo").to_dict("records")
    assert run["status"] == "FAILED" and run["tags.vitsweep.attempt"] == "1"  # one attempt: no Tune retry
    assert "is a file; expected a folder" in run["tags.vitsweep.error"]
    assert tables.read_trial(results, "demo", cfg.trial_id)["status"] == "failed"


@pytest.mark.timeout(180)
def test_a_trial_whose_workers_cannot_be_placed_ends_failed_with_why_instead_of_waiting_forever(ray_local, tmp_path):
    """Every CPU held by a placement group that never frees them (as a lost node's leaked group, or
    a cluster with no capacity left): Ray Train gives up on starting the trial's worker after the
    placement timeout, tries once more, and the trial ends failed, saying why."""
    from ray import tune
    from ray.util.placement_group import placement_group, remove_placement_group

    from trainables.config.run_config import RunConfig
    from trainables.trial.lifecycle import LaunchSettings
    from trainables.trial.ray_start import DRIVER_RESOURCES
    from trainables.trial.ray_trial import run_trial

    cfg = RunConfig.for_dataset("shapes", preset="tiny", study="demo", epochs=1, warmup_epochs=0)
    results = str(tmp_path / "results")
    uri = stores.default_tracking_uri(results)
    settings = LaunchSettings(study="demo", results=results, storage=str(tmp_path / "storage"), mlflow_uri=uri,
                              experiment_id=tracking.ensure_experiment(uri, "demo"), max_failures=0,
                              placement_timeout_s=2)
    held = placement_group([{"CPU": ray_local.cluster_resources()["CPU"]}])
    assert held.wait(30)
    try:
        trainable = tune.with_resources(
            tune.with_parameters(run_trial, settings=settings, trials={cfg.trial_id: cfg}), DRIVER_RESOURCES)
        (result,) = tune.Tuner(trainable, param_space={"trial_id": cfg.trial_id},
                               run_config=tune.RunConfig(storage_path=str(tmp_path / "tune"))).fit()
    finally:
        remove_placement_group(held)
    assert result.error is not None
    row = tables.read_trial(results, "demo", cfg.trial_id)
    assert row["status"] == "failed" and "found no node with {'CPU': 1.0} free in two tries of 2 s" in row["error"]
    (run,) = search_trial_runs(uri, "demo").to_dict("records")
    assert run["status"] == "FAILED" and run["tags.vitsweep.error"] == row["error"]
