"""Launcher: run a named study on Ray Tune + Ray Train, then analyse and report.

Runs as a plain script, so a cluster user can write

    ray submit cluster/aws.yaml sweeps/run.py -- study_l --address auto \
        --results s3://BUCKET/vitsweep --mlflow-uri '$VITSWEEP_MLFLOW_URI' --data-root /data

and locally it is ``vitsweep sweep STUDY``. Everything a user can get wrong
(study, PE, data set, protocol, ``--set`` field and value, storage and MLflow
URIs) is checked before Ray starts, names and values (``sweeps.validate``) and
the launch lock even before torch is imported; ``--dry-run`` stops right after
that check and prints the trial table. Exit codes: 0 done, 1 a trial failed or
a storage fault (``sweeps.faults``: one ``error: storage fault`` line, last on
stderr), 2 a user error (one ``error:`` line).
"""

from __future__ import annotations

import argparse
import contextlib
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
from sweeps.faults import close_unfinished, report_storage_faults  # noqa: F401  (the launcher's epilogue)
from sweeps.validate import check_args, check_value, parse_overrides  # noqa: F401

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


def build_trials(args: argparse.Namespace):
    """The study's trial configs; raises ValueError on any bad name or value."""
    from sweeps.common import StudyOptions  # imports torch: not at module level, so --help stays fast

    study = load_study(args.study)
    check_args(args)
    defaults: StudyOptions = study.DEFAULTS
    # At GPU speed an epoch takes seconds: checkpoint by wall time, not every epoch (--set overrides it).
    overrides = {"checkpoint_interval_s": GPU_CHECKPOINT_INTERVAL_S} if args.gpus_per_trial > 0 else {}
    if args.defaults_from:
        from sweeps.hparam import read_defaults

        overrides.update({k: check_value(k, v) for k, v in read_defaults(args.defaults_from).items()})
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
            overrides={**overrides, **dict(zip(swept, values)), **_swept_label(swept)},
            # Absolute: every Ray worker process has its own working directory.
            data_root=args.data_root if "://" in args.data_root else os.path.abspath(os.path.expanduser(args.data_root)),
        )
        configs += study.trials(options, **kwargs)
    ids = [c.trial_id for c in configs]
    if len(set(ids)) != len(ids):
        raise ValueError("the study produced duplicate trials; check --set overrides")
    return configs


def _swept_label(swept) -> dict:
    """The fields a --set sweep varies, for the trial ids' readable part (``RunConfig.swept``)."""
    varied = ",".join(k for k, v in swept.items() if len(v) > 1)
    return {"swept": varied} if varied else {}


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
    results, storage = resolve_paths(args)
    return results, storage, resolve_tracking(args, results)


def resolve_paths(args: argparse.Namespace) -> tuple[str, str]:
    """(results, storage), validated, without importing torch, Ray or MLflow."""
    results = args.results if "://" in args.results else os.path.abspath(args.results)
    storage = args.storage or f"{results.rstrip('/')}/storage"
    if "://" not in storage:
        storage = os.path.abspath(storage)
    for flag, uri in (("--results", results), ("--storage", storage)):
        if "://" not in uri and os.path.exists(uri) and not os.path.isdir(uri):
            raise ValueError(f"{flag} {uri} is a file; pass a folder (created when missing) or a URI (s3://...)")
        _check_uri(uri)
    return results, storage


