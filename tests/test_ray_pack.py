"""Packed trials on a real local Ray: a pack is one Tune trial, each member still its own trial's records."""

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import FAST_DEMO

from records import stores, tables, tracking
from sweeps import run as launcher

pytestmark = pytest.mark.ray


def sweep(results, *extra):
    parser = launcher.argparse.ArgumentParser()
    launcher.add_arguments(parser)
    return launcher.run(parser.parse_args(["demo", "--results", str(results), "--pack", "2", *FAST_DEMO, *extra]))


def test_demo_in_packs_of_two_keeps_every_trial_separate(ray_local, tmp_path):
    assert sweep(tmp_path) == 0
    trials = tables.read_table(str(tmp_path), "demo", "trials").to_pandas()  # paths rooted in the results
    assert len(trials) == 4 and set(trials["status"]) == {"finished"} and trials["error"].isna().all()
    # demo's PE {none, ape} is in the pack key, the protocol is not: two packs of two
    assert trials.groupby("pack")["pe"].agg(lambda s: (s.nunique(), len(s))).tolist() == [(1, 2), (1, 2)]
    assert all(p.startswith("pack-shapes-k2-") for p in trials["pack"])
    assert (trials["epochs_completed"] == 2).all() and trials["test_acc"].between(0, 1).all()
    epochs = pq.read_table(tmp_path / "demo" / "epochs").to_pandas()
    assert len(epochs) == 4 * 2 and not epochs.duplicated(["trial_id", "epoch"]).any()
    for t in trials.to_dict("records"):  # each member's own checkpoint and snapshots, keyed by its trial id
        assert t["trial_id"] in t["checkpoint_path"] and (Path(t["checkpoint_path"]) / "state.pt").exists()
        assert sorted(p.name for p in Path(t["snapshot_dir"]).glob("epoch_*.pt")) == [
            "epoch_0000.pt", "epoch_0001.pt", "epoch_0002.pt"]
    uri = stores.default_tracking_uri(str(tmp_path))
    runs = tracking.search_trial_runs(uri, "demo")
    assert sorted(runs["trial_id"]) == sorted(trials["trial_id"]) and set(runs["status"]) == {"FINISHED"}
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    for run_id, trial_id in zip(runs["run_id"], runs["trial_id"]):
        run = client.get_run(run_id)
        assert run.data.tags["vitsweep.pack"] == trials.set_index("trial_id").loc[trial_id, "pack"]
        assert [m.step for m in client.get_metric_history(run_id, "eval_acc")] == [1, 2]

    # Resuming a finished packed sweep retrains nothing.
    before = tables.read_table(str(tmp_path), "demo", "trials").to_pandas().set_index("trial_id")["wall_time_s"]
    assert sweep(tmp_path, "--resume") == 0
    after = tables.read_table(str(tmp_path), "demo", "trials").to_pandas().set_index("trial_id")["wall_time_s"]
    assert after.sort_index().tolist() == before.sort_index().tolist()
