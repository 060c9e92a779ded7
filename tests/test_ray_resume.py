"""A sweep killed mid-way (a real SIGKILL to a real launcher process) while its checkpoints lag its
epochs table, and resumed in packs; and the hparam study end to end. Each launcher starts its own
local Ray."""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from records import stores, tables, tracking

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parent.parent
# Checkpoints at epochs 2 and 4 only: during epoch 4 the epochs table (3) runs ahead of the checkpoint (2),
# as with GPU checkpoints throttled by checkpoint_interval_s.
SWEEP = ["demo", "--set", "epochs=4", "--set", "checkpoint_every=2", "--set", "max_train_images=1024",
         "--max-concurrent", "2"]


def launcher(*argv, ray_tmp: str):
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "sweeps/run.py", *argv], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def kill_ray_under(ray_tmp: str) -> None:
    """Kill whatever a killed launcher's Ray left behind, found by its own temp dir (never `ray stop`)."""
    subprocess.run(["pkill", "-9", "-f", ray_tmp], check=False)


def finished(results: Path) -> dict:
    table = tables.read_table(str(results), "demo", "trials")
    return {} if table is None else {r["trial_id"]: r for r in table.to_pylist() if r["status"] == "finished"}


def lagging(results: Path) -> dict[str, int]:
    """Unfinished trials whose epochs table runs ahead of their stored checkpoint (epoch >= 2):
    trial id -> the checkpoint's epoch."""
    from records import files, layout
    from trainables import checkpoints

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