def resolve_tracking(args: argparse.Namespace, results: str) -> str:
    from records import stores

    mlflow_uri = args.mlflow_uri or stores.default_tracking_uri(results)
    stores.check_tracking_uri(mlflow_uri)
    return mlflow_uri


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
    import ray
    from ray import tune

    from records import client, manifest, provenance, tracking
    from sweeps import faults as fault_module
    from trainables.lifecycle import LaunchSettings, finished_trials
    from trainables.ray_start import DRIVER_RESOURCES, init_ray
    from trainables.ray_trial import UNRETRIABLE, run_trial

    experiment_id = tracking.ensure_experiment(mlflow_uri, args.study)
    print(f"MLflow: {progress.mlflow_view(mlflow_uri, experiment_id)}", flush=True)  # at launch, not only at the end
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
    # No trial runs now (this launch holds the lock): a run still RUNNING is an earlier launch's
    # orphan, and a finished trial's run that could not be closed then is closed FINISHED now.
    tracking.end_orphaned_runs(mlflow_uri, experiment_id, finished_trial_ids=done)
    todo = [c for c in configs if c.trial_id not in done]
    if args.resume:
        log.info(_resume_line(results, args.study, len(configs), len(todo)))
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
    runs = [*members, *(c.trial_id for c in todo)]  # the Train runs this launch may continue
    for line in fault_module.set_aside_truncated_train_state(storage, args.study, runs):
        log.warning(line)
    if args.study != "hparam":  # a search's trials are sampled as it goes: no plan to record
        pack = pack_of(packs)
        plan = manifest.write_manifest(
            results, args.study, planned=[{"trial_id": c.trial_id, "pack": pack.get(c.trial_id)} for c in configs],
            command=[Path(sys.argv[0]).name, *sys.argv[1:]], code_version=code_version)
        tracking.describe_experiment(mlflow_uri, experiment_id, _describe(plan))
    ray_was_up = ray.is_initialized()
    init_ray(args.address, log_to_driver=args.verbose)  # quiet: the launcher prints one line per trial
    _check_store_reach(mlflow_uri)
    # Grid trials look their config up by id; hparam trials apply sampled values to `base`.
    by_id = {c.trial_id: c.to_flat() for c in configs}
    lines = progress.TrialProgress(results, args.study, total=len(todo), members=members, configs=todo)
    watch = fault_module.FaultWatch(mlflow_uri, client.RETRY_BUDGET_S)
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, settings=settings, trials=by_id, base=configs[0].to_flat(), packs=members),
        DRIVER_RESOURCES,
    )
    tune_dir = f"{storage.rstrip('/')}/{args.study}"
    # Every launch starts a fresh Tuner over the trials still to run, never Tuner.restore: the trials
    # table is the record of what is done, each trial continues its own Train checkpoint and MLflow
    # run by its id, and Tune's saved state (truncated by a full disk, from another Ray, or holding
    # the killed launcher's callbacks) has nothing a resume needs.
    name = f"tune-{time.strftime('%Y%m%d-%H%M%S')}"
    if packed:
        log.info("%d trials to run in %d packs", len(todo), len(packs))
    stopped: set[str] = set()  # trials the hparam study's scheduler (ASHA) stopped early
    if args.study == "hparam":
        tuner = hparam_tuner(args, configs[0], trainable, tune_dir, name, stopped,
                             callbacks=[watch.callback()], stop=watch.stopper())
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
                callbacks=[watch.callback(), lines.as_callback(watch)],  # the watch first: it silences the lines
                stop=watch.stopper(),
            ),
        )
    t0 = time.perf_counter()
    launch_log = fault_module.LaunchLog(results, args.study)
    grid, errors = None, []
    try:
        with manifest.heartbeat(results, args.study), fault_module.routed(launch_log, args.verbose), watch:
            try:
                grid = tuner.fit()
                errors = [r for r in grid if r.error or (r.metrics or {}).get(UNRETRIABLE)]
                for r in errors:
                    why = fault_module.classify(r.error) if r.error else None
                    if why:
                        watch.add(why)
                    elif not r.error:
                        log.error("trial %s failed without retries: %s",
                                  r.config.get("trial_id") or r.config.get("pack_id"), r.metrics[UNRETRIABLE])
            except Exception as exc:  # noqa: BLE001 - classified; anything else is raised as it is
                why = fault_module.classify(exc)
                if why is None:
                    raise
                logging.getLogger("vitsweep.tune").error("Tune ended with a storage fault", exc_info=True)
                watch.add(why)
            if args.study != "hparam":
                print(lines.summary(), flush=True)
            log.info("train stage: %d Tune trials in %.0f s, %d failed%s", len(grid or []), time.perf_counter() - t0,
                     len(errors), "; stopped by a storage fault" if watch.found else "")
            reason = ("storage fault: " + watch.found[0]) if watch.found else \
                "the launch ended before the trial finished (interrupted, or its driver was killed)"
            faults = close_unfinished(results, args.study, mlflow_uri, experiment_id, stopped, reason,
                                      tracking_down=watch.tracking_down)
            for line in watch.found + faults:
                launch_log.write_text(f"storage fault: {line}")
    finally:
        launch_log.close()
    if watch.found or faults:
        if not ray_was_up:  # Ray's shutdown chatter comes before the one line, not after it
            with contextlib.suppress(Exception):
                ray.shutdown()
        raise fault_module.StorageFault(watch.found + faults, launch_log.path)
    if args.study == "hparam":
        from sweeps import hparam

        best = grid.get_best_result(metric=hparam.METRIC, mode=hparam.MODE, scope="last")
        path = hparam.write_best(results, best.config, score=best.metrics[hparam.METRIC],
                                 condition=configs[0].to_flat(), n_trials=len(grid))
        log.info("best %s %.4f with %s -> %s", hparam.METRIC, best.metrics[hparam.METRIC],
                 {k: best.config[k] for k in hparam.SEARCHED}, path)
    if args.study != "hparam" and not errors:  # e.g. Ctrl-C: Tune returns, its trials cut short
        from records import tables

        table = tables.read_table(results, args.study, "trials")
        ended = {r["trial_id"] for r in (table.to_pylist() if table is not None else []) if r["status"] == "finished"}
        left = [c.trial_id for c in todo if c.trial_id not in ended]
        if left:
            log.warning("%d trial(s) did not finish; `--resume` continues them", len(left))
            return 1
    return 1 if errors else 0


