"""What reading a study's results costs as it grows: CPU seconds and peak memory of ``vitsweep status``,
``StudyData.load``, ``vitsweep report``, ``vitsweep compare``, a resumed launch's bookkeeping and the analysis'
bookkeeping per checkpoint, at N trials.

    python bench/scale.py --n 100 1000 --label after                       # this checkout
    git worktree add /tmp/vitsweep-before <commit>
    python bench/scale.py --n 100 1000 --label before --code /tmp/vitsweep-before
    python bench/scale.py --n 10000 --commands report --label before --code /tmp/vitsweep-before   # one command

The N-trial results are built once per N with the project's own writers (``records.tables``) in
``--folder`` (outside the work tree; reused by every later run, before and after): the factorial's
conditions (3 data sets x 56 conditions) cycled over seeds, each trial with its trials, epochs (8) and
summary row and 5 measured checkpoints of the demo model's rows (2 layers x 4 heads: 235 rows each).
Its N MLflow runs (``mlflow.db``, SQLite) are one trial's run made by the project's own calls (params, tags,
8 epochs' metrics, 5 checkpoints' scalars and per-layer curves), copied N times in the store's SQL (the
client takes about an hour at 10,000), each under its trials row's ``mlflow_run_id``.

Each command runs in a child process of the code under ``--code`` (its imports included: what a user
waits for), measured by ``os.wait4``: user + system CPU seconds and peak RSS. Two states of the folder,
each prepared by the code under test from a copy of the built one:

- ``compacted``: as a finished launch and analysis leave it (the code's ``records.tables.compact``,
  where it has one; before it, one file per writer unit);
- ``killed``: as a launch killed mid-sweep leaves it: the last min(500, N/2) trials uncompacted (the
  launch's compaction interval), half of them still ``running`` and none of them measured.

``bookkeeping per checkpoint`` is the analysis' work per checkpoint outside the metric computation, without a
figure (``analysis.measuring.job.Measurer.measure``: ``trial_record.record_checkpoint`` on the trial's run found by id,
then ``tables.write_measurements``): CPU seconds per checkpoint over 20 checkpoints of 20 trials (a new
epoch, after one to warm up), measured in the compacted state only, on a copy of the store.

It prints one table with every label measured so far in ``--folder`` (``results.json``), the CPU
ratio to N = 100 beside each. Timings on a loaded machine vary; compare labels measured on one machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STUDY = "factorial"
DATASETS = ("cifar10", "cifar100", "tinyimagenet")
EPOCHS = 8
CHECKPOINTS = (0, 2, 4, 6, 8)
TAIL = 500  # trials a killed launch leaves uncompacted: tables.COMPACT_EVERY of the code measured
COMMANDS = {  # name -> the child's code (R: the results folder, S: the study)
    "status": "from sweeps.cli import main; main(['status', S, '--results', R])",
    "StudyData.load": "from analysis.statistics.study_data import StudyData; StudyData.load(R, S)",
    # What a resumed launch reads before and after its trials (sweeps/run.py: open_launch, _resume_line, unfinished).
    "resume bookkeeping": "from trainables.trial.lifecycle import finished_trials; from records import tables; "
                          "finished_trials(R, S); tables.read_table(R, S, 'trials', ['trial_id']); "
                          "tables.read_table(R, S, 'trials', ['trial_id', 'status'])",
    "report": "import tempfile; from sweeps.cli import main; main(['report', S, '--results', R, '--out', "
              "tempfile.mkdtemp()])",
    "compare": "import tempfile; from sweeps.cli import main; main(['compare', R, R, S, '--out', tempfile.mkdtemp()])",
    "bookkeeping per checkpoint": """
import json, time
from analysis.measuring.trial_record import record_checkpoint
from records import tables, tracking
uri = f"sqlite:///{R}/mlflow.db"
experiment = tracking.ensure_experiment(uri, S)
rows = [{**r, "value": 0.5, "n_images": 10000} for r in json.loads(ROWS)]
trials = tables.read_table(R, S, "trials", ["trial_id", "mlflow_run_id"]).to_pylist()[-21:]

