"""The analysis job: every checkpoint of a study measured on Ray Data.

    vitsweep analyze demo                      # final checkpoints
    vitsweep analyze study_l --checkpoints all # plus the log-spaced snapshots

One Ray Data row per checkpoint (from the ``trials`` table); a pool of stateful actors (``Measurer``) each loads a
data set's evaluation set once (the whole test split; ``--eval-size`` caps it at a seeded subset) and a model per
row, runs ``analysis.measuring.evaluate.evaluate_checkpoint`` (all interventions of both studies share each transformed
image batch, so a checkpoint is the unit of work) and writes that checkpoint's measurement rows to Parquet and, on
the trial's MLflow run (found by id), its scalars, per-layer curves and, for a final checkpoint or with
``--figures all``, figure (``analysis.measuring.trial_record``); the caller (``sweeps.run.analyze_stage``) then
rewrites the wide ``summary`` table. A corrupt checkpoint is reported and skipped (its progress line gives
the error's first line; the whole text goes to ``<results>/<study>/logs/analysis-*.log``). A planned checkpoint
whose file is gone (a finished trial's checkpoint or snapshot folder deleted) is *missing*: named once before
measuring, in the analysis plan (``records.manifest.write_analysis_plan``, which ``vitsweep status`` and the
report read) and in the exit status. A storage fault (a full or read-only results folder, MLflow's SQLite store
full or read-only, an MLflow store that does not answer or stays locked for the whole retry budget:
``records.client.storage_fault``) is no checkpoint's fault, and every later checkpoint would hit it too: the actor
that meets it raises, Ray Data stops the pool, and the job ends at once, its heartbeat stamped with the fault, in
one line (``StorageError`` or ``TrackingError``, one line each, for the caller to print). A checkpoint counts as
measured when its Parquet file exists, written last, after its MLflow record: a fault between the two leaves it
unmeasured, and the rerun logs only the MLflow points still missing. Re-running skips checkpoints already measured
unless ``force``; an ``eval_size`` that gives another number of images than the rows already measured is refused
unless ``force`` measures them all again.

Pool sizing: seen with Ray 2.60 on 2 cores, an actor pool that holds every CPU starves Ray Data's other
tasks and hangs forever, so the actors' CPU shares leave one CPU unreserved; on CPUs there is still one
single-threaded actor per core (``pool_size``).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import tempfile
import time
import traceback
from collections.abc import Iterable
from typing import Any

import numpy as np

from analysis.measuring.plan import CHECKPOINT_CHOICES, missing_line, plan_checkpoints
from analysis.measuring.trial_record import FIGURE_CHOICES, record_checkpoint
from records import files, manifest, stores, tables, tracking
from records.client import storage_exception, storage_fault
from records.layout import is_uri, logs_dir, results_location, table_path
from records.vocab import format_duration
from trainables.config.data_roots import DATASET_SPECS
from trainables.trial.ray_start import init_ray

# Imports inside functions: the driver plans and reports without torch or Ray; Ray loads where the job starts
# and the measurement (torch, the model, the data) in the actors that run it.

log = logging.getLogger("vitsweep.analyze")


def list_checkpoints(results: str, study: str, which: str = "final") -> list[dict[str, Any]]:
    """One row per checkpoint to measure: trial_id, epoch, path; those whose file is gone left out."""
    return plan_checkpoints(results, study, which)[0]


class Measurer:
    """Stateful Ray Data actor: caches evaluation subsets, measures one checkpoint per row."""

    def __init__(self, results: str, study: str, mlflow_uri: str | None, eval_size: int | None, batch_size: int,
                 threads: int, figures: str = "final"):
        import torch

        torch.set_num_threads(max(1, threads))
        self.results, self.study, self.mlflow_uri, self.figures = results, study, mlflow_uri, figures
        self.experiment_id = tracking.ensure_experiment(mlflow_uri, study) if mlflow_uri else None
        self.eval_size, self.batch_size = eval_size, batch_size
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self._subsets: dict[tuple[str, str], Any] = {}

    def _subset(self, dataset: str, data_root: str):
        key = (dataset, data_root)
        if key not in self._subsets:
            from analysis.measuring.evaluate import evaluation_subset
            from trainables.data.datasets import load_dataset

            data = load_dataset(dataset, data_root, seed=0)
            images, labels = evaluation_subset(data.test, self.eval_size, seed=0)
            self._subsets[key] = (images, labels, data.mean, data.std)
        return self._subsets[key]

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {k: [] for k in ("trial_id", "epoch", "path", "status", "rows", "seconds", "images", "note", "detail")}
        for trial_id, epoch, path, dataset, data_root, run_id, final in zip(
            *(batch[k] for k in ("trial_id", "epoch", "path", "dataset", "data_root", "mlflow_run_id", "final"))
        ):
            try:  # loaded once per data set, before the clock starts: the seconds are one checkpoint's
                self._subset(str(dataset), str(data_root))
            except Exception:  # noqa: BLE001 - measure() raises it again, and the row says why
                pass
            t0 = time.perf_counter()
            note = detail = ""
            try:
                n, note = self.measure(str(trial_id), int(epoch), str(path), str(dataset), str(data_root),
                                       run_id=str(run_id) if run_id else None, final=bool(final))
                status = "ok"
            except Exception as exc:  # one bad checkpoint must not stop the study's analysis...
                found = storage_fault(exc)
                if found is not None:  # ...but a fault of the storage stops it: every checkpoint would fail
                    raise self._storage_error(found, exc, str(trial_id), int(epoch)) from exc
                # One line (MLflow's open with an autoflush remark, then SQL): the whole text is the detail.
                first = next((line for line in str(exc).splitlines() if line.strip()
                              and not line.startswith("(raised as a result of")), "")
                n, status, detail = 0, f"error: {type(exc).__name__}: {first}", traceback.format_exc()
            row = {"trial_id": str(trial_id), "epoch": int(epoch), "path": str(path), "status": status, "rows": n,
                   "seconds": time.perf_counter() - t0, "note": note, "detail": detail,
                   "images": len(self._subsets[(str(dataset), str(data_root))][1]) if status == "ok" else 0}
            for key, value in row.items():
                out[key].append(value)
        return {k: np.asarray(v) for k, v in out.items()}

    def _storage_error(self, found: tuple[str, int | None], exc: Exception, trial_id: str, epoch: int) -> Exception:
        """The storage fault ``found`` (``storage_fault``) as one line naming the checkpoint measured and, for a
        fault inside MLflow's store, the store: a TrackingError for MLflow's retry budget spent, else a
        StorageError with the fault's errno. Both pickle with their one line (Ray ships them to the driver)."""
        line, code = found
        store = ""
        if self.mlflow_uri and not isinstance(exc, (OSError, stores.TrackingError)):
            store = f"MLflow store {stores.redact(self.mlflow_uri)!r}: "
        return storage_exception(f"measuring {trial_id} epoch {epoch}: {store}{line}", code)

    def measure(self, trial_id: str, epoch: int, path: str, dataset: str, data_root: str, *,
                run_id: str | None = None, final: bool = True) -> tuple[int, str]:
        """(rows written, a note on MLflow values this measurement changed or ""); ``run_id``: the trials row's
        MLflow run; ``final``: the trial's last checkpoint, whose figure goes on the run (any with --figures all)."""
        from analysis.measuring.evaluate import evaluate_checkpoint
        from trainables.loop.checkpoints import load_model

        local = _fetch(path)
        try:
            model, cfg, _ = load_model(local, map_location="cpu", name=path)
        finally:
            if local != path:
                os.unlink(local)
        images, labels, mean, std = self._subset(dataset, data_root)
        rows = evaluate_checkpoint(model.to(self.device), images, labels, mean=mean, std=std,
                                   grid=cfg.model.grid, seed=0, batch_size=self.batch_size, device=self.device)
        note = "" if not self.mlflow_uri else record_checkpoint(
            self.mlflow_uri, self.experiment_id, trial_id, run_id, epoch, rows, cfg.model.grid,
            figure=final or self.figures == "all", table=table_path(self.results, self.study, "measurements"))
        tables.write_measurements(self.results, self.study, trial_id, epoch, rows)  # last: it marks it measured
        return len(rows), note


