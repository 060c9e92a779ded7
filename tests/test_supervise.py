"""The launch's keeper (``sweeps.launch.supervise``), with real processes and a real MLflow store, no Ray: a
launch that dies without a word (as Ray's core ends it when the local raylet dies) is closed by its
keeper, and a keeper killed by SIGKILL still tells its launch to stop."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow

from records import manifest, stores, tables

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = '''
import os, signal, sys, time
from pathlib import Path
from records import manifest, stores, tracking
from sweeps.launch import supervise
from sweeps.launch.lock import LaunchLock
from trainables.config.run_config import RunConfig
from trainables.trial.lifecycle import LaunchSettings, open_trials

results, mode = sys.argv[1], sys.argv[2]

def launch(argv):
    """Opens its records as a launch does, says so, then dies as told."""
    uri = stores.default_tracking_uri(results)
    settings = LaunchSettings(study="demo", results=results, storage=results + "/storage", mlflow_uri=uri,
                              experiment_id=tracking.ensure_experiment(uri, "demo"))
    with LaunchLock(results, "demo"), manifest.heartbeat(results, "demo"):
        open_trials(settings, [RunConfig.for_dataset("shapes", preset="tiny", study="demo")], None)
        signal.signal(signal.SIGTERM, lambda *_: (Path(results, "told").write_text("SIGTERM"), os._exit(130)))
        Path(results, "ready").write_text(str(os.getpid()))
        if mode == "die":
            os._exit(1)  # what Ray's core worker does when the raylet dies: no handler runs
        time.sleep(60)
    return 0

sys.exit(supervise.run(sys.argv[1:], launch, lambda: (results, "demo", None, "launch again with --resume")))
'''


def _start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, str]:
    script, results = tmp_path / "launch.py", str(tmp_path / "results")
    script.write_text(LAUNCH)
    keeper = subprocess.Popen([sys.executable, str(script), results, mode], cwd=ROOT, stderr=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True, start_new_session=True)
    return keeper, results


def test_a_launch_that_dies_without_a_word_is_closed_by_its_keeper_in_one_line(tmp_path):
    keeper, results = _start(tmp_path, "die")
    _, err = keeper.communicate(timeout=120)
    assert keeper.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: the launch process ended with exit code 1 and no last word") and \
        last.endswith("launch again with --resume"), err
    (row,) = tables.read_table(results, "demo", "trials").to_pylist()
    assert row["status"] == "failed" and row["error"].startswith("the launch process ended with exit code 1")
    client = mlflow.MlflowClient(stores.default_tracking_uri(results))
    (run,) = client.search_runs([client.get_experiment_by_name("demo").experiment_id])
    assert run.info.status == "FAILED"
    beat = manifest.read_heartbeat(results, "demo")
    assert beat["ended"] and beat["outcome"] == row["error"]
    assert not list(Path(results, "demo").glob(".launch.lock*"))  # the dead launch's lock is gone


def test_a_keeper_killed_by_sigkill_still_stops_its_launch(tmp_path):
    keeper, results = _start(tmp_path, "wait")
    ready = Path(results, "ready")
    deadline = time.monotonic() + 60
    while not ready.exists() and keeper.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready.exists(), keeper.communicate()[1]
    os.killpg(keeper.pid, signal.SIGKILL)  # the keeper's group: the launch has a group of its own
    keeper.wait()
    told = Path(results, "told")
    deadline = time.monotonic() + 30
    while not told.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert told.read_text() == "SIGTERM"  # so it closes its records and its Ray as at any signal
