"""What the console shows: one vitsweep line per finished trial, an ETA, a summary last; Ray's chatter off.

    [3/60] cifar10-ape-rpt-cutmix-s2-1a2b3c4d: test 0.481 in 84 s; ETA 41 min
    [4/60] cifar10-ape-rpt-cutmix-s3-5e6f7a8b: FAILED at epoch 12 (loss is nan); ETA 40 min

A Tune trial is a pack of one or more trials; when it ends, each member's own ``trials`` row (the record
of truth) gives the line, so the numbers printed are the numbers stored, and the callback, in the
launcher, needs no worker output: by default Ray's forwarding of worker logs, Tune's tables and Ray
Data's progress blocks are off; ``--verbose`` brings them back, with Ray's log deduplication off so no
epoch line is swallowed. While trials train, ``sweeps.launch.live`` adds a throttled line per running unit.

What is left of Ray's, Tune's and MLflow's own output reaches the console by ways no logger setting
reaches (Ray's C++ core worker writes to file descriptor 2, the raylet's warnings reach the driver's
stdout through Ray's error-listener thread, libraries log with their own handlers). ``quiet_console``
catches them where they all meet, file descriptors 1 and 2 of the launcher (a pipe each, read by a
thread): a line of the shape of a Ray, Tune or MLflow line (``FOREIGN``), or another library's log
record, goes to ``<results>/<study>/logs/console-*.log``; everything else (vitsweep's lines,
tracebacks) passes. Lines known to be harmless (``EXPECTED``) are not reported as errors:

- ``core_worker.cc ... Actor with class name: 'MapWorker(MapBatches(Measurer))' ... has constructor
  arguments in the object store and max_restarts > 0``: those arguments are the measuring actors'
  settings, owned by the launcher, which lives until the analysis ends, so a restart cannot lose them.
- ``(raylet) WARNING: N PYTHON worker processes have been started ... maximum expected startup
  concurrency``: each Tune trial's driver asks for no CPU (``trainables.trial.ray_start.DRIVER_RESOURCES``,
  so drivers never hold the cores their own Train workers need): more Python workers than CPUs is
  the design, not a leak.

Any other error-level line of theirs prints one vitsweep line, once, naming the log that keeps it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from records import manifest, stores, tables, tracking
from records.layout import TABLES, is_uri, logs_dir, study_dir
from records.vocab import format_duration
from sweeps.launch import live
from sweeps.launch.faults import private_log_folder
from sweeps.launch.status import study_status
from trainables.trial.lifecycle import RESTART_KEYS

# Imports inside functions: Tune loads only in the launch that reports through it.


def configure_console(verbose: bool) -> None:
    """Set the environment for Ray's output; call before Ray is imported (it reads these once)."""
    if verbose:
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # every epoch line, not "[repeated 3x across cluster]"
    else:
        # Ray Data logs a status block every few seconds on a non-terminal stdout unless its progress
        # output is off (the analysis job prints its own line per checkpoint).
        os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
        # Tune's default output engine prints its experiment header even at verbose=0 (and ignores a
        # custom reporter); the classic engine at verbose=0 prints nothing.
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")


# The shapes of Ray's, Tune's and MLflow's console lines (after colour codes are stripped).
FOREIGN = {
    "ray core": re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ([DIWEF]) \d+ \d+\] \S+:\d+: "),
    "ray process": re.compile(r"^\((raylet|autoscaler|gcs_server|monitor|pid=\d+[^)]*|[\w.:()-]+ pid=\d+[^)]*)\) "),
    "ray": re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+:\d+ -- "),
    "mlflow": re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR|CRITICAL) (mlflow|alembic)"),
    # MLflow's client writes these to stdout itself when a run on an http(s) store ends.
    "mlflow links": re.compile(r"^\S* ?View (run \S+|experiment) at: https?://"),
    # Another library's record in the launcher's own log format (fontTools subsetting a PDF's font, ...).
    "library": re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (?!vitsweep[.:])([\w.]+): "),
    "warning": re.compile(r"^\S*(site-packages|dist-packages)/\S+\.py:\d+: \w*Warning: "),
}
# Harmless lines, suppressed (the reasons: the module docstring).
EXPECTED = (
    re.compile(r"has constructor arguments in the object store and max_restarts > 0"),
    re.compile(r"PYTHON worker processes have been started on node"),
)
_ERROR = re.compile(r"^\[[^]]* [EF] \d+ \d+\]|\b(ERROR|CRITICAL)\b|\bE\d{4} ")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def classify_line(line: str) -> str | None:
    """Which library's console line ``line`` is (a ``FOREIGN`` key), or None: a vitsweep line,
    or anything else (a traceback), which stays on the console."""
    plain = _ANSI.sub("", line)
    return next((name for name, shape in FOREIGN.items() if shape.search(plain)), None)


