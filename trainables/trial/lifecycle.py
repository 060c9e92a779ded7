"""A trial's records from open to close: its ``trials`` row and its MLflow run, for every trial.

    open_trials       per member: MLflow run (continues a previous one), row "running"
    close_trial       final row + run as the row says, each closed whatever happens to the other
    close_unclosed    members still "running" when their driver ends: failed, with the reason
    close_unfinished  after Tune returns: every trial still "running" failed, a stopped one "stopped"

Every trial is closed by `close_trial`, whoever closes it: the Train worker (finished, or failed for a
non-finite loss), its Tune driver (`close_unclosed`) or the launcher's epilogue (`close_unfinished`).
A trial packed with others and a trial alone (a pack of one) go through the same functions.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from records import layout, tables, tracking
from records.stores import TrackingError
from trainables.config.run_config import RunConfig

PACK_TAG = "vitsweep.pack"
# The first report after Ray Train restarted a pack's worker carries these (the launcher prints them):
# the restart count, its cause, the epoch the members resumed from and the node they resumed on.
RESTART_KEYS = ("vitsweep_restarts", "vitsweep_restart_cause", "vitsweep_resumed_from", "vitsweep_node")
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
    # Seconds a trial's Train workers may wait to be placed (first start, or after a lost node) before
    # Ray Train gives up on that start; it retries once, so a trial that cannot be placed again ends
    # failed after about twice this (counted against max_failures) instead of waiting forever.
    placement_timeout_s: float = 60.0
    code_version: str = "unknown"  # computed by the launcher: workers' code copies carry no .git
    provenance: dict | None = None  # records.provenance.provenance(), taken once by the launcher

    def snapshot_uri(self, trial_id: str) -> str:
        return layout.snapshot_dir(self.storage, self.study, trial_id)

    def checkpoint_uri(self, trial_id: str) -> str:
        """The folder of a trial's resumable checkpoint, whichever pack (or none) trains it."""
        return layout.checkpoint_dir(self.storage, self.study, trial_id)


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


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
    # Every member's row before any run starts (a fault here leaves no run to end): a continued trial's row
    # names its MLflow run, found without a search, and keeps the wall time of its earlier launches.
    given = rows or {}
    rows = {c.trial_id: given[c.trial_id] if c.trial_id in given else
            tables.read_trial(settings.results, settings.study, c.trial_id) for c in cfgs}
    run_ids: dict[str, str] = {}
    for cfg in cfgs:
        flat = cfg.to_flat()
        tags = tracking.trial_tags(flat, code_version=settings.code_version)
        if pack_id is not None:
            tags = {**tags, PACK_TAG: pack_id}
        row = rows[cfg.trial_id]
        run_id = tracking.start_trial_run(settings.mlflow_uri, settings.experiment_id, cfg.trial_id, params=flat,
                                          tags=tags, run_id=(row or {}).get("mlflow_run_id"))
        run_ids[cfg.trial_id] = run_id
        try:
            # Sets the code_version tag from the launcher's provenance (which carries it).
            tracking.log_provenance(settings.mlflow_uri, run_id, config=flat, info=settings.provenance)
            # The row sums the wall time of every attempt.
            tables.write_trial(settings.results, settings.study, flat,
                               outcome(settings, cfg, "running", pack_id, mlflow_run_id=run_id, started_at=utc_now(),
                                       wall_time_s=prior_wall_time(row), **carried(row)))
        except BaseException as exc:
            for started in run_ids.values():
                try:
                    end_run(settings.mlflow_uri, started, "failed", f"storage fault: {type(exc).__name__}: {exc}")
                except Exception:  # noqa: BLE001 - the storage fault is raised
                    log.exception("could not end MLflow run %s", started)
            raise
    return run_ids