def checkpoint(trial):  # as analysis.measuring.job.Measurer.measure after evaluate_checkpoint, at a new epoch
    record_checkpoint(uri, experiment, trial["trial_id"], trial["mlflow_run_id"], 10, rows, 8, figure=False,
                      table="measurements")
    tables.write_measurements(R, S, trial["trial_id"], 10, rows)

checkpoint(trials[0])  # the imports' and the store's first use
start = time.process_time()
for trial in trials[1:]:
    checkpoint(trial)
print((time.process_time() - start) / len(trials[1:]))
""",
}
# its CPU seconds: per checkpoint, as the child prints them; compacted only
PER_CHECKPOINT = "bookkeeping per checkpoint"
QUICK = ("status", "resume bookkeeping")  # --quick: the commands whose imports take no second
PREPARE = """
from records import tables
from records.schema import TRIAL_FIELDS
import pyarrow.parquet as pq, os
compact = getattr(tables, "compact", None)
tail = {tail!r}
if compact is not None and {killed!r}:
    # As the launch's compaction found them: the tail still running while the rest is compacted.
    for tid in tail:
        row = tables.read_trial(R, S, tid)
        tables.write_trial(R, S, row, {{**row, "status": "running"}})
    compact(R, S, settled_only=True)
    for tid in tail[: len(tail) // 2]:
        row = tables.read_trial(R, S, tid)
        tables.write_trial(R, S, row, {{**row, "status": "finished"}})
elif compact is not None:
    compact(R, S)
"""


def _configs(n: int):
    from sweeps.studies import factorial
    from sweeps.studies.common import StudyOptions

    seeds = math.ceil(n / (56 * len(DATASETS)))
    configs = factorial.trials(StudyOptions(datasets=DATASETS, seeds=seeds, epochs=None))
    return sorted(configs, key=lambda c: c.seed)[:n]  # every condition once per seed: the grid's shape at any N


def _measurement_rows() -> list[dict]:
    """The rows of one checkpoint of the demo model (2 layers x 4 heads), values filled in per trial."""
    rows = [{"intervention": "clean", "metric": m} for m in ("acc", "ape_norm_ratio")]
    rows += [{"intervention": "clean", "metric": m, "layer": layer, "head_index": h}
             for m in ("cls_mass", "entropy", "mad", "mad_no_renorm", "mad_raw") for layer in (0, 1) for h in range(4)]
    rows += [{"intervention": "clean", "metric": "ssdc", "layer": layer} for layer in (0, 1)]
    shifts = ("acc", "fs", "right_both", "right_clean_only", "right_shift_only")
    rows += [{"intervention": "blur", "level": lv, "metric": m} for lv in (0.5, 1.0, 1.5, 2.0, 2.5) for m in shifts]
    rows += [{"intervention": "jpeg", "level": lv, "metric": m} for lv in (5.0, 10.0, 20.0, 50.0, 75.0) for m in shifts]
    scaled = ["acc", "dssdc", *(f"{k}{s}" for k in ("fs_blur", "fs_jpeg")
                                for s in ("", "_right_both", "_right_clean_only", "_right_shift_only"))]
    alphas = [round(a / 10, 1) for a in range(11)]
    rows += [{"intervention": "pe_scale", "level": a, "metric": m} for a in alphas for m in scaled]
    rows += [{"intervention": "pe_scale", "level": a, "metric": "ssdc", "layer": layer}
             for a in alphas for layer in (0, 1)]
    rows += [{"intervention": "rpi", "metric": m} for m in ("acc", "dssdc", "dssdc_per_batch")]
    rows += [{"intervention": "rpi", "metric": m, "layer": layer}
             for m in ("ssdc", "ssdc_content", "ssdc_per_batch") for layer in (0, 1)]
    return rows


def build(results: Path, n: int) -> None:
    """N trials' files, as a finished launch and analysis write them (one file per writer unit)."""
    import numpy as np

    from records import layout, manifest, tables

    rng = np.random.default_rng(0)
    template = _measurement_rows()
    storage = layout.default_storage(str(results))
    start = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
    for i, cfg in enumerate(_configs(n)):
        tid, acc = cfg.trial_id, float(rng.uniform(0.3, 0.9))
        run_id = f"{i:032x}"
        tables.write_epochs(str(results), STUDY, tid, [
            {"epoch": e, "train_loss": 2.0 / e, "train_acc": acc * e / EPOCHS, "eval_loss": 2.1 / e,
             "eval_acc": acc * e / EPOCHS, "eval_images": 10000, "lr": 1e-3, "images_per_s": 5000.0,
             "wall_time_s": 10.0 * e} for e in range(1, EPOCHS + 1)])
        for epoch in CHECKPOINTS:
            values = rng.uniform(0.0, 1.0, len(template))
            tables.write_measurements(str(results), STUDY, tid, epoch, [
                {**r, "value": float(v) * (10000 if r["metric"].endswith(("_both", "_only")) else 1),
                 "n_images": 10000} for r, v in zip(template, values)])
        tables.write_trial(str(results), STUDY, cfg.to_flat(), {
            "trial_id": tid, "study": STUDY, "status": "finished", "epochs_completed": EPOCHS, "train_loss": 0.5,
            "train_acc": acc, "eval_loss": 0.6, "eval_acc": acc, "test_acc": acc, "did_not_learn": False,
            "checkpoint_path": layout.checkpoint_dir(storage, STUDY, tid),
            "snapshot_dir": layout.snapshot_dir(storage, STUDY, tid), "wall_time_s": 80.0, "code_version": "bench",
            "pack": f"pack-{i // 8}", "mlflow_run_id": run_id, "restarts": 0, "node": "10.0.0.1 bench",
            "started_at": start, "ended_at": start + datetime.timedelta(seconds=80)})
        tables.write_summary(str(results), STUDY, cfg.to_flat(), {
            "trial_id": tid, "study": STUDY, "condition": cfg.protocol.name, "test_acc": acc, "eval_acc": acc,
            "did_not_learn": False, "checkpoint_epoch": CHECKPOINTS[-1], "acc_clean": acc, "n_images": 10000,
            "mlflow_run_id": run_id})
    configs = _configs(n)
    manifest.write_manifest(str(results), STUDY, planned=[{"trial_id": c.trial_id} for c in configs],
                            command=["vitsweep", "sweep", STUDY, "--stage", "all"], code_version="bench")
    manifest.write_analysis_plan(str(results), STUDY, checkpoints="all", eval_size=0, missing=[],
                                 planned=[(c.trial_id, e) for c in configs for e in CHECKPOINTS])
    (results / "built").write_text(f"{n}\n")


def build_runs(results: Path, n: int) -> None:
    """The N trials' MLflow runs in ``results/mlflow.db``: one made by the project's own calls, then copied
    in SQL under each trials row's ``mlflow_run_id`` (``build``'s), named and tagged by its trial."""
    import sqlite3

    from analysis.measuring.trial_record import log_checkpoint
    from records import tracking

    uri = f"sqlite:///{results}/mlflow.db"
    configs = _configs(n)
    experiment = tracking.ensure_experiment(uri, STUDY)
    flat = configs[0].to_flat()
    template = tracking.start_trial_run(uri, experiment, "template", params=flat, tags=tracking.trial_tags(flat))
    for e in range(1, EPOCHS + 1):
        tracking.log_epoch_metrics(uri, template, {"train_loss": 2.0 / e, "train_acc": 0.1 * e, "eval_loss": 2.1 / e,
                                                   "eval_acc": 0.1 * e, "lr": 1e-3, "images_per_s": 5000.0}, e)
    rows = [{**r, "value": 0.5, "n_images": 10000} for r in _measurement_rows()]
    for epoch in CHECKPOINTS:
        log_checkpoint(uri, template, "template", epoch, rows, 8, figure=False)
    with sqlite3.connect(results / "mlflow.db") as db:
        db.execute("CREATE TEMP TABLE trial (run_uuid TEXT, trial_id TEXT)")
        db.executemany("INSERT INTO trial VALUES (?, ?)", [(f"{i:032x}", c.trial_id) for i, c in enumerate(configs)])
        named = f"CASE WHEN t.key IN ('{tracking.TRIAL_ID_TAG}', 'mlflow.runName') THEN trial.trial_id ELSE t.value END"
        for table in ("runs", "tags", "params", "metrics", "latest_metrics"):
            columns = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
            values = {"run_uuid": "trial.run_uuid", "name": "trial.trial_id",
                      "artifact_uri": f"replace(t.artifact_uri, '{template}', trial.run_uuid)",
                      "value": named if table == "tags" else "t.value"}
            db.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT "
                       f"{', '.join(values.get(c, f't.{c}') for c in columns)} FROM {table} t, trial "
                       f"WHERE t.run_uuid = ?", (template,))
            db.execute(f"DELETE FROM {table} WHERE run_uuid = ?", (template,))
    (results / "runs-built").write_text(f"{n}\n")


