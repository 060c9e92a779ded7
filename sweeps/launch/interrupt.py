"""Ctrl-C, SIGTERM and SIGHUP end a launch (or an analysis) the same way.

SIGTERM is what ``timeout``, systemd, SLURM preemption and ``docker stop`` send first, SIGHUP what
a closed terminal sends; a user expects either to end a launch as Ctrl-C does. Ray's own SIGTERM
handler (``sys.exit`` from wherever the main thread is) ended the launcher in an abort (exit 134)
with no record closed, so the launcher answers all three itself (``Interrupts``; ``ray.init`` keeps
it, ``trainables.trial.ray_start``):

- while Tune runs, the first signal stops every trial through the fault watch's stopper (as a
  storage fault does, ``sweeps.launch.faults.FaultWatch``), after which the launcher closes each
  unfinished trial ``failed`` with the reason, ends its MLflow run, and prints its closing lines;
- anywhere else (or at a second signal) it raises ``KeyboardInterrupt``, which the command turns
  into one line.

Either way the command exits with ``INTERRUPTED_EXIT``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator

INTERRUPTED_EXIT = 130  # the shell's code for Ctrl-C (128 + SIGINT), for every signal here
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
TUNE_SIGINT = "TUNE_DISABLE_SIGINT_HANDLER"
# A signal sent to every process of a job (SLURM's, a cgroup's) reaches the launch twice: directly and
# as its keeper's copy (sweeps.launch.supervise). The same signal again within this many seconds counts once.
ECHO_S = 1.0


class Interrupts:
    """``with Interrupts() as stop: ...``: the signal names received (``stop.received``), and, while
    ``stop.stopping(watch)`` is entered, the first one stops Tune instead of raising."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self._watch = None
        self._close = None
        self._last = 0.0  # time.monotonic() of the last signal counted
        self._saved: dict[int, object] = {}
        self._tune: str | None = None

    def __enter__(self) -> Interrupts:
        # Tune's own SIGINT handler would end the loop without telling the launcher it was interrupted.
        self._tune = os.environ.get(TUNE_SIGINT)
        os.environ[TUNE_SIGINT] = "1"
        if threading.current_thread() is threading.main_thread():  # (Python's rule for signal handlers)
            self._saved = {sig: signal.getsignal(sig) for sig in SIGNALS}
            for sig in SIGNALS:
                signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        if self._tune is None:
            os.environ.pop(TUNE_SIGINT, None)

    @property
    def reason(self) -> str:
        return f"the launch was interrupted ({self.received[0]})" if self.received else ""

    @contextlib.contextmanager
    def stopping(self, watch, close=None) -> Iterator[None]:
        """While Tune runs: the first signal sets ``watch.interrupted``, which its stopper reads, and
        runs ``close`` in a thread at once: the records are closed before the launch waits on Ray to
        stop its trials (Ray may be dying too, and a scheduler's SIGKILL follows in seconds)."""
        self._watch, self._close = watch, close
        try:
            yield
        finally:
            self._watch = self._close = None

    def _handle(self, signum: int, frame) -> None:
        name, now = signal.Signals(signum).name, time.monotonic()
        if self.received and self.received[-1] == name and now - self._last < ECHO_S:
            return  # the same signal twice at once: a scheduler's to every process, and the keeper's copy
        self._last = now
        first = not self.received
        self.received.append(name)
        if first and self._watch is not None:
            self._watch.interrupted = self.reason
            if self._close is not None:
                threading.Thread(target=self._close, name="vitsweep-close-on-signal", daemon=True).start()
            return
        raise KeyboardInterrupt(self.received[-1])