def close_trial(results: str, study: str, mlflow_uri: str, flat: dict[str, Any], result: dict[str, Any],
                run_id: str | None, tags: dict[str, str] | None = None) -> tuple[Exception | None, Exception | None]:
    """Write a trial's final row (`result`: ``status`` finished, failed or stopped, ``error`` why it
    failed) and end its MLflow run as the row says (`end_run`), each whatever happens to the other (a
    read-only or full results folder must not leave the run RUNNING, nor an MLflow outage the row
    "running"). A trial whose row could not be written is not finished: its run ends FAILED and
    --resume reruns it. ``run_id`` None leaves the run alone (the tracking server is gone). Returns
    (the row's fault, the run's fault), None where there was none; an interrupt is raised."""
    status, why = result["status"], (result.get("error") or "")[: tracking.ERROR_TEXT_LIMIT] or None
    result = {**result, "error": why, "mlflow_run_id": result.get("mlflow_run_id") or run_id, "ended_at": utc_now()}
    row_fault = run_fault = None
    try:
        tables.write_trial(results, study, flat, result)
    except BaseException as exc:  # noqa: BLE001 - returned (an interrupt raised) once the run is closed
        row_fault = exc
        if status != "failed":
            status, why = "failed", f"storage fault: {type(exc).__name__}: {exc}"
    try:
        if run_id is not None:
            end_run(mlflow_uri, run_id, status, why, tags)
    except Exception as exc:  # noqa: BLE001 - returned
        run_fault = exc
    if row_fault is not None and not isinstance(row_fault, Exception):
        raise row_fault  # an interrupt, once the run is closed
    return row_fault, run_fault


def end_run(mlflow_uri: str, run_id: str, status: str, why: str | None = None,
            tags: dict[str, str] | None = None) -> None:
    """End a trial's MLflow run as its row's ``status`` says: finished FINISHED; stopped (a scheduler
    stopped it) FINISHED, tagged stopped early; failed FAILED, with `why` in its error tag. ``tags``: more."""
    tags = {**(tags or {}),
            tracking.ERROR_TAG: (why or "")[: tracking.ERROR_TEXT_LIMIT] if status == "failed" else None}
    if status == "stopped":
        tags[tracking.STOPPED_EARLY_TAG] = "true"
    tracking.set_tags(mlflow_uri, run_id, tags)
    tracking.end_trial_run(mlflow_uri, run_id, "FAILED" if status == "failed" else "FINISHED")


def close_unclosed(settings: LaunchSettings, cfgs: Sequence[RunConfig], run_ids: dict[str, str], why: str,
                   pack_id: str | None) -> None:
    """Members whose row is still "running" (or missing) when their driver ends (the worker was killed,
    every retry failed, the data is missing, a scheduler stopped the trial) become failed with `why`; each
    row and run is closed whatever happens to the others, then the first storage fault is raised."""
    errors: list[BaseException] = []
    for cfg in cfgs:
        try:
            row = tables.read_trial(settings.results, settings.study, cfg.trial_id)
        except OSError as exc:
            row, errors = None, [*errors, exc]
        if row is None or row["status"] == "running":
            result = outcome(settings, cfg, "failed", pack_id, error=why, started_at=(row or {}).get("started_at"),
                             **carried(row))
            errors += [f for f in close_trial(settings.results, settings.study, settings.mlflow_uri, cfg.to_flat(),
                                              result, run_ids[cfg.trial_id]) if f is not None]
    if errors:
        raise errors[0]