# The child's own peak RSS, as it exits: its VmHWM (a child's ru_maxrss starts at this process's RSS, which it
# inherits through fork and exec).
PEAK = """
import atexit
def _peak():
    with open("/proc/self/status") as status, open({path!r}, "w") as out:
        out.write(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
atexit.register(_peak)
"""


def _child(code: Path, program: str, results: Path) -> tuple[float, float, str]:
    """(user + system CPU seconds, peak RSS in MB, the last line it printed) of ``program`` run by the code
    under ``code``."""
    peak = Path(tempfile.mkdtemp()) / "peak"
    preamble = (f"R, S, ROWS = {str(results)!r}, {STUDY!r}, {json.dumps(_measurement_rows())!r}\n"
                + PEAK.format(path=str(peak)))
    env = {**os.environ, "PYTHONPATH": str(code), "MPLBACKEND": "Agg"}
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
        child = subprocess.Popen([sys.executable, "-c", preamble + program], cwd=code, env=env,
                                 stdout=out, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        if child.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"{program!r} failed ({child.returncode}):\n{err.read().decode()[-3000:]}")
        out.seek(0)
        printed = out.read().decode().strip().splitlines()
    rss = int(peak.read_text()) / 1024  # kB
    shutil.rmtree(peak.parent)
    return usage.ru_utime + usage.ru_stime, rss, printed[-1] if printed else ""


