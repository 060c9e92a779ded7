"""Storage faults while a sweep runs: recognised, logged, and ended in one line.

A full or read-only results disk, a truncated Tune state file, or an MLflow server that stopped
answering is no bug of the sweep: the user fixes the storage and launches again with ``--resume``. So
Ray's and Tune's own output goes to the launch's log file (``LaunchLog``), not the console, unless
``--verbose``; a storage fault, or a tracking server silent for ``RETRY_BUDGET_S``, stops the Tune
experiment at once (``FaultWatch``) instead of letting Tune retry every trial into the same wall; and
what comes out of Tune is classified (``classify``), every trial and MLflow run closed
(``trainables.trial.lifecycle.close_unfinished``), and the launch ends with ``error: storage fault: ...``
last on stderr, naming the log, exit code 1 (``StorageFault``).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import json
import logging
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

from records.client import STORAGE_WORDS, cause_chain, errno_of
from records.layout import filesystem, logs_dir, train_storage
from records.stores import TrackingError, check_http, redact, scheme

# Imports inside functions: Ray (Tune's stopper) and pyarrow's filesystems load only where a launch runs, so
# the launcher's checks import this module without them.

log = logging.getLogger("vitsweep")
STORAGE_ERRNOS = set(STORAGE_WORDS.values())
PROBE_INTERVAL_S = 5.0


class StorageFault(Exception):
    """Raised by the train stage after it closed what it could; ``lines``: one per fault."""

    def __init__(self, lines: list[str], log_path: str | None = None):
        super().__init__(lines[0] if lines else "storage fault")
        self.lines, self.log_path = lines, log_path


def classify(exc: BaseException) -> str | None:
    """One line saying which storage fault ``exc`` is, or None when it is no storage fault."""
    for e in cause_chain(exc):
        if isinstance(e, StorageFault):
            return e.lines[0]
        if isinstance(e, TrackingError):
            text = str(e).splitlines()[0] if str(e) else ""  # SQLite locked past the retry budget is no outage
            state = "database stayed locked" if "database is locked" in text.lower() else "unreachable"
            return f"MLflow {state}: {text}"
        if isinstance(e, (pickle.UnpicklingError, EOFError)):
            return f"a Tune state file is truncated ({type(e).__name__}: {str(e) or 'end of file'})"
        if isinstance(e, OSError) and (e.errno in STORAGE_ERRNOS or errno_of(str(e)) is not None):
            return f"{type(e).__name__}: {e}"
    for e in cause_chain(exc):  # Ray's errors carry the remote one's traceback as text
        why = classify_text(str(e))
        if why:
            return why
    return None


def classify_text(text: str) -> str | None:
    """The line of a remote traceback (Ray ships a worker's error as text) that names a storage fault."""
    for line in reversed((text or "").splitlines()):
        line = line.strip()
        if "TrackingError" in line:
            return "MLflow unreachable: " + line.split("TrackingError:", 1)[-1].strip()[:400]
        if errno_of(line) is not None:
            return line[:400]
    return None


# ---------------------------------------------------------------------------------------------- the log

_PRIVATE: list[str] = []  # this process's fallback log folder, made once, when a log first needs it


def private_log_folder() -> str:
    """Where this process's logs go when the results folder cannot take them: a folder of its own
    (``mkdtemp``: mode 0700, a fresh name), not a fixed name that another user could make first.
    Removed at exit when nothing was written there (a log opens at its first line), so empty ones do
    not pile up in the temp folder, one per launch."""
    if not _PRIVATE:
        _PRIVATE.append(tempfile.mkdtemp(prefix="vitsweep-logs-"))
        atexit.register(_remove_if_empty, _PRIVATE[0], os.getpid())
    return _PRIVATE[0]


def _remove_if_empty(folder: str, pid: int) -> None:
    if os.getpid() != pid:  # a forked child inherits the hook; the folder is its parent's
        return
    with contextlib.suppress(OSError):  # not empty: a log is there, and the line that named it stays true
        os.rmdir(folder)


def remove_trial_temp_folders(names) -> None:
    """Remove the local temp folders of Train runs (``vitsweep-<trial or pack id>-*``, made by each
    run's worker, ``trainables.trial.ray_trial``) that a killed or stopped worker could not remove. Call it
    while none of them runs (the launch lock is held): before a launch, and after its Tune returns."""
    for name in dict.fromkeys(names):
        pattern = f"vitsweep-{glob.escape(name)}-{'[a-z0-9_]' * 8}"  # mkdtemp's suffix: no other run's folder
        for folder in glob.glob(os.path.join(tempfile.gettempdir(), pattern)):
            shutil.rmtree(folder, ignore_errors=True)


class LaunchLog(logging.Handler):
    """The launch's log file. A write that fails (the results disk filled up) moves the log to the
    system temp folder, so the tracebacks of the fault itself are kept."""

    def __init__(self, results: str, study: str):
        super().__init__(logging.DEBUG)
        name = f"launch-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        here = [os.path.join(logs, name)] if (logs := logs_dir(results, study)) else []
        # None: the private fallback folder, made only when the results folder cannot take the log.
        self._candidates: list[str | None] = [*here, None]
        self._fallback_name = f"{study}-{name}"
        self.path: str | None = None
        self._file = None
        self._next()
        self.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))

    def _next(self) -> bool:
        while self._candidates:
            path = self._candidates.pop(0)
            with contextlib.suppress(OSError):
                path = path or os.path.join(private_log_folder(), self._fallback_name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                self._file, self.path = open(path, "a", encoding="utf-8"), path  # noqa: SIM115
                return True
        self._file = None
        return False

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record) + "\n"
        except Exception:  # noqa: BLE001 - a bad log call must not stop the sweep
            return
        while self._file is not None:
            try:
                self._file.write(text)
                self._file.flush()
                return
            except OSError:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._next()

    def write_text(self, text: str) -> None:
        self.emit(logging.LogRecord("vitsweep", logging.ERROR, __file__, 0, "%s", (text,), None))

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
        super().close()


