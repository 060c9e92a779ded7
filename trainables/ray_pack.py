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
        tables.write_trial(settings.results, settings.study, flat, _outcome(settings, cfg, "running", pack_id))
        run_ids[cfg.trial_id] = run_id
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
    try:
        trainer.fit()
    finally:
        # Members the worker could not close (it was killed, or every retry failed) become failed.
        for cfg in todo:
            row = tables.read_trial(settings.results, settings.study, cfg.trial_id)
            if row is None or row["status"] == "running":
                tables.write_trial(settings.results, settings.study, cfg.to_flat(),
                                   _outcome(settings, cfg, "failed", pack_id, error=f"pack {pack_id} ended without closing it"))
                tracking.end_trial_run(settings.mlflow_uri, run_ids[cfg.trial_id], "FAILED")


def _outcome(settings, cfg: RunConfig, status: str, pack_id: str, **fields: Any) -> dict[str, Any]:
    return {"trial_id": cfg.trial_id, "study": settings.study, "status": status, "code_version": settings.code_version,
            "snapshot_dir": settings.snapshot_uri(cfg.trial_id), "pack": pack_id, **fields}


def _pack_worker(loop_config: dict[str, Any]) -> None:
    """Runs on the pack's one Train worker: restore each member, train the pack, close each member."""
    import ray.train
    import torch

    from trainables.ray_trainable import LaunchSettings, _upload_snapshots
    from trainables.train import CHECKPOINT_DIR, CHECKPOINT_FILE, SNAPSHOT_DIR, train_pack_fitting

    settings = LaunchSettings(**loop_config["settings"])
    run_ids = loop_config["run_ids"]
    cfgs = []
    for flat in loop_config["trials"]:  # a retried worker skips members an earlier attempt closed
        row = tables.read_trial(settings.results, settings.study, RunConfig.from_flat(flat).trial_id)
        if row is None or row["status"] == "running":
            cfgs.append(RunConfig.from_flat(flat))
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
    t0 = time.perf_counter()

    def report(members: list[tuple[str, dict[str, Any], str | None]]) -> None:
        keyed: dict[str, Any] = {"epoch": members[0][1]["epoch"]}
        for trial_id, metrics, checkpoint_dir in members:
            histories[trial_id].append(metrics)
            tables.write_epochs(settings.results, settings.study, trial_id, histories[trial_id])
            tracking.log_metrics(settings.mlflow_uri, run_ids[trial_id],
                                 {k: v for k, v in metrics.items() if k != "epoch"}, step=metrics["epoch"])
            _upload_snapshots(workdirs[trial_id] / SNAPSHOT_DIR, settings.snapshot_uri(trial_id), uploaded[trial_id])
            if checkpoint_dir:
                _upload(Path(checkpoint_dir) / CHECKPOINT_FILE, f"{checkpoint_uri(settings, trial_id)}/{CHECKPOINT_FILE}")
            keyed.update({f"{trial_id}/{k}": v for k, v in metrics.items() if k != "epoch"})
        ray.train.report(keyed)

    finals = train_pack_fitting(cfgs, [workdirs[c.trial_id] for c in cfgs], report=report)
    for cfg, final in zip(cfgs, finals):
        error = final.get("error")
        outcome = _outcome(
            settings, cfg, "failed" if error else "finished", loop_config["pack_id"], error=error,
            checkpoint_path=checkpoint_uri(settings, cfg.trial_id), wall_time_s=time.perf_counter() - t0,
            epochs_completed=final.get("epochs_completed"), test_acc=final.get("test_acc"),
            did_not_learn=final.get("did_not_learn"),
            **{k: final.get(k) for k in _SUMMARY},
        )
        tables.write_trial(settings.results, settings.study, cfg.to_flat(), outcome)
        run_id = run_ids[cfg.trial_id]
        if final.get("test_acc") is not None:
            tracking.log_metrics(settings.mlflow_uri, run_id, {"test_acc": final["test_acc"]},
                                 step=final["epochs_completed"])
        tracking.set_tags(settings.mlflow_uri, run_id, {"checkpoint_path": outcome["checkpoint_path"],
                                                         "snapshot_dir": outcome["snapshot_dir"],
                                                         "vitsweep.error": error or ""})
        tracking.end_trial_run(settings.mlflow_uri, run_id, "FAILED" if error else "FINISHED")
    shutil.rmtree(root, ignore_errors=True)


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
