"""The one module that writes and deletes Parquet (files' names: ``records.layout``; columns: ``records.schema``).

Each writer unit (a trial; in ``measurements`` a trial's checkpoint) owns one file. A retried or resumed
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

Compaction: thousands of small files cost a file open each on every read, so writer units whose trial
settled are folded into a few compacted files per table (``compact``: at the end of
a launch's training and every ``COMPACT_EVERY`` settled trials or ``COMPACT_INTERVAL_S`` during it,
``compacting``; at an analysis' end). Rows are copied as stored (paths stay relative). Nothing is renamed
on an object store, so the order of writes alone keeps every read exact, wherever a compaction is killed:

- a compacted file is written whole (a local temporary name renamed, an object store's single PUT)
  before any file it replaces is deleted;
- a writer unit's own file wins over every compacted row of its unit (trial; trial x checkpoint for
  measurements): a trial retried after compaction, or a file a killed compaction did not delete yet;
- ``<lo>-<hi>`` are the compaction generations a compacted file holds: one whose range lies inside
  another's was merged into it (by a compaction killed before deleting it) and is not read;
- live compacted files never share a unit: a compaction whose units are compacted already merges.

Compactions run one at a time: under the launch lock (the launch, ``vitsweep analyze``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from records.layout import (TABLES, compacted_file, filesystem, generations, relative_path, rooted_path, table_path,
                            unit_file, unit_of)
from records.schema import EPOCHS, MEASUREMENTS, SUMMARY_FIELDS, TRIAL_FIELDS

log = logging.getLogger("vitsweep")

COMPACT_EVERY = 500  # during a launch: compact once this many settled trials' files wait...
COMPACT_INTERVAL_S = 600.0  # ...or this long has passed with any waiting
MAX_COMPACTED = 8  # live compacted files of a table before a compaction merges them into one
TRIALS_PER_ROW_GROUP = 1024  # compacted trials and summary, sorted by trial id: read_trial reads one row group
ROWS_PER_GROUP = 1 << 18  # compacted epochs and measurements: a few row groups, not one per unit file
FIXED = {"trials": TRIAL_FIELDS, "epochs": EPOCHS, "measurements": MEASUREMENTS, "summary": SUMMARY_FIELDS}
UNITS_KEY = b"vitsweep.units"  # a compacted file's footer: its units, [trial_id] ([trial_id, checkpoint_epoch])
SETTLED = ("finished", "stopped")  # no launch writes such a trial's files again: compacted while others train


@dataclass
class _Placement:
    fs: pafs.FileSystem
    path: str  # where to write
    final: str
    keep: bool = True  # False: the file is deleted when the block ends


@contextlib.contextmanager
def _placing(results: str, study: str, name: str, file: str) -> Iterator[_Placement]:
    """Where to write table ``name``'s file ``file`` so that no reader sees it half written: on a local
    disk a hidden temp name (leading dot, no .parquet suffix: readers skip it) moved into place when the
    block ends; elsewhere the final name (an object store's upload lands whole). A block that raises (a
    full disk, a kill) leaves no file."""
    fs, root = filesystem(table_path(results, study, name))
    fs.create_dir(root, recursive=True)
    final = f"{root}/{file}"
    local = isinstance(fs, pafs.LocalFileSystem)
    place = _Placement(fs, f"{root}/.{file}.{uuid.uuid4().hex[:8]}.tmp" if local else final, final)
    try:
        yield place
    except BaseException:
        with contextlib.suppress(OSError):
            fs.delete_file(place.path)
        raise
    if not place.keep:
        fs.delete_file(place.path)
    elif local:
        fs.move(place.path, final)


def _write(table: pa.Table, results: str, study: str, name: str, file: str, **options: Any) -> str:
    with _placing(results, study, name, file) as place:
        pq.write_table(table, place.path, filesystem=place.fs, **options)
    return place.final


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
    return _write(_wide_row(TRIAL_FIELDS, config, outcome), results, study, "trials", unit_file(outcome["trial_id"]))


def write_summary(results: str, study: str, config: Mapping[str, Any], headline: Mapping[str, Any]) -> str:
    """Write (or overwrite) the one ``summary`` row of a trial: ``headline`` holds the fixed
    columns of ``schema.SUMMARY_FIELDS`` (missing ones, NaN or None, are null), ``config`` the
    flat run config beside them."""
    clean = {k: None if _isnan(v) else v for k, v in headline.items()}
    config = {k: v for k, v in config.items() if v is not None and not _isnan(v)}
    return _write(_wide_row(SUMMARY_FIELDS, config, clean), results, study, "summary", unit_file(clean["trial_id"]))


def write_epochs(results: str, study: str, trial_id: str, rows: Iterable[Mapping[str, Any]]) -> str:
    """Write a trial's whole epoch history (one row per finished epoch)."""
    rows = [{**r, "trial_id": trial_id, "study": study} for r in rows]
    return _write(pa.Table.from_pylist(rows, schema=EPOCHS), results, study, "epochs", unit_file(trial_id))