def _fetch(path: str) -> str:
    """A local copy of a checkpoint file (object stores are downloaded)."""
    if not is_uri(path):
        if not os.path.exists(path):
            raise FileNotFoundError(f"checkpoint {path} does not exist")
        return path
    fd, local = tempfile.mkstemp(suffix=".pt")
    os.close(fd)
    if not files.download(path, local):
        os.unlink(local)
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return local


def pool_size(cpus: float, gpus: float, max_actors: int | None, gpus_per_actor: float) -> tuple[int, float, float]:
    """(actors, cpus per actor, gpus per actor) for a cluster of ``cpus`` and ``gpus``, with a CPU to spare.
    CPU actors: one per core, one thread each, their CPU shares adding up to one CPU less than the
    cluster's. A Ray CPU is a reservation, not a core: the one left unreserved keeps Ray Data's own tasks
    running (see the module docstring), and an actor's thread still uses the core, so 2 cores measure two
    checkpoints at once instead of one."""
    if gpus >= 1 and gpus_per_actor > 0:
        fit = max(1, math.floor(gpus / gpus_per_actor))
        cpu_each = max(0.5, min(2.0, (cpus - 1) / fit))
        return (min(fit, max_actors or fit), cpu_each, gpus_per_actor)
    actors = min(max(1, math.floor(cpus)), max_actors or math.inf)
    return (actors, max(0.5, cpus - 1) / actors, 0.0)


