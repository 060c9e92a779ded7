"""The Ray side of packed trials: one pack = one Tune trial = one Ray Train run of one worker.

    driver (Tune trial "pack-...")                 Train worker (one, rank 0)
    ------------------------------                 --------------------------
    members not yet finished (their trials rows)   each member's checkpoint from storage, if any
    per member: MLflow run (tag vitsweep.pack),    train_pack(): per epoch, per member -> epochs/<id>,
      trials/<id> row: running                       MLflow metrics, snapshots, checkpoint upload;
    TorchTrainer(name=<pack id>).fit()               one ray.train.report of "<trial id>/<metric>"
    members the worker left "running": failed      per member: trials/<id> finished | failed (error)

Records and checkpoints stay per trial: each member's resumable checkpoint lives at
`LaunchSettings.checkpoint_uri(trial_id)` (not among the pack's Train checkpoints, which
`num_to_keep=1` would delete and which name the pack, not the trial), so a member resumes in any pack
or alone. A member whose loss turns non-finite is marked failed with its reason; the others go on.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pyarrow import fs as pafs

from records import tables, tracking
from trainables.config import RunConfig

PACK_TAG = "vitsweep.pack"
_SUMMARY = ("train_loss", "train_acc", "eval_loss", "eval_acc")


def checkpoint_uri(settings, trial_id: str) -> str:
    """The folder of a trial's own resumable checkpoint (state.pt), whichever pack trains it; the
    trials row's `checkpoint_path`, as a Train checkpoint folder is for a trial trained alone."""
    return f"{settings.storage.rstrip('/')}/{settings.study}/checkpoints/{trial_id}"


def run_pack(pack_id: str, member_ids: list[str], settings, trials: dict[str, dict[str, Any]]) -> None:
    """Tune function trainable body for a pack of several trials (see the module docstring)."""
    import ray.train
    from ray import tune
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from trainables.ray_trainable import UNRETRIABLE, _close_run, _close_trial, utc_now

    todo = []
    for trial_id in member_ids:
        done = tables.read_trial(settings.results, settings.study, trial_id)
        if done is None or done["status"] != "finished":  # never train a finished member twice
            todo.append(RunConfig.from_flat(trials[trial_id]))
    if not todo:
        tune.report({"members_to_train": 0})
        return
    run_ids = {}
    for cfg in todo:
        flat = cfg.to_flat()
        tags = {**tracking.trial_tags(flat, code_version=settings.code_version), PACK_TAG: pack_id}
        run_id = tracking.start_trial_run(settings.mlflow_uri, settings.experiment_id, cfg.trial_id, params=flat,
                                          tags=tags)
        tracking.log_provenance(settings.mlflow_uri, run_id, config=flat, info=settings.provenance)
        run_ids[cfg.trial_id] = run_id
        try:
            tables.write_trial(settings.results, settings.study, flat,
                               _outcome(settings, cfg, "running", pack_id, mlflow_run_id=run_id, started_at=utc_now()))
        except OSError as exc:  # a storage fault before training: no run may stay RUNNING
            for started in run_ids.values():
                _close_run(settings, started, "FAILED", {"vitsweep.error": f"storage fault: {exc}"[:5000]})
            raise
    use_gpu = settings.gpus_per_trial > 0
    resources = {"CPU": settings.cpus_per_trial, **({"GPU": settings.gpus_per_trial} if use_gpu else {})}
    trainer = TorchTrainer(
        _pack_worker,
        train_loop_config={"pack_id": pack_id, "trials": [c.to_flat() for c in todo], "settings": asdict(settings),
                           "run_ids": run_ids},
        scaling_config=ray.train.ScalingConfig(num_workers=1, use_gpu=use_gpu, resources_per_worker=resources),
        run_config=ray.train.RunConfig(
            name=pack_id,
            storage_path=f"{settings.storage.rstrip('/')}/{settings.study}/train",
            failure_config=ray.train.FailureConfig(max_failures=settings.max_failures),
            callbacks=[TuneReportCallback()],
        ),
    )
    why = f"pack {pack_id} ended without closing it"
    try:
        result = trainer.fit()
        if isinstance(result.return_value, dict) and result.return_value.get(UNRETRIABLE):
            why = str(result.return_value[UNRETRIABLE])  # e.g. its data missing on this node: not retried
    finally:
        # Members the worker could not close (it was killed, every retry failed, or its data is missing)
        # become failed; each row and run is closed whatever happens to the others (a storage fault).
        errors = []
        for cfg in todo:
            try:
                row = tables.read_trial(settings.results, settings.study, cfg.trial_id)
            except OSError as exc:
                row, errors = None, [*errors, exc]
            if row is None or row["status"] == "running":
                try:
                    outcome = _outcome(settings, cfg, "failed", pack_id, error=why,
                                       started_at=(row or {}).get("started_at"))
                    _close_trial(settings, cfg.to_flat(), outcome, run_ids[cfg.trial_id], "FAILED",
                                 {"vitsweep.error": why[:5000]})
                except Exception as exc:  # noqa: BLE001 - the first is raised once every member is closed
                    errors.append(exc)
        if errors:
            raise errors[0]


