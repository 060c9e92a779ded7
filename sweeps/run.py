"""Launcher: run a named study on Ray Tune + Ray Train, then analyse and report.

Runs as a plain script, so a cluster user can write

    ray submit cluster/aws.yaml sweeps/run.py -- study_l --address auto \
        --results s3://BUCKET/vitsweep --mlflow-uri '$VITSWEEP_MLFLOW_URI' --data-root /data

and locally it is ``vitsweep sweep STUDY``. Everything a user can get wrong (study, PE, data set,
protocol, ``--set`` field and value, storage and MLflow URIs) is checked before Ray starts, names and
values (``sweeps.launch.options``, ``sweeps.launch.validate``) and the launch lock even before torch is imported;
``--dry-run`` stops right after that check and prints the plan (``sweeps.launch.dry_run``). The stages know no
study by name: what a study does differently it declares in its hooks (``sweeps/studies/study.py``).

Exit codes: 0 done; 1 a trial failed or a storage fault (``sweeps.launch.faults``: one ``error: storage
fault`` line, last on stderr); 2 a user error (one ``error:`` line); 130 interrupted: Ctrl-C, SIGTERM
or SIGHUP (``sweeps.launch.interrupt``: the unfinished trials closed ``failed``, then the closing lines).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import shlex
import socket
import sys
import time
import traceback
import urllib.parse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python sweeps/run.py` / `ray submit ... sweeps/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from records import client, layout, manifest, provenance, stores, tables, tracking
from records.stores import TrackingError
from sweeps.launch import faults, options, progress, supervise
from sweeps.launch.interrupt import INTERRUPTED_EXIT, Interrupts
from sweeps.launch.lock import AGAIN, LaunchLock
from sweeps.launch.packs import pack_of, resume_epochs
from sweeps.launch.validate import OneLineParser
from sweeps.studies import study
from trainables.config.data_roots import check_root
from trainables.trial.lifecycle import LaunchSettings, close_unfinished, finished_trials
from trainables.trial.ray_start import DRIVER_RESOURCES, init_ray

# Imports inside functions: Ray, Tune, the training stack and the analysis stack load only once a launch passed
# its checks and reached the stage that needs them (a refused launch, a dry run and --help start nothing).

log = logging.getLogger("vitsweep")
USER_ERRORS = (ValueError, TrackingError)  # what a user can fix by changing the command: one `error:` line, exit 2


def check_data(configs) -> None:
    """Fail before Ray starts when a data set's root is missing or malformed, or a
    download it needs (CIFAR) fails: once here, not in every Train worker."""
    roots = sorted({(c.dataset, c.data_root) for c in configs})
    for dataset, root in roots:
        check_root(dataset, root)  # torch-free: a bad root is refused before torch is imported
    from trainables.data.datasets import prepare_root

    for dataset, root in roots:
        prepare_root(dataset, root)


def resolve_paths(args: argparse.Namespace) -> tuple[str, str]:
    """(results, storage), validated, without importing torch, Ray or MLflow."""
    results = layout.results_location(args.results)
    storage = layout.results_location(args.storage or layout.default_storage(results))
    for flag, uri in (("--results", results), ("--storage", storage)):
        if not layout.is_uri(uri) and os.path.exists(uri) and not os.path.isdir(uri):
            raise ValueError(f"{flag} {uri} is a file; pass a folder (created when missing) or a URI (s3://...)")
        try:
            layout.filesystem(uri)
        except Exception as exc:  # pyarrow raises ArrowInvalid / OSError with its own wording
            raise ValueError(f"cannot use storage location {uri!r}: {exc}") from exc
    return results, storage


def resolve_tracking(args: argparse.Namespace, results: str) -> str:
    mlflow_uri = args.mlflow_uri or stores.default_tracking_uri(results)
    stores.check_tracking_uri(mlflow_uri)
    return mlflow_uri


def max_concurrent(args: argparse.Namespace) -> int | None:
    """Trials that fit at once in the cluster as it is now, so none waits forever
    for Train workers that the other trials' workers block."""
    import ray

    if args.max_concurrent:
        return args.max_concurrent
    total = ray.cluster_resources()
    gpus = options.gpus_per_trial(args)
    fits = [math.floor(total.get("CPU", 0) / (args.cpus_per_trial * args.workers_per_trial) + 1e-9)]
    if gpus > 0:
        fits.append(math.floor(total.get("GPU", 0) / (gpus * args.workers_per_trial) + 1e-9))
    fit = min(fits)
    if fit < 1:
        if args.address:  # an autoscaling cluster adds nodes for pending trials
            return None
        raise ValueError(f"one trial needs {args.workers_per_trial} worker(s) x {args.cpus_per_trial} CPU / {gpus} "
                         f"GPU, but this Ray has {total.get('CPU', 0)} CPU / {total.get('GPU', 0)} GPU")
    return fit


