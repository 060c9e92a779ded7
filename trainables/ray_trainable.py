"""The thin Ray layer: one Tune trial = one Ray Train run of the plain loop.

Ray 2.5x/2.6x runs Train V2, where ``Tuner(TorchTrainer)`` is gone; the
recommended pattern is a Tune *function* trainable that launches a
``TorchTrainer`` and forwards its reports to Tune with ``TuneReportCallback``.
The function is only a driver: it asks for no CPU at all
(``DRIVER_RESOURCES``: a token of memory, since Tune refuses an empty
request), so drivers never hold the cores their own Train workers need. With
1 CPU per driver two drivers fill a 2-core machine and their workers never
start; with 0.01 CPU a worker asking for a whole CPU no longer fits beside a
driver, and trials silently run one at a time.

Per trial:
    driver (Tune trial)                       Train worker(s), rank 0 writes
    -------------------                       ------------------------------
    skip if trials/<id> says finished
    MLflow run (continues a previous one)     restore the latest Train checkpoint
    trials/<id> row: running                  train(): per epoch -> epochs/<id>,
    TorchTrainer(name=<id>).fit()               MLflow metrics, ray.train.report,
    trials/<id> row: finished | failed          snapshots copied to storage
    MLflow run FINISHED | FAILED

The Train run is named by the trial id under ``<storage>/<study>/train``, so a
retried trial (Tune ``FailureConfig``) or a resumed sweep continues from its
latest checkpoint: Train V2 restores its checkpoint list from storage.
"""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pyarrow import fs as pafs

from records import tables, tracking
from trainables.config import RunConfig, did_not_learn

DRIVER_RESOURCES = {"CPU": 0, "memory": 2**20}
# Reported (instead of raised) by a worker whose data set is missing: a retry cannot
# fix that, and Train V2 / Tune retry every raised error, so the trial ends failed
# without retries (the launcher counts it as a failure).
UNRETRIABLE = "vitsweep_unretriable_error"


@dataclass(frozen=True)
class LaunchSettings:
    """Where a sweep writes and what each trial may use; the same for every trial."""

    study: str
    results: str
    storage: str
    mlflow_uri: str
    experiment_id: str
    workers_per_trial: int = 1
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    max_failures: int = 2
    code_version: str = "unknown"  # computed by the launcher: workers' code copies carry no .git
    provenance: dict | None = None  # records.provenance.provenance(), taken once by the launcher

    def snapshot_uri(self, trial_id: str) -> str:
        return f"{self.storage.rstrip('/')}/{self.study}/snapshots/{trial_id}"


def init_ray(address: str | None = None, **kwargs: Any) -> None:
    """Connect to ``address`` ("auto" or host:port), or start a fresh local Ray.

    Locally, a second Ray instance on the same machine (another user's sweep, a
    test) breaks Ray Train's placement-group cleaner: it finds its cluster's
    state API by scanning for running instances and gives up when there are
    two, leaking the CPUs of every early-stopped trial until the sweep
    deadlocks. So the local instance gets a dashboard port chosen here, and
    every process of the job is told where it is (``RAY_API_SERVER_ADDRESS``).

    The local instance listens on loopback only (``_single_node``) and its
    token file is readable by the user alone (``_private_token_file``); a
    cluster (``address``) keeps the binding its ``ray start`` gave it."""
    import socket

    import ray

    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, **kwargs)
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {"RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{port}"}
    _private_token_file()
    with _single_node():
        ray.init(address="local", include_dashboard=True, dashboard_host="127.0.0.1", dashboard_port=port,
                 runtime_env={"env_vars": env}, **kwargs)
    os.environ.update(env)  # this driver's own state-API calls


