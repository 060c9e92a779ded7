"""A trial's records from open to close: its ``trials`` row and its MLflow run, for every trial.

    open_trials      per member: MLflow run (continues a previous one), row "running"
    close_trial      final row + run FINISHED | FAILED, each closed whatever happens to the other
    close_unclosed   members still "running" when their driver ends: failed, with the reason

A trial packed with others and a trial alone (a pack of one) go through the same functions; the
Ray layer (``trainables.ray_trial``) decides when.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from records import layout, tables, tracking
from trainables.config import RunConfig

PACK_TAG = "vitsweep.pack"
log = logging.getLogger("vitsweep")


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
        return layout.snapshot_dir(self.storage, self.study, trial_id)

    def checkpoint_uri(self, trial_id: str) -> str:
        """The folder of a trial's resumable checkpoint, whichever pack (or none) trains it."""
        return layout.checkpoint_dir(self.storage, self.study, trial_id)


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def finished_trials(results: str, study: str) -> dict[str, dict[str, Any]]:
    """trial_id -> trials row of every trial that already finished."""
    table = tables.read_table(results, study, "trials")
    if table is None:
        return {}
    return {row["trial_id"]: row for row in table.to_pylist() if row["status"] == "finished"}


def outcome(settings: LaunchSettings, cfg: RunConfig, status: str, pack_id: str | None, **fields: Any) -> dict:
    """A trials row's outcome fields (the config columns come from the flat config)."""
    return {"trial_id": cfg.trial_id, "study": settings.study, "status": status, "code_version": settings.code_version,
            "snapshot_dir": settings.snapshot_uri(cfg.trial_id), "pack": pack_id, **fields}


def open_trials(settings: LaunchSettings, cfgs: Sequence[RunConfig], pack_id: str | None,
                rows: dict[str, dict[str, Any] | None] | None = None) -> dict[str, str]:
    """Start (or continue) each member's MLflow run and write its row "running"; trial id -> run id.
    ``rows``: the members' trials rows as the caller already read them (read here when not given).
    A storage fault ends every run started here FAILED before it is raised: none stays RUNNING."""
    run_ids: dict[str, str] = {}
    for cfg in cfgs:
        flat = cfg.to_flat()
        tags = tracking.trial_tags(flat, code_version=settings.code_version)
        if pack_id is not None:
            tags = {**tags, PACK_TAG: pack_id}
        run_id = tracking.start_trial_run(settings.mlflow_uri, settings.experiment_id, cfg.trial_id, params=flat,
                                          tags=tags)
        run_ids[cfg.trial_id] = run_id
        try:
            # Sets the code_version tag from the launcher's provenance (which carries it).
            tracking.log_provenance(settings.mlflow_uri, run_id, config=flat, info=settings.provenance)
            # A continued trial keeps the wall time of its earlier launches: the row sums every attempt.
            row = rows[cfg.trial_id] if rows is not None and cfg.trial_id in rows else \
                tables.read_trial(settings.results, settings.study, cfg.trial_id)
            earlier = prior_wall_time(row)
            tables.write_trial(settings.results, settings.study, flat,
                               outcome(settings, cfg, "running", pack_id, mlflow_run_id=run_id, started_at=utc_now(),
                                       wall_time_s=earlier))
        except BaseException as exc:
            for started in run_ids.values():
                close_run(settings, started, "FAILED", {"vitsweep.error": f"storage fault: {type(exc).__name__}: {exc}"})
            raise
    return run_ids


def close_trial(settings: LaunchSettings, flat: dict[str, Any], result: dict[str, Any], run_id: str,
                status: str, tags: dict[str, str] | None = None) -> None:
    """Write the trial's final row and end its MLflow run, each whatever happens to the
    other (a read-only or full results folder must not leave the run RUNNING, nor an
    MLflow outage the row "running"); then raise the first error. A trial whose row
    could not be written is not finished: its run ends FAILED and --resume reruns it."""
    error = None
    result = {**result, "mlflow_run_id": result.get("mlflow_run_id") or run_id, "ended_at": utc_now()}
    try:
        tables.write_trial(settings.results, settings.study, flat, result)
    except BaseException as exc:  # noqa: BLE001 - re-raised below, after the run is closed
        error = exc
        status, tags = "FAILED", {**(tags or {}), "vitsweep.error": f"storage fault: {type(exc).__name__}: {exc}"}
    try:
        close_run(settings, run_id, status, tags, quiet=False)
    except BaseException as exc:  # noqa: BLE001 - re-raised below
        error = error or exc
    if error is not None:
        raise error


def close_run(settings: LaunchSettings, run_id: str, status: str, tags: dict[str, str] | None = None,
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
        log.exception("could not end MLflow run %s %s", run_id, status)


def close_failed(settings: LaunchSettings, cfg: RunConfig, run_id: str, why: str, pack_id: str | None,
                 **fields: Any) -> None:
    """Close one trial as failed with its reason (row ``error``, run tag ``vitsweep.error``)."""
    close_trial(settings, cfg.to_flat(), outcome(settings, cfg, "failed", pack_id, error=why[:5000], **fields),
                run_id, "FAILED", {"vitsweep.error": why[:5000]})


def close_unclosed(settings: LaunchSettings, cfgs: Sequence[RunConfig], run_ids: dict[str, str], why: str,
                   pack_id: str | None) -> None:
    """Members whose row is still "running" (or missing) when their driver ends (the worker was
    killed, every retry failed, the data is missing, a scheduler stopped the trial) become failed
    with `why`; each row and run is closed whatever happens to the others, then the first storage
    fault is raised."""
    errors: list[BaseException] = []
    for cfg in cfgs:
        try:
            row = tables.read_trial(settings.results, settings.study, cfg.trial_id)
        except OSError as exc:
            row, errors = None, [*errors, exc]
        if row is None or row["status"] == "running":
            try:
                close_failed(settings, cfg, run_ids[cfg.trial_id], why, pack_id,
                             started_at=(row or {}).get("started_at"))
            except Exception as exc:  # noqa: BLE001 - the first is raised once every member is closed
                errors.append(exc)
    if errors:
        raise errors[0]


def prior_wall_time(row: dict[str, Any] | None) -> float:
    """Seconds of training a trial's row already holds from earlier attempts (0 for a new trial)."""
    value = (row or {}).get("wall_time_s")
    return float(value) if value is not None and value == value else 0.0


def still_open(settings: LaunchSettings, cfgs: Sequence[RunConfig]) -> list[tuple[RunConfig, dict[str, Any]]]:
    """(config, row or {}) of the members whose row is "running" or missing: what a (retried)
    worker trains. A member closed already (finished, or failed for a non-finite loss by an earlier
    attempt) never rejoins its pack."""
    todo = []
    for cfg in cfgs:
        row = tables.read_trial(settings.results, settings.study, cfg.trial_id)
        if row is None or row["status"] == "running":
            todo.append((cfg, row or {}))
    return todo