@dataclass(frozen=True)
class Launch:
    """One launch's checked values, bundled once (``_run``), for every stage."""

    args: argparse.Namespace
    configs: list  # the study's trials (RunConfig), built once
    results: str
    storage: str
    mlflow_uri: str
    interrupts: Interrupts
    # Set by the train stage (``open_launch``): where it writes and what each trial may use
    # (``trainables.trial.lifecycle.LaunchSettings``), and the trial ids earlier launches finished.
    settings: Any = None
    done: frozenset[str] = frozenset()

    @property
    def spec(self) -> study.Study:
        return study.of(self.args.study)


def train_stage(launch: Launch) -> int:
    """Train the trials not finished yet on Ray Tune (one Tune trial per pack or trial): 0 when every
    one finished, 1 when one failed or was cut short, ``INTERRUPTED_EXIT`` when a signal stopped it
    (its trials closed); a storage fault raises StorageFault."""
    launch = open_launch(launch)
    todo = trials_to_run(launch)
    if not todo:
        return 0
    start_ray(launch.args, launch.mlflow_uri)  # refuses here, before any trial starts
    members = plan_packs(launch, todo)
    watch = faults.FaultWatch(launch.mlflow_uri, client.RETRY_BUDGET_S)
    lines = progress.TrialProgress(launch.results, launch.args.study, total=len(todo), members=members, configs=todo)
    stopped: set[str] = set()  # trials a study's scheduler stopped early: recorded as stopped, not failed
    tuner = make_tuner(launch, todo, members, watch, lines, stopped)
    grid, errors = fit(launch, tuner, watch, lines, stopped)  # a storage fault raises StorageFault
    if launch.interrupts.received:
        return INTERRUPTED_EXIT
    launch.spec.after_sweep(launch.results, grid, launch.configs)
    return 1 if errors or (launch.spec.planned and unfinished(launch, todo)) else 0


def open_launch(launch: Launch) -> Launch:
    """The launch with the study's MLflow experiment and its settings; runs an earlier launch left open closed."""
    args, results, mlflow_uri = launch.args, launch.results, launch.mlflow_uri
    experiment_id = tracking.ensure_experiment(mlflow_uri, args.study)
    print(f"MLflow: {progress.mlflow_view(mlflow_uri, experiment_id)}", flush=True)  # at launch, not only at the end
    # `ray job submit` ships the code without .git: the submitter can pass the commit.
    code_version = os.environ.get("VITSWEEP_CODE_VERSION") or provenance.code_version()
    settings = LaunchSettings(
        study=args.study, results=results, storage=launch.storage, mlflow_uri=mlflow_uri,
        experiment_id=experiment_id, workers_per_trial=args.workers_per_trial, cpus_per_trial=args.cpus_per_trial,
        gpus_per_trial=options.gpus_per_trial(args), max_failures=args.max_failures,
        placement_timeout_s=args.placement_timeout, code_version=code_version,
        provenance={**provenance.provenance(), "code_version": code_version})
    done = finished_trials(results, args.study)
    # No trial runs now (this launch holds the lock): a run still RUNNING is an earlier launch's
    # orphan, and a finished trial's run that could not be closed then is closed FINISHED now.
    tracking.end_orphaned_runs(mlflow_uri, experiment_id, finished_trial_ids=done)
    return replace(launch, settings=settings, done=frozenset(done))


def trials_to_run(launch: Launch) -> list:
    """The trials not finished yet, said on the console; a study that cannot resume refuses ``--resume``."""
    args, spec, configs = launch.args, launch.spec, launch.configs
    todo = [c for c in configs if c.trial_id not in launch.done]
    if args.resume:
        log.info(_resume_line(launch.settings.results, args.study, len(configs), len(todo)))
    if spec.planned:  # a search samples its trials; there is no list to check off
        log.info("%d trials, %d already finished, %d to run", len(configs), len(configs) - len(todo), len(todo))
    if todo and args.resume and spec.resume_refused:
        raise ValueError(spec.resume_refused)
    return todo


