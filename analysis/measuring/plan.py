"""The analysis plan: which checkpoints of a study's finished trials to measure, and which of them are gone.

A finished trial plans its final checkpoint and, with ``--checkpoints all``, its snapshots at the epochs
training writes them (``trainables.loop.train.snapshot_epochs``). A planned checkpoint whose file is gone (its
trial's checkpoint or snapshot folder deleted) is *missing*: the analysis job names it, records it in the
analysis plan (``records.manifest.write_analysis_plan``) for ``vitsweep status`` and the report, and
measures the rest.
"""

from __future__ import annotations

from typing import Any

from records import files, tables
from records.layout import table_path

CHECKPOINT_CHOICES = ("final", "all")


def plan_checkpoints(results: str, study: str,
                     which: str = "final") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(checkpoints to measure, planned checkpoints whose file is gone) of the finished trials. Planned: each
    trial's final checkpoint, and with ``which="all"`` its snapshots at ``trainables.loop.train.snapshot_epochs``
    of its epochs (the ones training writes) before the last. Each is a dict of trial_id, epoch, path,
    dataset, data_root, mlflow_run_id and final (the trial's last checkpoint). A missing one used to drop
    out of the plan unseen, leaving an empty summary row."""
    from trainables.loop import checkpoints, train  # here, not at the top: `vitsweep --help` imports no torch

    if which not in CHECKPOINT_CHOICES:
        raise ValueError(f"checkpoints must be one of {list(CHECKPOINT_CHOICES)}, got {which!r}")
    trials = tables.read_table(results, study, "trials")
    if trials is None:
        raise ValueError(f"no trials table under {table_path(results, study, 'trials')}: train the study "
                         f"first; studies under {results}: {tables.list_studies(results) or '(none)'}")
    rows, missing = [], []
    for t in trials.to_pylist():
        if t["status"] != "finished":
            continue
        last = int(t["epochs_completed"] or 0)
        # Its MLflow run, found by id (``records.tracking.find_trial_run``); the final checkpoint gets a figure.
        about = {"dataset": t["dataset"], "data_root": t["data_root"], "mlflow_run_id": t.get("mlflow_run_id")}
        if t.get("checkpoint_path"):
            path = checkpoints.checkpoint_file(t["checkpoint_path"])
            found = rows if files.exists(path) else missing
            found.append({"trial_id": t["trial_id"], "epoch": last, "path": path, **about, "final": True})
        if which == "all" and t.get("snapshot_dir"):
            stored = {e: p for p in files.list_files(t["snapshot_dir"])
                      if (e := checkpoints.snapshot_epoch(p)) is not None}
            expected = {e for e in train.snapshot_epochs(int(t.get("epochs") or last)) if e < last}
            for epoch in sorted((set(stored) | expected) - {last}):  # the last epoch: its checkpoint is measured
                path = stored.get(epoch) or f"{t['snapshot_dir'].rstrip('/')}/{checkpoints.snapshot_name(epoch)}"
                (rows if epoch in stored else missing).append(
                    {"trial_id": t["trial_id"], "epoch": epoch, "path": path, **about, "final": False})
    return rows, missing


def missing_line(study: str, missing: list[dict[str, Any]]) -> str:
    """One line naming the planned checkpoints whose files are gone, by trial."""
    by_trial: dict[str, list[int]] = {}
    for m in missing:
        by_trial.setdefault(m["trial_id"], []).append(int(m["epoch"]))
    named = [f"{t} epoch{'s' if len(e) > 1 else ''} {', '.join(map(str, sorted(e)))}" for t, e in by_trial.items()]
    shown = "; ".join(named[:5]) + (f"; and {len(named) - 5} more trial(s)" if len(named) > 5 else "")
    return (f"analysis of {study}: {len(missing)} planned checkpoint(s) missing, their files gone, not measured: "
            f"{shown}")
