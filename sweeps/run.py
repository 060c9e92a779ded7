"""Launcher: run a named study on Ray Tune + Ray Train, then analyse and report.

Runs as a plain script, so a cluster user can write

    ray submit cluster/aws.yaml sweeps/run.py -- study_l --address auto \
        --results s3://BUCKET/vitsweep --mlflow-uri '$VITSWEEP_MLFLOW_URI' --data-root /data

and locally it is ``vitsweep sweep STUDY``. Everything a user can get wrong
(study, PE, data set, protocol, ``--set`` field, storage and MLflow URIs) is
checked before Ray starts; ``--dry-run`` stops right after that check and
prints the trial table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # `python sweeps/run.py` / `ray submit ... sweeps/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sweeps import STUDIES, load_study, names, progress

log = logging.getLogger("vitsweep")
STAGES = ("train", "analyze", "report", "all")
GPU_CHECKPOINT_INTERVAL_S = 120.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help=f"one of: {', '.join(STUDIES)}")
    g = parser.add_argument_group("what to run")
    g.add_argument("--datasets", help=f"comma-separated data sets (default: the study's); valid: {', '.join(names.DATASETS)}")
    g.add_argument("--seeds", type=int, help="run seeds 0..N-1 (default: the study's)")
    g.add_argument("--epochs", type=int, help="epochs per trial (default: the study's)")
    g.add_argument("--preset", help="model preset for every trial (default: the study's / each data set's native "
                   f"one); valid: {', '.join(names.PRESETS)}")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any run-config field, e.g. --set lr=5e-4 --set depth=6 (repeatable); "
                   "KEY=V1,V2 sweeps it, crossed with the study's grid; "
                   f"pe: {', '.join(names.PES)}; protocol: {', '.join(names.PROTOCOLS)}")
    g.add_argument("--include-none-rpt", action="store_true", help="factorial: keep the redundant none + RPT cell")
    g.add_argument("--defaults-from", metavar="JSON", help="best config written by the hparam study")
    g.add_argument("--samples", type=int, help="hparam: number of Optuna trials (default 24)")
    g.add_argument("--stage", choices=STAGES, default="train", help="train (default), analyze, report, or all three")
    g.add_argument("--dry-run", action="store_true", help="print the trial table and count; start nothing")
    g.add_argument("--verbose", action="store_true",
                   help="also show per-epoch lines, Tune's tables and Ray's own output (default: one line per trial)")
    g.add_argument("--json", action="store_true", help="with --dry-run: only a JSON list of trial configs on stdout")
    g.add_argument("--pack", type=int, metavar="K",
                   help="train up to K same-shaped trials together in one process (default: 1 without GPUs, "
                        "8 with --gpus-per-trial); see sweeps/packs.py")
    w = parser.add_argument_group("where it runs and writes")
    w.add_argument("--results", default="results", help="local folder or URI (s3://...) for Parquet tables (default ./results)")
    w.add_argument("--storage", help="checkpoints and Tune state, local or URI (default: <results>/storage)")
    w.add_argument("--mlflow-uri", help="tracking URI (default: sqlite:///<results>/mlflow.db for a local --results)")
    w.add_argument("--data-root", default="data", help="where data sets live or are downloaded (default ./data)")
    w.add_argument("--address", help="Ray address; default starts a local Ray, 'auto' joins a running cluster")
    w.add_argument("--resume", action="store_true", help="continue an interrupted sweep: finished trials are not re-run")
    r = parser.add_argument_group("resources per trial")
    r.add_argument("--gpus-per-trial", type=float, default=0.0, help="GPUs per Train worker; fractions share a GPU")
    r.add_argument("--cpus-per-trial", type=float, default=1.0, help="CPUs per Train worker (default 1)")
    r.add_argument("--workers-per-trial", type=int, default=1, help="Ray Train workers per trial (>1: DDP)")
    r.add_argument("--max-concurrent", type=int, help="cap on trials running at once (default: what fits)")
    r.add_argument("--max-failures", type=int, default=2, help="retries of a failed trial from its last checkpoint")


def parse_overrides(pairs: list[str]) -> dict[str, list[str]]:
    """``--set KEY=VALUE`` pairs -> {key: [values]}: ``KEY=V1,V2`` sweeps the key over V1 and V2
    (crossed with the study's grid and with the other swept keys), as Hydra's multirun does."""
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        values = [v.strip() for v in value.split(",")]
        if not sep or not key.strip() or not all(values):
            raise ValueError(f"--set expects KEY=VALUE or KEY=V1,V2,..., got {pair!r}")
        overrides[key.strip()] = values
    return overrides


# (flag, attribute, smallest valid value, whether the value may equal it, integer?)
# None (flag not given) always means "the study's / the default value".
NUMERIC_FLAGS = (
    ("--seeds", "seeds", 1, True, True),
    ("--epochs", "epochs", 1, True, True),
    ("--samples", "samples", 1, True, True),
    ("--gpus-per-trial", "gpus_per_trial", 0, True, False),
    ("--cpus-per-trial", "cpus_per_trial", 0, False, False),
    ("--workers-per-trial", "workers_per_trial", 1, True, True),
    ("--max-concurrent", "max_concurrent", 1, True, True),
    ("--max-failures", "max_failures", 0, True, True),
)
TEXT_FLAGS = (("--datasets", "datasets"), ("--preset", "preset"), ("--results", "results"),
              ("--storage", "storage"), ("--mlflow-uri", "mlflow_uri"), ("--data-root", "data_root"),
              ("--address", "address"), ("--defaults-from", "defaults_from"))


def check_numbers(args: argparse.Namespace, flags=NUMERIC_FLAGS) -> None:
    """Every numeric flag in its range (zero epochs is an error, not "the default"):
    raises ValueError naming the flag, the value and the valid range."""
    for flag, attr, low, inclusive, integer in flags:
        value = getattr(args, attr, None)
        if value is None:
            continue
        valid = f"an integer >= {low}" if integer else f"a number {'>=' if inclusive else '>'} {low:g}"
        if not math.isfinite(value) or (value < low if inclusive else value <= low):
            raise ValueError(f"{flag} must be {valid}, got {value:g}")
        if not integer and value and abs(value * 10_000 - round(value * 10_000)) > 1e-6:
            # Ray's resource precision: a finer fraction is refused only after Ray started.
            raise ValueError(f"{flag} must be a multiple of 0.0001 (Ray's resource precision), got {value!r}")


def check_texts(args: argparse.Namespace, flags=TEXT_FLAGS) -> None:
    """A text flag given as "" (or only commas and blanks) is an error, never a silent default."""
    for flag, attr in flags:
        value = getattr(args, attr, None)
        if value is not None and not value.replace(",", "").strip():
            raise ValueError(f"{flag} is empty ({value!r}); omit it for the default, or {_expected(flag)}")


def _expected(flag: str) -> str:
    if flag == "--datasets":
        return f"pass comma-separated data sets from {list(names.DATASETS)}"
    if flag == "--preset":
        return f"pass one of {list(names.PRESETS)}"
    return "pass a value"


def build_trials(args: argparse.Namespace):
    """The study's trial configs; raises ValueError on any bad name or value."""
    from sweeps.common import StudyOptions  # imports torch: not at module level, so --help stays fast

    study = load_study(args.study)
    check_numbers(args)
    check_texts(args)
    defaults: StudyOptions = study.DEFAULTS
    # At GPU speed an epoch takes seconds: checkpoint by wall time, not every epoch (--set overrides it).
    overrides = {"checkpoint_interval_s": GPU_CHECKPOINT_INTERVAL_S} if args.gpus_per_trial > 0 else {}
    if args.defaults_from:
        from sweeps.hparam import read_defaults

        overrides.update(read_defaults(args.defaults_from))
    swept = parse_overrides(args.set)
    datasets = tuple(d.strip() for d in args.datasets.split(",") if d.strip()) if args.datasets else defaults.datasets
    if args.study == "hparam" and any(len(v) > 1 for v in swept.values()):
        raise ValueError("the hparam study searches one condition; --set KEY=V1,V2 sweeps are for grid studies")
    kwargs = {"include_none_rpt": True} if args.include_none_rpt and args.study == "factorial" else {}
    configs = []
    for values in itertools.product(*swept.values()):  # one pass of the study's grid per swept combination
        options = StudyOptions(
            datasets=datasets,
            seeds=defaults.seeds if args.seeds is None else args.seeds,
            epochs=defaults.epochs if args.epochs is None else args.epochs,
            preset=defaults.preset if args.preset is None else args.preset,
            overrides={**overrides, **dict(zip(swept, values))},
            # Absolute: every Ray worker process has its own working directory.
            data_root=args.data_root if "://" in args.data_root else os.path.abspath(os.path.expanduser(args.data_root)),
        )
        configs += study.trials(options, **kwargs)
    ids = [c.trial_id for c in configs]
    if len(set(ids)) != len(ids):
        raise ValueError("the study produced duplicate trials; check --set overrides")
    return configs


def build_packs(args: argparse.Namespace, configs, resume_epochs=None):
    """The study's trials grouped into packs (``--pack``); raises ValueError on a bad size."""
    from sweeps.packs import form_packs, pack_size

    k = pack_size(getattr(args, "pack", None), args.gpus_per_trial)
    return form_packs(configs, k, workers_per_trial=args.workers_per_trial, resume_epochs=resume_epochs)


def print_table(configs, stream=None, packs=None) -> None:
    from sweeps.packs import pack_of

    stream = stream or sys.stdout  # looked up per call, so a redirected stdout is honoured

    cols = ("trial_id", "dataset", "preset", "pe", "rpt", "protocol", "seed", "epochs", "lr")
    rows = [{**c.to_flat(), "trial_id": c.trial_id} for c in configs]
    if packs is not None:
        cols += ("pack",)
        rows = [{**r, "pack": pack_of(packs)[r["trial_id"]]} for r in rows]
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols} if rows else {c: len(c) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols), file=stream)
    for r in rows:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in cols), file=stream)
    if packs is None:
        print(f"{len(rows)} trials", file=stream)
    else:
        sizes = sorted({len(p.members) for p in packs}, reverse=True)
        print(f"{len(rows)} trials in {len(packs)} packs (sizes {', '.join(map(str, sizes))})", file=stream)