ADDRESS_TIMEOUT_S = 5.0


def check_address(address: str | None) -> None:
    """Refuse, in one line, a ``--address host:port`` where no Ray GCS answers, before anything is
    planned: Ray itself retries such an address silently for minutes, and one that answers HTTP (the
    dashboard's port) ends in a traceback. The probe is one call of the GCS's own gRPC service
    (``NodeInfoGcsService.CheckAlive``) over Ray's own channel (``gcs_utils.create_gcs_channel``: its TLS
    and token settings), bounded by ``ADDRESS_TIMEOUT_S``; gRPC's wait checks for signals, so Ctrl-C or
    SIGTERM ends it at once. (``ray._raylet.GcsClient`` waits 12 s whatever its timeout and writes its
    retries to stderr.) A ``ray://`` (Ray Client) address gets a TCP connect only, an ``http://`` one (the
    dashboard's) is refused; "auto" and an address without a port are left to Ray."""
    if not address or address == "auto":
        return
    where = urllib.parse.urlsplit(address if layout.is_uri(address) else f"ray://{address}")
    try:
        host, port = where.hostname, where.port
    except ValueError as exc:
        raise ValueError(f"--address {address!r} is not host:port, ray://host:port or 'auto' ({exc})") from exc
    if where.scheme in ("http", "https"):  # the dashboard's address, which `ray job submit` takes
        raise ValueError(f"--address {address!r} is an HTTP address (the dashboard's, for `ray job submit`), not "
                         "Ray's: pass the GCS's HOST:PORT (6379 unless `ray start --head --port` chose another), "
                         "ray://HOST:10001 for Ray Client, 'auto' on a cluster node, or no --address for a local Ray")
    if not host or port is None:
        return
    if layout.is_uri(address):  # ray://: the Ray Client server speaks its own protocol; a TCP connect it is
        try:
            socket.create_connection((host, port), timeout=ADDRESS_TIMEOUT_S).close()
        except OSError as exc:
            raise ValueError(f"--address {address!r}: nothing accepts a connection at {host}:{port} (tried for up "
                             f"to {ADDRESS_TIMEOUT_S:g} s: {exc.strerror or exc})") from exc
        return
    import grpc  # (Ray's own dependency; with the two below, ~0.4 s, no torch)
    import ray
    from ray._private import gcs_utils
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 literal keeps its brackets
    try:
        channel = gcs_utils.create_gcs_channel(target)
    except Exception:  # noqa: BLE001 - Ray's own TLS / token settings are broken: ray.init says how, in its words
        return
    try:
        reply = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).CheckAlive(
            gcs_service_pb2.CheckAliveRequest(), timeout=ADDRESS_TIMEOUT_S)
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
        gcs_port = ("Ray's GCS listens on another port: 6379 unless `ray start --head --port` chose another "
                    "(`ray start --head` printed it as --address='HOST:PORT'; /tmp/ray/ray_current_cluster on the "
                    "head holds it)")
        if code == grpc.StatusCode.UNAVAILABLE and ("refused" in details or "resolving" in details):
            why = (f"nothing accepts a connection at {host}:{port} "
                   f"({'connection refused' if 'refused' in details else 'its host name does not resolve'})")
            gcs_port = "pass the GCS address (`ray start --head` printed it as --address='HOST:PORT')"
        elif code == grpc.StatusCode.UNAVAILABLE:  # it answered, and not with HTTP/2: an HTTP/1 server
            why = (f"{host}:{port} answers, but not in gRPC: no Ray GCS (an HTTP server, such as Ray's dashboard, "
                   "answers so)")
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:  # (a silent listener, or a firewall dropping the packets)
            why = (f"no Ray GCS answered at {host}:{port} within {ADDRESS_TIMEOUT_S:g} s (or a firewall drops "
                   "the packets)")
        elif code == grpc.StatusCode.UNIMPLEMENTED:
            why = f"{host}:{port} speaks gRPC but is no Ray GCS (a Ray Client port takes ray://{target})"
        else:  # a GCS that answers with an error (UNAUTHENTICATED: no token here) is Ray's: ray.init says why
            return
        dashboard = f" ({port} is the port of Ray's dashboard)" if port == 8265 else ""
        raise ValueError(f"--address {address!r}: {why}{dashboard}; {gcs_port}; or pass 'auto' on a cluster node, "
                         "or no --address for a local Ray") from None
    except Exception:  # noqa: BLE001 - e.g. Ray's token interceptor finds no token here: ray.init says so
        return
    finally:
        channel.close()
    if reply.ray_version and reply.ray_version != ray.__version__:  # ray.init refuses it later, in a traceback
        raise ValueError(f"--address {address!r}: that cluster runs Ray {reply.ray_version} and this launcher Ray "
                         f"{ray.__version__}; install ray=={reply.ray_version} here")