class _Pump:
    """One file descriptor's lines, read from a pipe in a thread: foreign ones to the log, the rest
    to where the descriptor pointed before."""

    def __init__(self, guard: QuietConsole, fd: int):
        self.guard, self.fd = guard, fd
        self.target = os.dup(fd)
        self.read, write = os.pipe()
        os.dup2(write, fd)
        os.close(write)
        self.thread = threading.Thread(target=self.run, name=f"vitsweep-console-{fd}", daemon=True)
        self.thread.start()

    def run(self) -> None:
        rest, continued = b"", False
        while True:
            try:
                chunk = os.read(self.read, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                if rest:
                    self.guard.route(self, rest.decode(errors="replace"), False)
                os.close(self.read)
                return
            *lines, rest = (rest + chunk).split(b"\n")
            for raw in lines:
                continued = self.guard.route(self, raw.decode(errors="replace") + "\n", continued)

    def restore(self) -> None:
        os.dup2(self.target, self.fd)

    def write(self, text: str) -> None:
        data = text.encode()
        while data:
            try:
                data = data[os.write(self.target, data):]
            except OSError:
                return


class QuietConsole:
    """File descriptors 1 and 2 of this process filtered (see the module docstring): a context."""

    def __init__(self, log_path: str | None):
        self.log_path = log_path
        self.log: TextIO | None = None
        self.told = False
        self.moved = 0
        self.lock = threading.Lock()
        self.pumps: list[_Pump] = []

    def __enter__(self) -> QuietConsole:
        sys.stdout.flush()
        sys.stderr.flush()
        self.pumps = [_Pump(self, 1), _Pump(self, 2)]
        return self

    def __exit__(self, *exc) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for pump in self.pumps:
            pump.restore()  # the pipe's last write end here is closed: its pump reads to the end
        for pump in self.pumps:
            # A child process (a Ray daemon started meanwhile) may hold the pipe open: its pump goes on
            # filtering in the background, and this does not wait for it.
            pump.thread.join(timeout=2.0)
        with self.lock:
            if self.log is not None:
                self.log.flush()

    def route(self, pump: _Pump, line: str, continued: bool) -> bool:
        """Forward or move one line; returns whether it was moved (an indented line after a moved
        one, e.g. a warning's source line, goes with it)."""
        kind = classify_line(line)
        if kind is None and not (continued and line[:1] in (" ", "\t") and line.strip()):
            pump.write(line)
            return False
        with self.lock:
            self.moved += 1
            if self.log is None and self.log_path:
                try:
                    os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
                    self.log = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115
                except OSError:
                    self.log_path = None
            if self.log is not None:
                with contextlib.suppress(OSError):
                    self.log.write(f"[fd {pump.fd}] {_ANSI.sub('', line)}")
                    self.log.flush()
            plain = _ANSI.sub("", line)
            if kind and not self.told and _ERROR.search(plain) and not any(e.search(plain) for e in EXPECTED):
                self.told = True
                where = self.log_path or "the launch log"
                pump.write(f"vitsweep: {kind.split()[0].capitalize()} reported an error; its lines are kept in "
                           f"{where} (the sweep goes on; a trial that fails is named on its own line)\n")
        return True


def quiet_console(results: str, study: str, verbose: bool):
    """``QuietConsole`` for a launch (its log beside the launch logs), or nothing with ``--verbose``."""
    if verbose:
        return contextlib.nullcontext()
    name = f"console-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    folder = logs_dir(results, study)
    if folder is None or not _writable(folder):
        folder, name = private_log_folder(), f"{study}-{name}"
    return QuietConsole(os.path.join(folder, name))


def _writable(folder: str) -> bool:
    """Whether ``folder`` could be created and written, without creating it: a launch refused on bad
    input must leave no results folder behind (the log opens at its first line)."""
    while not os.path.exists(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            return False
        folder = parent
    return os.path.isdir(folder) and os.access(folder, os.W_OK)


def trial_line(k: int, total: int, row: Mapping[str, Any] | None, trial_id: str) -> str:
    """The line of one ended trial, from its trials row (None: the trial left no row)."""
    head = f"[{k}/{total}] {trial_id}: "
    if row is None:
        return head + "ended without a record (see the Ray logs)"
    status = row.get("status")
    wall = row.get("wall_time_s")
    took = f" in {format_duration(wall)}" if wall is not None else ""
    if status == "finished":
        acc, split = ((row.get("test_acc"), "test") if row.get("test_acc") is not None
                      else (row.get("eval_acc"), "holdout"))
        score = f"{split} {acc:.3f}" if acc is not None else "no score"
        flag = " (did not learn)" if row.get("did_not_learn") else ""
        moved = f", after {row['restarts']} restart(s)" if row.get("restarts") else ""
        return head + score + flag + took + moved
    if status == "running":  # its driver ended but could not write its end: a storage fault, or a kill
        return head + "ended while its record still says running (see the launch log)"
    why = row.get("error") or "see its MLflow run"
    return head + f"{str(status).upper()} after {row.get('epochs_completed') or 0} epoch(s) ({why}){took}"


class TrialProgress:
    """Counts ended trials and prints their lines; ``Tune`` calls it through ``as_callback``."""

    def __init__(self, results: str, study: str, total: int, members: Mapping[str, Sequence[str]],
                 stream: TextIO | None = None, configs: Sequence[Any] = (), clock=time.time):
        self.results, self.study, self.total = results, study, total
        self.members = {k: list(v) for k, v in members.items()}  # Tune trial name -> its trial ids
        self.stream = stream  # None: sys.stdout when printing (Tune pickles its callbacks; a terminal is no pickle)
        self.start = time.monotonic()
        self.done = 0
        self.counts: Counter[str] = Counter()
        self._seen: set[str] = set()
        self._started: set[str] = set()  # Tune trials (packs, or lone trials) seen running
        self._restarts: dict[str, int] = {}  # Tune trial -> the restarts already said
        # Live lines while trials train (sweeps.launch.live), from the configs of the trials to run.
        flats = {c.trial_id: c.to_flat() for c in configs}
        plan = live.plan_units(self.members, flats) if flats else {}
        self.clock = clock
        poll_s = live.REMOTE_POLL_S if is_uri(results) else live.POLL_S
        self.live = (live.LiveProgress(plan, live.RecordReader(results, study, self.members, plan), poll_s=poll_s)
                     if plan else None)

    def _print(self, line: str) -> None:
        print(line, file=self.stream or sys.stdout, flush=True)

    def tick(self, running: Sequence[str]) -> None:
        """Tune's loop stepped (``running``: the Tune trials running now): a line for the batch that
        started since the last step, then the live lines due now."""
        batch = [name for name in running if name not in self._started]
        if batch:
            self._started.update(batch)
            self._print(self.batch_line(batch))
        if self.live is None:
            return
        for line in self.live.tick(running, self.clock()):
            self._print(line.text)
        self._report(self.live.eta_s)

    def batch_line(self, batch: Sequence[str]) -> str:
        """``[train] started 8 trial(s) in 1 pack(s): <names>; 8 of 60 started``."""
        trials = sum(len(self.members.get(name, [name])) for name in batch)
        started = sum(len(self.members.get(name, [name])) for name in self._started)
        packs = f" in {len(batch)} pack(s)" if trials > len(batch) else ""
        names = ", ".join(batch[:3]) + (f", ... ({len(batch) - 3} more)" if len(batch) > 3 else "")
        return f"[train] started {trials} trial(s){packs}: {names}; {min(started, self.total)} of {self.total} started"

    def _eta(self, left: int) -> float | None:
        """The sweep's ETA: the live one (measured rates, the slots), else the mean time per ended trial."""
        if self.live is not None and self.live.eta_s is not None:
            self.live.poll([], self.clock())  # this trial just ended: count it
            return self.live.eta_s
        return (time.monotonic() - self.start) / self.done * left if self.done else None

    def _report(self, eta: float | None) -> None:
        manifest.report_progress(self.results, self.study, done=self.done, total=self.total, unit="trials ended",
                                 eta_s=eta)

    def ended(self, name: str) -> None:
        """The Tune trial ``name`` ended (completed or errored): print one line per member."""
        for trial_id in self.members.get(name, [name]):
            if trial_id in self._seen:
                continue
            self._seen.add(trial_id)
            row = tables.read_trial(self.results, self.study, trial_id)
            self.done += 1
            status = row["status"] if row else "unrecorded"
            self.counts[status] += 1
            left = self.total - self.done
            seconds = self._eta(left) if left else None
            eta = f"; ETA {format_duration(seconds)}" if seconds is not None else ""
            self._print(trial_line(self.done, self.total, row, trial_id) + eta)
            self._report(seconds if left else 0.0)

    def restarted(self, name: str, result: Mapping[str, Any]) -> None:
        """Ray Train restarted the Tune trial ``name`` (its first report since then carries
        ``ray_trial.RESTART_KEYS``): one line naming what was lost, and where and from when it resumed."""
        count, cause, epoch, node = (result.get(k) for k in RESTART_KEYS)
        if not count or count <= self._restarts.get(name, 0):
            return
        self._restarts[name] = count
        self._print(f"[train] {self._which(name)}: {cause or 'its Train worker was lost'}; resumed from epoch "
                    f"{epoch} on node {node} (restart {count})")

    def retried(self, name: str, error: str | None) -> None:
        """Tune starts the Tune trial ``name`` again (its driver was lost with its node, or Ray Train gave
        up on it): one line with the error's last line (a traceback's is the exception)."""
        last = next((line.strip() for line in reversed((error or "").splitlines()) if line.strip()),
                    "see the launch log")
        self._print(f"[train] {self._which(name)}: failed ({last[:300]}); Tune starts it again, each member from "
                    "its last checkpoint")

    def _which(self, name: str) -> str:
        members = self.members.get(name, [name])
        return f"pack {name} ({len(members)} trials)" if len(members) > 1 else name

    def final_counts(self) -> tuple[dict[str, int], bool]:
        """(trials per status, whether from the table): the launch's trials as the trials table has
        them now (the record of truth, not what this object counted: a restored or missed callback
        cannot make it wrong); what this launch saw when the table cannot be read."""
        ids = list(dict.fromkeys([*(t for members in self.members.values() for t in members), *self._seen]))
        try:
            table = tables.read_table(self.results, self.study, "trials", ["trial_id", "status"])
            rows = {r["trial_id"]: r["status"] for r in (table.to_pylist() if table is not None else [])}
        except OSError:  # the results folder is what failed: what this launch saw is all there is
            return dict(self.counts), False
        counts = Counter(rows.get(t, "unrecorded" if t in self._seen else "not started") for t in ids)
        return dict(counts), bool(ids)

    def summary(self) -> str:
        """One line: the launch's trials by status (``final_counts``) and its time."""
        counts, ids = self.final_counts()
        ended = sum(n for s, n in counts.items() if s not in ("running", "not started"))
        parts = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        return (f"{self.study}: {ended if ids else self.done} of {self.total} trials ended in "
                f"{format_duration(time.monotonic() - self.start)} ({parts or 'none'})")

    def as_callback(self, watch=None):
        """The Tune callback; ``watch`` (a ``sweeps.launch.faults.FaultWatch``): once it saw a storage fault,
        the lines go to the launch log only (the console keeps the fault's one line)."""
        from ray import tune

        progress = self

        def ended(trial) -> None:
            if watch is not None and (watch.found or watch.interrupted):
                return
            try:
                progress.ended(str(trial))  # the custom trial name: the pack id (or trial id)
            except OSError as exc:  # the row cannot be read: the results storage failed
                if watch is not None:
                    watch.add(f"cannot read the trials row of {trial}: {exc}")

        def stepped(trials) -> None:
            if watch is not None and (watch.found or watch.interrupted):
                return
            try:
                progress.tick([str(t) for t in trials if t.status == "RUNNING"])
            except Exception:  # noqa: BLE001 - a live line must never stop the sweep (e.g. a file mid-write)
                logging.getLogger("vitsweep.progress").debug("live progress skipped", exc_info=True)

        class _Callback(tune.Callback):
            def on_step_end(self, iteration, trials, **info):
                stepped(trials)

            def on_trial_result(self, iteration, trials, trial, result, **info):
                if RESTART_KEYS[0] in result and not (watch is not None and (watch.found or watch.interrupted)):
                    progress.restarted(str(trial), result)

            def on_trial_recover(self, iteration, trials, trial, **info):
                if not (watch is not None and (watch.found or watch.interrupted)):
                    error = None
                    with contextlib.suppress(Exception):  # the error file may be what a full disk cut
                        error = trial.get_error()
                    progress.retried(str(trial), error)

            def on_trial_complete(self, iteration, trials, trial, **info):
                ended(trial)

            on_trial_error = on_trial_complete

        return _Callback()


def closing_lines(results: str, study: str, mlflow_uri: str, *, report: str | None = None) -> str:
    """Where everything is, printed last: status, tables, the report (``report``: its ``index.html``,
    None when there is none), and the MLflow runs page."""
    lines = [f"\nvitsweep {study}: results in {results}"]
    try:
        now = study_status(results, study)
    except ValueError:  # nothing recorded (e.g. a report of another folder's study)
        now = None
    if now is not None:
        planned = f" of {now['planned']} planned" if now["planned"] is not None else ""
        counts = {s: n for s, n in sorted(now["counts"].items()) if n}
        lines.append(f"  trials{planned}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    lines.append(f"  Parquet tables: {study_dir(results, study)}/{{{','.join(TABLES)}}}/")
    if report:
        lines.append(f"  report:         {report}")
    lines.append(f"  status:         {shlex.join(['vitsweep', 'status', study, '--results', results])}")
    try:
        missing = mlflow_uri.startswith("sqlite:") and not stores.sqlite_path(mlflow_uri).exists()
        experiment_id = None if missing else tracking.experiment_id_of(mlflow_uri, study)
    except Exception:  # noqa: BLE001 - the store is what failed: the closing lines still say where to look
        experiment_id = None
    lines.append("  MLflow:         " + mlflow_view(mlflow_uri, experiment_id))
    return "\n".join(lines)


def mlflow_view(mlflow_uri: str, experiment_id: str | None = None) -> str:
    """How to open the study's runs in MLflow's training layout (``?workflowType=machine_learning``:
    MLflow 3 opens its GenAI layout otherwise): the experiment's runs table; a run's charts open on
    its headline numbers (``Headline/``), then its training curves (``epochs/``). A local store needs ``mlflow ui``
    first."""
    where = (tracking.experiment_url(mlflow_uri, experiment_id) if experiment_id is not None
             else f"{tracking.ui_base(mlflow_uri)}/#/experiments (the study's experiment)")
    command = tracking.ui_command(mlflow_uri)
    return f"{command}, then {where}" if command else where


