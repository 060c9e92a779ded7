"""A trial's MLflow run found by the id its trials row keeps, not by a search (CPU, seconds; no Ray).

A tag search per trial start and per checkpoint measured cost 12-46 ms CPU at 1,000-10,000 runs; the
analysis also read every metric history of a checkpoint and rendered a figure per checkpoint. Here: the
row's id is used (a search only where it is missing or not the trial's), histories are read only for keys
the run has, and only each trial's final checkpoint gets a figure unless ``--figures all`` asks.
"""

from __future__ import annotations

import shutil

import mlflow
import pytest
import torch

from analysis.measuring.job import Measurer, list_checkpoints
from records import stores, tables, tracking
from trainables.model.vit import ViT
from trainables.config.run_config import RunConfig
from trainables.trial import lifecycle


@pytest.fixture()
def calls(monkeypatch):
    """The MLflow client calls made, by name: searches and metric histories."""
    made: list[str] = []
    for name in ("search_runs", "get_metric_history"):
        real = getattr(mlflow.MlflowClient, name)
        monkeypatch.setattr(mlflow.MlflowClient, name,
                            lambda self, *a, _real=real, _name=name, **k: made.append(_name) or _real(self, *a, **k))
    return made


def test_a_trial_start_with_its_rows_run_id_searches_nothing(tmp_path, calls):
    uri = stores.default_tracking_uri(str(tmp_path))
    experiment = tracking.ensure_experiment(uri, "demo")
    first = tracking.start_trial_run(uri, experiment, "t", params={"lr": 1e-3})
    assert calls.count("search_runs") == 1  # a new trial: the one search, in case a create committed unseen
    calls.clear()
    again = tracking.start_trial_run(uri, experiment, "t", params={"lr": 1e-3}, run_id=first)
    assert again == first and "search_runs" not in calls
    client = mlflow.MlflowClient(tracking_uri=uri)
    assert client.get_run(first).data.tags[tracking.ATTEMPT_TAG] == "2"
    assert tracking.find_trial_run(uri, experiment, "t", first) == first and "search_runs" not in calls


def test_a_row_whose_run_id_is_not_the_trials_falls_back_to_the_search(tmp_path):
    uri = stores.default_tracking_uri(str(tmp_path))
    experiment = tracking.ensure_experiment(uri, "demo")
    other_experiment = tracking.ensure_experiment(uri, "other")
    mine = tracking.start_trial_run(uri, experiment, "t", params={})
    others = tracking.start_trial_run(uri, experiment, "u", params={})
    elsewhere = tracking.start_trial_run(uri, other_experiment, "t", params={})
    deleted = tracking.start_trial_run(uri, other_experiment, "d", params={})
    mlflow.MlflowClient(tracking_uri=uri).delete_run(deleted)
    for wrong in (others, elsewhere, "0" * 32, ""):
        assert tracking.find_trial_run(uri, experiment, "t", wrong) == mine, wrong
        assert tracking.start_trial_run(uri, experiment, "t", params={}, run_id=wrong) == mine, wrong
    assert tracking.find_trial_run(uri, other_experiment, "d", deleted) is None  # a deleted run is not found


def test_a_resumed_trial_continues_the_run_its_row_names(tmp_path, calls):
    results = str(tmp_path / "results")
    uri = stores.default_tracking_uri(results)
    settings = lifecycle.LaunchSettings(study="demo", results=results, storage=str(tmp_path / "storage"),
                                        mlflow_uri=uri, experiment_id=tracking.ensure_experiment(uri, "demo"),
                                        provenance={"code_version": "x", "hostname": "h", "git": None, "packages": {}})
    cfg = RunConfig.for_dataset("shapes", preset="tiny", epochs=1, warmup_epochs=0, study="demo")
    (first,) = lifecycle.open_trials(settings, [cfg], None).values()
    calls.clear()
    (again,) = lifecycle.open_trials(settings, [cfg], None).values()  # --resume: the row says which run
    assert again == first and "search_runs" not in calls
    assert tables.read_trial(results, "demo", cfg.trial_id)["mlflow_run_id"] == first


def _study_with_a_snapshot(tmp_path):
    """A finished trial of one epoch: its final checkpoint (epoch 1) and a snapshot at epoch 0, its row
    naming its MLflow run."""
    results = tmp_path / "results"
    cfg = RunConfig.for_dataset("shapes", preset="tiny", epochs=1, warmup_epochs=0, study="demo",
                                data_root=str(tmp_path / "data"))
    torch.manual_seed(0)
    state = {"model": ViT(cfg.model).state_dict(), "config": cfg.to_flat(), "epoch": 1}
    (results / "storage" / "ckpt").mkdir(parents=True)
    (results / "storage" / "snaps").mkdir()
    torch.save(state, results / "storage" / "ckpt" / "state.pt")
    shutil.copy(results / "storage" / "ckpt" / "state.pt", results / "storage" / "snaps" / "epoch_0000.pt")
    uri = stores.default_tracking_uri(str(results))
    run_id = tracking.start_trial_run(uri, tracking.ensure_experiment(uri, "demo"), "t", params={})
    tables.write_trial(str(results), "demo", cfg.to_flat(), {
        "trial_id": "t", "study": "demo", "status": "finished", "epochs_completed": 1, "mlflow_run_id": run_id,
        "checkpoint_path": str(results / "storage" / "ckpt"), "snapshot_dir": str(results / "storage" / "snaps")})
    return results, uri, run_id


@pytest.mark.parametrize("figures, drawn", [("final", {1}), ("all", {0, 1})])
def test_the_analysis_finds_the_run_by_id_reads_only_histories_it_has_and_draws_the_final_figure(
        tmp_path, calls, figures, drawn):
    results, uri, run_id = _study_with_a_snapshot(tmp_path)
    measurer = Measurer(str(results), "demo", uri, eval_size=8, batch_size=8, threads=1, figures=figures)
    rows = sorted(list_checkpoints(str(results), "demo", "all"), key=lambda r: r["epoch"])
    assert [(r["epoch"], r["final"], r["mlflow_run_id"]) for r in rows] == [(0, False, run_id), (1, True, run_id)]
    calls.clear()
    snapshot, final = ({k: [v] for k, v in r.items()} for r in rows)
    assert str(measurer(snapshot)["status"][0]) == "ok"
    assert calls == []  # a run with no analysis metric yet: no search, no history read
    assert str(measurer(final)["status"][0]) == "ok"
    # Epoch 1 reads the histories of the scalar keys epoch 0 logged (step = checkpoint epoch), not of its
    # own per-layer keys (named by epoch 1, which the run does not have).
    client = mlflow.MlflowClient(tracking_uri=uri)
    scalars = [k for k in client.get_run(run_id).data.metrics if not k.startswith(tracking.LAYER_SECTION)]
    assert "search_runs" not in calls and calls.count("get_metric_history") == len(scalars) > 0
    figures_on_run = {a.path for a in client.list_artifacts(run_id, "figures")}
    assert figures_on_run == {f"figures/layers_epoch_{e:04d}.{ext}" for e in drawn for ext in ("png", "svg")}
    calls.clear()
    assert str(measurer(final)["note"][0]) == ""  # measured again: the same values, no second point
    for key in client.get_run(run_id).data.metrics:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)), (key, steps)
