"""The sweep manifest and heartbeat, beside a study's tables: what was planned, and whether a launcher is alive.

``<results>/<study>/sweep.json``: the plan of the latest launch (planned trial ids and their packs, the
launch command, code version, start time, host and pid). ``<results>/<study>/analysis.json``: the plan of
the latest analysis (every checkpoint it set out to measure, and those whose file is gone).
``<results>/<study>/heartbeat.json``: rewritten every ``HEARTBEAT_INTERVAL_S`` while a launcher runs, naming its
stage (``train``, ``analyze``, ``report``) and that stage's progress (``report_progress``), and stamped ``ended``
only when the process closed its records (with ``outcome``: why it ended early, e.g. interrupted); a process
that died with records open leaves it unstamped. With both, ``vitsweep status`` tells from the results folder alone
which trials are pending, which stage runs, and whether ``running`` rows are live or left behind by a
launcher that died (stale). Both are small JSON files (``records.files``), local or on object storage.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from records import files
from records.layout import study_file

MANIFEST_FILE = "sweep.json"
HEARTBEAT_FILE = "heartbeat.json"
ANALYSIS_PLAN_FILE = "analysis.json"
HEARTBEAT_INTERVAL_S = 30.0
# A launcher whose heartbeat is older than this is taken for dead (several missed beats:
# a busy driver or a slow object store may delay one).
STALE_AFTER_S = 4 * HEARTBEAT_INTERVAL_S


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def write_manifest(results: str, study: str, *, planned: Sequence[Mapping[str, Any]], command: Sequence[str],
                   code_version: str) -> dict:
    """Record a launch's plan. planned: one mapping per trial with ``trial_id`` (and ``pack`` when packed)."""
    manifest = {"study": study, "planned": [dict(p) for p in planned], "n_trials": len(planned),
                "command": " ".join(command), "code_version": code_version,
                "started_at": _now().isoformat(timespec="seconds"), "host": socket.gethostname(), "pid": os.getpid()}
    files.write_json(study_file(results, study, MANIFEST_FILE), manifest)
    return manifest


def read_manifest(results: str, study: str) -> dict | None:
    return files.read_json(study_file(results, study, MANIFEST_FILE))


def write_analysis_plan(results: str, study: str, *, checkpoints: str, eval_size: int | None,
                        planned: Sequence[tuple[str, int]], missing: Sequence[Mapping[str, Any]]) -> dict:
    """Record what the latest analysis set out to measure: every planned checkpoint (trial id, epoch),
    those of them whose file is gone (``missing``: trial_id, epoch, path), and the choices it measured
    with. ``vitsweep status`` and the report read it beside the measurements on disk."""
    plan = {"study": study, "checkpoints": checkpoints, "eval_size": eval_size or 0,
            "planned": [[str(t), int(e)] for t, e in planned], "missing": [dict(m) for m in missing],
            "written_at": _now().isoformat(timespec="seconds")}
    files.write_json(study_file(results, study, ANALYSIS_PLAN_FILE), plan)
    return plan


def read_analysis_plan(results: str, study: str) -> dict | None:
    return files.read_json(study_file(results, study, ANALYSIS_PLAN_FILE))


def read_heartbeat(results: str, study: str) -> dict | None:
    return files.read_json(study_file(results, study, HEARTBEAT_FILE))


def beat(results: str, study: str, *, ended: bool = False, stage: str | None = None,
         progress: Mapping[str, Any] | None = None, outcome: str | None = None) -> None:
    """Write the heartbeat: who beats (host, pid, its start time, the boot), ``stage`` and its
    ``progress`` ({done, total, unit, eta_s, ...}: see ``report_progress``), and with ``ended`` the
    ``outcome`` (None: the stage ran to its end)."""
    files.write_json(study_file(results, study, HEARTBEAT_FILE), {
        "time": _now().isoformat(timespec="seconds"), "host": socket.gethostname(), "pid": os.getpid(),
        "proc_start": proc_start(os.getpid()), "boot_id": boot_id(), "ended": ended,
        "stage": stage, "progress": dict(progress) if progress else None, "outcome": outcome,
    })


def proc_start(pid: int) -> str | None:
    """Start time of ``pid`` in clock ticks since boot (Linux), to tell a reused pid apart."""
    return _stat(pid, 19)


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def process_alive(record: Mapping[str, Any]) -> tuple[bool | None, str]:
    """(alive?, why not) of the process a heartbeat or lock file names (``host``, ``pid``, and
    ``proc_start``, ``boot_id`` when known); None when it runs on another machine (or this one before
    a reboot is not told apart), where only its heartbeat's age can tell."""
    if record.get("host") != socket.gethostname():
        return None, ""
    if record.get("boot_id") and record.get("boot_id") != boot_id():
        return False, "the machine rebooted since"
    try:
        pid = int(record.get("pid", -1))
    except (TypeError, ValueError):
        return None, ""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False, f"pid {pid} is no longer running"
    except PermissionError:
        pass  # runs, as another user
    except (OverflowError, ValueError):
        return False, f"pid {pid} is not a process id"
    if record.get("proc_start") and proc_start(pid) not in (None, record["proc_start"]):
        return False, f"pid {pid} now belongs to another process"
    if _stat(pid, 0) == "Z":  # killed, not yet reaped (an orphan waits for init, which in a container may be slow)
        return False, f"pid {pid} is no longer running"
    return True, ""