def write_measurements(results: str, study: str, trial_id: str, checkpoint_epoch: int,
                       rows: Iterable[Mapping[str, Any]]) -> str:
    """Write the long-format measurement rows of one checkpoint of one trial."""
    rows = [{**r, "level": None if r.get("level") is None or _isnan(r["level"]) else float(r["level"]),
             "trial_id": trial_id, "study": study, "checkpoint_epoch": checkpoint_epoch} for r in rows]
    return _write(pa.Table.from_pylist(rows, schema=MEASUREMENTS), results, study, "measurements",
                  unit_file(trial_id, checkpoint_epoch))


@dataclass(frozen=True)
class _Unit:
    path: str
    trial_id: str
    checkpoint_epoch: int | None  # measurements only


@dataclass(frozen=True)
class _Compacted:
    path: str
    lo: int  # the compaction generations it holds
    hi: int


@dataclass(frozen=True)
class _Folder:
    """One table's files as one listing saw them: writer units and the live compacted files (the stale
    ones were merged into a live one by a compaction killed before it deleted them)."""

    fs: pafs.FileSystem
    table: str
    units: tuple[_Unit, ...]
    live: tuple[_Compacted, ...]
    stale: tuple[_Compacted, ...]

    @property
    def paths(self) -> list[str]:
        return [c.path for c in self.live] + [u.path for u in self.units]


def _folder(results: str, study: str, table: str) -> _Folder | None:
    """The files of a table (one listing); None when it has no folder."""
    fs, root = filesystem(table_path(results, study, table))
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    except (FileNotFoundError, NotADirectoryError):
        return None
    units, compacted = [], []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        if held := generations(info.base_name):
            compacted.append(_Compacted(info.path, *held))
        elif unit := unit_of(info.base_name, table):
            units.append(_Unit(info.path, *unit))
    inside = {c for c in compacted for o in compacted
              if (o.lo, o.hi) != (c.lo, c.hi) and o.lo <= c.lo and c.hi <= o.hi}
    live = sorted(set(compacted) - inside, key=lambda c: (c.lo, c.path))
    return _Folder(fs, table, tuple(sorted(units, key=lambda u: u.path)), tuple(live), tuple(inside))


def _keys(table: str) -> list[str]:
    return ["trial_id", "checkpoint_epoch"] if table == "measurements" else ["trial_id"]


def _of_units(units: Iterable[_Unit], table: str) -> pc.Expression | None:
    """Rows of these writer units (None: no unit)."""
    by_epoch: dict[int | None, list[str]] = {}
    for u in units:
        by_epoch.setdefault(u.checkpoint_epoch, []).append(u.trial_id)
    if table != "measurements":
        ids = by_epoch.get(None)
        return pc.field("trial_id").isin(ids) if ids else None
    expr = None
    for epoch, ids in by_epoch.items():
        one = (pc.field("checkpoint_epoch") == epoch) & pc.field("trial_id").isin(ids)
        expr = one if expr is None else expr | one
    return expr


def _schema(folder: _Folder, columns: Iterable[str] | None) -> pa.Schema:
    """The columns of the files as one schema: the fixed one where it covers what is asked (epochs and
    measurements always; a file lacking a column reads it null), else every file's footer unified
    (trials and summary carry config columns a study may add)."""
    fixed = FIXED[folder.table]
    if folder.table in ("epochs", "measurements") or (columns is not None and set(columns) <= set(fixed.names)):
        return fixed
    return pa.unify_schemas([pq.read_schema(p, filesystem=folder.fs) for p in folder.paths],
                            promote_options="permissive")