def start_ray(args, mlflow_uri: str) -> None:
    """Start (or join) Ray, then refuse what it cannot run as asked: a SQLite store on many nodes, CPU
    trials on a cluster with GPUs unless ``--gpus-per-trial 0`` says so (then one warning)."""
    import ray

    # Ray's start takes up to a minute or two: say so, then what it found.
    print(f"Ray: joining {args.address}" if args.address else "Ray: starting a local Ray (loopback only)", flush=True)
    init_ray(args.address, log_to_driver=args.verbose)  # quiet: the launcher prints one line per trial
    found, nodes = ray.cluster_resources(), ray.nodes()
    print(f"Ray: up, {len(nodes)} node(s), {found.get('CPU', 0):g} CPU(s), {found.get('GPU', 0):g} GPU(s)", flush=True)
    alive = [n for n in nodes if n.get("Alive")]
    if mlflow_uri.startswith("sqlite:") and len(alive) > 1:  # a file on one machine: each node would write its own
        raise ValueError(f"--mlflow-uri {mlflow_uri!r} is a SQLite file, but this Ray cluster has {len(alive)} nodes; "
                         "pass the MLflow server the cluster runs, e.g. --mlflow-uri http://HEAD_IP:5000")
    if warning := options.check_gpus(found, args):
        log.warning(warning)


def plan_packs(launch: Launch, todo) -> dict[str, list[str]]:
    """Pack the trials to run, set aside the Train state a full disk truncated, record the plan;
    returns pack id -> its trial ids ({} for a search, whose trials are sampled as it goes)."""
    args, settings = launch.args, launch.settings
    packs = []
    if launch.spec.planned:  # packs form by resume epoch, so a resumed sweep re-forms them
        epochs = resume_epochs(settings.results, args.study, settings.storage, [c.trial_id for c in todo])
        packs = options.build_packs(args, todo, epochs)
    members = {p.pack_id: p.trial_ids for p in packs}
    runs = [*members, *(c.trial_id for c in todo)]  # the Train runs this launch may continue
    for line in faults.set_aside_truncated_train_state(settings.storage, args.study, runs):
        log.warning(line)
    faults.remove_trial_temp_folders(runs)  # an earlier launch's killed drivers left theirs
    if launch.spec.planned:
        pack = pack_of(packs)
        plan = manifest.write_manifest(
            settings.results, args.study,
            planned=[{"trial_id": c.trial_id, "pack": pack.get(c.trial_id)} for c in launch.configs],
            command=[Path(sys.argv[0]).name, *sys.argv[1:]], code_version=settings.code_version)
        tracking.describe_experiment(settings.mlflow_uri, settings.experiment_id, _describe(plan))
    if any(len(m) > 1 for m in members.values()):
        log.info("%d trials to run in %d packs", len(todo), len(packs))
    return members


def make_tuner(launch: Launch, todo, members, watch, lines, stopped: set[str]):
    """The study's own Tuner (its ``tuner`` hook), or a grid over the packs (or trials) to run."""
    from ray import tune

    from trainables.trial.ray_trial import run_trial

    args, configs = launch.args, launch.configs
    # Grid trials look their config up by id; a search's trials apply sampled values to `base`.
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, settings=launch.settings, trials={c.trial_id: c for c in configs},
                             base=configs[0], packs=members),
        DRIVER_RESOURCES,
    )
    # Every launch starts a fresh Tuner over the trials still to run, never Tuner.restore: the trials
    # table is the record of what is done, each trial continues its own Train checkpoint and MLflow
    # run by its id, and Tune's saved state (truncated by a full disk, from another Ray, or holding
    # the killed launcher's callbacks) has nothing a resume needs.
    setup = study.TuneSetup(
        args=args, base=configs[0], trainable=trainable, max_concurrent=max_concurrent(args), stopped=stopped,
        run_config={"name": f"tune-{time.strftime('%Y%m%d-%H%M%S')}",
                    "storage_path": layout.storage_dir(launch.settings.storage, args.study),
                    "verbose": int(args.verbose),  # Tune's status tables only with --verbose
                    "callbacks": [watch.callback()], "stop": watch.stopper()})
    if launch.spec.tuner is not None:
        return launch.spec.tuner(setup)
    return grid_tuner(setup, todo, members, lines.as_callback(watch))


