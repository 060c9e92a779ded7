"""Packed trials on a real local Ray (a launcher process of its own, so the fault wrappers of
tests/trialfaults/ reach its workers): two packs of two, each one Tune trial, each member still its own
trial's records, a member that diverges is closed at once and never rejoins, a killed worker's retry
finishes the others once; the node's workers share one decoded copy of the data set."""

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from mlflow_runs import search_trial_runs
from test_ray_resume import ROOT, kill_ray_under

from records import stores, tables
from sweeps import run as launcher
from sweeps.launch import options
from trainables.loop import checkpoints

pytestmark = pytest.mark.ray
SWEEP = ["demo", "--seeds", "1", "--pack", "4", "--set", "epochs=3", "--set", "max_train_images=256"]


def launch(*argv, ray_tmp: str, env: dict | None = None, timeout: int = 600, rc: int = 0) -> str:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "sweeps/run.py", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "RAY_TMPDIR": ray_tmp, **(env or {})})
    out = proc.stdout + proc.stderr
    assert proc.returncode == rc, out[-4000:]
    return out


def planned_packs():
    parser = launcher.argparse.ArgumentParser()
    options.add_arguments(parser)
    args = parser.parse_args([*SWEEP, "--dry-run"])
    return options.build_packs(args, options.build_trials(args))


def test_a_diverged_member_and_a_killed_worker_leave_every_other_member_finished_once(tmp_path):
    import tempfile

    results = tmp_path / "results"
    packs = planned_packs()
    survivor, diverged = packs[0].trial_ids[0], packs[0].trial_ids[1]
    marker = tmp_path / "killed"
    hooks = {"PYTHONPATH": f"{ROOT / 'tests' / 'trialfaults'}{os.pathsep}{ROOT}",  # the fault wrappers
             "VITSWEEP_TEST_DIVERGE": f"{diverged}:2",  # NaN weights at the start of epoch 2
             "VITSWEEP_TEST_DIE": f"{survivor}:3:{marker}"}  # SIGKILL the pack's worker at epoch 3, once
    ray_tmp = tempfile.mkdtemp(prefix="vsp-", dir="/tmp")
    ended = Path(ray_tmp) / "ray" / "session_2000-01-01_00-00-00_000000_1" / "vitsweep" / "shapes-0"
    ended.mkdir(parents=True)  # the copy an ended session left
    try:
        # A failed trial (the diverged one) makes the launch exit 1; the rest finished.
        out = launch(*SWEEP, "--results", str(results), ray_tmp=ray_tmp, env=hooks, rc=1)
    finally:
        kill_ray_under(ray_tmp)
    assert "(1 failed, 3 finished)" in out
    # The packs' workers (and the killed one's retry) read one decoded copy of the data set on the node.
    copies = {p.resolve() for p in Path(ray_tmp).glob("**/session_*/vitsweep/shapes-*/train_images.npy")}
    assert len(copies) == 1 and not ended.exists()  # (session_latest links to the session's folder)
    assert marker.exists()  # the worker was killed (after the diverged member was closed) and retried

    trials = tables.read_table(str(results), "demo", "trials").to_pandas().set_index("trial_id")  # paths rooted
    assert len(trials) == 4 and [len(p.members) for p in packs] == [2, 2]
    assert trials.drop(diverged)["status"].eq("finished").all() and trials.drop(diverged)["error"].isna().all()
    assert trials.loc[diverged, "status"] == "failed" and "at epoch 2: diverged" in trials.loc[diverged, "error"]
    assert trials.loc[diverged, "epochs_completed"] == 1
    import pandas as pd  # closed at once, before the worker was killed, not when the pack ended

    assert trials.loc[diverged, "ended_at"] < pd.Timestamp(marker.stat().st_mtime, unit="s", tz="UTC")
    for p in packs:  # the rows name their pack; the pack key holds the PE
        assert set(trials.loc[p.trial_ids, "pack"]) == {p.pack_id}
        assert trials.loc[p.trial_ids, "pe"].nunique() == 1
    epochs = pq.read_table(results / "demo" / "epochs").to_pandas()
    assert not epochs.duplicated(["trial_id", "epoch"]).any()  # the retried epoch 3 is recorded once
    steps = epochs.groupby("trial_id")["epoch"].apply(sorted).map(list)
    assert steps.pop(diverged) == [1] and steps.tolist() == [[1, 2, 3]] * 3
    for trial_id, t in trials.drop(diverged).iterrows():  # each member's own checkpoint and snapshots
        assert trial_id in t["checkpoint_path"] and Path(checkpoints.checkpoint_file(t["checkpoint_path"])).exists()
        assert sorted(p.name for p in Path(t["snapshot_dir"]).iterdir()) == [
            checkpoints.snapshot_name(e) for e in (0, 1, 2, 3)]

    uri = stores.default_tracking_uri(str(results))
    runs = search_trial_runs(uri, "demo").set_index("trial_id")
    assert sorted(runs.index) == sorted(trials.index)  # one run per trial
    assert runs.loc[diverged, "status"] == "FAILED" and "diverged" in runs.loc[diverged, "tags.vitsweep.error"]
    assert set(runs.drop(diverged)["status"]) == {"FINISHED"}
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    for trial_id, run in runs.iterrows():
        assert run["tags.vitsweep.pack"] == trials.loc[trial_id, "pack"]
        logged = [m.step for m in client.get_metric_history(run["run_id"], "epochs/eval_acc")]
        assert logged == ([1] if trial_id == diverged else [1, 2, 3]), trial_id