SINGLE_NODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextmanager
def _single_node():
    """Ray's own switch for a one-machine Ray (its default on macOS and Windows):
    with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` the node IP is 127.0.0.1, and
    GCS, raylet, every worker's gRPC server, the dashboard agent, the runtime-env
    agent and the metrics endpoints bind to it instead of 0.0.0.0 / the machine's
    address. (``_node_ip_address="127.0.0.1"`` does not do it: Ray replaces a
    loopback node IP by the machine's address.) Ray reads the variable once, when
    ``ray`` is imported, so the constant it sets is applied too, for a ``ray``
    imported before this call; both are restored after the start, so a later
    cluster connection in the same process is not affected."""
    from ray._private import ray_constants

    # (A Ray without the constant reads only the variable; tests/test_ray_resume.py
    # checks the sockets either way.)
    before_env, before_const = os.environ.get(SINGLE_NODE_ENV), getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[SINGLE_NODE_ENV] = "0"
    if before_const is not None:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if before_const is not None:
            ray_constants.ENABLE_RAY_CLUSTER = before_const
        if before_env is None:
            os.environ.pop(SINGLE_NODE_ENV, None)
        else:
            os.environ[SINGLE_NODE_ENV] = before_env


def _private_token_file() -> None:
    """A new local Ray enables token auth and writes its token to ``~/.ray/auth_token``
    (or ``$RAY_AUTH_TOKEN_PATH``) with the default umask, i.e. readable by everyone
    (0644). Create the file first with mode 0600 (Ray then fills it and keeps the
    mode) and tighten an existing one."""
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        return  # the token is not in a file, or there is none
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token").expanduser()
    try:
        if path.exists():
            if path.stat().st_mode & 0o077:
                path.chmod(0o600)
            return
        from ray._private.authentication.authentication_token_generator import (
            generate_new_authentication_token,
        )

        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(generate_new_authentication_token())
    except FileExistsError:  # another launch created it meanwhile: Ray will read theirs
        pass
    except OSError as exc:  # e.g. a read-only home: Ray reports its own error if it cannot write either
        import logging

        logging.getLogger("vitsweep").warning("could not make Ray's token file %s private: %s", path, exc)


def finished_trials(results: str, study: str) -> dict[str, dict[str, Any]]:
    """trial_id -> trials row of every trial that already finished."""
    table = tables.read_table(results, study, "trials")
    if table is None:
        return {}
    return {row["trial_id"]: row for row in table.to_pylist() if row["status"] == "finished"}