def prepare(code: Path, pristine: Path, state: str, n: int) -> Path:
    """A copy of the built folder (hard links: the copy's rewrites replace files, never edit them) as the
    code under ``code`` leaves it in ``state``."""
    from records import layout, tables

    folder = pristine.parent / f"{pristine.name}-{state}"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(pristine, folder, copy_function=os.link, ignore=shutil.ignore_patterns("mlflow.db"))
    # written in place (the checkpoint bookkeeping): a copy, not a link
    if state == "compacted" and (pristine / "mlflow.db").exists():
        shutil.copyfile(pristine / "mlflow.db", folder / "mlflow.db")
    tail = [c.trial_id for c in _configs(n)][-min(TAIL, n // 2):] if state == "killed" else []
    for tid in tail:  # not measured yet; the "running" half is written so by the code under test
        for epoch in CHECKPOINTS:
            (folder / STUDY / "measurements" / layout.unit_file(tid, epoch)).unlink(missing_ok=True)
        (folder / STUDY / "summary" / layout.unit_file(tid)).unlink(missing_ok=True)
    if state == "killed":
        for tid in tail[len(tail) // 2:]:
            row = tables.read_trial(str(folder), STUDY, tid)
            tables.write_trial(str(folder), STUDY, row, {**row, "status": "running", "ended_at": None})
    _child(code, PREPARE.format(tail=tail[: len(tail) // 2] if tail else [], killed=state == "killed"), folder)
    return folder


def table(measured: dict) -> str:
    labels = sorted({k.split("|")[0] for k in measured})
    lines = ["| N | state | command | " + " | ".join(f"{lb} CPU s (x N=100) | {lb} RSS MB" for lb in labels) + " |",
             "| --- | --- | --- | " + " | ".join("--- | ---" for _ in labels) + " |"]
    keys = sorted({tuple(k.split("|")[1:]) for k in measured}, key=lambda k: (int(k[0]), k[1], k[2]))
    for n, state, command in keys:
        cells = []
        for lb in labels:
            got = measured.get(f"{lb}|{n}|{state}|{command}")
            base = measured.get(f"{lb}|100|{state}|{command}")
            if got is None:
                cells.append("- | -")
                continue
            ratio = f" (x{got[0] / base[0]:.1f})" if base and n != "100" else ""
            cells.append(f"{got[0]:.2f}{ratio} | {got[1]:.0f}")
        lines.append(f"| {n} | {state} | {command} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000], help="trials (default: 100 1000)")
    parser.add_argument("--folder", default=os.path.join(tempfile.gettempdir(), "vitsweep-scale"),
                        help="where the built results live, reused by later runs (outside the work tree)")
    parser.add_argument("--code", default=str(ROOT), help="the checkout whose code is measured (default: this one)")
    parser.add_argument("--label", default="after", help="the name of this code's columns in the table")
    parser.add_argument("--quick", action="store_true", help=f"only {' and '.join(QUICK)} (a test of the bench)")
    parser.add_argument("--commands", nargs="+", choices=list(COMMANDS), default=list(COMMANDS),
                        help="the commands measured (default: all)")
    args = parser.parse_args()
    folder, code = Path(args.folder), Path(args.code).resolve()
    book = folder / "results.json"
    measured = json.loads(book.read_text()) if book.exists() else {}
    for n in args.n:
        pristine = folder / f"n{n}"
        if not (pristine / "built").exists():
            shutil.rmtree(pristine, ignore_errors=True)
            print(f"building {n} trials in {pristine} ...", file=sys.stderr, flush=True)
            build(pristine, n)
        commands = [c for c in args.commands if not args.quick or c in QUICK]
        if PER_CHECKPOINT in commands and not (pristine / "runs-built").exists():
            print(f"building {n} MLflow runs in {pristine} ...", file=sys.stderr, flush=True)
            (pristine / "mlflow.db").unlink(missing_ok=True)
            build_runs(pristine, n)
        for state in ("compacted", "killed"):
            if all(c == PER_CHECKPOINT for c in commands) and state != "compacted":
                continue
            results = prepare(code, pristine, state, n)
            for command in commands:
                if command == PER_CHECKPOINT and state != "compacted":
                    continue
                cpu, rss, printed = _child(code, COMMANDS[command], results)
                measured[f"{args.label}|{n}|{state}|{command}"] = (float(printed) if command == PER_CHECKPOINT
                                                                    else cpu, rss)
                print(f"{args.label} N={n} {state} {command}: {measured[f'{args.label}|{n}|{state}|{command}']}",
                      file=sys.stderr, flush=True)
            shutil.rmtree(results)
            folder.mkdir(parents=True, exist_ok=True)
            book.write_text(json.dumps(measured, indent=1))
    print(table({k: v for k, v in measured.items() if int(k.split("|")[1]) in args.n or not args.quick}))


if __name__ == "__main__":
    main()