def grid_tuner(setup: study.TuneSetup, todo, members: dict[str, list[str]], progress_callback):
    """One Tune trial per pack (or per trial when none packs), each trained once, retried on failure."""
    from ray import tune

    packed = any(len(m) > 1 for m in members.values())
    run_config = {**setup.run_config, "callbacks": [*setup.run_config["callbacks"], progress_callback]}
    return tune.Tuner(  # (the watch's callback first: it silences the progress lines)
        setup.trainable,
        param_space={"pack_id": tune.grid_search(list(members))} if packed
        else {"trial_id": tune.grid_search([c.trial_id for c in todo])},
        tune_config=tune.TuneConfig(
            max_concurrent_trials=setup.max_concurrent,
            trial_name_creator=_trial_name,
            trial_dirname_creator=_trial_name,
            reuse_actors=True,  # a driver process (imports, MLflow client) serves many trials
        ),
        run_config=tune.RunConfig(**run_config,
                                  failure_config=tune.FailureConfig(max_failures=setup.args.max_failures)),
    )


def fit(launch: Launch, tuner, watch, lines, stopped: set[str]):
    """Run the Tuner under the heartbeat, the launch log and the fault watch, then close what did not
    finish; (Tune's results, the failed ones). A storage fault raises StorageFault."""
    args, settings, interrupts, results = launch.args, launch.settings, launch.interrupts, launch.results
    t0 = time.perf_counter()
    launch_log = faults.LaunchLog(results, args.study)
    grid, errors = None, []
    def close_now() -> None:  # at the first signal (sweeps.launch.interrupt); the epilogue below closes the rest
        with contextlib.suppress(Exception):  # noqa: BLE001 - the epilogue closes again, and reports faults
            close_unfinished(results, args.study, settings.mlflow_uri, settings.experiment_id, stopped,
                             interrupts.reason, tracking_down=watch.tracking_down)

    try:
        with manifest.heartbeat(results, args.study) as beat, faults.routed(launch_log, args.verbose), watch, \
                interrupts.stopping(watch, close_now):
            try:
                grid = tuner.fit()
                errors = failed(grid, watch)
            except Exception as exc:  # noqa: BLE001 - classified; anything else is raised as it is
                why = faults.classify(exc)
                if why is None:
                    raise
                logging.getLogger("vitsweep.tune").error("Tune ended with a storage fault", exc_info=True)
                watch.add(why)
            stopped_by = ("; stopped by a storage fault" if watch.found else
                          f"; {interrupts.reason}" if interrupts.received else "")
            reason = ("storage fault: " + watch.found[0]) if watch.found else interrupts.reason or \
                "the launch ended before the trial finished (its driver was killed)"
            unclosed = close_unfinished(results, args.study, settings.mlflow_uri, settings.experiment_id,
                                        stopped, reason, tracking_down=watch.tracking_down)
            faults.remove_trial_temp_folders([*lines.members, *(t for m in lines.members.values() for t in m)])
            if launch.spec.planned:  # one training summary, after the epilogue: the trials table's counts
                print(lines.summary() + stopped_by, flush=True)
            else:  # a search: Tune's trials are its record
                log.info("train stage: %d Tune trials in %.0f s, %d failed%s", len(grid or []),
                         time.perf_counter() - t0, len(errors), stopped_by)
            for line in watch.found + unclosed:
                launch_log.write_text(f"storage fault: {line}")
            if interrupts.received:
                beat.outcome = interrupts.reason
                log.warning("%s: its unfinished trials are recorded failed; `--resume` continues them",
                            interrupts.reason)
    finally:
        launch_log.close()
    if watch.found or unclosed:
        raise faults.StorageFault(watch.found + unclosed, launch_log.path)
    return grid, errors