def analyze(*, results: str, study: str, mlflow_uri: str | None, address: str | None = None,
            checkpoints: str = "final", force: bool = False, eval_size: int | None = None, batch_size: int = 128,
            max_actors: int | None = None, gpus_per_actor: float = 1.0, verbose: bool = False,
            figures: str = "final") -> list[dict[str, Any]]:
    """Measure a study's checkpoints; returns one status row per checkpoint (a missing one's: "missing").

    eval_size: None measures the whole test split (the studies' setting); an int caps it
    at a fixed, seeded subset of that many images (demos, tests)."""
    import ray

    rows, gone, before, total = plan_analysis(results, study, checkpoints, force=force, eval_size=eval_size)
    log.info("analysis of %s: %d checkpoint(s) to measure", study, len(rows))
    if not rows:
        return gone

    init_ray(address, log_to_driver=verbose)
    # Quiet by default: one line per measured checkpoint below instead of Ray Data's status blocks; an error
    # Ray Data logs is also raised here, where it ends the job in its own line (a storage fault) or traceback.
    ray.data.DataContext.get_current().enable_progress_bars = verbose
    logging.getLogger("ray.data").setLevel(logging.INFO if verbose else logging.CRITICAL)
    cluster = ray.cluster_resources()
    actors, cpu_each, gpu_each = pool_size(cluster.get("CPU", 1.0), cluster.get("GPU", 0.0), max_actors, gpus_per_actor)
    ds = ray.data.from_items(rows).map_batches(
        Measurer, fn_constructor_kwargs={"results": results, "study": study, "mlflow_uri": mlflow_uri,
                                         "eval_size": eval_size, "batch_size": batch_size,
                                         "threads": int(max(1, cpu_each)), "figures": figures},
        batch_size=1, compute=ray.data.ActorPoolStrategy(min_size=1, max_size=actors), num_cpus=cpu_each,
        num_gpus=gpu_each or None)
    with tables.compacting(results, study, table="measurements"):  # measured files folded as they pile up
        statuses = measure_checkpoints(results, study, rows, ds.iter_rows(), actors=actors, before=before,
                                       total=total, choices={"checkpoints": checkpoints, "eval_size": eval_size or 0})
    ok = sum(s["status"] == "ok" for s in statuses)
    corrupt = [s["path"] for s in statuses if "CorruptCheckpointError" in s["status"]]
    log.info("analysis of %s: %d measured, %d skipped%s", study, ok, len(statuses) - ok,
             f" ({len(corrupt)} corrupt: {', '.join(corrupt)})" if corrupt else "")
    return gone + statuses


def plan_analysis(results: str, study: str, checkpoints: str, *, force: bool = False,
                  eval_size: int | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int, int]:
    """(checkpoints to measure, a status row per missing one, how many of the plan are measured already, how
    many it holds). Refuses another number of images than the rows measured (``check_n_images``), then
    records the plan (``records.manifest.write_analysis_plan``) and names the missing ones in one line."""
    rows, missing = plan_checkpoints(results, study, checkpoints)
    done = tables.measured(results, study)
    planned = [(r["trial_id"], r["epoch"]) for r in rows + missing]
    missing = [m for m in missing if (m["trial_id"], m["epoch"]) not in done]  # measured before its file went
    if not force:
        rows = [r for r in rows if (r["trial_id"], r["epoch"]) not in done]
        check_n_images(results, study, rows, eval_size)
    manifest.write_analysis_plan(results, study, checkpoints=checkpoints, eval_size=eval_size, planned=planned,
                                 missing=[{k: m[k] for k in ("trial_id", "epoch", "path")} for m in missing])
    if missing:
        print(missing_line(study, missing), flush=True)
    gone = [{"trial_id": m["trial_id"], "epoch": m["epoch"], "path": m["path"], "status": "missing: the file is gone",
             "rows": 0, "seconds": 0.0, "images": 0, "note": "", "detail": ""} for m in missing]
    return rows, gone, 0 if force else len(set(planned) & done), len(planned)


