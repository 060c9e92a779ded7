"""The one module that writes Parquet (layout and columns: ``records.schema``).

Each writer unit owns one file: ``trials/<trial_id>.parquet``, ``epochs/<trial_id>.parquet``,
``measurements/<trial_id>-e<epoch>.parquet`` and ``summary/<trial_id>.parquet``. A retried or resumed
trial overwrites its own files, so no table ever holds duplicate rows, concurrent trials never touch
the same file, and no file is rewritten per *other* trial (nothing grows quadratically with the sweep).

``results`` is a local folder or any URI pyarrow's filesystems understand
(``s3://bucket/prefix``, ``gs://...``). Local writes go to a hidden temporary
name and are renamed into place, so a reader never sees half a file; object
stores make a finished upload visible atomically by themselves.

A copy of the results folder is self-contained: the ``trials`` columns that name files
(``PATH_COLUMNS``) are stored relative to the results root when they lie under it, and every read gives
them back rooted in the results folder being read (``records.layout.relative_path``, ``rooted_path``),
so ``vitsweep analyze`` on a moved copy reads the copy's checkpoints, never the original's.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from records.layout import TABLES, filesystem, relative_path, rooted_path, table_path
from records.schema import EPOCHS, MEASUREMENTS, SUMMARY_FIELDS, TRIAL_FIELDS


def _write(table: pa.Table, results: str, study: str, name: str, file: str) -> str:
    fs, root = filesystem(table_path(results, study, name))
    fs.create_dir(root, recursive=True)
    final = f"{root}/{file}.parquet"
    if isinstance(fs, pafs.LocalFileSystem):
        # Hidden temp name (leading dot, no .parquet suffix): readers skip it.
        tmp = f"{root}/.{file}.{uuid.uuid4().hex[:8]}.tmp"
        pq.write_table(table, tmp, filesystem=fs)
        fs.move(tmp, final)
    else:
        pq.write_table(table, final, filesystem=fs)
    return final


def _scalar_type(value: Any) -> pa.DataType:
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64()
    if isinstance(value, float):
        return pa.float64()
    return pa.string()


def _wide_row(fields: pa.Schema, config: Mapping[str, Any], outcome: Mapping[str, Any]) -> pa.Table:
    columns = {f.name: pa.array([outcome.get(f.name, config.get(f.name))], type=f.type) for f in fields}
    for key, value in config.items():
        if key not in columns:
            columns[key] = pa.array([value], type=_scalar_type(value))
    return pa.table(columns)


PATH_COLUMNS = ("checkpoint_path", "snapshot_dir")


def _rooted_rows(results: str, study: str, table: pa.Table) -> pa.Table:
    for name in PATH_COLUMNS:
        if name in table.column_names:
            values = [rooted_path(results, study, v) for v in table.column(name).to_pylist()]
            table = table.set_column(table.column_names.index(name), name, pa.array(values, type=pa.string()))
    return table


def write_trial(results: str, study: str, config: Mapping[str, Any], outcome: Mapping[str, Any]) -> str:
    """Write (or overwrite) the one ``trials`` row of a trial.

    ``config`` is ``RunConfig.to_flat()``; ``outcome`` holds the fixed columns of
    ``schema.TRIAL_FIELDS`` (missing ones are null). Paths under ``results`` are stored relative
    to it (``PATH_COLUMNS``)."""
    outcome = {**outcome, **{k: relative_path(results, outcome[k]) for k in PATH_COLUMNS if k in outcome}}
    config = {**config, **{k: relative_path(results, config[k]) for k in PATH_COLUMNS if k in config}}
    return _write(_wide_row(TRIAL_FIELDS, config, outcome), results, study, "trials", outcome["trial_id"])


def write_summary(results: str, study: str, config: Mapping[str, Any], headline: Mapping[str, Any]) -> str:
    """Write (or overwrite) the one ``summary`` row of a trial: ``headline`` holds the fixed
    columns of ``schema.SUMMARY_FIELDS`` (missing ones, NaN or None, are null), ``config`` the
    flat run config beside them."""
    clean = {k: None if _isnan(v) else v for k, v in headline.items()}
    config = {k: v for k, v in config.items() if v is not None and not _isnan(v)}
    return _write(_wide_row(SUMMARY_FIELDS, config, clean), results, study, "summary", clean["trial_id"])


def write_epochs(results: str, study: str, trial_id: str, rows: Iterable[Mapping[str, Any]]) -> str:
    """Write a trial's whole epoch history (one row per finished epoch)."""
    rows = [{**r, "trial_id": trial_id, "study": study} for r in rows]
    return _write(pa.Table.from_pylist(rows, schema=EPOCHS), results, study, "epochs", trial_id)