def _dataset(folder: _Folder, columns: Iterable[str] | None, *, lean: bool = False
             ) -> tuple[pads.Dataset, list[str], list[str], pc.Expression | None]:
    """(the folder's files as one dataset, the columns asked that they have (None: all), the columns to scan, the
    filter that leaves out a compacted row whose unit has its own file now, or None). ``lean``: string columns
    read dictionary-encoded, one row group decoded at a time."""
    columns = list(columns) if columns is not None else None
    schema = _schema(folder, columns)
    names = [c for c in (columns if columns is not None else schema.names) if c in schema.names]
    replaced = _of_units(folder.units, folder.table) if folder.live else None
    keys = [k for k in _keys(folder.table) if k not in names]
    scan = names if replaced is None else [*names, *keys, "__fragment_index"]
    kept = None if replaced is None else (pc.field("__fragment_index") >= len(folder.live)) | ~replaced
    file_format: Any = "parquet"  # fragments: the live compacted files first, then the units (``_Folder.paths``)
    if lean:
        strings = [f.name for f in schema if pa.types.is_string(f.type)]
        schema = pa.schema([f.with_type(pa.dictionary(pa.int32(), f.type)) if f.name in strings else f for f in schema],
                           metadata=schema.metadata)
        file_format = pads.ParquetFileFormat(read_options=pads.ParquetReadOptions(dictionary_columns=strings),
                                             default_fragment_scan_options=pads.ParquetFragmentScanOptions(
                                                 pre_buffer=False))
    return pads.dataset(folder.paths, schema=schema, format=file_format, filesystem=folder.fs), names, scan, kept


def _scan(folder: _Folder, columns: Iterable[str] | None = None, *, where: pc.Expression | None = None) -> pa.Table:
    """One ``pyarrow.dataset`` scan of the folder's files, projected on ``columns`` (those the files have;
    None: all), rows as stored; a compacted row whose unit has its own file now is left out."""
    dataset, names, scan, kept = _dataset(folder, columns)
    table = dataset.to_table(columns=scan, filter=where)
    return table if kept is None else table.filter(kept).select(names)


def measured(results: str, study: str) -> set[tuple[str, int]]:
    """(trial_id, checkpoint_epoch) pairs that already have measurements (a file, or compacted rows)."""
    folder = _folder(results, study, "measurements")
    if folder is None:
        return set()
    done = {(u.trial_id, u.checkpoint_epoch) for u in folder.units}
    for part in folder.live:
        done |= _held(folder, part)
    return done


def _held(folder: _Folder, part: _Compacted) -> set[tuple]:
    """The units a compacted file holds: (trial_id,), or (trial_id, checkpoint_epoch) for measurements. Its
    footer lists them (``_listed``): no row is read; a file compacted before footers were written has its keys read."""
    listed = (pq.read_metadata(part.path, filesystem=folder.fs).metadata or {}).get(UNITS_KEY)  # the file's key-values
    if listed is not None:
        return set(map(tuple, json.loads(listed)))
    keys = _scan(replace(folder, units=(), live=(part,)), _keys(folder.table)).to_pydict()
    return set(zip(*(keys[k] for k in _keys(folder.table))))


def _write_streamed(folder: _Folder, results: str, study: str, file: str) -> set[tuple]:
    """``_scan``'s rows written to ``file`` one record batch at a time (memory: a batch, not the table), its
    footer listing the units it holds (``_listed``); those units. No rows: no file."""
    dataset, names, scan, kept = _dataset(folder, None)
    keys, held = _keys(folder.table), set()
    with _placing(results, study, folder.table, file) as place, pq.ParquetWriter(
            place.path, pa.schema([dataset.schema.field(n) for n in names]), filesystem=place.fs) as writer:
        pending: list[pa.Table] = []  # a row group per write: batches (one per unit file) gathered first
        waiting = 0
        for batch in dataset.to_batches(columns=scan, batch_readahead=1, fragment_readahead=1):
            rows = pa.Table.from_batches([batch])
            rows = rows if kept is None else rows.filter(kept).select(names)
            if rows.num_rows:
                held |= _units(rows, keys)
                pending.append(rows)
                waiting += rows.num_rows
            if waiting >= ROWS_PER_GROUP:
                writer.write_table(pa.concat_tables(pending), row_group_size=ROWS_PER_GROUP)
                pending, waiting = [], 0
        if pending:
            writer.write_table(pa.concat_tables(pending), row_group_size=ROWS_PER_GROUP)
        writer.add_key_value_metadata({UNITS_KEY: json.dumps(sorted(held))})
        place.keep = bool(held)  # no rows: no file
    return held