def measure_checkpoints(results: str, study: str, rows: list[dict[str, Any]], measured: Iterable[dict[str, Any]], *,
                        actors: int = 1, before: int = 0, total: int | None = None,
                        choices: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The driver's side of the job: ``measured`` yields each checkpoint's status row as it ends (the actor
    pool's output); one progress line each, the heartbeat's progress (``before`` of the ``total`` planned
    checkpoints measured by earlier runs, ``choices``: what `vitsweep status` says continues it), a skipped
    one's whole error in the analysis log. A storage fault out of ``measured`` ends it at once, the first
    one: the heartbeat is stamped ended with it (the analysis holds no record open, so nothing else is left
    to close; Ray's actors end with Ray), and it is raised as one line (``StorageError``/``TrackingError``)."""
    total = len(rows) + before if total is None else total
    statuses: list[dict[str, Any]] = []
    ended: list[float] = []
    fault: Exception | None = None
    with manifest.heartbeat(results, study, stage="analyze") as beat:
        try:
            # `vitsweep status` shows the stage, and what continues it when it is cut short
            manifest.report_progress(results, study, done=before, total=total, unit="checkpoints measured",
                                     **(choices or {}))
            for s in measured:  # as each checkpoint is measured
                statuses.append(s)
                ended.append(time.monotonic())
                eta = eta_s(ended, [x["seconds"] for x in statuses], len(rows), actors)
                print(_progress_line(s, len(statuses), len(rows), eta), flush=True)
                if s["note"]:
                    print(f"  {s['note']}", flush=True)
                manifest.report_progress(results, study, done=before + sum(x["status"] == "ok" for x in statuses),
                                         total=total, unit="checkpoints measured", eta_s=eta, **(choices or {}))
        except Exception as exc:  # noqa: BLE001 - a storage fault ends it in one line; anything else raises
            found = storage_fault(exc)
            if found is None:
                raise
            fault = storage_exception(*found)
            fault.__cause__ = exc  # (the traceback behind the one line, for the caller's log)
            beat.outcome = f"storage fault: {found[0]}"
        finally:
            details = _write_details(results, study, statuses)
    if fault is not None:
        raise fault
    if details:
        log.info("analysis of %s: the errors of skipped checkpoints in full: %s", study, details)
    return statuses


def _write_details(results: str, study: str, statuses: list[dict[str, Any]]) -> str | None:
    """The whole text of each skipped checkpoint's error (its progress line has the first line only) in
    ``<results>/<study>/logs/analysis-<time>-<pid>.log``; None when none was skipped, or where the folder
    cannot take it (remote results; a failing storage is reported on its own)."""
    texts = [f"{s['trial_id']} epoch {s['epoch']} ({s['path']}): skipped\n{s['detail']}"
             for s in statuses if s.get("detail")]
    folder = logs_dir(results, study)
    if not texts or folder is None:
        return None
    path = os.path.join(folder, f"analysis-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write("\n".join(texts) + "\n")
    except OSError:
        return None
    return path


def check_n_images(results: str, study: str, rows: list[dict[str, Any]], eval_size: int | None) -> None:
    """Refuse to measure ``rows`` on another number of images than the study's measured rows of the
    same data set: one table would mix n_images (``force`` measures every checkpoint again)."""
    had = tables.read_table(results, study, "measurements", ["trial_id", "n_images"]) if rows else None
    if had is None:
        return
    # (one pair per trial and image count: a measurements table holds millions of rows at 10,000 trials)
    pairs = had.group_by(["trial_id", "n_images"]).aggregate([]).to_pylist()
    dataset_of = {r["trial_id"]: r["dataset"] for r in rows}
    trials = tables.read_table(results, study, "trials", ["trial_id", "dataset"]).to_pylist()
    dataset_of.update({t["trial_id"]: t["dataset"] for t in trials})
    measuring = {r["dataset"] for r in rows}
    for pair in pairs:
        dataset, n = dataset_of.get(pair["trial_id"]), pair["n_images"]
        if n is None or dataset not in measuring:
            continue
        whole = DATASET_SPECS[dataset].test_images
        want = whole if eval_size is None else min(eval_size, whole or eval_size)
        if want is not None and want != n:
            asked = "the whole test split" if eval_size is None else f"--eval-size {eval_size}"
            raise ValueError(
                f"{study}'s {dataset} checkpoints measured so far are on {n} images, and {asked} gives {want}: "
                f"one measurements table would mix them; pass --eval-size {n} to continue, or --force to measure "
                "every checkpoint again")


def eta_s(ended: list[float], seconds: list[float], total: int, actors: int) -> float | None:
    """Seconds until the last of ``total`` checkpoints is measured, given the times the first ones ended
    (``ended``, any clock) and how long each took (``seconds``) on a pool of ``actors``. From the second
    checkpoint on, the rate since the first one ended: it leaves out the pool's start-up (Ray Data,
    actors importing torch, the data set's load), which made the first ETAs 2-4x too high, and counts the
    actors working at once. After the first, its own seconds over the actors."""
    left = total - len(ended)
    if left <= 0:
        return 0.0 if ended else None
    if len(ended) >= 2 and ended[-1] > ended[0]:
        return left * (ended[-1] - ended[0]) / (len(ended) - 1)
    return left * seconds[0] / max(1, min(actors, left)) if seconds else None


def _progress_line(status: dict[str, Any], k: int, total: int, eta: float | None) -> str:
    """``[k/M] checkpoints: <trial> epoch E in 12 s, 830 images/s; ETA 3 min`` (or why it was skipped)."""
    left = total - k
    eta = f"; ETA {format_duration(eta)}" if left and eta is not None else ""
    head = f"[{k}/{total}] checkpoints: {status['trial_id']} epoch {status['epoch']}"
    if status["status"] != "ok":
        return f"{head} skipped ({status['status']}){eta}"
    rate = status["images"] / status["seconds"] if status["seconds"] else float("nan")
    return f"{head} in {status['seconds']:.0f} s, {rate:,.0f} images/s{eta}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study")
    parser.add_argument("--results", default="results", help="results folder or URI (default ./results)")
    parser.add_argument("--mlflow-uri", help="tracking URI (default: sqlite:///<results>/mlflow.db)")
    parser.add_argument("--checkpoints", choices=CHECKPOINT_CHOICES, default=None,
                        help="final: each trial's last checkpoint; all: also every log-spaced snapshot "
                             "(default: the study's choice)")
    parser.add_argument("--figures", choices=FIGURE_CHOICES, default="final", help="the checkpoints whose figure "
                        "goes on the trial's MLflow run: final (default; each trial's last) or all")
    parser.add_argument("--force", action="store_true", help="measure again checkpoints already measured")
    parser.add_argument("--eval-size", type=int, default=None,
                        help="cap on the evaluation images: a fixed, seeded subset; 0: the whole test split "
                             "(default: the study's choice)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--actors", type=int, help="cap on the actor pool (default: what the cluster fits)")
    parser.add_argument("--gpus-per-actor", type=float, default=1.0, help="GPU share per actor when GPUs exist")
    parser.add_argument("--address", help="Ray address; default a local Ray, 'auto' joins a cluster")
    parser.add_argument("--verbose", action="store_true", help="also show Ray Data's progress and the workers' output")


def check(args: argparse.Namespace) -> tuple[str, str]:
    """(results, tracking URI) of ``vitsweep analyze``, its values checked before any work: raises
    ValueError, or TrackingError for a store that does not answer."""
    results = results_location(args.results)
    mlflow_uri = args.mlflow_uri or stores.default_tracking_uri(results)
    for flag, value, low in (("--eval-size", args.eval_size, 0), ("--batch-size", args.batch_size, 1),
                             ("--actors", args.actors, 1)):
        if value is not None and value < low:
            raise ValueError(f"{flag} must be an integer >= {low}, got {value}")
    if not (math.isfinite(args.gpus_per_actor) and args.gpus_per_actor >= 0):  # 0: CPU actors
        raise ValueError(f"--gpus-per-actor must be a number >= 0, got {args.gpus_per_actor:g}")
    stores.check_tracking_uri(mlflow_uri)
    return results, mlflow_uri
