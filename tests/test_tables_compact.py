"""Compacted tables (#41): a study's writer units folded into a few files per table, every read one scan
that sees each unit once, whether a trial was retried after compaction or a compaction was killed midway
(``records.tables``, its docstring)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from records import tables
from tests.conftest import ROOT

STUDY = "s"


def _trial(results: str, trial_id: str, status: str = "finished", *, value: float = 0.5, epochs=(0, 2),
           **config) -> None:
    """One trial's files, as the launcher and the analysis write them."""
    tables.write_trial(results, STUDY, {"lr": 1e-3, **config}, {
        "trial_id": trial_id, "study": STUDY, "status": status, "test_acc": value,
        "snapshot_dir": f"{results}/storage/{STUDY}/snapshots/{trial_id}"})
    tables.write_epochs(results, STUDY, trial_id, [{"epoch": e, "eval_acc": value} for e in (1, 2)])
    for epoch in epochs:
        tables.write_measurements(results, STUDY, trial_id, epoch, [
            {"intervention": "clean", "metric": "acc", "value": value, "n_images": 8},
            {"intervention": "clean", "metric": "mad", "layer": 0, "head_index": 0, "value": value, "n_images": 8}])


def _files(results: Path, table: str) -> list[str]:
    return sorted(p.name for p in (results / STUDY / table).iterdir())


def _rows(results: str, table: str) -> list[dict]:
    return tables.read_table(results, STUDY, table).to_pylist()


def test_compaction_folds_the_units_and_every_read_sees_each_row_once(tmp_path):
    results = str(tmp_path)
    for i in range(4):
        _trial(results, f"shapes-{i}")
    before = {t: sorted(map(str, _rows(results, t))) for t in ("trials", "epochs", "measurements")}
    tables.compact(results, STUDY)
    for table in ("trials", "epochs", "measurements"):
        assert _files(tmp_path, table) == ["compacted-000001-000001.parquet"]
        assert sorted(map(str, _rows(results, table))) == before[table]
        # Its footer lists the units it holds: the next compaction and ``measured`` read no row.
        footer = pq.read_metadata(tmp_path / STUDY / table / "compacted-000001-000001.parquet").metadata
        units = [[f"shapes-{i}", *([e] if table == "measurements" else [])] for i in range(4)
                 for e in ((0, 2) if table == "measurements" else (None,))]
        assert sorted(json.loads(footer[tables.UNITS_KEY])) == units
    # Batch by batch (strings dictionary-encoded), the same rows.
    batches = pa.Table.from_batches(tables.read_batches(results, STUDY, "measurements"))
    assert sorted(map(str, batches.to_pylist())) == before["measurements"]
    # The compacted rows are stored as the units were: paths relative to the results root, rooted on read.
    stored = pq.read_table(tmp_path / STUDY / "trials" / "compacted-000001-000001.parquet").to_pylist()
    assert {r["snapshot_dir"] for r in stored} == {f"storage/{STUDY}/snapshots/shapes-{i}" for i in range(4)}
    snapshots = f"{results}/storage/{STUDY}/snapshots"
    assert tables.read_trial(results, STUDY, "shapes-2")["snapshot_dir"] == f"{snapshots}/shapes-2"
    assert tables.read_trial(results, STUDY, "nope") is None
    assert tables.measured(results, STUDY) == {(f"shapes-{i}", e) for i in range(4) for e in (0, 2)}
    # One scan, projected: only the columns asked for.
    assert tables.read_table(results, STUDY, "trials", ["trial_id", "status"]).column_names == ["trial_id", "status"]
    assert tables.read_table(results, STUDY, "measurements", ["value"]).num_rows == 16
    # A moved copy reads its own paths.
    shutil.copytree(tmp_path / STUDY, tmp_path / "copy" / STUDY)
    copy = str(tmp_path / "copy")
    assert tables.read_trial(copy, STUDY, "shapes-1")["snapshot_dir"] == f"{copy}/storage/{STUDY}/snapshots/shapes-1"


