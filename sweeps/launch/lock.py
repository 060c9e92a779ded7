"""One launch or analysis per (results, study) at a time: the launch lock.

Two launches of one study into one results folder both see the same trials
still to run and train each of them twice (two MLflow histories, two Train
checkpoint lists); two analyses measure the same checkpoints twice. So a
launch, and ``vitsweep analyze``, holds ``<results>/<study>/.launch.lock`` from
before Ray starts until it ends; a second launch sees it at once and is
refused with a message naming the holder (host, pid, start time) and what to
do. A lock whose holder is gone is taken over, with a note in the log:

- same host: the holder's pid no longer runs, or now belongs to another
  process (its start time, from ``/proc``, differs), or the machine rebooted
  since (another ``boot_id``);
- any host: the holder stopped renewing its lease (``heartbeat`` older than
  ``STALE_AFTER_S``; a live holder renews it every ``HEARTBEAT_S``), which
  covers a holder on another machine that cannot be asked about its pid.

How the lock file is created, per storage:

- a local folder or an NFS path (the cluster YAMLs' shared storage): an
  exclusive create (``O_CREAT | O_EXCL``), atomic on local file systems and on
  NFSv3 and later; a takeover renames the stale file to a unique name first,
  so of two launches taking over one stale lock only one wins.
- an object store (``s3://``, ``gs://``): pyarrow's file systems offer no
  conditional put (S3 ``If-None-Match``, GCS ``ifGenerationMatch``), so the
  lease object is written unconditionally and read back: a second launch
  started later is refused, but two launches started within the same moment
  can both pass. Documented limitation (docs/operations.md, "Faults, security
  and storage"); use a results folder on the head node or NFS for a strict lock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

from records.layout import filesystem, is_uri, lock_path
from records.manifest import boot_id, proc_start, process_alive

log = logging.getLogger("vitsweep")
HEARTBEAT_S = 30.0
STALE_AFTER_S = 600.0
UNREADABLE_GRACE_S = 10.0
# What a refused one runs once the holder is gone, by what it is: ``vitsweep analyze`` has no --resume
# (it continues where it stopped by itself); a launch does not re-run its finished trials with it.
AGAIN = {"launch": "launch again with --resume", "analysis": "run the same `vitsweep analyze` command again",
         "demo": "run `vitsweep demo` again"}


class LaunchLockError(ValueError):
    """Another live launch of the study holds the lock (a user error: exit code 2)."""


def _alive(holder: dict[str, Any]) -> tuple[bool, str]:
    """(alive?, why not) for the holder recorded in a lock file."""
    try:
        age = time.time() - float(holder.get("heartbeat", 0))
    except (TypeError, ValueError):
        age = float("inf")
    if holder.get("unreadable"):  # a lock being created is unreadable for a moment only
        return (age < UNREADABLE_GRACE_S), "its lock file is not readable JSON"

    alive, why = process_alive(holder)
    if alive is not None:  # on this machine: the pid tells
        return alive, why
    if age > STALE_AFTER_S:
        return False, f"its lease was last renewed {age:.0f} s ago (stale after {STALE_AFTER_S:.0f} s)"
    return True, ""


def describe(holder: dict[str, Any]) -> str:
    return (f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, "
            f"started {holder.get('started', '?')}")


@dataclass
class LaunchLock:
    """``with LaunchLock(results, study): ...`` holds the lock for the block; ``what`` holds it (a
    launch, an analysis), as a refused second one is told."""

    results: str
    study: str
    what: str = "launch"

    def __post_init__(self) -> None:
        self.uri = lock_path(self.results, self.study)
        self.token = uuid.uuid4().hex
        self.holder = {
            "token": self.token, "host": socket.gethostname(), "pid": os.getpid(),
            "proc_start": proc_start(os.getpid()), "boot_id": boot_id(),
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "heartbeat": time.time(), "study": self.study, "results": self.results, "what": self.what,
        }
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._local = not is_uri(self.uri)
        self._made_folder = False  # the study's folder was created for the lock: removed with it when empty

    def acquire(self) -> None:
        """Take the lock, or raise LaunchLockError naming its live holder."""
        for _ in range(3):  # a takeover that loses a race looks again
            if self._create():
                break
            current = self._read()
            if current is None:  # released between our create and our read
                continue
            alive, why = _alive(current)
            if alive:
                raise LaunchLockError(f"another {current.get('what', 'launch')} of study {self.study!r} into "
                                      f"{self.results} is running ({describe(current)}; lock {self.uri}): wait for "
                                      f"it to end, or stop it (on {current.get('host')}: kill {current.get('pid')}) "
                                      f"and {AGAIN.get(self.what, 'run the same command again')}")
            if self._take_over(current):
                log.warning("took over the launch lock %s from %s: %s", self.uri, describe(current), why)
                break
        else:
            raise LaunchLockError(f"could not take the launch lock {self.uri}: other launches keep taking it")
        self._thread = threading.Thread(target=self._renew, name="vitsweep-lock", daemon=True)
        self._thread.start()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            current = self._read()
            if self._ours(current):  # never remove a taker's lock
                self._remove(self.uri)
        except OSError as exc:  # harmless: the next launch sees this process is gone and takes it over
            log.warning("could not remove the launch lock %s: %s", self.uri, exc)
        if self._local:
            with contextlib.suppress(OSError):
                self._remove(self._tmp_uri())  # a renewal a full disk cut short
            if self._made_folder:  # a launch refused before it wrote anything leaves no folder
                with contextlib.suppress(OSError):  # not empty: the launch wrote its tables there
                    Path(self.uri).parent.rmdir()

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _payload(self) -> bytes:
        return json.dumps(self.holder, indent=1).encode()

    def _create(self) -> bool:
        """Atomically create the lock file; False if it exists."""
        if self._local:
            folder = Path(self.uri).parent
            if not folder.exists():
                folder.mkdir(parents=True, exist_ok=True)
                self._made_folder = True
            try:
                fd = os.open(self.uri, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as fh:
                fh.write(self._payload())
            return True
        return self._read() is None and self._put_remote()

    def _read(self) -> dict[str, Any] | None:
        try:
            if self._local:
                text = Path(self.uri).read_text()
            else:
                fs, path = filesystem(self.uri)
                with fs.open_input_stream(path) as fh:
                    text = fh.read().decode()
        except FileNotFoundError:
            return None
        try:
            holder = dict(json.loads(text))
        except ValueError:  # being written right now, or a foreign / damaged file
            holder = {"host": "?", "pid": "?", "started": "?", "unreadable": True, "heartbeat": self._mtime()}
        return {**holder, "_raw": text}

    def _take_over(self, stale: dict[str, Any]) -> bool:
        """Replace the stale lock by ours; False if another launch got there first."""
        if not self._local:
            return self._put_remote()
        moved = f"{self.uri}.stale-{self.token}"
        try:
            os.rename(self.uri, moved)  # only one of two takers renames the file away
        except FileNotFoundError:
            return False
        try:
            taken = Path(moved).read_text()
        except OSError:
            taken = None
        if taken != stale.get("_raw"):
            # A fresh lock appeared (or the holder renewed it) between our read and the rename: put it back.
            with contextlib.suppress(FileExistsError):
                os.link(moved, self.uri)
            os.unlink(moved)
            return False
        os.unlink(moved)
        return self._create()

    def _mtime(self) -> float:
        try:
            if self._local:
                return os.stat(self.uri).st_mtime
            fs, path = filesystem(self.uri)
            mtime = fs.get_file_info(path).mtime
            return mtime.timestamp() if mtime else 0.0
        except OSError:
            return 0.0

    def _write_remote(self) -> None:
        fs, path = filesystem(self.uri)
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(path) as fh:
            fh.write(self._payload())

    def _put_remote(self) -> bool:
        """Write the lease object, then read it back: whether it is ours (no conditional put: see the module doc)."""
        self._write_remote()
        return self._ours(self._read())

    def _ours(self, current: dict[str, Any] | None) -> bool:
        return current is not None and current.get("token") == self.token

    def _remove(self, uri: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            if self._local:
                os.unlink(uri)
            else:
                fs, path = filesystem(uri)
                fs.delete_file(path)

    def _renew(self) -> None:
        """Renew the lease (for takers on other hosts, which cannot check our pid)."""
        while not self._stop.wait(HEARTBEAT_S):
            self.holder["heartbeat"] = time.time()
            try:
                current = self._read()
                if not self._ours(current):
                    log.warning("the launch lock %s was taken over by %s", self.uri,
                                describe(current) if current else "nobody (it was removed)")
                    return
                if self._local:
                    tmp = self._tmp_uri()
                    try:
                        Path(tmp).write_bytes(self._payload())
                        os.replace(tmp, self.uri)
                    except OSError:
                        with contextlib.suppress(OSError):
                            self._remove(tmp)  # never leave half a lock file behind (a full disk)
                        raise
                else:
                    self._write_remote()
            except OSError as exc:  # a storage hiccup: the next renewal tries again
                log.warning("could not renew the launch lock %s: %s", self.uri, exc)

    def _tmp_uri(self) -> str:
        return f"{self.uri}.{self.token}.tmp"


def remove_dead_holders_lock(results: str, study: str) -> None:
    """Remove the lock of ``study`` when its holder ran on this machine and is gone (a launch's keeper,
    ``sweeps.launch.supervise``, closing what its dead launch left); a live holder's lock stays."""
    lock = LaunchLock(results, study)
    current = lock._read()
    if current is not None and current.get("host") == socket.gethostname() and process_alive(current)[0] is False:
        lock._remove(lock.uri)