@contextlib.contextmanager
def routed(launch_log: LaunchLog, verbose: bool) -> Iterator[None]:
    """While Tune runs: every logger's records (Ray's, Tune's, Train's, MLflow's, warnings) go to the
    launch log; unless ``verbose`` they leave the console, where only vitsweep's lines stay."""
    root = logging.getLogger()
    moved: dict[logging.Logger, list[logging.Handler]] = {}
    def console_filter(record: logging.LogRecord) -> bool:  # on the console, only vitsweep's own lines
        return record.name == "vitsweep" or record.name.startswith("vitsweep.")

    logging.captureWarnings(True)
    root.addHandler(launch_log)
    for _name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and logger.handlers and not logger.propagate:
            logger.addHandler(launch_log)  # e.g. "ray": its own console handler, not propagating
            if not verbose:
                moved[logger] = [h for h in logger.handlers if h is not launch_log]
                for h in moved[logger]:
                    logger.removeHandler(h)
    if not verbose:
        for h in root.handlers:
            if h is not launch_log:
                h.addFilter(console_filter)
    try:
        yield
    finally:
        for logger, handlers in moved.items():
            for h in handlers:
                logger.addHandler(h)
        for logger in [logging.getLogger(n) for n in logging.root.manager.loggerDict]:
            if launch_log in logger.handlers:
                logger.removeHandler(launch_log)
        for h in root.handlers:
            h.removeFilter(console_filter)
        root.removeHandler(launch_log)
        logging.captureWarnings(False)


# -------------------------------------------------------------------------------------------- the watch