def write_measurements(results: str, study: str, trial_id: str, checkpoint_epoch: int,
                       rows: Iterable[Mapping[str, Any]]) -> str:
    """Write the long-format measurement rows of one checkpoint of one trial."""
    rows = [{**r, "level": None if r.get("level") is None or _isnan(r["level"]) else float(r["level"]),
             "trial_id": trial_id, "study": study, "checkpoint_epoch": checkpoint_epoch} for r in rows]
    return _write(pa.Table.from_pylist(rows, schema=MEASUREMENTS), results, study, "measurements",
                  f"{trial_id}-e{checkpoint_epoch}")


def measured(results: str, study: str) -> set[tuple[str, int]]:
    """(trial_id, checkpoint_epoch) pairs that already have measurement files."""
    fs, root = filesystem(table_path(results, study, "measurements"))
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    except FileNotFoundError:
        return set()
    done = set()
    for info in infos:
        stem = info.base_name.removesuffix(".parquet")
        if info.base_name.endswith(".parquet") and "-e" in stem:
            trial_id, _, epoch = stem.rpartition("-e")
            if epoch.isdigit():
                done.add((trial_id, int(epoch)))
    return done


def list_studies(results: str) -> list[str]:
    """Studies with tables under ``results``: folders holding a ``trials``, ``epochs`` or
    ``measurements`` folder (not ``storage/``, ``mlartifacts/`` or other neighbours)."""
    fs, root = filesystem(results)
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True, recursive=False))
        studies = []
        for info in infos:
            if info.type == pafs.FileType.Directory and not info.base_name.startswith("."):
                kinds = fs.get_file_info([f"{info.path}/{t}" for t in TABLES])
                if any(k.type == pafs.FileType.Directory for k in kinds):
                    studies.append(info.base_name)
    except OSError:  # not a folder, unreachable: there is nothing to list
        return []
    return sorted(studies)


def read_trial(results: str, study: str, trial_id: str) -> dict[str, Any] | None:
    """The ``trials`` row of one trial, or None: one small read, whatever the sweep's size."""
    fs, root = filesystem(table_path(results, study, "trials"))
    path = f"{root}/{trial_id}.parquet"
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    rows = pq.read_table(path, filesystem=fs).to_pylist()
    if not rows:
        return None
    return {**rows[0], **{k: rooted_path(results, study, rows[0][k]) for k in PATH_COLUMNS if k in rows[0]}}


def read_table(results: str, study: str, table: str) -> pa.Table | None:
    """A whole table, or None when nothing has been written yet (the trials' paths rooted in
    ``results``)."""
    fs, root = filesystem(table_path(results, study, table))
    info = fs.get_file_info(root)
    if info.type != pafs.FileType.Directory:
        return None
    files = [i.path for i in fs.get_file_info(pafs.FileSelector(root))
             if i.base_name.endswith(".parquet") and not i.base_name.startswith(".")]
    if not files:
        return None
    # Trials may differ in config columns (a study adds a field): unify by name.
    tables = [pq.read_table(f, filesystem=fs) for f in sorted(files)]
    whole = pa.concat_tables(tables, promote_options="default")
    return _rooted_rows(results, study, whole) if table == "trials" else whole


def _isnan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)