def check_data(configs) -> None:
    """Fail before Ray starts when a data set's root is missing or malformed, or a
    download it needs (CIFAR) fails: once here, not in every Train worker."""
    from trainables.datasets import prepare_root

    for dataset, root in sorted({(c.dataset, c.data_root) for c in configs}):
        prepare_root(dataset, root)


def resolve_locations(args: argparse.Namespace) -> tuple[str, str, str]:
    """(results, storage, mlflow_uri), validated."""
    from records import stores

    results = args.results if "://" in args.results else os.path.abspath(args.results)
    storage = args.storage or f"{results.rstrip('/')}/storage"
    if "://" not in storage:
        storage = os.path.abspath(storage)
    for flag, uri in (("--results", results), ("--storage", storage)):
        if "://" not in uri and os.path.exists(uri) and not os.path.isdir(uri):
            raise ValueError(f"{flag} {uri} is a file; pass a folder (created when missing) or a URI (s3://...)")
        _check_uri(uri)
    mlflow_uri = args.mlflow_uri or stores.default_tracking_uri(results)
    stores.check_tracking_uri(mlflow_uri)
    return results, storage, mlflow_uri


def _check_uri(uri: str) -> None:
    from records.tables import filesystem

    try:
        filesystem(uri)
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError with its own wording
        raise ValueError(f"cannot use storage location {uri!r}: {exc}") from exc