def assert_listens_on_loopback_only(pid: int) -> None:
    """From the OS socket table: no listening socket of the launcher or any process it
    started (GCS, raylet, dashboard and its agent, Ray workers, Train workers) is bound
    beyond loopback (0.0.0.0, ::, or an address of this machine)."""
    import ipaddress

    import psutil  # the test extra (pyproject.toml); `make test` installs it
    root = psutil.Process(pid)
    listening = []
    for p in [root, *root.children(recursive=True)]:
        try:
            listening += [(p.name(), c.laddr) for c in p.net_connections(kind="inet")
                          if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:
            continue
    assert len(listening) >= 5, listening  # GCS, raylet, dashboard, agents: the scan saw Ray

    def loopback(ip: str) -> bool:
        addr = ipaddress.ip_address(ip.split("%")[0])
        return addr.is_loopback or bool(getattr(addr, "ipv4_mapped", None) and addr.ipv4_mapped.is_loopback)

    assert all(loopback(laddr.ip) for _, laddr in listening), [x for x in listening if not loopback(x[1].ip)]


def test_killed_sweep_resumes_without_rerunning_or_duplicating(tmp_path):
    results = tmp_path / "results"
    first_tmp, second_tmp = (tempfile.mkdtemp(prefix="vsk-", dir="/tmp") for _ in range(2))
    try:
        proc = launcher(*SWEEP, "--results", str(results), ray_tmp=first_tmp)
        deadline = time.time() + 420
        while not finished(results) and proc.poll() is None and time.time() < deadline:
            time.sleep(1)
        assert proc.poll() is None, f"the sweep ended before it could be killed:\n{proc.stdout.read()[-3000:]}"
        # While it runs: a second launch of the study is refused at once, before its Ray...
        second = launcher(*SWEEP, "--results", str(results), ray_tmp=second_tmp)
        out, _ = second.communicate(timeout=120)
        assert second.returncode == 2, out[-3000:]
        assert f"another launch of study 'demo' into {results} is running" in out and f"pid {proc.pid}," in out
        assert not Path(second_tmp, "ray").exists()  # no Ray was started
        # ...and every socket the first launch's Ray listens on is bound to loopback.
        assert_listens_on_loopback_only(proc.pid)
        assert not (Path.home() / ".ray" / "auth_token").stat().st_mode & 0o077  # the token is private
        # Killed while a running trial's checkpoint (epoch 2) lags its epochs table (epoch 3).
        while not lagging(results) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kill_ray_under(first_tmp)
        done_before, lag = finished(results), lagging(results)
        assert 1 <= len(done_before) < 4 and lag, (done_before.keys(), lag)
        stamps = {t: (results / "demo" / "trials" / f"{t}.parquet").stat().st_mtime_ns for t in done_before}
        trained = pq.read_table(results / "demo" / "epochs").to_pandas().set_index(["trial_id", "epoch"])

        # Resumed in packs of two: the unfinished trials, trained alone so far, re-form by the epoch of
        # their checkpoints (not of the epochs table) and each finds its own checkpoint.
        resumed = launcher(*SWEEP, "--results", str(results), "--resume", "--pack", "2", ray_tmp=second_tmp)
        out, _ = resumed.communicate(timeout=600)
        assert resumed.returncode == 0, out[-4000:]
        assert f"pid {proc.pid} is no longer running" in out  # the dead launch's lock, taken over
    finally:
        kill_ray_under(first_tmp)
        kill_ray_under(second_tmp)

    trials = pq.read_table(results / "demo" / "trials").to_pandas()
    assert len(trials) == 4 and set(trials["status"]) == {"finished"}
    for t, stamp in stamps.items():  # finished trials were not run again
        assert (results / "demo" / "trials" / f"{t}.parquet").stat().st_mtime_ns == stamp
    epochs = pq.read_table(results / "demo" / "epochs").to_pandas()
    assert not epochs.duplicated(["trial_id", "epoch"]).any()
    assert epochs.groupby("trial_id")["epoch"].apply(sorted).map(list).tolist() == [[1, 2, 3, 4]] * 4
    by_epoch = epochs.set_index(["trial_id", "epoch"])
    for trial_id, stored in lag.items():  # nothing restarted from epoch 1: the checkpointed epochs stay as run
        for epoch in range(1, stored + 1):
            assert by_epoch.loc[(trial_id, epoch), "wall_time_s"] == trained.loc[(trial_id, epoch), "wall_time_s"]

    uri = stores.default_tracking_uri(str(results))
    runs = tracking.search_trial_runs(uri, "demo")
    assert sorted(runs["trial_id"]) == sorted(trials["trial_id"])  # exactly one run per trial
    assert set(runs["status"]) == {"FINISHED"}
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    for run_id in runs["run_id"]:  # concurrent trials on the SQLite default lost no metric
        assert [m.step for m in client.get_metric_history(run_id, "epochs/eval_acc")] == [1, 2, 3, 4]


def test_hparam_search_writes_a_best_config_that_other_studies_pick_up(tmp_path):
    results = tmp_path / "results"
    ray_tmp = tempfile.mkdtemp(prefix="vsh-", dir="/tmp")
    try:
        # Two samples: both run at once on 2 CPUs, still a search (the TPE searcher proposes, ASHA judges).
        proc = launcher("hparam", "--datasets", "shapes", "--preset", "tiny", "--epochs", "3", "--samples", "2",
                        "--set", "max_train_images=512", "--set", "batch_size=64", "--results", str(results),
                        ray_tmp=ray_tmp)
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-4000:]
    finally:
        kill_ray_under(ray_tmp)
    best = results / "hparam" / "best_config.json"
    import json

    doc = json.loads(best.read_text())
    assert set(doc["best_config"]) == {"lr", "weight_decay", "warmup_epochs"}
    assert doc["score"]["split"] == "holdout" and doc["trials"] == 2
    trials = pq.read_table(results / "hparam" / "trials").to_pandas()
    assert len(trials) == 2 and set(trials["eval_split"]) == {"holdout"}
    assert trials["test_acc"].isna().all()  # scored on holdout, the test split never looked at
    runs = tracking.search_trial_runs(stores.default_tracking_uri(str(results)), "hparam")
    assert len(runs) == 2 and set(runs["status"]) <= {"FINISHED"}

    # Another study's plan picks the file up (in-process: the dry run's JSON is tests/test_sweeps.py's).
    from sweeps import options
    from sweeps import run as sweep_launcher

    parser = sweep_launcher.argparse.ArgumentParser()
    options.add_arguments(parser)
    configs = [c.to_flat() for c in options.build_trials(
        parser.parse_args(["study_l", "--dry-run", "--defaults-from", str(best)]))]
    assert all(c["lr"] == pytest.approx(doc["best_config"]["lr"]) for c in configs)
    assert all(c["weight_decay"] == pytest.approx(doc["best_config"]["weight_decay"]) for c in configs)