class FaultWatch:
    """Storage faults seen while Tune runs. ``callback()`` reads every trial error (Tune retries a
    trial before it reports it failed: ``on_trial_recover`` sees the first attempt's); a probe thread
    asks an http(s) tracking server every ``PROBE_INTERVAL_S``; ``stopper()`` stops the whole
    experiment once any fault is seen. Tune pickles callbacks and stoppers with its state, so the
    probe's thread stays out of the pickle."""

    def __init__(self, mlflow_uri: str, budget_s: float):
        self.mlflow_uri, self.budget_s = mlflow_uri, budget_s
        self.found: list[str] = []
        self.tracking_down = False  # the probe found the server gone: the epilogue leaves MLflow alone
        # why the launch was interrupted (``sweeps.launch.interrupt``): stops Tune as a fault does
        self.interrupted = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __getstate__(self):
        return {"mlflow_uri": self.mlflow_uri, "budget_s": self.budget_s, "found": list(self.found),
                "tracking_down": self.tracking_down, "interrupted": self.interrupted}

    def __setstate__(self, state):
        self.__dict__.update(state, _stop=threading.Event(), _thread=None)

    def add(self, line: str) -> None:
        if line not in self.found:
            self.found.append(line)
            log.debug("storage fault: %s", line)

    def trial_failed(self, trial) -> None:
        text = None
        with contextlib.suppress(Exception):  # the error file itself may be what the full disk truncated
            text = trial.get_error()
        if text is None and getattr(trial, "error_file", None):
            with contextlib.suppress(OSError):
                text = open(trial.error_file, encoding="utf-8", errors="replace").read()  # noqa: SIM115
        why = classify_text(text or "")
        if why:
            self.add(f"trial {trial}: {why}")

    # -- the tracking probe --------------------------------------------------------------------------
    def __enter__(self) -> FaultWatch:
        if scheme(self.mlflow_uri) in ("http", "https"):
            self._thread = threading.Thread(target=self._probe, name="vitsweep-tracking-probe", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=PROBE_INTERVAL_S * 2)

    def _probe(self) -> None:
        down_since = None
        while not self._stop.wait(PROBE_INTERVAL_S):
            try:
                check_http(self.mlflow_uri, min(PROBE_INTERVAL_S, self.budget_s))
                down_since = None
            except Exception as exc:  # noqa: BLE001 - TrackingError, or the server answering nonsense
                now = time.monotonic()
                down_since = down_since or now - PROBE_INTERVAL_S  # it was up at the last probe
                if now - down_since >= self.budget_s:
                    self.tracking_down = True
                    self.add(f"MLflow tracking server {redact(self.mlflow_uri)!r} did not answer for "
                             f"{now - down_since:.0f} s (budget {self.budget_s:g} s): {str(exc).splitlines()[0]}")
                    return

    # -- Tune's side -----------------------------------------------------------------------------------
    def callback(self):
        from ray import tune

        watch = self

        class _Watch(tune.Callback):
            def on_trial_recover(self, iteration, trials, trial, **info):
                watch.trial_failed(trial)

            on_trial_error = on_trial_recover

        return _Watch()

    def stopper(self):
        from ray.tune.stopper import Stopper

        watch = self

        class _Stop(Stopper):
            def __call__(self, trial_id, result):
                return False

            def stop_all(self):
                return bool(watch.found or watch.interrupted)

        return _Stop()


# ------------------------------------------------------------------------------------ before a launch

TRAIN_SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train V2's list of a run's checkpoints


def set_aside_truncated_train_state(storage: str, study: str, names: list[str]) -> list[str]:
    """Ray Train restores a run (named by trial or pack id) from its checkpoint list, a JSON file
    beside the checkpoints; a full disk leaves it empty or cut, and Train then fails the trial on
    every retry (``CheckpointManagerInitializationError``). Call it while no trial runs (the launch
    lock is held): each such file is renamed aside, so the run starts over instead of failing.
    Returns one line per file set aside."""
    from pyarrow import fs as pafs

    fs, root = filesystem(train_storage(storage, study))
    paths = [f"{root}/{name}/{TRAIN_SNAPSHOT}" for name in dict.fromkeys(names)]  # (a pack of one: its trial)
    lines = []
    for info in fs.get_file_info(paths):
        if info.type != pafs.FileType.File:
            continue
        try:
            with fs.open_input_stream(info.path) as stream:
                json.loads(stream.read())
            continue
        except (ValueError, OSError) as exc:  # empty, cut, or not text
            why = f"{type(exc).__name__}: {exc}"
        aside = f"{info.path}.truncated-{time.strftime('%Y%m%d-%H%M%S')}"
        fs.move(info.path, aside)
        lines.append(f"Ray Train's checkpoint list {info.path} cannot be read ({why}), as a full disk leaves it; "
                     f"set aside as {aside}: run {info.path.rsplit('/', 2)[-2]} starts over")
    return lines


# ------------------------------------------------------------------------------------------ the epilogue

def report_storage_faults(faults: list[str], log_path: str | None = None,
                          then: str = "launch again with --resume") -> None:
    """The one line on stderr for a storage fault (each fault is in the launch log)."""
    more = f" (and {len(faults) - 1} more)" if len(faults) > 1 else ""
    where = f"; details in {log_path}" if log_path else ""
    print(f"error: storage fault: {faults[0]}{more}{where}; fix the storage, then {then}",
          file=sys.stderr, flush=True)