def max_concurrent(args: argparse.Namespace) -> int | None:
    """Trials that fit at once in the cluster as it is now, so none waits forever
    for Train workers that the other trials' workers block."""
    import ray

    if args.max_concurrent:
        return args.max_concurrent
    total = ray.cluster_resources()
    fits = [math.floor(total.get("CPU", 0) / (args.cpus_per_trial * args.workers_per_trial) + 1e-9)]
    if args.gpus_per_trial > 0:
        fits.append(math.floor(total.get("GPU", 0) / (args.gpus_per_trial * args.workers_per_trial) + 1e-9))
    fit = min(fits)
    if fit < 1:
        if args.address:  # an autoscaling cluster adds nodes for pending trials
            return None
        raise ValueError(
            f"one trial needs {args.workers_per_trial} worker(s) x {args.cpus_per_trial} CPU / "
            f"{args.gpus_per_trial} GPU, but this Ray has {total.get('CPU', 0)} CPU / {total.get('GPU', 0)} GPU"
        )
    return fit


def train_stage(args, configs, results, storage, mlflow_uri) -> int:
    from ray import tune

    from records import manifest, provenance, tracking
    from trainables.lifecycle import LaunchSettings, finished_trials
    from trainables.ray_start import DRIVER_RESOURCES, init_ray
    from trainables.ray_trial import UNRETRIABLE, run_trial

    experiment_id = tracking.ensure_experiment(mlflow_uri, args.study)
    # `ray job submit` ships the code without .git: the submitter can pass the commit.
    code_version = os.environ.get("VITSWEEP_CODE_VERSION") or provenance.code_version()
    settings = LaunchSettings(
        study=args.study, results=results, storage=storage, mlflow_uri=mlflow_uri, experiment_id=experiment_id,
        workers_per_trial=args.workers_per_trial, cpus_per_trial=args.cpus_per_trial,
        gpus_per_trial=args.gpus_per_trial, max_failures=args.max_failures,
        code_version=code_version,
        provenance={**provenance.provenance(), "code_version": code_version},
    )
    done = finished_trials(results, args.study)
    todo = [c for c in configs if c.trial_id not in done]
    if args.study != "hparam":  # a search samples its trials; there is no list to check off
        log.info("%d trials, %d already finished, %d to run", len(configs), len(configs) - len(todo), len(todo))
    if not todo:
        return 0
    if args.study == "hparam" and args.resume:
        raise ValueError("the hparam study cannot be resumed; start a new search (results go to a new run)")
    # Packs form from the trials still to run, by resume epoch, so a resumed sweep re-forms them.
    from sweeps.packs import pack_of, resume_epochs

    packs = (build_packs(args, todo, resume_epochs(results, args.study, storage, [c.trial_id for c in todo]))
             if args.study != "hparam" else [])
    packed = any(len(p.members) > 1 for p in packs)
    members = {p.pack_id: p.trial_ids for p in packs}
    if args.study != "hparam":  # a search's trials are sampled as it goes: no plan to record
        pack = pack_of(packs)
        plan = manifest.write_manifest(
            results, args.study, planned=[{"trial_id": c.trial_id, "pack": pack.get(c.trial_id)} for c in configs],
            command=[Path(sys.argv[0]).name, *sys.argv[1:]], code_version=code_version)
        tracking.describe_experiment(mlflow_uri, experiment_id, _describe(plan))
    init_ray(args.address, log_to_driver=args.verbose)  # quiet: the launcher prints one line per trial
    _check_store_reach(mlflow_uri)
    # Grid trials look their config up by id; hparam trials apply sampled values to `base`.
    by_id = {c.trial_id: c.to_flat() for c in configs}
    lines = progress.TrialProgress(results, args.study, total=len(todo), members=members)
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, settings=settings, trials=by_id, base=configs[0].to_flat(), packs=members),
        DRIVER_RESOURCES,
    )
    tune_dir = f"{storage.rstrip('/')}/{args.study}"
    # A packed sweep always starts a fresh Tuner: the old grid of packs is not what should run now.
    name = f"tune-packs-{time.strftime('%Y%m%d-%H%M%S')}" if packed else "tune"
    restore_path = f"{tune_dir}/{name}"
    if packed:
        log.info("%d trials to run in %d packs", len(todo), len(packs))
    if args.resume and not packed and tune.Tuner.can_restore(restore_path):
        log.info("resuming the Tune experiment at %s", restore_path)
        tuner = tune.Tuner.restore(restore_path, trainable=trainable, resume_errored=True, restart_errored=False)
    elif args.study == "hparam":
        tuner = hparam_tuner(args, configs[0], trainable, tune_dir, name)
    else:
        tuner = tune.Tuner(
            trainable,
            param_space={"pack_id": tune.grid_search(list(members))} if packed
            else {"trial_id": tune.grid_search([c.trial_id for c in todo])},
            tune_config=tune.TuneConfig(
                max_concurrent_trials=max_concurrent(args),
                trial_name_creator=_trial_name,
                trial_dirname_creator=_trial_name,
                reuse_actors=True,  # a driver process (imports, MLflow client) serves many trials
            ),
            run_config=tune.RunConfig(
                name=name,
                storage_path=tune_dir,
                failure_config=tune.FailureConfig(max_failures=args.max_failures),
                verbose=progress.tune_verbosity(args.verbose),
                callbacks=[lines.as_callback()],
            ),
        )
    t0 = time.perf_counter()
    with manifest.heartbeat(results, args.study):
        grid = tuner.fit()
    if args.study != "hparam":
        print(lines.summary(), flush=True)
    errors = [r for r in grid if r.error or (r.metrics or {}).get(UNRETRIABLE)]
    for r in errors:
        if not r.error:
            log.error("trial %s failed without retries: %s", r.config.get("trial_id") or r.config.get("pack_id"),
                      r.metrics[UNRETRIABLE])
    log.info("train stage: %d trials in %.0f s, %d failed", len(grid), time.perf_counter() - t0, len(errors))
    base = configs[0]
    # Packs close their members themselves (finished, or failed with the reason), so only trials
    # that ran alone can have been stopped early.
    stopped = {
        r.config["trial_id"] if "trial_id" in r.config else
        members[r.config["pack_id"]][0] if "pack_id" in r.config else base.with_overrides(r.config).trial_id
        for r in grid
        if not any(r is e for e in errors)
        and ("pack_id" not in r.config or len(members[r.config["pack_id"]]) == 1)
    }
    faults = close_unfinished(results, args.study, mlflow_uri, experiment_id, stopped)
    if faults:
        report_storage_faults(faults)
        return 1
    if args.study == "hparam":
        from sweeps import hparam

        best = grid.get_best_result(metric=hparam.METRIC, mode=hparam.MODE, scope="last")
        path = hparam.write_best(results, best.config, score=best.metrics[hparam.METRIC],
                                 condition=configs[0].to_flat(), n_trials=len(grid))
        log.info("best %s %.4f with %s -> %s", hparam.METRIC, best.metrics[hparam.METRIC],
                 {k: best.config[k] for k in hparam.SEARCHED}, path)
    return 1 if errors else 0


