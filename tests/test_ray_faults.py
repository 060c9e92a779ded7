"""A storage fault mid-sweep on a real local Ray: the trials folder turns read-only
(immutable) while trials run. Nothing stays RUNNING, the launcher reports the fault in
one line and exits non-zero without raising; ``--resume`` then recovers every trial,
each MLflow step logged once."""

import threading

import pyarrow.parquet as pq
import pytest
from conftest import FAST_DEMO
from test_faults import chattr, freezable  # noqa: F401  (the fixture)

from records import stores, tracking

pytestmark = pytest.mark.ray


def test_read_only_results_mid_run_then_resume_recovers(ray_local, tmp_path, freezable, capsys):  # noqa: F811
    from sweeps import run as launcher

    results = tmp_path / "results"
    trials_dir = results / "demo" / "trials"
    parser = launcher.argparse.ArgumentParser()
    launcher.add_arguments(parser)
    argv = ["demo", "--results", str(results), *FAST_DEMO, "--max-failures", "0"]

    done = threading.Event()

    def freeze_at_first_row():  # the first trial is running: from now on no row can be written
        while not done.wait(0.2):
            if trials_dir.is_dir() and any(p.name.endswith(".parquet") for p in trials_dir.iterdir()):
                freezable(trials_dir)
                return

    watcher = threading.Thread(target=freeze_at_first_row, daemon=True)
    watcher.start()
    try:
        assert launcher.run(parser.parse_args(argv)) == 1  # returns: no traceback out of the launcher
    finally:
        done.set()
        watcher.join()
    errors = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: storage fault: cannot write the trials row of "), errors
    uri = stores.default_tracking_uri(str(results))
    runs = tracking.search_trial_runs(uri, "demo")
    assert len(runs) == 4 and set(runs["status"]) == {"FAILED"}, runs[["trial_id", "status"]]
    assert runs["tags.vitsweep.error"].str.startswith("storage fault: ").all()

    chattr(trials_dir, "-i")  # the storage is fixed
    assert launcher.run(parser.parse_args([*argv, "--resume"])) == 0
    trials = pq.read_table(trials_dir).to_pandas()
    assert len(trials) == 4 and set(trials["status"]) == {"finished"}
    runs = tracking.search_trial_runs(uri, "demo")
    assert sorted(runs["trial_id"]) == sorted(trials["trial_id"]) and set(runs["status"]) == {"FINISHED"}
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    for run_id in runs["run_id"]:  # trials that had trained fully before the fault log nothing twice
        assert [m.step for m in client.get_metric_history(run_id, "eval_acc")] == [1, 2]
        assert [m.step for m in client.get_metric_history(run_id, "test_acc")] == [2]


def test_a_missing_data_set_in_a_worker_fails_the_trial_without_retries(ray_local, tmp_path):
    """Data a retry cannot bring (the node's data root is a file): the Train worker
    reports it instead of raising, so neither Train nor Tune retries the trial."""
    from ray import tune

    from records import tables
    from trainables.config import RunConfig
    from trainables.lifecycle import LaunchSettings
    from trainables.ray_start import DRIVER_RESOURCES
    from trainables.ray_trial import UNRETRIABLE, run_trial

    not_a_folder = tmp_path / "data"
    not_a_folder.write_text("")
    cfg = RunConfig.for_dataset("cifar10", preset="tiny", study="demo", data_root=str(not_a_folder),
                                epochs=1, warmup_epochs=0)
    results = str(tmp_path / "results")
    uri = stores.default_tracking_uri(results)
    settings = LaunchSettings(study="demo", results=results, storage=str(tmp_path / "storage"), mlflow_uri=uri,
                              experiment_id=tracking.ensure_experiment(uri, "demo"), max_failures=2)
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, settings=settings, trials={cfg.trial_id: cfg.to_flat()}), DRIVER_RESOURCES)
    grid = tune.Tuner(
        trainable, param_space={"trial_id": cfg.trial_id},
        run_config=tune.RunConfig(storage_path=str(tmp_path / "tune"), failure_config=tune.FailureConfig(2)),
    ).fit()
    (result,) = grid
    assert result.error is None and "is a file; expected a folder" in result.metrics[UNRETRIABLE]
    (run,) = tracking.search_trial_runs(uri, "demo").to_dict("records")
    assert run["status"] == "FAILED" and run["tags.vitsweep.attempt"] == "1"  # one attempt: no Tune retry
    assert "is a file; expected a folder" in run["tags.vitsweep.error"]
    assert tables.read_trial(results, "demo", cfg.trial_id)["status"] == "failed"