def close_unfinished(results: str, study: str, mlflow_uri: str, experiment_id: str, stopped: set[str],
                     reason: str = "the launch ended before the trial finished", *,
                     tracking_down: bool = False) -> list[str]:
    """After Tune returns no trial runs, so nothing may stay "running". A trial in ``stopped`` (the hparam
    study's scheduler stopped it) becomes "stopped" (MLflow: FINISHED, tag vitsweep.stopped_early); any
    other unfinished trial becomes "failed" with ``reason`` (its row's own error, when it has one, is
    kept), its run FAILED with the same reason. A finished trial's run ends FINISHED
    (``tracking.end_orphaned_runs``), whichever of row and run was closed first.

    Storage faults (a read-only or full results folder, an MLflow outage) do not stop the rest: each row
    is closed on its own; after one MLflow call failed for its whole retry budget the remaining runs are
    left to the next launch (which closes them before it starts), as all are when ``tracking_down`` (the
    launcher's probe found the server gone). Returns one line per fault (empty: none)."""
    faults: list[str] = []
    try:
        table = tables.read_table(results, study, "trials")
        rows = table.to_pylist() if table is not None else []
    except OSError as exc:
        faults.append(f"cannot read the trials table under {results}: {exc}")
        rows = []
    if tracking_down:
        faults.append("the MLflow runs of the unfinished trials are left for the next launch to close "
                      "(the tracking server does not answer)")
    for row in rows:
        early = row["trial_id"] in stopped and row["status"] in ("running", "failed")
        if not early and row["status"] != "running":
            continue
        # (a running row's error is the cause of its last restart, not why it ends: the launch ended it)
        why = reason if row["status"] == "running" else row.get("error") or reason
        closed = {**row, "status": "stopped" if early else "failed", "error": None if early else why}
        run_id, run_fault = None, None
        try:
            run_id = None if tracking_down else \
                row.get("mlflow_run_id") or tracking.find_trial_run(mlflow_uri, experiment_id, row["trial_id"])
        except Exception as exc:  # noqa: BLE001 - told below, as a failed end of the run
            run_fault = exc
        row_fault, end_fault = close_trial(results, study, mlflow_uri, row, closed, run_id)
        run_fault = run_fault or end_fault
        if row_fault is not None:  # the row stays "running": `vitsweep status` calls it stale, --resume reruns it
            faults.append(f"cannot write the trials row of {row['trial_id']}: {row_fault}")
        if isinstance(run_fault, TrackingError):
            tracking_down = True
            faults.append(f"cannot end the MLflow runs of the unfinished trials: {run_fault}")
        elif run_fault is not None:  # the store's own error, e.g. its disk is full
            faults.append(f"cannot end the MLflow run of {row['trial_id']}: {run_fault}")
    if not tracking_down:
        try:
            finished = [r["trial_id"] for r in rows if r["status"] == "finished"]
            tracking.end_orphaned_runs(mlflow_uri, experiment_id, finished_trial_ids=finished)
        except Exception as exc:  # noqa: BLE001 - reported with the other faults
            faults.append(f"cannot end the MLflow runs left RUNNING: {exc}")
    return faults


def carried(row: dict[str, Any] | None) -> dict[str, Any]:
    """What a trial's row keeps across its attempts and launches: its restart count, its last node."""
    return {"restarts": (row or {}).get("restarts") or 0, "node": (row or {}).get("node")}


def record_restart(settings: LaunchSettings, cfgs: Sequence[RunConfig], run_ids: dict[str, str], cause: str) -> None:
    """Ray Train restarts the worker of ``cfgs`` from their last checkpoints: each member still "running"
    counts one more restart in its row (``error`` holds the cause until the trial ends) and in its
    run's tags, so the record says the trial moved. A member closed already is left alone."""
    for cfg in cfgs:
        row = tables.read_trial(settings.results, settings.study, cfg.trial_id)
        if row is None or row["status"] != "running":
            continue
        restarts = (row.get("restarts") or 0) + 1
        why = cause[: tracking.ERROR_TEXT_LIMIT]
        tables.write_trial(settings.results, settings.study, row, {**row, "restarts": restarts, "error": why})
        tracking.set_tags(settings.mlflow_uri, run_ids[cfg.trial_id],
                          {tracking.RESTARTS_TAG: str(restarts), tracking.LAST_RESTART_TAG: why})


def record_node(settings: LaunchSettings, rows: Sequence[dict[str, Any]], node: str) -> None:
    """The rows (still "running") name the node that trains them now (a row that names it already is left)."""
    for row in (r for r in rows if r.get("node") != node):
        tables.write_trial(settings.results, settings.study, row, {**row, "node": node})


def prior_wall_time(row: dict[str, Any] | None) -> float:
    """Seconds of training a trial's row already holds from earlier attempts (0 for a new trial)."""
    value = (row or {}).get("wall_time_s")
    return float(value) if value is not None and value == value else 0.0


def still_open(settings: LaunchSettings, cfgs: Sequence[RunConfig]) -> list[tuple[RunConfig, dict[str, Any]]]:
    """(config, row or {}) of the members whose row is "running" or missing: what a (retried) worker
    trains. A member closed already (finished, or failed for a non-finite loss) never rejoins its pack."""
    rows = [(cfg, tables.read_trial(settings.results, settings.study, cfg.trial_id)) for cfg in cfgs]
    return [(cfg, row or {}) for cfg, row in rows if row is None or row["status"] == "running"]
