"""The launch's keeper: ``vitsweep sweep``, ``demo`` and ``analyze`` run in a child process that this
one outlives, so every exit it lives through ends with its records closed and one last line.

Ray can end a launcher without a word, past every Python handler: when the local raylet or GCS dies,
Ray's core worker exits the process from C++ (exit code 1); and a scheduler's end (SIGTERM to the
process group, SIGKILL seconds later: SLURM, Kubernetes, ``timeout``) reaches Ray's daemons at the
same moment as the launcher, so the launcher's orderly stop waits on a Ray that is gone. Either way
rows stayed ``running``, MLflow runs RUNNING, the heartbeat unstamped and the lock held. So:

- the child (the same command line, marked ``CHILD_ENV``) runs in a process group of its own, with its
  Ray: a signal to the terminal's or the scheduler's group reaches only this keeper, which forwards
  each one to the child, so the child and its Ray stop in order (``sweeps.launch.interrupt``);
- the child closes its records the moment a signal comes, then stops its trials; one that has not
  ended ``CLOSE_WITHIN_S`` after the signal is ended (its group SIGKILLed, Ray's daemons with it), and
  the keeper closes what is left (``close``) and prints the interrupted line;
- a child that ends without saying it closed its records (``NOTE_ENV``: a file it writes on the way
  out) died under Ray: the keeper closes them and prints one ``error:`` line;
- the child is told when the keeper dies (``PR_SET_PDEATHSIG``: SIGTERM), so a keeper killed by SIGKILL
  still gets its records closed by the child, which then shuts its Ray down: no Ray process is left.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from records import manifest, stores, tables, tracking
from sweeps.launch.interrupt import INTERRUPTED_EXIT, SIGNALS
from sweeps.launch.lock import remove_dead_holders_lock
from trainables.trial.lifecycle import close_unfinished

CHILD_ENV = "VITSWEEP_LAUNCH_CHILD"  # set in the child: it runs the command itself
NOTE_ENV = "VITSWEEP_LAUNCH_NOTE"  # the file the child writes its exit code to once its records are closed
# After a signal the child closes its records at once (sweeps.launch.interrupt), then stops its trials and
# Ray in order (seconds; more on a loaded machine). A child still running this long after is wedged:
# it is ended and the keeper closes what is left.
CLOSE_WITHIN_S = 30.0
POLL_S = 0.2
PR_SET_PDEATHSIG = 1


def run(argv: list[str], entry: Callable[[list[str]], int], where: Callable[[], tuple[str, str, str | None, str]]
        ) -> int:
    """``entry(argv)`` in a child process kept by this one (or here, in the child). ``where()``: (results,
    study, MLflow URI or None for the default, the next command), for the keeper's own closing."""
    if os.environ.get(CHILD_ENV):
        code = entry(argv)
        if note := os.environ.get(NOTE_ENV):
            Path(note).write_text(str(code))
        return code
    with tempfile.TemporaryDirectory(prefix="vitsweep-keeper-") as folder:
        return _keep(Path(folder) / "closed", where)


def _keep(note: Path, where) -> int:
    """Run this process's own command line again as the child (``CHILD_ENV``), and keep it."""
    env = {**os.environ, CHILD_ENV: "1", NOTE_ENV: str(note)}
    child = subprocess.Popen([sys.executable, *sys.orig_argv[1:]], env=env, process_group=0,
                             preexec_fn=_die_with_parent)
    received: list[tuple[str, float]] = []  # (signal name, when)

    def forward(signum, frame) -> None:
        received.append((signal.Signals(signum).name, time.monotonic()))
        with contextlib.suppress(ProcessLookupError):  # to the child alone: its Ray must outlive the signal
            os.kill(child.pid, signum)

    saved = {sig: signal.signal(sig, forward) for sig in SIGNALS}
    try:
        code = _wait(child, received)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    if note.exists():  # the child closed its records and said its last line
        return code
    if code is None:  # a signal, and the child did not end in time
        _kill_group(child)
        child.wait()
        return _closed(where, f"the launch was interrupted ({received[0][0]})", INTERRUPTED_EXIT,
                       lambda status, then: f"vitsweep: interrupted ({received[0][0]}); what it left open is "
                       f"closed; `{status}` shows what was left; {then}")
    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    why = (f"the launch process ended with {how} and no last word (Ray ends it so when the local raylet or GCS "
           "dies; the kernel's out-of-memory killer too)")
    return _closed(where, why, 1, lambda status, then: f"error: {why}; what it left open is closed; `{status}` "
                   f"shows what was left, the launch logs under the results folder say more; {then}")


def _wait(child: subprocess.Popen, received: list[tuple[str, float]]) -> int | None:
    """The child's exit code; None when a signal came and the child did not end within ``CLOSE_WITHIN_S``.
    (It polls: a blocking wait is resumed after the signal handler, and would not see the deadline.)"""
    while True:
        try:
            return child.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            if received and time.monotonic() - received[0][1] >= CLOSE_WITHIN_S:
                return None


def _closed(where, reason: str, code: int, line: Callable[[str, str], str]) -> int:
    """Close what the child left open (``close``), then the one last line; returns ``code``."""
    results, study, mlflow_uri, then = where()
    faults = close(results, study, mlflow_uri, reason)
    for fault in faults:
        print(f"vitsweep: {fault}", file=sys.stderr, flush=True)
    status = shlex.join(["vitsweep", "status", study, "--results", results])
    print(line(status, then), file=sys.stderr, flush=True)
    return code


def close(results: str, study: str, mlflow_uri: str | None, reason: str) -> list[str]:
    """A dead launch's records closed: its ``running`` rows failed with ``reason`` and their MLflow runs
    FAILED (``lifecycle.close_unfinished``), its heartbeat stamped ended, its lock removed. Returns one
    line per fault."""
    faults: list[str] = []
    beat = manifest.read_heartbeat(results, study)
    if beat and not beat.get("ended") and manifest.process_alive(beat)[0] is False:
        manifest.beat(results, study, ended=True, stage=beat.get("stage"), progress=beat.get("progress"),
                      outcome=reason)
    remove_dead_holders_lock(results, study)
    table = tables.read_table(results, study, "trials", ["status"])
    if table is not None and "running" in table.column("status").to_pylist():
        uri = mlflow_uri or stores.default_tracking_uri(results)
        experiment_id = tracking.experiment_id_of(uri, study)
        faults += close_unfinished(results, study, uri, experiment_id, set(), reason,
                                   tracking_down=experiment_id is None)
    return faults


def _kill_group(child: subprocess.Popen) -> None:
    """The child, its Ray daemons and workers (all in the child's process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)


def _die_with_parent() -> None:
    """In the child, before it runs: the kernel sends it SIGTERM when the keeper dies (Linux), so a
    keeper SIGKILLed ends its launch as a signal does: records closed, Ray shut down with the child."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