def run_trial(
    config: dict[str, Any],
    settings: LaunchSettings,
    trials: dict[str, dict[str, Any]],
    base: dict[str, Any] | None = None,
    packs: dict[str, list[str]] | None = None,
) -> None:
    """Tune function trainable (the driver of one trial).

    A grid's Tune config holds only a trial id (``config["trial_id"]``): the flat
    configs travel once, through ``tune.with_parameters`` (``trials``: id -> flat
    config), which keeps Tune's state and progress output small for
    thousand-trial sweeps. A searcher's Tune config holds the sampled values,
    applied to the ``base`` flat config. A grid of packs holds ``config["pack_id"]``
    (``packs``: pack id -> member trial ids); a pack of several trials runs in
    ``trainables.ray_pack``."""
    import ray.train
    from ray import tune
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    if "pack_id" in config:  # a grid of packs (sweeps/packs.py); a pack of one is the trial itself
        members = (packs or {}).get(config["pack_id"], [config["pack_id"]])
        if len(members) > 1:
            from trainables.ray_pack import run_pack

            return run_pack(config["pack_id"], members, settings, trials)
        config = {"trial_id": members[0]}
    if "trial_id" in config:
        cfg = RunConfig.from_flat(trials[config["trial_id"]])
    else:
        cfg = RunConfig.from_flat(base).with_overrides(config)
    trial_id, flat = cfg.trial_id, cfg.to_flat()
    done = tables.read_trial(settings.results, settings.study, trial_id)
    if done is not None and done["status"] == "finished":  # in an earlier launch: never train twice
        tune.report({k: done[k] for k in ("eval_acc", "test_acc", "epochs_completed") if done.get(k) is not None})
        return

    version = settings.code_version
    tags = tracking.trial_tags(flat, code_version=version)
    run_id = tracking.start_trial_run(settings.mlflow_uri, settings.experiment_id, trial_id, params=flat, tags=tags)
    # Sets the code_version tag from the launcher's provenance (which carries `version`).
    tracking.log_provenance(settings.mlflow_uri, run_id, config=flat, info=settings.provenance)
    outcome = {"trial_id": trial_id, "study": settings.study, "status": "running", "mlflow_run_id": run_id,
               "started_at": utc_now(), "snapshot_dir": settings.snapshot_uri(trial_id), "code_version": version}
    try:
        tables.write_trial(settings.results, settings.study, flat, outcome)
    except BaseException as exc:  # storage fault: the MLflow run must not stay RUNNING
        _close_run(settings, run_id, "FAILED", {"vitsweep.error": f"storage fault: {type(exc).__name__}: {exc}"})
        raise
    t0 = time.perf_counter()
    use_gpu = settings.gpus_per_trial > 0
    resources = {"CPU": settings.cpus_per_trial, **({"GPU": settings.gpus_per_trial} if use_gpu else {})}
    trainer = TorchTrainer(
        _train_worker,
        train_loop_config={"trial": flat, "settings": asdict(settings), "run_id": run_id},
        scaling_config=ray.train.ScalingConfig(
            num_workers=settings.workers_per_trial, use_gpu=use_gpu, resources_per_worker=resources
        ),
        run_config=ray.train.RunConfig(
            name=trial_id,
            storage_path=f"{settings.storage.rstrip('/')}/{settings.study}/train",
            failure_config=ray.train.FailureConfig(max_failures=settings.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1),
            callbacks=[TuneReportCallback()],
        ),
    )
    try:
        result = trainer.fit()
    except BaseException:
        outcome.update(status="failed", wall_time_s=time.perf_counter() - t0)
        _close_trial(settings, flat, outcome, run_id, "FAILED")
        raise
    # Train V2's result carries the metrics of the latest checkpoint, which the
    # loop writes at its last epoch.
    final = result.metrics or {}
    unretriable = result.return_value.get(UNRETRIABLE) if isinstance(result.return_value, dict) else None
    if unretriable:  # (rank 0's return value; the metrics carry only checkpointed reports)
        outcome.update(status="failed", error=str(unretriable)[:5000], wall_time_s=time.perf_counter() - t0)
        _close_trial(settings, flat, outcome, run_id, "FAILED", {"vitsweep.error": str(unretriable)[:5000]})
        return
    outcome.update(
        status="finished",
        checkpoint_path=result.checkpoint.path if result.checkpoint else None,
        wall_time_s=time.perf_counter() - t0,
        epochs_completed=final.get("epoch"),
        test_acc=final.get("eval_acc") if cfg.eval_split == "test" else None,
        did_not_learn=did_not_learn(final.get("eval_acc"), cfg.model.num_classes),
        **{k: final.get(k) for k in ("train_loss", "train_acc", "eval_loss", "eval_acc")},
    )
    _close_trial(settings, flat, outcome, run_id, "FINISHED", {"checkpoint_path": str(outcome["checkpoint_path"]),
                                                              "snapshot_dir": outcome["snapshot_dir"]})


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _close_trial(settings: LaunchSettings, flat: dict[str, Any], outcome: dict[str, Any], run_id: str,
                 status: str, tags: dict[str, str] | None = None) -> None:
    """Write the trial's final row and end its MLflow run, each whatever happens to the
    other (a read-only or full results folder must not leave the run RUNNING, nor an
    MLflow outage the row "running"); then raise the first error. A trial whose row
    could not be written is not finished: its run ends FAILED and --resume reruns it."""
    error = None
    outcome = {**outcome, "mlflow_run_id": outcome.get("mlflow_run_id") or run_id, "ended_at": utc_now()}
    try:
        tables.write_trial(settings.results, settings.study, flat, outcome)
    except BaseException as exc:  # noqa: BLE001 - re-raised below, after the run is closed
        error = exc
        status, tags = "FAILED", {**(tags or {}), "vitsweep.error": f"storage fault: {type(exc).__name__}: {exc}"}
    try:
        _close_run(settings, run_id, status, tags, quiet=False)
    except BaseException as exc:  # noqa: BLE001 - re-raised below
        error = error or exc
    if error is not None:
        raise error