def test_a_trial_retried_after_compaction_is_never_duplicated(tmp_path):
    results = str(tmp_path)
    for i in range(3):
        _trial(results, f"shapes-{i}")
    tables.compact(results, STUDY)
    # Retried: its own files replace its compacted rows (a checkpoint's measurements replace only that
    # checkpoint's), before and after the next compaction.
    _trial(results, "shapes-1", value=0.9, epochs=(2,))
    for _ in range(2):
        trials = {r["trial_id"]: r["test_acc"] for r in _rows(results, "trials")}
        assert trials == {"shapes-0": 0.5, "shapes-1": 0.9, "shapes-2": 0.5}
        assert len(_rows(results, "trials")) == 3
        assert sorted((r["trial_id"], r["eval_acc"]) for r in _rows(results, "epochs")) == sorted(
            [(f"shapes-{i}", 0.9 if i == 1 else 0.5) for i in range(3) for _ in (1, 2)])
        measured = sorted((r["trial_id"], r["checkpoint_epoch"], r["metric"], r["value"])
                          for r in _rows(results, "measurements"))
        assert [m for m in measured if m[0] == "shapes-1"] == [("shapes-1", 0, "acc", 0.5), ("shapes-1", 0, "mad", 0.5),
                                                               ("shapes-1", 2, "acc", 0.9), ("shapes-1", 2, "mad", 0.9)]
        assert len(measured) == 12
        assert tables.read_trial(results, STUDY, "shapes-1")["test_acc"] == 0.9
        tables.compact(results, STUDY)
    # The retry merged the compacted files: live ones never share a unit, so one holds them all.
    assert _files(tmp_path, "trials") == _files(tmp_path, "measurements") == ["compacted-000001-000002.parquet"]
    assert tables.read_trial(results, STUDY, "shapes-1")["test_acc"] == 0.9


def test_a_compaction_killed_midway_loses_no_row_and_shows_none_twice(tmp_path):
    """Killed after it wrote its compacted file and before it deleted what that replaces: the state an
    object store (no rename) leaves too. Replayed by putting back the files it deleted."""
    results = str(tmp_path)
    for i in range(3):
        _trial(results, f"shapes-{i}")
    tables.compact(results, STUDY)
    _trial(results, "shapes-1", value=0.9)  # a retry: the next compaction merges
    _trial(results, "shapes-3")
    expected = {t: sorted(map(str, _rows(results, t))) for t in ("trials", "epochs", "measurements")}
    saved = tmp_path / "saved"
    shutil.copytree(tmp_path / STUDY, saved)
    tables.compact(results, STUDY)
    for table in ("trials", "epochs", "measurements"):
        for f in (saved / table).iterdir():
            if not (tmp_path / STUDY / table / f.name).exists():
                shutil.copy(f, tmp_path / STUDY / table / f.name)
        # The merged file beside the one it merged and beside the units it holds: each row once.
        assert "compacted-000001-000001.parquet" in _files(tmp_path, table)
        assert "compacted-000001-000002.parquet" in _files(tmp_path, table)
        assert sorted(map(str, _rows(results, table))) == expected[table]
    assert tables.read_trial(results, STUDY, "shapes-1")["test_acc"] == 0.9
    assert len(tables.measured(results, STUDY)) == 8
    tables.compact(results, STUDY)  # the next compaction clears what the killed one left
    for table in ("trials", "epochs", "measurements"):
        assert _files(tmp_path, table) == ["compacted-000001-000003.parquet"]
        assert sorted(map(str, _rows(results, table))) == expected[table]


def test_during_a_launch_only_settled_trials_are_compacted_and_all_at_its_end(tmp_path):
    results = str(tmp_path)
    _trial(results, "shapes-0")
    _trial(results, "shapes-1", status="stopped")
    _trial(results, "shapes-2", status="running", epochs=())
    _trial(results, "shapes-3", status="failed", epochs=())  # a launch may still retry it
    assert tables.compact(results, STUDY, settled_only=True) == 2
    assert _files(tmp_path, "trials") == ["compacted-000001-000001.parquet", "shapes-2.parquet", "shapes-3.parquet"]
    assert _files(tmp_path, "epochs") == ["compacted-000001-000001.parquet", "shapes-2.parquet", "shapes-3.parquet"]
    assert len(_rows(results, "trials")) == 4
    with tables.compacting(results, STUDY, every=10**6, interval_s=10**6):
        _trial(results, "shapes-2", epochs=())  # finishes
    assert _files(tmp_path, "trials") == _files(tmp_path, "epochs") == [
        "compacted-000001-000001.parquet", "compacted-000002-000002.parquet"]
    assert {r["trial_id"]: r["status"] for r in _rows(results, "trials")} == {
        "shapes-0": "finished", "shapes-1": "stopped", "shapes-2": "finished", "shapes-3": "failed"}


