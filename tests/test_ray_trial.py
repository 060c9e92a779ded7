"""The Ray layer's worker without Ray: what it records when the loop trains epochs again."""

import pytest
import torch

import trainables.loop.train as loop
from records import files, stores, tables, tracking
from trainables.config.run_config import RunConfig
from trainables.loop import checkpoints
from trainables.trial import lifecycle
from trainables.trial.ray_trial import PackWorker


def test_an_oom_retry_records_each_epoch_once_and_uploads_retrained_snapshots(tmp_path, monkeypatch):
    """Checkpoints every 2 epochs: the pack of two runs out of memory in epoch 2, and each half starts
    again from epoch 1. Epoch 1 is recorded once (its epochs row replaced, its MLflow step not logged
    again: MLflow keeps every point it is sent) and its retrained snapshot goes to storage again."""
    cfgs = [RunConfig.for_dataset("shapes", preset="tiny", seed=seed, max_train_images=128, batch_size=64, epochs=2,
                                  warmup_epochs=0, checkpoint_every=2, eval_split="holdout")
            for seed in (0, 1)]
    results = str(tmp_path / "results")
    uri = stores.default_tracking_uri(results)
    settings = lifecycle.LaunchSettings(study="demo", results=results, storage=str(tmp_path / "storage"),
                                        mlflow_uri=uri, experiment_id=tracking.ensure_experiment(uri, "demo"))
    run_ids = lifecycle.open_trials(settings, cfgs, "pack-x")
    real_step, steps = loop.pack_step, []

    def step(pack, *args, **kwargs):  # 2 steps per epoch: the pack's third step is epoch 2's first
        if pack.k == 2:
            steps.append(1)
            if len(steps) == 3:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return real_step(pack, *args, **kwargs)

    monkeypatch.setattr(loop, "pack_step", step)
    uploaded = []
    real_upload = files.upload
    monkeypatch.setattr(files, "upload", lambda local, dest: uploaded.append(dest.rsplit("/", 2)[-2:]) or
                        real_upload(local, dest))
    worker = PackWorker(settings, {"pack_id": "pack-x", "tag": "pack-x", "solo": False, "run_ids": run_ids,
                                   "trials": cfgs}, rank=0)
    reported = []
    try:
        assert worker.run(reported.append) is None
    finally:
        worker.cleanup()
    assert [r["epoch"] for r in reported] == [1, 1, 2, 1, 2]  # the pack's epoch 1, then each half's
    for cfg in cfgs:
        assert [r["epoch"] for r in tables.read_table(results, "demo", "epochs").to_pylist()
                if r["trial_id"] == cfg.trial_id] == [1, 2]
        assert sorted(tracking.logged_steps(uri, run_ids[cfg.trial_id], "epochs/eval_acc")) == [1, 2]
        import mlflow

        history = mlflow.MlflowClient(tracking_uri=uri).get_metric_history(run_ids[cfg.trial_id], "epochs/eval_acc")
        assert [m.step for m in history] == [1, 2]
        assert uploaded.count([cfg.trial_id, "epoch_0001.pt"]) == 2  # the retrained snapshot, uploaded again
        row = tables.read_trial(results, "demo", cfg.trial_id)
        assert row["status"] == "finished" and row["epochs_completed"] == 2


def test_a_continued_trial_sums_the_wall_time_of_every_launch(tmp_path):
    """A resumed trial's row held only the last launch's seconds; now the earlier ones carry over."""
    cfg = RunConfig.for_dataset("shapes", preset="tiny", seed=0, epochs=1, warmup_epochs=0)
    results = str(tmp_path / "results")
    uri = stores.default_tracking_uri(results)
    settings = lifecycle.LaunchSettings(study="demo", results=results, storage=str(tmp_path / "storage"),
                                        mlflow_uri=uri, experiment_id=tracking.ensure_experiment(uri, "demo"))
    lifecycle.open_trials(settings, [cfg], None)
    assert tables.read_trial(results, "demo", cfg.trial_id)["wall_time_s"] == 0.0  # a new trial: nothing before
    tables.write_trial(results, "demo", cfg.to_flat(), lifecycle.outcome(settings, cfg, "running", None,
                                                                          wall_time_s=42.5))  # a killed launch
    lifecycle.open_trials(settings, [cfg], None)  # --resume
    row = tables.read_trial(results, "demo", cfg.trial_id)
    assert row["status"] == "running" and row["wall_time_s"] == 42.5
    (member, open_row), = lifecycle.still_open(settings, [cfg])
    assert lifecycle.prior_wall_time(open_row) == 42.5  # what the worker adds its own seconds to


def test_a_checkpoint_uploaded_before_its_epoch_rows_failed_to_write_restores_the_rows(tmp_path, monkeypatch):
    """The last epoch's checkpoint reaches storage while its epochs row and MLflow step fail to write (a
    full disk): the resumed trial has nothing left to train, and still ends with every epoch recorded once."""
    cfg = RunConfig.for_dataset("shapes", preset="tiny", seed=0, max_train_images=64, batch_size=64, epochs=2,
                                warmup_epochs=0, eval_split="holdout")
    results = str(tmp_path / "results")
    uri = stores.default_tracking_uri(results)
    settings = lifecycle.LaunchSettings(study="demo", results=results, storage=str(tmp_path / "storage"),
                                        mlflow_uri=uri, experiment_id=tracking.ensure_experiment(uri, "demo"))
    run_ids = lifecycle.open_trials(settings, [cfg], None)
    real_write = tables.write_epochs

    def full_at_epoch_2(results, study, trial_id, rows):
        if rows[-1]["epoch"] == 2:
            raise OSError(28, "No space left on device")
        real_write(results, study, trial_id, rows)

    loop_config = {"pack_id": "p", "tag": None, "solo": True, "run_ids": run_ids, "trials": [cfg]}
    with monkeypatch.context() as patch:
        patch.setattr(tables, "write_epochs", full_at_epoch_2)
        worker = PackWorker(settings, loop_config, rank=0)
        try:
            with pytest.raises(OSError, match="No space left on device"):
                worker.run(lambda metrics: None)
        finally:
            worker.cleanup()
    assert [r["epoch"] for r in tables.read_table(results, "demo", "epochs").to_pylist()] == [1]
    lifecycle.open_trials(settings, [cfg], None)  # --resume
    loads, real_load = [], checkpoints.load
    monkeypatch.setattr(checkpoints, "load", lambda path, **kw: loads.append(path) or real_load(path, **kw))
    worker = PackWorker(settings, loop_config, rank=0)
    try:
        assert worker.run(lambda metrics: None) is None
    finally:
        worker.cleanup()
    assert len(loads) == 1  # the resumed checkpoint is read once: its epoch and history, then its state
    assert [r["epoch"] for r in tables.read_table(results, "demo", "epochs").to_pylist()] == [1, 2]
    assert sorted(tracking.logged_steps(uri, run_ids[cfg.trial_id], "epochs/eval_acc")) == [1, 2]
    assert tables.read_trial(results, "demo", cfg.trial_id)["status"] == "finished"