def _close_run(settings: LaunchSettings, run_id: str, status: str, tags: dict[str, str] | None = None,
               *, quiet: bool = True) -> None:
    """Tag and end an MLflow run; ``quiet``: log a failure instead of raising it (when
    another error is already on its way)."""
    try:
        if tags:
            tracking.set_tags(settings.mlflow_uri, run_id, tags)
        tracking.end_trial_run(settings.mlflow_uri, run_id, status)
    except Exception:
        if not quiet:
            raise
        import logging

        logging.getLogger("vitsweep").exception("could not end MLflow run %s %s", run_id, status)


def _train_worker(loop_config: dict[str, Any]) -> dict[str, str] | None:
    """Runs on each Ray Train worker: restore, train, report."""
    import ray.train
    import torch

    from trainables.datasets import DataRootError, prepare_root
    from trainables.train import CHECKPOINT_DIR, CHECKPOINT_FILE, SNAPSHOT_DIR, train

    cfg = RunConfig.from_flat(loop_config["trial"])
    settings = LaunchSettings(**loop_config["settings"])
    run_id = loop_config["run_id"]
    try:
        prepare_root(cfg.dataset, cfg.data_root)  # this node's copy (the launcher checked its own)
    except DataRootError as exc:
        error = {UNRETRIABLE: f"{type(exc).__name__}: {exc}"}
        ray.train.report(error)  # for Tune's result (the launcher counts the trial as failed)
        return error  # for this trial's driver
    rank = ray.train.get_context().get_world_rank()
    workdir = Path(tempfile.mkdtemp(prefix=f"vitsweep-{cfg.trial_id}-"))
    history: list[dict[str, Any]] = []  # the epochs table: restored epochs + new ones
    restored = ray.train.get_checkpoint()
    if restored is not None:
        local = workdir / CHECKPOINT_DIR / CHECKPOINT_FILE
        local.parent.mkdir(parents=True)
        with restored.as_directory() as d:
            shutil.copy(Path(d) / CHECKPOINT_FILE, local)
        history = list(torch.load(local, map_location="cpu", weights_only=False)["history"])
    uploaded: set[str] = set()
    # Steps an earlier attempt already logged: a retry restores the checkpoint *before*
    # the epoch that failed after logging, and MLflow keeps every point it is sent.
    logged = tracking.logged_steps(settings.mlflow_uri, run_id, "eval_acc") if rank == 0 else set()

    def report(metrics: dict[str, Any], checkpoint_dir: str | None) -> None:
        if rank == 0:
            history.append(metrics)
            tables.write_epochs(settings.results, settings.study, cfg.trial_id, history)
            if metrics["epoch"] not in logged:
                tracking.log_metrics(settings.mlflow_uri, run_id,
                                     {k: v for k, v in metrics.items() if k != "epoch"}, step=metrics["epoch"])
            _upload_snapshots(workdir / SNAPSHOT_DIR, settings.snapshot_uri(cfg.trial_id), uploaded)
        checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
        ray.train.report(metrics, checkpoint=checkpoint)

    final = train(cfg, workdir, report=report)
    if final.get("error"):  # a non-finite loss: deterministic, so the trial fails now, not after retries
        error = {UNRETRIABLE: f"trial {cfg.trial_id}: {final['error']}"}
        ray.train.report(error)
        shutil.rmtree(workdir, ignore_errors=True)
        return error
    if (rank == 0 and final["test_acc"] is not None
            and final["epochs_completed"] not in tracking.logged_steps(settings.mlflow_uri, run_id, "test_acc")):
        tracking.log_metrics(settings.mlflow_uri, run_id, {"test_acc": final["test_acc"]},
                             step=final["epochs_completed"])
    shutil.rmtree(workdir, ignore_errors=True)
    return None


def _upload_snapshots(local_dir: Path, uri: str, uploaded: set[str]) -> None:
    """Copy new snapshot files to storage (local folder or object store)."""
    if not local_dir.exists():
        return
    fs, root = tables.filesystem(uri)
    fs.create_dir(root, recursive=True)
    for path in sorted(local_dir.glob("epoch_*.pt")):
        if path.name not in uploaded:
            pafs.copy_files(str(path), f"{root}/{path.name}", source_filesystem=pafs.LocalFileSystem(),
                            destination_filesystem=fs)
            uploaded.add(path.name)
