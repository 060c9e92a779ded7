"""Where a sweep's results live: every path under ``--results`` and ``--storage``, the remote test and
the filesystem behind a path, in this one module.

    <results>/                        a local folder or a URI (s3://bucket/vitsweep)
      mlflow.db                       the embedded tracking store of local results (records.stores)
      storage/                        the default --storage
      hparam/best_config.json         the hparam study's winner (--defaults-from)
      <study>/                        study_dir
        trials/ epochs/ measurements/ summary/   table_path (TABLES; their columns: records.schema)
          <trial id>[-e<epoch>].parquet, compacted-<lo>-<hi>.parquet   unit_file, compacted_file (records.tables)
        logs/                         logs_dir: the launch's and the console's logs (local results only)
        report/                       report_dir (remote results: ./<study>-report where the command runs)
        .launch.lock                  lock_path (sweeps.launch.lock)
        manifest.json, heartbeat.json study_file (records.manifest)
    <storage>/<study>/                storage_dir: Tune's experiment folders
      train/<pack id>/                train_storage: Ray Train's runs, one per pack
      checkpoints/<trial id>/         checkpoint_dir: a trial's stored checkpoint (its row's checkpoint_path)
      snapshots/<trial id>/           snapshot_dir: its per-epoch snapshots

A path keeps the form of its root: a local path, or a URI with its scheme. What is inside a checkpoint
folder (file names, the snapshot pattern) is ``trainables/loop/checkpoints.py``'s. Standard library only at
import: the launch's pre-torch checks and the plain training loop name paths without loading pyarrow.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyarrow import fs as pafs

TABLES = ("trials", "epochs", "measurements", "summary")
TRACKING_DB = "mlflow.db"
LOCK_NAME = ".launch.lock"
COMPACTED = "compacted"


def is_uri(text: str) -> bool:
    """A URI (``s3://bucket/x``, ``file:///x``, ``ray://host:10001``), not a local path."""
    return "://" in text


def results_location(path: str) -> str:
    """The results-path rule: a URI as it is, a local path made absolute, so every process of a sweep
    names the same folder whatever its working directory."""
    return path if is_uri(path) else os.path.abspath(path)


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path) for a local folder or a remote URI."""
    from pyarrow import fs as pafs  # here: see the module's docstring

    if not is_uri(uri):
        return pafs.LocalFileSystem(), results_location(uri)
    return pafs.FileSystem.from_uri(uri)


def in_form_of(uri: str, path: str) -> str:
    """`path` (a filesystem path) written as `uri` is: with its scheme for a URI."""
    return f"{uri.split('://')[0]}://{path}" if is_uri(uri) else path


def _join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


# -- under <results> ---------------------------------------------------------------------------------
def study_dir(results: str, study: str) -> str:
    return _join(results, study)


def table_path(results: str, study: str, table: str) -> str:
    """Folder of one table, in the same form (local path or URI) as ``results``."""
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}; valid tables: {list(TABLES)}")
    return _join(results, study, table)


# A table's files (records.tables alone writes and deletes them): names built and parsed here only.
def unit_file(trial_id: str, checkpoint_epoch: int | None = None) -> str:
    """The file of one writer unit: a trial, or (measurements) a trial's checkpoint."""
    return f"{trial_id}{'' if checkpoint_epoch is None else f'-e{checkpoint_epoch}'}.parquet"


def compacted_file(lo: int, hi: int) -> str:
    """The file of compaction generations lo..hi (no trial id starts so: it starts with its data set)."""
    return f"{COMPACTED}-{lo:06d}-{hi:06d}.parquet"


def unit_of(name: str, table: str) -> tuple[str, int | None] | None:
    """(trial_id, checkpoint_epoch) of a ``unit_file`` name of ``table``; None: not one (a hidden temp file)."""
    found = re.fullmatch(r"([^.].*)-e(\d+)\.parquet" if table == "measurements" else r"([^.].*)\.parquet", name)
    return (found[1], int(found[2]) if table == "measurements" else None) if found else None


def generations(name: str) -> tuple[int, int] | None:
    """(lo, hi) of a ``compacted_file`` name; None: not one."""
    found = re.fullmatch(rf"{COMPACTED}-(\d+)-(\d+)\.parquet", name)
    return (int(found[1]), int(found[2])) if found else None


def study_file(results: str, study: str, name: str) -> str:
    return _join(results, study, name)


def lock_path(results: str, study: str) -> str:
    return _join(results, study, LOCK_NAME)


def logs_dir(results: str, study: str) -> str | None:
    """The study's log folder; None for remote results (a log file is appended to, line by line)."""
    return None if is_uri(results) else os.path.join(results, study, "logs")


def report_dir(results: str, study: str) -> Path:
    """Where the report goes unless told: ``<results>/<study>/report``; for remote results (``s3://``,
    ``gs://``) the local folder ``<study>-report`` where the command runs (the launch's closing lines
    name it, and with a tracking store it is also the run ``<study>-report``'s artifacts)."""
    if is_uri(results) and not results.startswith("file://"):
        return Path(f"{study}-report").resolve()
    return Path(results.removeprefix("file://")) / study / "report"


def tracking_db(results: str) -> Path | None:
    """The embedded tracking store's file of local results (None for a URI)."""
    return None if is_uri(results) else Path(results).expanduser().resolve() / TRACKING_DB


def best_config_path(results: str) -> str:
    return _join(results, "hparam", "best_config.json")


def default_storage(results: str) -> str:
    return _join(results, "storage")


# -- under <storage> ---------------------------------------------------------------------------------
def storage_dir(storage: str, study: str) -> str:
    return _join(storage, study)


def train_storage(storage: str, study: str) -> str:
    """Ray Train's storage for a study's runs (one per pack, named by the pack id)."""
    return _join(storage, study, "train")


def checkpoint_dir(storage: str, study: str, trial_id: str) -> str:
    """The folder of a trial's stored checkpoint, whichever pack (or none) trains it: the trials
    row's ``checkpoint_path``."""
    return _join(storage, study, "checkpoints", trial_id)


def snapshot_dir(storage: str, study: str, trial_id: str) -> str:
    return _join(storage, study, "snapshots", trial_id)


# -- paths stored in the tables ----------------------------------------------------------------------
def relative_path(results: str, value: Any) -> Any:
    """A path under the results root, as stored: relative to it (anything else as it is)."""
    root = results_location(results).rstrip("/") + "/"
    return value[len(root):] if isinstance(value, str) and value.startswith(root) else value


def rooted_path(results: str, study: str, value: Any) -> Any:
    """A stored path, as read: a relative one joined to ``results``; an absolute one of an older row
    re-rooted under ``results`` when it names ``.../storage/<study>/...`` and that file is here."""
    if not isinstance(value, str) or not value or is_uri(value):
        return value
    root = results_location(results).rstrip("/")
    if not value.startswith("/"):
        return f"{root}/{value}"
    if is_uri(root) or value.startswith(root + "/"):
        return value
    at = value.rfind("/" + storage_dir("storage", study) + "/")
    if at >= 0 and os.path.exists(root + value[at:]):
        return root + value[at:]
    return value