def failed(grid, watch) -> list:
    """Tune's results that failed, or ended unretriable; a storage fault among them goes to the watch."""
    from trainables.trial.ray_trial import UNRETRIABLE

    errors = [r for r in grid if r.error or (r.metrics or {}).get(UNRETRIABLE)]
    for r in errors:
        why = faults.classify(r.error) if r.error else None
        if why:
            watch.add(why)
        elif not r.error:
            log.error("trial %s failed without retries: %s",
                      r.config.get("trial_id") or r.config.get("pack_id"), r.metrics[UNRETRIABLE])
    return errors


def unfinished(launch: Launch, todo) -> list[str]:
    """Trials of ``todo`` the trials table does not show finished (e.g. Ctrl-C: Tune returns, its
    trials cut short), said in one warning."""
    table = tables.read_table(launch.results, launch.args.study, "trials", ["trial_id", "status"])
    ended = {r["trial_id"] for r in (table.to_pylist() if table is not None else []) if r["status"] == "finished"}
    left = [c.trial_id for c in todo if c.trial_id not in ended]
    if left:
        log.warning("%d trial(s) did not finish; `--resume` continues them", len(left))
    return left


def _resume_line(results: str, study_name: str, planned: int, todo: int) -> str:
    if tables.read_table(results, study_name, "trials", ["trial_id"]) is None:
        return f"--resume: study {study_name!r} has no records in {results}; starting it fresh"
    return (f"--resume: {todo} of {planned} trials unfinished (from the trials table); a fresh Tune run "
            "continues each from its own checkpoint and MLflow run")


def _describe(plan: dict) -> str:
    """The MLflow experiment's description (Markdown above its runs; the experiments list shows its first line raw)."""
    return (f"vitsweep study {plan['study']}: {plan['n_trials']} trials, one run each (runs are named by "
            f"trial id).\n\nLatest launch {plan['started_at']} on {plan['host']}, code `{plan['code_version']}`:\n\n"
            f"    {plan['command']}\n\nParquet tables: `<results>/{plan['study']}/{{trials,epochs,measurements}}/`; "
            f"`vitsweep status {plan['study']}` shows progress.")


def _trial_name(trial) -> str:
    return trial.config.get("pack_id") or trial.config["trial_id"]


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="sweeps/run.py", description="Run a study: train every trial on Ray Tune + Ray "
                           "Train, then analyse and report.", epilog="example: python sweeps/run.py demo --stage all"
                           "   |   python sweeps/run.py study_l --dry-run")
    options.add_arguments(parser)
    args = parser.parse_args(argv)
    if argv is not None or args.dry_run:
        return run(args)
    # As the program (`ray job submit -- python sweeps/run.py ...`): kept by a parent process, as
    # `vitsweep sweep` is (see sweeps/launch/supervise.py).
    return supervise.run(sys.argv[1:], lambda argv: run(parser.parse_args(argv)),
                         lambda: (layout.results_location(args.results), args.study, args.mlflow_uri,
                                  AGAIN["launch"]))


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    progress.configure_console(getattr(args, "verbose", False))  # before Ray is imported: it reads these once
    with Interrupts() as interrupts:
        try:
            return _run(args, interrupts)
        except KeyboardInterrupt:
            print(f"vitsweep: interrupted ({interrupts.received[-1] if interrupts.received else 'SIGINT'}); "
                  f"{shlex.join(['vitsweep', 'status', args.study, '--results', args.results])} shows what "
                  "was left", file=sys.stderr, flush=True)
            return INTERRUPTED_EXIT


def _run(args: argparse.Namespace, interrupts: Interrupts) -> int:
    try:
        # Names, values and the trials before torch, Ray or MLflow is imported: a bad value answers in a moment.
        configs = options.build_trials(args)
        if args.dry_run:
            from sweeps.launch.dry_run import dry_run

            return dry_run(args, configs)
        check_address(args.address)  # nothing there: said now, not after Ray's two minutes of retries
        results, storage = resolve_paths(args)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def prepare() -> Launch:
        mlflow_uri = resolve_tracking(args, results)
        if args.stage in ("train", "all"):
            check_data(configs)
        return Launch(args, configs, results, storage, mlflow_uri, interrupts)

    return guarded(results, args.study, args.verbose, prepare, _stages)