def _describe(plan: dict) -> str:
    """The MLflow experiment's description (Markdown, shown above its runs)."""
    return (f"**vitsweep study `{plan['study']}`**: {plan['n_trials']} trials, one run each (runs are named by "
            f"trial id).\n\nLatest launch {plan['started_at']} on {plan['host']}, code `{plan['code_version']}`:\n\n"
            f"    {plan['command']}\n\nParquet tables: `<results>/{plan['study']}/{{trials,epochs,measurements}}/`; "
            f"`vitsweep status {plan['study']}` shows progress.")


def _check_store_reach(mlflow_uri: str) -> None:
    """A SQLite store is a file on one machine: on a multi-node cluster each node
    would write its own copy at that path. Such a sweep needs an MLflow server."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if mlflow_uri.startswith("sqlite:") and len(nodes) > 1:
        raise ValueError(
            f"--mlflow-uri {mlflow_uri!r} is a SQLite file, but this Ray cluster has {len(nodes)} nodes; "
            "pass the MLflow server the cluster runs, e.g. --mlflow-uri http://HEAD_IP:5000"
        )


def hparam_tuner(args, base, trainable, tune_dir: str, name: str):
    """Optuna (TPE) proposals + ASHA early stopping around one base condition."""
    from ray import tune

    from sweeps import hparam

    return tune.Tuner(
        trainable,
        param_space=hparam.search_space(base.epochs),
        tune_config=tune.TuneConfig(
            search_alg=hparam.searcher(seed=base.seed),
            scheduler=hparam.scheduler(base.epochs),
            num_samples=args.samples or hparam.DEFAULT_SAMPLES,
            max_concurrent_trials=max_concurrent(args),
            metric=hparam.METRIC,
            mode=hparam.MODE,
        ),
        run_config=tune.RunConfig(name=name, storage_path=tune_dir, verbose=progress.tune_verbosity(args.verbose)),
    )


def close_unfinished(results: str, study: str, mlflow_uri: str, experiment_id: str, stopped: set[str]) -> list[str]:
    """After Tune returns no trial runs, so nothing may stay "running". ``stopped``:
    trials Tune ended without an error before they finished, i.e. a scheduler (ASHA)
    stopped them; their driver may have recorded the stop as a failure. They become
    "stopped" (MLflow: FINISHED, tag vitsweep.stopped_early); any other unfinished
    trial (a killed driver) becomes "failed".

    Storage faults (a read-only or full results folder, an MLflow outage) do not stop
    the rest: each row and each run is closed on its own, and every MLflow run still
    RUNNING ends FAILED. Returns one line per fault (empty: none)."""
    from records import tables, tracking

    faults: list[str] = []
    try:
        table = tables.read_table(results, study, "trials")
        rows = table.to_pylist() if table is not None else []
    except OSError as exc:
        faults.append(f"cannot read the trials table under {results}: {exc}")
        rows = []
    for row in rows:
        early = row["trial_id"] in stopped and row["status"] in ("running", "failed")
        if not early and row["status"] != "running":
            continue
        try:
            tables.write_trial(results, study, row, {**row, "status": "stopped" if early else "failed"})
        except OSError as exc:
            faults.append(f"cannot write the trials row of {row['trial_id']}: {exc}")
        try:
            run_id = tracking.find_trial_run(mlflow_uri, experiment_id, row["trial_id"])
            if run_id is not None:
                if early:
                    tracking.set_tags(mlflow_uri, run_id, {"vitsweep.stopped_early": "true", "vitsweep.error": ""})
                tracking.end_trial_run(mlflow_uri, run_id, "FINISHED" if early else "FAILED")
        except Exception as exc:  # noqa: BLE001 - TrackingError after its retries, or the store's own error
            faults.append(f"cannot end the MLflow run of {row['trial_id']}: {exc}")
    try:
        tracking.end_orphaned_runs(mlflow_uri, experiment_id)
    except Exception as exc:  # noqa: BLE001 - reported with the other faults
        faults.append(f"cannot end the MLflow runs left RUNNING: {exc}")
    return faults


def report_storage_faults(faults: list[str]) -> None:
    """One line on stderr for the whole epilogue (details go to the log)."""
    for fault in faults:
        log.warning("storage fault: %s", fault)
    more = f" (and {len(faults) - 1} more, logged above)" if len(faults) > 1 else ""
    print(f"error: storage fault: {faults[0]}{more}; fix the storage, then launch again with --resume",
          file=sys.stderr)


def _trial_name(trial) -> str:
    return trial.config.get("pack_id") or trial.config["trial_id"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sweeps/run.py",
        description="Run a study: train every trial on Ray Tune + Ray Train, then analyse and report.",
        epilog="example: python sweeps/run.py demo --stage all   |   python sweeps/run.py study_l --dry-run",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


def user_errors() -> tuple[type[BaseException], ...]:
    """What a user can fix by changing the command: one ``error:`` line and exit code 2."""
    from records.stores import TrackingError

    return (ValueError, TrackingError)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    progress.configure_console(getattr(args, "verbose", False))  # before Ray is imported: it reads these once
    try:
        configs = build_trials(args)
        packs = build_packs(args, configs)
        if args.dry_run:
            if args.json:
                from sweeps.packs import pack_of

                pack = pack_of(packs)
                json.dump([{**c.to_flat(), "trial_id": c.trial_id, "pack": pack[c.trial_id]} for c in configs],
                          sys.stdout, indent=1)
                print()
            else:
                from sweeps import estimate

                print_table(configs, packs=packs)
                print(estimate.estimate(configs, packs, estimate.load_table()))
            return 0
        results, storage, mlflow_uri = resolve_locations(args)
        if args.stage in ("train", "all"):
            check_data(configs)
        from sweeps.lock import LaunchLock

        with LaunchLock(results, args.study):
            try:
                return _stages(args, configs, results, storage, mlflow_uri)
            except OSError as exc:  # pyarrow's and the OS's I/O errors: a full or read-only folder
                report_storage_faults([f"{type(exc).__name__}: {exc}"])
                return 1
    except user_errors() as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _stages(args, configs, results: str, storage: str, mlflow_uri: str) -> int:
    status = 0
    if args.stage in ("train", "all"):
        status = train_stage(args, configs, results, storage, mlflow_uri)
    if args.stage in ("analyze", "all"):
        from analysis.job import analyze

        study = load_study(args.study)
        statuses = analyze(results=results, study=args.study, mlflow_uri=mlflow_uri, address=args.address,
                           eval_size=getattr(study, "EVAL_SIZE", None),
                           checkpoints=getattr(study, "CHECKPOINTS", "final"), verbose=args.verbose)
        if any(s["status"] != "ok" for s in statuses):
            status = status or 1
    if args.stage in ("report", "all"):
        from analysis.report import build_report

        path = build_report(results, args.study, mlflow_uri=mlflow_uri)
        log.info("report: %s", path)
    print(progress.closing_lines(results, args.study, mlflow_uri), flush=True)  # the summary comes last
    return status


if __name__ == "__main__":
    sys.exit(main())