def _units(rows: pa.Table, keys: list[str]) -> set[tuple]:
    """The units the rows hold: their distinct ``keys`` tuples."""
    found = rows.select(keys).group_by(keys).aggregate([]).to_pydict()
    return set(zip(*(found[k] for k in keys)))


def _listed(rows: pa.Table, table: str) -> tuple[pa.Table, set[tuple]]:
    """(``rows`` with the units they hold listed in their footer, those units)."""
    held = _units(rows, _keys(table))
    return rows.replace_schema_metadata({**(rows.schema.metadata or {}), UNITS_KEY: json.dumps(sorted(held))}), held


def read_trial(results: str, study: str, trial_id: str) -> dict[str, Any] | None:
    """The ``trials`` row of one trial, or None: one small read, whatever the sweep's size (its own file;
    else the one row group of the compacted files that holds it)."""
    fs, root = filesystem(table_path(results, study, "trials"))
    path = f"{root}/{unit_file(trial_id)}"
    if fs.get_file_info(path).type == pafs.FileType.File:
        rows = pq.read_table(path, filesystem=fs).to_pylist()
    else:
        folder = _folder(results, study, "trials")
        rows = _scan(replace(folder, units=()), where=pc.field("trial_id") == trial_id).to_pylist() \
            if folder is not None and folder.live else []
    if not rows:
        return None
    return {**rows[0], **{k: rooted_path(results, study, rows[0][k]) for k in PATH_COLUMNS if k in rows[0]}}


def read_table(results: str, study: str, table: str, columns: Iterable[str] | None = None) -> pa.Table | None:
    """A whole table in one scan, or None when nothing has been written yet: ``columns`` only (those it
    has; None: all), each unit's rows once (its own file over compacted rows), the trials' paths rooted
    in ``results``."""
    folder = _folder(results, study, table)
    if folder is None or not folder.paths:
        return None
    whole = _scan(folder, columns)
    return _rooted_rows(results, study, whole) if table == "trials" else whole


def read_batches(results: str, study: str, table: str,
                 columns: Iterable[str] | None = None) -> Iterator[pa.RecordBatch]:
    """``read_table`` batch by batch (not ``trials``: its paths are rooted by ``read_table``), for a reader that
    keeps each batch in a leaner form: string columns come dictionary-encoded and one row group is decoded at a
    time, so the stored form of the whole table never sits in memory (the measurements of 10,000 trials: 11.75
    million rows, 2.6 GB as pandas reads them)."""
    if table == "trials":
        raise ValueError("read_batches does not read 'trials' (its paths are rooted by read_table)")
    folder = _folder(results, study, table)
    if folder is None or not folder.paths:
        return
    dataset, names, scan, kept = _dataset(folder, columns, lean=True)
    for batch in dataset.to_batches(columns=scan, use_threads=False, batch_readahead=0, fragment_readahead=0):
        yield batch if kept is None else batch.filter(kept).select(names)


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


def compact(results: str, study: str, *, settled_only: bool = False) -> int:
    """Fold every table's writer-unit files into compacted files (see the module's docstring); with
    ``settled_only`` (a launch still training) only those of trials whose row is ``SETTLED``. Returns how
    many trials' files were left as they are."""
    left: set[str] = set()
    listed: dict[str, _Folder | None] = {}
    if settled_only:
        # The trials table is compacted from this same listing: a row written after it (a trial opening
        # now) is neither read as settled nor folded in.
        listed["trials"] = trials = _folder(results, study, "trials")
        if trials is not None and trials.units:
            rows = _scan(replace(trials, live=()), ["trial_id", "status"]).to_pydict()
            left = {t for t, s in zip(rows["trial_id"], rows["status"]) if s not in SETTLED}
    for table in TABLES:
        folder = listed[table] if table in listed else _folder(results, study, table)
        if folder is not None:
            _compact(results, study, folder, tuple(u for u in folder.units if u.trial_id not in left))
    return len(left)