def guarded(results: str, study_name: str, verbose: bool, prepare, work, *, what: str = "launch",
            then: str = AGAIN["launch"]) -> int:
    """``work(prepare())`` holding the study's lock (``what`` names the holder to a refused second
    one), the console filtered: a user error (of either) ends in one ``error:`` line, exit 2; a storage
    fault out of ``work`` in one ``error: storage fault`` line, last on stderr, exit 1; anything else
    is raised as it is."""
    fault = None
    try:
        with LaunchLock(results, study_name, what), progress.quiet_console(results, study_name, verbose):
            ready = prepare()
            ray_was_up = _ray_up()
            try:
                return work(ready)
            except ValueError:
                raise
            except Exception as exc:  # noqa: BLE001 - a storage fault ends in one line; anything else raises
                why = faults.classify(exc)
                if why is None:
                    raise
                fault = exc if isinstance(exc, faults.StorageFault) else _logged_fault(results, study_name, why)
                if _ray_up() and not ray_was_up:  # its shutdown chatter before the one line
                    with contextlib.suppress(Exception):
                        sys.modules["ray"].shutdown()
        # (the lock is released here, so its own warnings come before the one line)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    faults.report_storage_faults(fault.lines, fault.log_path, then)
    return 1


def _ray_up() -> bool:
    """Whether this process runs a Ray (without importing Ray, a second's work, when it is not)."""
    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


def _logged_fault(results: str, study_name: str, why: str):
    """A storage fault outside Tune (a manifest, a table, an MLflow call of the launcher): its
    traceback goes to a launch log too."""
    launch_log = faults.LaunchLog(results, study_name)
    launch_log.write_text(traceback.format_exc())
    launch_log.close()
    return faults.StorageFault([why], launch_log.path)


def analyze_stage(results: str, study_name: str, mlflow_uri: str | None, **choices: Any) -> list[dict[str, Any]]:
    """The analysis stage (a launch's, and ``vitsweep analyze``): every checkpoint measured
    (``analysis.measuring.job.analyze``, its keyword ``choices``), then the wide ``summary`` table rewritten
    from everything measured so far; returns the job's status rows."""
    from analysis.measuring.job import analyze  # (see sweeps/cli.py: the analysis stack only where it runs)
    from analysis.statistics.study_data import write_summary_table

    statuses = analyze(results=results, study=study_name, mlflow_uri=mlflow_uri, **choices)
    log.info("summary table of %s: %d trial(s)", study_name, write_summary_table(results, study_name))
    tables.try_compact(results, study_name)  # the summary files too: every later read is one scan
    return statuses


def _stages(launch: Launch) -> int:
    args, results, mlflow_uri = launch.args, launch.results, launch.mlflow_uri
    status = 0
    if args.stage in ("train", "all"):
        with tables.compacting(results, args.study):  # settled trials' files folded as it trains, all at its end
            status = train_stage(launch)
    interrupted = status == INTERRUPTED_EXIT  # no later stage: the closing lines say where the launch stopped
    if args.stage in ("analyze", "all") and not interrupted:
        spec = launch.spec  # its EVAL_SIZE and CHECKPOINTS hooks
        statuses = analyze_stage(results, args.study, mlflow_uri, address=args.address, eval_size=spec.eval_size,
                                 checkpoints=spec.checkpoints, verbose=args.verbose)
        if any(s["status"] != "ok" for s in statuses):
            status = status or 1
    if args.stage in ("report", "all") and not interrupted:
        from analysis.reporting.report import build_report  # (see sweeps/cli.py)

        with manifest.heartbeat(results, args.study, stage="report"):  # `vitsweep status` shows the stage
            report = str(build_report(results, args.study, mlflow_uri=mlflow_uri))
    else:
        report = _report_of(results, args.study)
    # The summary comes last; it names the report only when there is one.
    print(progress.closing_lines(results, args.study, mlflow_uri, report=report), flush=True)
    return status


def _report_of(results: str, study_name: str) -> str | None:
    """The study's report written by an earlier launch, where ``build_report`` puts it; None: none."""
    index = layout.report_dir(results, study_name) / "index.html"
    return str(index) if index.exists() else None


if __name__ == "__main__":
    sys.exit(main())