def _stat(pid: int, index: int) -> str | None:
    """Field ``index + 3`` of ``/proc/<pid>/stat`` (Linux; counted after the command name, which may hold
    spaces): 0 the state (``R``, ``S``, ``Z`` for a zombie, ...), 19 the start time; None when unknown."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[index]
    except (OSError, IndexError):
        return None


def heartbeat_age(heartbeat: Mapping[str, Any], *, now: datetime.datetime | None = None) -> float:
    return ((now or _now()) - datetime.datetime.fromisoformat(heartbeat["time"])).total_seconds()


def launcher_alive(heartbeat: Mapping[str, Any] | None, *, now: datetime.datetime | None = None) -> bool:
    """Whether the heartbeat says a launcher is running now: not ended, and on this machine its
    process still runs (checked, not guessed from the beat's age); on another machine, it beat
    within ``STALE_AFTER_S``."""
    if not heartbeat or heartbeat.get("ended"):
        return False
    alive, _ = process_alive(heartbeat)
    if alive is not None:
        return alive
    return heartbeat_age(heartbeat, now=now) <= STALE_AFTER_S


class _Stage:
    """The stage a live heartbeat of this process stands for, and its latest progress. The heartbeat
    thread and ``report_progress`` (the caller's thread) both write the file: one at a time."""

    def __init__(self, results: str, study: str, stage: str):
        self.results, self.study, self.stage = results, study, stage
        self.progress: dict[str, Any] | None = None
        self.outcome: str | None = None  # set by the stage when it ended early but closed its records
        self.lock = threading.Lock()
        self.written = 0.0  # time.monotonic() of the last write

    def write(self, *, ended: bool = False) -> None:
        with self.lock:
            self.written = time.monotonic()
            with contextlib.suppress(OSError):  # a storage blip must not kill the launcher
                beat(self.results, self.study, ended=ended, stage=self.stage, progress=self.progress,
                     outcome=self.outcome if ended else None)


# Stages that hold records open (a trial's row and MLflow run): only their own epilogue closes them, so
# an interrupt escaping the stage leaves them open. The others write each record whole.
OPEN_RECORDS_STAGES = ("train",)
_LIVE: dict[str, _Stage] = {}  # heartbeat path -> the stage this process beats for
PROGRESS_WRITE_S = 5.0  # report_progress writes at once, at most this often (the thread beats anyway)


@contextlib.contextmanager
def heartbeat(results: str, study: str, interval_s: float = HEARTBEAT_INTERVAL_S, *,
              stage: str = "train") -> Iterator[_Stage]:
    """Beat in a daemon thread while the block runs, naming ``stage``; stamp ``ended`` when it
    leaves normally (with the ``outcome`` the block set on what it yields), or by an interrupt
    from a stage that holds no record open; an exception leaves the beat unstamped. Inside,
    ``report_progress(results, study, ...)`` sets the stage's progress."""
    state = _Stage(results, study, stage)
    key = study_file(results, study, HEARTBEAT_FILE)
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            state.write()

    _LIVE[key] = state
    state.write()
    thread = threading.Thread(target=loop, name="vitsweep-heartbeat", daemon=True)
    thread.start()
    closed = False
    try:
        yield state
        closed = True
    except KeyboardInterrupt:
        if stage not in OPEN_RECORDS_STAGES:
            state.outcome, closed = "interrupted", True
        raise
    finally:
        stop.set()
        thread.join(timeout=5)
        if closed:
            state.write(ended=True)
        if _LIVE.get(key) is state:
            del _LIVE[key]


def report_progress(results: str, study: str, *, done: int, total: int, unit: str,
                    eta_s: float | None = None, **more: Any) -> None:
    """The progress of the stage this process beats for (``done`` of ``total`` ``unit``, an ETA in seconds or
    None): in the heartbeat file at once (the first, the last, and at most every ``PROGRESS_WRITE_S`` between)
    and with every beat. Without a live heartbeat of (results, study) in this process it does nothing."""
    state = _LIVE.get(study_file(results, study, HEARTBEAT_FILE))
    if state is None:
        return
    first = state.progress is None
    state.progress = {"done": int(done), "total": int(total), "unit": unit,
                      "eta_s": None if eta_s is None else round(float(eta_s), 1), **more}
    if first or done >= total or time.monotonic() - state.written >= PROGRESS_WRITE_S:
        state.write()