def _compact(results: str, study: str, folder: _Folder, units: tuple[_Unit, ...]) -> None:
    fs, table = folder.fs, folder.table
    gone = [c.path for c in folder.stale]
    if units:
        generation = 1 + max((c.hi for c in (*folder.live, *folder.stale)), default=0)
        # A unit compacted already (a retried trial), or too many files: merge them all, so live compacted
        # files never share a unit and stay few. The live files' footers say which units they hold.
        mine = {(u.trial_id, u.checkpoint_epoch)[:len(_keys(table))] for u in units}
        merge = len(folder.live) >= MAX_COMPACTED or any(mine & _held(folder, part) for part in folder.live)
        merged = replace(folder, units=units, live=folder.live if merge else ())
        file = compacted_file(min((c.lo for c in folder.live), default=generation) if merge else generation,
                               generation)
        if table in ("trials", "summary"):  # sorted, in small row groups: read_trial reads one
            rows = _scan(merged).sort_by("trial_id")
            rows, held = _listed(rows, table)  # ``measured`` and the next compaction read no row
            if rows.num_rows:
                _write(rows, results, study, table, file, row_group_size=TRIALS_PER_ROW_GROUP)
        else:  # epochs and measurements: millions of rows at 10,000 trials, so streamed, a batch at a time
            held = _write_streamed(merged, results, study, file)
        if held:
            # A unit file with no rows stays: its name is the record that it ran (``measured``).
            gone += [u.path for u in units if (u.trial_id, u.checkpoint_epoch)[:len(_keys(table))] in held]
            gone += [c.path for c in folder.live] if merge else []
    for path in gone:  # only now: the compacted file holds their rows
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(path)


def retain(results: str, study: str, table: str, trial_ids: set[str]) -> None:
    """Drop the rows of every trial not in ``trial_ids`` from ``table``: their own files deleted, compacted
    files written again without them (an object store replaces a file whole, like a local rename)."""
    folder = _folder(results, study, table)
    if folder is None:
        return
    for unit in folder.units:
        if unit.trial_id not in trial_ids:
            with contextlib.suppress(FileNotFoundError):
                folder.fs.delete_file(unit.path)
    keep = pc.field("trial_id").isin(sorted(trial_ids))
    for part in folder.live:
        rows = pq.read_table(part.path, filesystem=folder.fs)
        kept = rows.filter(keep)
        if kept.num_rows == rows.num_rows:
            continue
        if kept.num_rows:
            _write(_listed(kept, table)[0], results, study, table, part.path.rsplit("/", 1)[1],
                   row_group_size=TRIALS_PER_ROW_GROUP)
        else:
            folder.fs.delete_file(part.path)


def try_compact(results: str, study: str, *, settled_only: bool = False) -> int:
    """``compact``, where a storage fault costs only speed: it is logged, and every file stays readable as
    it is (a later compaction folds it)."""
    try:
        return compact(results, study, settled_only=settled_only)
    except (OSError, pa.ArrowException) as exc:
        log.warning("compacting the tables of %s failed (%s); their files stay as they are", study, exc)
        return 0


@contextlib.contextmanager
def compacting(results: str, study: str, *, table: str = "trials", every: int = COMPACT_EVERY,
               interval_s: float = COMPACT_INTERVAL_S, poll_s: float = 30.0) -> Iterator[None]:
    """While the block runs (a launch's training; ``table="measurements"``: an analysis), compact the settled
    trials' files in a daemon thread once ``every`` files of ``table`` wait or ``interval_s`` has passed;
    when it ends (no trial runs then), all of them (``try_compact``). So no compaction meets the files of
    thousands of units at once (the scan's cost grows with the files: ~0.2 MB each at 10,000)."""
    stop = threading.Event()

    def waiting() -> int:
        folder = _folder(results, study, table)
        return len(folder.units) if folder is not None else 0

    def loop() -> None:
        last, running = time.monotonic(), 0
        while not stop.wait(poll_s):
            try:
                ready = waiting() - running
            except OSError:
                continue
            if ready >= every or (ready > 0 and time.monotonic() - last >= interval_s):
                try_compact(results, study, settled_only=True)
                last = time.monotonic()
                with contextlib.suppress(OSError):  # the files it kept (running trials') wait for no compaction
                    running = waiting()

    thread = threading.Thread(target=loop, name="vitsweep-compact", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        try_compact(results, study)


def _isnan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)