def test_a_launch_compacts_settled_trials_while_it_trains(tmp_path):
    results = str(tmp_path)
    with tables.compacting(results, STUDY, every=2, poll_s=0.01):
        _trial(results, "shapes-0")
        _trial(results, "shapes-1")  # the second settled trial: the pass folds both
        _trial(results, "shapes-2", status="running", epochs=())
        folded = ["compacted-000001-000001.parquet", "shapes-2.parquet"]
        for _ in range(6000):  # until the thread's pass has deleted what it folded (bounded: a slow machine)
            if _files(tmp_path, "trials") == folded:
                break
            time.sleep(0.01)
        assert _files(tmp_path, "trials") == folded
    assert _files(tmp_path, "trials") == ["compacted-000001-000001.parquet", "compacted-000002-000002.parquet"]
    assert {r["trial_id"]: r["status"] for r in _rows(results, "trials")} == {
        "shapes-0": "finished", "shapes-1": "finished", "shapes-2": "running"}


def test_an_analysis_folds_measured_checkpoints_as_they_pile_up(tmp_path):
    results = str(tmp_path)
    _trial(results, "shapes-0", epochs=())
    tables.compact(results, STUDY)  # the launch has ended: no trial's own file waits
    with tables.compacting(results, STUDY, table="measurements", every=2, poll_s=0.01):
        _trial(results, "shapes-0", epochs=(0, 2))  # (its trials row written again: as an analysis does)
        for _ in range(6000):  # until the thread's pass has folded both checkpoints (bounded: a slow machine)
            if _files(tmp_path, "measurements") == ["compacted-000001-000001.parquet"]:
                break
            time.sleep(0.01)
        assert _files(tmp_path, "measurements") == ["compacted-000001-000001.parquet"]
    assert tables.measured(results, STUDY) == {("shapes-0", 0), ("shapes-0", 2)}


def test_many_compactions_merge_into_few_files_and_empty_units_stay(tmp_path):
    results = str(tmp_path)
    for i in range(tables.MAX_COMPACTED + 2):
        _trial(results, f"shapes-{i}", epochs=(2,), extra=i)  # a config column of a later launch: unified
        tables.compact(results, STUDY)
    assert len(_files(tmp_path, "trials")) <= tables.MAX_COMPACTED
    assert sorted(r["extra"] for r in _rows(results, "trials")) == list(range(tables.MAX_COMPACTED + 2))
    tables.write_measurements(results, STUDY, "shapes-0", 4, [])  # measured, no rows: its file is the record
    tables.compact(results, STUDY)
    assert "shapes-0-e4.parquet" in _files(tmp_path, "measurements")
    assert ("shapes-0", 4) in tables.measured(results, STUDY)


def test_retain_drops_compacted_and_own_rows_of_other_trials(tmp_path):
    results = str(tmp_path)
    for i in range(3):
        tables.write_summary(results, STUDY, {"lr": 1e-3}, {"trial_id": f"shapes-{i}", "study": STUDY})
    tables.compact(results, STUDY)
    tables.write_summary(results, STUDY, {"lr": 1e-3}, {"trial_id": "shapes-3", "study": STUDY})
    tables.retain(results, STUDY, "summary", {"shapes-0", "shapes-3"})
    assert sorted(r["trial_id"] for r in _rows(results, "summary")) == ["shapes-0", "shapes-3"]


def test_the_scale_bench_runs_at_a_small_n(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "scale.py"), "--n", "12", "--folder", str(tmp_path),
                          "--quick"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "| 12 |" in out.stdout and "compacted" in out.stdout and "killed" in out.stdout