def _resume_line(results: str, study: str, planned: int, todo: int) -> str:
    from records import tables

    if tables.read_table(results, study, "trials") is None:
        return f"--resume: study {study!r} has no records in {results}; starting it fresh"
    return (f"--resume: {todo} of {planned} trials unfinished (from the trials table); a fresh Tune run "
            "continues each from its own checkpoint and MLflow run")


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


def hparam_tuner(args, base, trainable, tune_dir: str, name: str, stopped: set[str], **run_config):
    """Optuna (TPE) proposals + ASHA early stopping around one base condition. ``stopped`` collects
    the trial ids ASHA stops: only those may be recorded as stopped early."""
    from ray import tune
    from ray.tune.schedulers import TrialScheduler

    from sweeps import hparam

    scheduler = hparam.scheduler(base.epochs)
    decide = scheduler.on_trial_result

    def on_trial_result(tune_controller, trial, result):
        decision = decide(tune_controller, trial, result)
        if decision == TrialScheduler.STOP:
            stopped.add(base.with_overrides(trial.config).trial_id)
        return decision

    scheduler.on_trial_result = on_trial_result
    return tune.Tuner(
        trainable,
        param_space=hparam.search_space(base.epochs),
        tune_config=tune.TuneConfig(
            search_alg=hparam.searcher(seed=base.seed),
            scheduler=scheduler,
            num_samples=args.samples or hparam.DEFAULT_SAMPLES,
            max_concurrent_trials=max_concurrent(args),
            metric=hparam.METRIC,
            mode=hparam.MODE,
        ),
        run_config=tune.RunConfig(name=name, storage_path=tune_dir, verbose=progress.tune_verbosity(args.verbose),
                                  **run_config),
    )


def _trial_name(trial) -> str:
    return trial.config.get("pack_id") or trial.config["trial_id"]


def main(argv: list[str] | None = None) -> int:
    from sweeps.validate import OneLineParser

    parser = OneLineParser(
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
    fault = None
    try:
        # Names, values and the launch lock before torch, Ray or MLflow is imported: a bad value or a
        # refused second launch answers in a moment.
        check_args(args)
        if args.dry_run:
            return dry_run(args)
        results, storage = resolve_paths(args)
        from sweeps.lock import LaunchLock

        with LaunchLock(results, args.study), progress.quiet_console(results, args.study, args.verbose):
            configs = build_trials(args)
            build_packs(args, configs)
            mlflow_uri = resolve_tracking(args, results)
            if args.stage in ("train", "all"):
                check_data(configs)
            try:
                return _stages(args, configs, results, storage, mlflow_uri)
            except ValueError:
                raise
            except Exception as exc:  # noqa: BLE001 - a storage fault ends in one line; anything else raises
                from sweeps import faults

                why = faults.classify(exc)
                if why is None:
                    raise
                fault = exc if isinstance(exc, faults.StorageFault) else _logged_fault(results, args.study, why)
        # (the lock is released here, so its own warnings come before the one line)
    except user_errors() as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report_storage_faults(fault.lines, fault.log_path)
    return 1


def _logged_fault(results: str, study: str, why: str):
    """A storage fault outside Tune (a manifest, a table, an MLflow call of the launcher): its
    traceback goes to a launch log too."""
    import traceback

    from sweeps import faults

    launch_log = faults.LaunchLog(results, study)
    launch_log.write_text(traceback.format_exc())
    launch_log.close()
    return faults.StorageFault([why], launch_log.path)


def dry_run(args: argparse.Namespace) -> int:
    configs = build_trials(args)
    packs = build_packs(args, configs)
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

        from records import manifest

        with manifest.heartbeat(results, args.study, stage="report"):  # `vitsweep status` shows the stage
            path = build_report(results, args.study, mlflow_uri=mlflow_uri)
        log.info("report: %s", path)
    # The summary comes last; it names the report only when there is one.
    report = args.stage in ("report", "all") or _report_exists(results, args.study)
    print(progress.closing_lines(results, args.study, mlflow_uri, report=report), flush=True)
    return status


def _report_exists(results: str, study: str) -> bool:
    from records.tables import filesystem

    try:
        fs, path = filesystem(f"{results.rstrip('/')}/{study}/report/index.html")
        return fs.get_file_info(path).size is not None
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
