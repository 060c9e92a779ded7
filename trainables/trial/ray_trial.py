"""The thin Ray layer: one Tune trial = one pack of trials (a lone trial is a pack of one) = one
Ray Train run of the plain loop (``trainables.loop.oom.train_pack_fitting``).

Ray 2.5x/2.6x runs Train V2, where ``Tuner(TorchTrainer)`` is gone; the recommended pattern is a
Tune *function* trainable that launches a ``TorchTrainer`` and forwards its reports to Tune with
``TuneReportCallback``. The function is only a driver (``ray_start.DRIVER_RESOURCES``).

    driver (Tune trial: pack id, or trial id)     Train worker(s): one, or DDP ranks for a lone trial
    -----------------------------------------     ---------------------------------------------------
    members not yet finished (their rows)         members still "running" (a retry skips closed ones)
    per member: MLflow run, row "running"         each member's stored checkpoint, if any; members
      (lifecycle.open_trials)                       grouped by its epoch, each group one pack
    TorchTrainer(name=<pack id>).fit()            per epoch, per member -> epochs/<id>, MLflow metrics
                                                    (background thread: trainables.trial.epoch_records),
                                                    snapshots + checkpoint upload (background thread)
                                                  a member whose loss turns non-finite: closed failed
                                                    at once; the others go on
    members left "running": failed with why       per member at the end: finished | failed
      (lifecycle.close_unclosed)

A lost node (or a killed worker) fails the worker group: Train restarts it from each member's last
checkpoint, up to ``max_failures`` times, and ``restart_recorder`` counts it in the members' rows and
runs first; the restarted worker names its node in them and tells the launcher in its first report
(``lifecycle.RESTART_KEYS``). A worker group no node can take fails its start after
``placement_timeout_s``; Train tries once more, then the trial fails.

Every pack is a Train run of its own, and Ray Train V2 starts a new controller, placement-group cleaner and
worker process for each ``fit()`` and kills them after it (``ray/train/v2/api/data_parallel_trainer.py``,
``_initialize_and_run_controller``; ``execution/worker_group/state.py``, ``WorkerGroupState.shutdown``): no
API hands a worker group to a later ``fit()``, so no worker outlives its pack. What each would load again
is kept per node instead: the decoded data set (``datasets.shared_splits`` in ``node_folder``, the node's
Ray session folder) and inductor's FX graph and AOT autograd caches (torch's defaults: on, in
``/tmp/torchinductor_<user>``, read by every worker of the node and every later launch).

Every trial's checkpoint lives in ``<storage>/<study>/checkpoints/<trial id>/`` (``trainables.loop.checkpoints``),
whichever pack trains it, so a member resumes in any pack or alone; a lone trial of an earlier version is
found in its Train storage (``checkpoints.find_stored``). Only rank 0 writes records. A Tune retry
(``FailureConfig``) or a resumed sweep continues every member from its stored checkpoint; epochs reported
again (after a retry, or an out-of-memory retry in halves) replace their ``epochs`` rows and are not
logged to MLflow twice.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from records import files, layout, tables, tracking
from trainables.data.datasets import SHARED_ENV, prepare_root
from trainables.loop import checkpoints
from trainables.loop.oom import train_pack_fitting
from trainables.config.run_config import RunConfig
from trainables.config.data_roots import DataRootError
from trainables.trial import lifecycle
from trainables.trial.epoch_records import EpochRecords
from trainables.trial.lifecycle import RESTART_KEYS, LaunchSettings

# Imports inside functions: Ray Train and Tune load in the processes that run a trial, not in those that plan one.

# Reported (instead of raised) by a worker whose data set is missing, or by a lone trial whose loss
# turned non-finite: a retry cannot fix that, and Train V2 / Tune retry every raised error, so the
# trial ends failed without retries (the launcher counts it as a failure).
UNRETRIABLE = "vitsweep_unretriable_error"
PLACEMENT_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"  # Ray Train's own setting
SUMMARY = ("train_loss", "train_acc", "eval_loss", "eval_acc", "epochs_completed", "test_acc", "did_not_learn")


def members_of(config: Mapping[str, Any], trials: Mapping[str, RunConfig], base: RunConfig | None,
               packs: Mapping[str, list[str]] | None) -> tuple[str, list[RunConfig]]:
    """(pack id, member configs) of a Tune trial's config. A grid's Tune config holds only a trial id
    (``config["trial_id"]``) or a pack id (``config["pack_id"]``; ``packs``: pack id -> member trial ids):
    the configs travel once, through ``tune.with_parameters`` (``trials``: id -> the launcher's RunConfig),
    which keeps Tune's state and progress output small for thousand-trial sweeps. A searcher's Tune
    config holds the sampled values, applied to ``base``."""
    if "pack_id" in config:
        ids = (packs or {}).get(config["pack_id"], [config["pack_id"]])
        return config["pack_id"], [trials[i] for i in ids]
    cfg = trials[config["trial_id"]] if "trial_id" in config else base.with_overrides(dict(config))
    return cfg.trial_id, [cfg]


def trainer_class(workers: int) -> type:
    """``TorchTrainer`` for DDP (several workers: it sets up the process group); the plain data-parallel
    trainer for one worker, which needs no process group. TorchTrainer would start one anyway, and its
    rendezvous store (torch's TCPStore) listens on every interface of the node, where everything else
    of a local Ray listens on loopback only."""
    if workers > 1:
        from ray.train.torch import TorchTrainer

        return TorchTrainer
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    return DataParallelTrainer


def run_trial(config: dict[str, Any], settings: LaunchSettings, trials: dict[str, RunConfig],
              base: RunConfig | None = None, packs: dict[str, list[str]] | None = None) -> None:
    """Tune function trainable: the driver of one pack (see the module docstring)."""
    import ray.train
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    pack_id, cfgs = members_of(config, trials, base, packs)
    solo = len(cfgs) == 1
    rows = {c.trial_id: tables.read_trial(settings.results, settings.study, c.trial_id) for c in cfgs}
    todo = [c for c in cfgs if rows[c.trial_id] is None or rows[c.trial_id]["status"] != "finished"]
    if not todo:  # in an earlier launch: never train twice
        done = rows[cfgs[0].trial_id]
        tune.report({k: done[k] for k in ("eval_acc", "test_acc", "epochs_completed") if done.get(k) is not None}
                    if solo else {"members_to_train": 0})
        return
    tag = None if solo else pack_id  # the rows' `pack` and the runs' vitsweep.pack: packs of several only
    run_ids = lifecycle.open_trials(settings, todo, tag, rows)  # the rows read just above
    # Ray Train reads its start timeout here (the driver) and hands it to its controller.
    os.environ[PLACEMENT_TIMEOUT_ENV] = f"{settings.placement_timeout_s:g}"
    use_gpu = settings.gpus_per_trial > 0
    resources = {"CPU": settings.cpus_per_trial, **({"GPU": settings.gpus_per_trial} if use_gpu else {})}
    workers = settings.workers_per_trial if solo else 1
    trainer = trainer_class(workers)(
        train_worker,
        train_loop_config={"pack_id": pack_id, "tag": tag, "solo": solo, "trials": todo,
                           "settings": settings, "run_ids": run_ids,
                           "restarts": {c.trial_id: (rows[c.trial_id] or {}).get("restarts") or 0 for c in todo}},
        scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=use_gpu, resources_per_worker=resources),
        run_config=ray.train.RunConfig(name=pack_id,
                                       storage_path=layout.train_storage(settings.storage, settings.study),
                                       # A start that timed out (no node can take the workers) is retried
                                       # once, not forever (Ray's default): then the trial fails.
                                       failure_config=ray.train.FailureConfig(max_failures=settings.max_failures,
                                                                              controller_failure_limit=1),
                                       callbacks=[TuneReportCallback(), restart_recorder(settings, todo, run_ids)]))
    why = f"{'trial' if solo else 'pack'} {pack_id} ended without closing it"
    try:
        result = trainer.fit()
        if isinstance(result.return_value, dict) and result.return_value.get(UNRETRIABLE):
            why = str(result.return_value[UNRETRIABLE])  # e.g. its data missing on this node: not retried
    except BaseException as exc:  # every retry failed, the driver was stopped (ASHA), ...
        why = f"{why}: {_unplaced(settings, resources) if _STARTUP_TIMEOUT in str(exc) else ''}" \
              f"{type(exc).__name__}: {exc}"
        raise
    finally:
        lifecycle.close_unclosed(settings, todo, run_ids, why, tag)


_STARTUP_TIMEOUT = "worker group startup timed out"  # Ray Train's words for WorkerGroupStartupTimeoutError


def _unplaced(settings: LaunchSettings, resources: dict[str, float]) -> str:
    return (f"its Train worker found no node with {resources} free in two tries of {settings.placement_timeout_s:g} s "
            "(--placement-timeout; a lost node's resources may still be held, or the cluster is full); ")


def restart_recorder(settings: LaunchSettings, cfgs: list[RunConfig], run_ids: dict[str, str]):
    """A Ray Train callback, run by Train's controller: each time the worker group fails (a lost node,
    a killed or crashed worker) and Train will restart it from the last checkpoint, the members'
    records count the restart and say why (``lifecycle.record_restart``); the restarted worker tells
    the launcher (``PackWorker.restart_note``)."""
    from ray.train import UserCallback

    class RecordRestarts(UserCallback):
        def __init__(self):
            self.failures = 0

        def after_exception(self, run_context, worker_exceptions):
            # Train's default failure policy restarts a failed worker group max_failures times (-1: always).
            self.failures += 1
            if 0 <= settings.max_failures < self.failures:
                return  # no restart: the driver closes the members failed, with the error
            _, error = min(worker_exceptions.items())  # rank 0's, or the lowest rank that failed
            node = _last_node(settings, cfgs)
            cause = (f"its Train worker{f' on node {node}' if node else ''} was lost "
                     f"({type(error).__name__}: {_first_line(error)})")
            lifecycle.record_restart(settings, cfgs, run_ids, cause)

    return RecordRestarts()


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return (lines[0] if lines else "no message")[:300]


def _last_node(settings: LaunchSettings, cfgs: list[RunConfig]) -> str | None:
    """The node the members' rows say they trained on (written by the worker when it started)."""
    rows = (tables.read_trial(settings.results, settings.study, cfg.trial_id) for cfg in cfgs)
    return next((row["node"] for row in rows if row and row.get("node")), None)


def this_node() -> str:
    """``"<ip> <node id>"`` of the Ray node this process runs on: the IP for people, the id for
    ``ray list nodes`` (nodes on one machine share the IP)."""
    import ray

    if not ray.is_initialized():  # the worker's loop run without Ray
        return socket.gethostname()
    return f"{ray.util.get_node_ip_address()} {ray.get_runtime_context().get_node_id()}"


def node_folder() -> Path:
    """This node's folder of the running Ray session (``<temp dir>/<session name>``, Ray's own layout):
    on the node's disk, shared by the node's workers, gone with the node. Ray keeps the folders of
    ended sessions, so the copies of other sessions are removed here (a local launch starts a session
    of its own: each would leave its data set behind); a process that still maps one keeps its pages,
    and a session still running builds its copy again."""
    import ray

    context = ray.get_runtime_context()
    temp, session = Path(context.get_temp_dir()), context.get_session_name()
    for other in temp.glob("session_*/vitsweep"):
        if other.parent.name != session and not other.parent.is_symlink():  # (session_latest links to one)
            shutil.rmtree(other, ignore_errors=True)
    return temp / session / "vitsweep"


def train_worker(loop_config: dict[str, Any]) -> dict[str, str] | None:
    """Runs on each Ray Train worker: restore each member, train, report, close each member."""
    import ray.train

    os.environ[SHARED_ENV] = str(node_folder())  # the data set decoded once per node (`datasets.shared_splits`)
    worker = PackWorker(loop_config["settings"], loop_config, ray.train.get_context().get_world_rank())
    try:
        return worker.run(ray.train.report)
    finally:
        worker.cleanup()


class PackWorker:
    """One Train worker's state: members, their workdirs, histories, MLflow steps and uploads."""

    def __init__(self, settings: LaunchSettings, loop_config: dict[str, Any], rank: int):
        self.settings, self.rank = settings, rank
        self.pack_id, self.tag, self.solo = loop_config["pack_id"], loop_config["tag"], loop_config["solo"]
        self.run_ids: dict[str, str] = loop_config["run_ids"]
        self.restarts_at_open: dict[str, int] = loop_config.get("restarts") or {}  # none: not started by run_trial
        self.cfgs: list[RunConfig] = loop_config["trials"]  # the launcher's, unpickled
        self.members = lifecycle.still_open(settings, self.cfgs)  # a retried worker skips closed members
        self.rows = {c.trial_id: row for c, row in self.members}  # as they were when this attempt started
        self.cfg_of = {c.trial_id: c for c, _ in self.members}
        self.root = Path(tempfile.mkdtemp(prefix=f"vitsweep-{self.pack_id}-"))
        self.workdirs = {c.trial_id: self.root / c.trial_id for c, _ in self.members}
        self.histories: dict[str, list[dict[str, Any]]] = {}
        self.epochs: dict[str, int] = {}
        self.states: dict[str, dict[str, Any]] = {}  # each resuming member's checkpoint, until its group trains
        self.uploaded: dict[str, dict[str, int]] = {t: {} for t in self.workdirs}
        self.closed: set[str] = set()
        self.faults: list[BaseException] = []
        # Steps an earlier attempt already logged: a retry restores a checkpoint from before the epoch
        # that failed after logging, and MLflow keeps every point it is sent (the first one it shows).
        self.logged = ({t: tracking.logged_steps(settings.mlflow_uri, self.run_ids[t], tracking.epoch_key("eval_acc"))
                        for t in self.workdirs} if rank == 0 else {})
        # Snapshots and checkpoints go to storage in a background thread, so the next epoch trains while
        # they upload. At most one epoch is in flight, and its errors surface at the next report; each
        # upload is atomic, so a kill mid-upload leaves the previous checkpoint to resume from.
        self.uploads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vitsweep-upload")
        self.in_flight: list[Future] = []
        self.node = this_node()
        self.restart_note: dict[str, Any] = {}  # for the launcher's console, in the first report after a restart
        self.records = EpochRecords(settings.results, settings.study, settings.mlflow_uri, self.run_ids,
                                    self.histories, self.logged)
        self.t0 = time.perf_counter()

    def restore(self) -> None:
        """Each member's stored checkpoint (its own place, or a lone trial's of an earlier version)
        into its workdir, loaded once: its epoch and history here, its state handed to the loop."""
        for trial_id, workdir in self.workdirs.items():
            uri = checkpoints.find_stored(self.settings.storage, self.settings.study, trial_id)
            local = checkpoints.local_checkpoint(workdir)
            self.epochs[trial_id], self.histories[trial_id] = 0, []
            if uri is not None and files.download(uri, local):
                self.epochs[trial_id], self.histories[trial_id], self.states[trial_id] = \
                    checkpoints.resume_point(local, name=uri)
            if self.rank == 0 and self.histories[trial_id]:  # its rows may have failed to write after its upload
                self.records.add(trial_id, self.histories[trial_id][-1])
        if self.rank == 0:
            self.mark_node()

    def mark_node(self) -> None:
        """Each member's row names the node training it now; after a restart (``record_restart`` counted
        it) the first report tells the launcher where the members resumed, and from which epoch."""
        lifecycle.record_node(self.settings, [row for row in self.rows.values() if row], self.node)
        # (restarts counted while this driver runs: a resumed launch does not announce its earlier ones)
        restarted = [(row.get("restarts") or 0, row.get("error")) for trial_id, row in self.rows.items()
                     if row and (row.get("restarts") or 0) > self.restarts_at_open.get(trial_id, 0)]
        restarts, cause = max(restarted, default=(0, None), key=lambda r: r[0])
        if restarts:
            self.restart_note = {RESTART_KEYS[0]: restarts, RESTART_KEYS[1]: cause or "",
                                 RESTART_KEYS[2]: min(self.epochs.values(), default=0), RESTART_KEYS[3]: self.node}

    def run(self, report_to_train) -> dict[str, str] | None:
        try:
            prepare_root(self.cfgs[0].dataset, self.cfgs[0].data_root)  # this node's copy; the launcher checked its own
        except DataRootError as exc:
            error = {UNRETRIABLE: f"{type(exc).__name__}: {exc}"}
            report_to_train(error)  # for Tune's result (the launcher counts the trial as failed)
            return error  # for the driver, which closes every member with it
        self.restore()
        # Members resume together only from the same epoch: they re-form by the epoch their checkpoint
        # holds (an upload cut short by a kill leaves one behind), each group trained as its own pack.
        groups: dict[int, list[RunConfig]] = {}
        for cfg, _ in self.members:
            groups.setdefault(self.epochs[cfg.trial_id], []).append(cfg)
        error = None
        for epoch in sorted(groups, reverse=True):
            cfgs = groups[epoch]
            try:
                finals = train_pack_fitting(cfgs, [self.workdirs[c.trial_id] for c in cfgs],
                                            report=lambda entries: self.report(entries, report_to_train),
                                            dropped=self.dropped,
                                            states=[self.states.pop(c.trial_id) for c in cfgs] if epoch else None)
                self.settle()  # every member's last checkpoint is on storage before any is closed as finished
            except BaseException:
                self.settle(quiet=True)
                self.records.flush(quiet=True)
                raise
            for cfg, final in zip(cfgs, finals):
                self.close(cfg, final)
                if self.solo and final.get("error"):  # deterministic: the trial fails now, not after retries
                    error = {UNRETRIABLE: f"trial {cfg.trial_id}: {final['error']}"}
        if self.faults:
            raise self.faults[0]
        if error is not None:
            report_to_train(error)
        return error

    def report(self, entries: list[tuple[str, dict[str, Any], str | None]], report_to_train) -> None:
        """Once per epoch: every member's metrics to its records (rank 0), one report to Train."""
        self.settle()
        keyed: dict[str, Any] = {"epoch": entries[0][1]["epoch"]}
        for trial_id, metrics, checkpoint_dir in entries:
            if self.rank == 0:
                self.records.add(trial_id, metrics)  # written in the background, in order
                self.in_flight.append(self.uploads.submit(self.upload, trial_id, checkpoint_dir is not None,
                                                          metrics["epoch"]))
            # A lone trial reports plain metric names (a scheduler such as ASHA reads them); a pack's
            # are keyed by member.
            keyed.update({k: v for k, v in metrics.items() if k != "epoch"} if self.solo else
                         {f"{trial_id}/{k}": v for k, v in metrics.items() if k != "epoch"})
        keyed.update(self.restart_note)
        self.restart_note = {}
        report_to_train(keyed)

    def upload(self, trial_id: str, with_checkpoint: bool, epoch: int) -> None:
        workdir = self.workdirs[trial_id]
        files.upload_new(checkpoints.local_snapshots(workdir), self.settings.snapshot_uri(trial_id),
                         self.uploaded[trial_id])
        if with_checkpoint:
            folder = self.settings.checkpoint_uri(trial_id)
            files.upload(checkpoints.local_checkpoint(workdir), checkpoints.checkpoint_file(folder))
            files.write_json(checkpoints.epoch_file(folder), {"trial_id": trial_id, "epoch": epoch})

    def settle(self, *, quiet: bool = False) -> None:
        pending, self.in_flight = self.in_flight, []
        for done in pending:
            try:
                done.result()
            except Exception:
                if not quiet:
                    raise

    def dropped(self, trial_id: str, final: dict[str, Any]) -> None:
        """A member left its pack (a non-finite loss): closed now, so no retry brings it back."""
        self.close(self.cfg_of[trial_id], final)

    def close(self, cfg: RunConfig, final: dict[str, Any]) -> None:
        trial_id = cfg.trial_id
        if self.rank != 0 or trial_id in self.closed:
            return
        self.records.flush()  # its epochs are recorded before its row says it ended (a failed write raises)
        self.closed.add(trial_id)
        error, run_id = final.get("error"), self.run_ids[trial_id]
        try:
            key = tracking.headline_key("test_acc")
            if final.get("test_acc") is not None and final["epochs_completed"] not in tracking.logged_steps(
                    self.settings.mlflow_uri, run_id, key):
                tracking.log_metrics(self.settings.mlflow_uri, run_id, {key: final["test_acc"]},
                                     step=final["epochs_completed"])
            result = lifecycle.outcome(
                self.settings, cfg, "failed" if error else "finished", self.tag, error=error,
                checkpoint_path=self.settings.checkpoint_uri(trial_id),
                started_at=self.rows[trial_id].get("started_at"),
                **{**lifecycle.carried(self.rows[trial_id]), "node": self.node},
                wall_time_s=lifecycle.prior_wall_time(self.rows[trial_id]) + time.perf_counter() - self.t0,
                **{k: final.get(k) for k in SUMMARY})
            inputs = final.get("inputs") or {}
            if inputs.get("dataset"):  # the run's input: the data set it trained on (mlflow.log_input)
                tracking.log_dataset_input(self.settings.mlflow_uri, run_id, inputs["dataset"])
            self.faults += [f for f in lifecycle.close_trial(
                self.settings.results, self.settings.study, self.settings.mlflow_uri, cfg.to_flat(), result, run_id,
                {"checkpoint_path": result["checkpoint_path"], "snapshot_dir": result["snapshot_dir"],
                 tracking.NODE_TAG: self.node,
                 **({tracking.DEVICE_TAG: inputs["device"]} if inputs.get("device") else {})}) if f is not None]
        except Exception as exc:  # noqa: BLE001 - row and run closed per member; the first fault raised at the end
            self.faults.append(exc)

    def cleanup(self) -> None:
        self.uploads.shutdown(wait=True)
        self.records.close()
        shutil.rmtree(self.root, ignore_errors=True)