def _outcome(settings, cfg: RunConfig, status: str, pack_id: str, **fields: Any) -> dict[str, Any]:
    return {"trial_id": cfg.trial_id, "study": settings.study, "status": status, "code_version": settings.code_version,
            "snapshot_dir": settings.snapshot_uri(cfg.trial_id), "pack": pack_id, **fields}


def _pack_worker(loop_config: dict[str, Any]) -> dict[str, str] | None:
    """Runs on the pack's one Train worker: restore each member, train the pack, close each member."""
    import ray.train
    import torch

    from trainables.datasets import DataRootError, prepare_root
    from trainables.ray_trainable import UNRETRIABLE, LaunchSettings, _close_trial, _upload_snapshots
    from trainables.train import CHECKPOINT_DIR, CHECKPOINT_FILE, SNAPSHOT_DIR, train_pack_fitting

    settings = LaunchSettings(**loop_config["settings"])
    run_ids = loop_config["run_ids"]
    first = RunConfig.from_flat(loop_config["trials"][0])  # data set and root are in the pack key
    try:
        prepare_root(first.dataset, first.data_root)  # this node's copy (the launcher checked its own)
    except DataRootError as exc:
        error = {UNRETRIABLE: f"{type(exc).__name__}: {exc}"}
        ray.train.report(error)  # for Tune's result (the launcher counts the pack as failed)
        return error  # for the pack's driver, which closes every member with it
    cfgs, started = [], {}
    for flat in loop_config["trials"]:  # a retried worker skips members an earlier attempt closed
        row = tables.read_trial(settings.results, settings.study, RunConfig.from_flat(flat).trial_id)
        if row is None or row["status"] == "running":
            cfgs.append(RunConfig.from_flat(flat))
            started[cfgs[-1].trial_id] = (row or {}).get("started_at")
    root = Path(tempfile.mkdtemp(prefix=f"vitsweep-{loop_config['pack_id']}-"))
    workdirs = {c.trial_id: root / c.trial_id for c in cfgs}
    histories: dict[str, list[dict[str, Any]]] = {}
    for cfg in cfgs:
        local = workdirs[cfg.trial_id] / CHECKPOINT_DIR / CHECKPOINT_FILE
        restored = _download(f"{checkpoint_uri(settings, cfg.trial_id)}/{CHECKPOINT_FILE}", local)
        histories[cfg.trial_id] = (
            list(torch.load(local, map_location="cpu", weights_only=False)["history"]) if restored else []
        )
    uploaded: dict[str, set[str]] = {c.trial_id: set() for c in cfgs}
    # Steps an earlier attempt already logged: a retry restores a checkpoint from before the epoch
    # that failed after logging, and MLflow keeps every point it is sent.
    logged = {c.trial_id: tracking.logged_steps(settings.mlflow_uri, run_ids[c.trial_id], "eval_acc") for c in cfgs}
    t0 = time.perf_counter()
    # Snapshots and checkpoints go to storage in a background thread, so the next epoch trains while
    # they upload (at GPU speed a K = 8 CIFAR epoch takes seconds). At most one epoch is in flight, and
    # its errors surface at the next report; each upload is atomic, so a kill mid-upload leaves the
    # previous checkpoint to resume from.
    uploads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vitsweep-upload")
    in_flight: list[Future] = []

    def upload(trial_id: str, checkpoint_dir: str | None) -> None:
        _upload_snapshots(workdirs[trial_id] / SNAPSHOT_DIR, settings.snapshot_uri(trial_id), uploaded[trial_id])
        if checkpoint_dir:
            _upload(Path(checkpoint_dir) / CHECKPOINT_FILE, f"{checkpoint_uri(settings, trial_id)}/{CHECKPOINT_FILE}")

    def settle() -> None:
        for done in in_flight:
            done.result()
        in_flight.clear()

    def report(members: list[tuple[str, dict[str, Any], str | None]]) -> None:
        settle()
        keyed: dict[str, Any] = {"epoch": members[0][1]["epoch"]}
        for trial_id, metrics, checkpoint_dir in members:
            histories[trial_id].append(metrics)
            tables.write_epochs(settings.results, settings.study, trial_id, histories[trial_id])
            if metrics["epoch"] not in logged[trial_id]:
                tracking.log_metrics(settings.mlflow_uri, run_ids[trial_id],
                                     {k: v for k, v in metrics.items() if k != "epoch"}, step=metrics["epoch"])
            in_flight.append(uploads.submit(upload, trial_id, checkpoint_dir))
            keyed.update({f"{trial_id}/{k}": v for k, v in metrics.items() if k != "epoch"})
        ray.train.report(keyed)

    try:
        finals = train_pack_fitting(cfgs, [workdirs[c.trial_id] for c in cfgs], report=report)
        settle()  # every member's last checkpoint is on storage before any is closed as finished
    finally:
        uploads.shutdown(wait=True)
    faults: list[Exception] = []
    for cfg, final in zip(cfgs, finals):
        error = final.get("error")
        outcome = _outcome(
            settings, cfg, "failed" if error else "finished", loop_config["pack_id"], error=error,
            checkpoint_path=checkpoint_uri(settings, cfg.trial_id), wall_time_s=time.perf_counter() - t0,
            epochs_completed=final.get("epochs_completed"), test_acc=final.get("test_acc"),
            did_not_learn=final.get("did_not_learn"), started_at=started[cfg.trial_id],
            **{k: final.get(k) for k in _SUMMARY},
        )
        run_id = run_ids[cfg.trial_id]
        if final.get("test_acc") is not None and final["epochs_completed"] not in tracking.logged_steps(
                settings.mlflow_uri, run_id, "test_acc"):
            tracking.log_metrics(settings.mlflow_uri, run_id, {"test_acc": final["test_acc"]},
                                 step=final["epochs_completed"])
        try:  # row and run closed independently; the first storage fault is raised after all members
            _close_trial(settings, cfg.to_flat(), outcome, run_id, "FAILED" if error else "FINISHED",
                         {"checkpoint_path": outcome["checkpoint_path"], "snapshot_dir": outcome["snapshot_dir"],
                          "vitsweep.error": error or ""})
        except Exception as exc:  # noqa: BLE001
            faults.append(exc)
    shutil.rmtree(root, ignore_errors=True)
    if faults:
        raise faults[0]


def _download(uri: str, local: Path) -> bool:
    """Copy a file from storage (local folder or object store) to `local`; False when there is none."""
    fs, path = tables.filesystem(uri)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return False
    local.parent.mkdir(parents=True, exist_ok=True)
    pafs.copy_files(path, str(local), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
    return True


def _upload(local: Path, uri: str) -> None:
    """Replace the file at `uri` with `local`: written beside it, then moved, so a reader never sees half
    a checkpoint (an object store's PUT is atomic on its own)."""
    fs, path = tables.filesystem(uri)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    tmp = f"{path}.tmp"
    pafs.copy_files(str(local), tmp, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    fs.move(tmp, path)
