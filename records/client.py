"""The MLflow client of a tracking URI, and the retries every write goes through.

SQLite allows one writer at a time: MLflow sets ``PRAGMA busy_timeout = 20000`` on each session, and
every write here is also retried on "database is locked" / OperationalError with exponential backoff
and jitter. One vitsweep call, every retry included, ends within ``RETRY_BUDGET_S`` (30 s), so an MLflow
outage is a fault the launcher reports, not a hang: MLflow's own HTTP client would retry each request 7
times with exponential backoff, up to 120 s per request, inside each of our attempts (246 s for one call
were seen). So this module sets MLflow's HTTP settings for the process (``HTTP_SETTINGS``: no retries of
its own, ``REQUEST_TIMEOUT_S`` per request; MLflow reads them at every request, and Ray workers import
this module before any MLflow call), and the loop here starts no attempt that could end past the budget.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from records.stores import TrackingError, redact, scheme, sqlite_path

# Imports inside functions: MLflow (and SQLAlchemy under it) loads on the first MLflow call, so the tables,
# `vitsweep status` and the launch's checks never pay for it.

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

RETRY_BUDGET_S = 30.0  # total time one call may take, its retries included
REQUEST_TIMEOUT_S = 10  # one HTTP request to an MLflow server: connect, and each read (MLflow wants an int)
HTTP_SETTINGS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",  # the retries are ours (with_retries), within the budget
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
}


def bound_http_requests() -> None:
    """Set MLflow's HTTP settings so that one request cannot outlast ``REQUEST_TIMEOUT_S`` (a user's
    own values would break the budget, so they are overridden; the launch log says so)."""
    for key, value in {**HTTP_SETTINGS, "MLFLOW_HTTP_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT_S)}.items():
        if os.environ.get(key, value) != value:
            _log.info("%s=%s overridden by %s: vitsweep bounds each MLflow call by its own retries",
                      key, os.environ[key], value)
        os.environ[key] = value


bound_http_requests()


@functools.lru_cache(maxsize=32)
def client(uri: str):
    """MlflowClient for ``uri``. Cheap after the first call: MLflow caches the store and
    its SQLAlchemy engine per URI, and this cache keeps the client."""
    from mlflow.tracking import MlflowClient

    if scheme(uri) != "sqlite":
        return MlflowClient(tracking_uri=uri)
    # Building the store of a new SQLite file runs MLflow's schema migrations, which are not
    # transactional: two trials starting at once on a fresh file fail with "duplicate column
    # name" or worse. A lock file beside the database serialises the first build across
    # processes (SQLite is one machine, so flock suffices); once a lock holder has finished
    # the schema, later processes only check that and build their store concurrently.
    try:
        import fcntl
    except ImportError:  # Windows: no flock; the retries in _with_retries must do
        return MlflowClient(tracking_uri=uri)
    path = sqlite_path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.init-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not _sqlite_schema_exists(path):
                return MlflowClient(tracking_uri=uri)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return MlflowClient(tracking_uri=uri)


def _sqlite_schema_exists(path: Path) -> bool:
    """Whether some process has created MLflow's tables in the SQLite file (checked
    under the init lock, so no migration is half done)."""
    if not path.exists():
        return False
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as db:
        names = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return {"alembic_version", "experiments", "runs"} <= names and db.execute(
            "SELECT count(*) FROM alembic_version").fetchone()[0] > 0


_TRANSIENT_CODES = {"TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED", "DEADLINE_EXCEEDED", "ABORTED"}
_TRANSIENT_TEXT = ("database is locked", "database table is locked", "deadlock", "api request to",
                   "connection refused", "connection reset", "timed out", "max retries exceeded",
                   "temporarily unavailable")


class StorageError(OSError):
    """A storage fault of MLflow's store in one line (``storage_fault``): a write the disk under its SQLite
    file refused (full, read-only), which no retry helps. An OSError with the errno of the disk's fault, so
    every caller that classes storage faults by errno and words (``sweeps.launch.faults.classify``) classes it.
    Its text is its one line, without OSError's ``[Errno N]`` (the line often quotes the OS's own error)."""

    def __str__(self) -> str:
        return self.strerror if self.strerror is not None else super().__str__()


# The OS's and SQLite's words for a storage fault, and the errno each stands for: pyarrow's and Ray's errors
# carry the OS's wording, not always an errno, and a remote error arrives as text.
STORAGE_WORDS = {"no space left on device": errno.ENOSPC, "read-only file system": errno.EROFS,
                 "disk quota exceeded": errno.EDQUOT, "input/output error": errno.EIO,
                 "permission denied": errno.EACCES, "operation not permitted": errno.EPERM,
                 "database or disk is full": errno.ENOSPC, "attempt to write a readonly database": errno.EROFS}


def cause_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception behind it, each once, nearest first: ``__cause__``, ``__context__`` and
    a Ray error's ``cause`` (the remote exception it wraps)."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop(0)
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, getattr(e, "cause", None)]


def storage_fault(exc: BaseException) -> tuple[str, int | None] | None:
    """(one line, errno) naming the storage fault ``exc`` is, or None when it is no storage fault: an MLflow
    call that failed for its whole retry budget (``TrackingError``: the server did not answer, or SQLite's
    database stayed locked), MLflow's store full or read-only (SQLite's words, found anywhere in the cause
    chain: MLflow's own message opens with SQLAlchemy's autoflush remark and goes on with the SQL and every
    bound parameter, so only the line that names the fault is kept), or an OSError of the storage (any but a
    missing file, which is the file's fault, not the storage's). A Ray error of a remote one is read through
    its ``cause``, else its text (the remote traceback), from the last line up."""
    chain = list(cause_chain(exc))
    for e in chain:
        if isinstance(getattr(e, "cause", None), BaseException):
            continue  # Ray's wrapper (an instance of the remote error's class too): its text is a whole traceback
        if isinstance(e, TrackingError):
            return str(e).splitlines()[0] if str(e) else "MLflow did not answer", None
        if isinstance(e, StorageError):  # already one line
            return e.strerror or str(e), e.errno
        if isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
            return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else e.errno}", e.errno
    for e in chain:
        for line in reversed(str(e).splitlines()):
            for name in ("TrackingError: ", "StorageError: "):  # ours, raised remotely: its one line as it was
                if name in line:
                    text = line.split(name, 1)[1].strip()[:400]
                    return text, None if name == "TrackingError: " else errno_of(text) or errno.EIO
            # only a full or read-only store by its words: "permission denied" in a text may be a server's 403
            if (code := errno_of(line)) in (errno.ENOSPC, errno.EROFS, errno.EDQUOT):
                return line.strip()[:400], code
    return None


def storage_exception(line: str, code: int | None) -> Exception:
    """The storage fault (``storage_fault``'s line and errno) as the exception that ends a stage in that one
    line: a TrackingError for MLflow's retry budget spent (no errno), else a StorageError with the errno."""
    return TrackingError(line) if code is None else StorageError(code, line)


def errno_of(text: str) -> int | None:
    """The errno that ``text``'s storage words (``STORAGE_WORDS``) stand for, or None."""
    low = text.lower()
    return next((code for words, code in STORAGE_WORDS.items() if words in low), None)


def _is_transient(exc: BaseException) -> bool:
    """True for errors another attempt may not hit: locks, migration races, network blips."""
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    text = str(exc).lower()
    if errno_of(text) is not None:  # another attempt hits the same full or read-only disk
        return False
    if isinstance(exc, (sqlalchemy.exc.OperationalError, sqlite3.OperationalError, ConnectionError,
                        TimeoutError)):
        return True
    if isinstance(exc, MlflowException):
        if exc.error_code in _TRANSIENT_CODES:
            return True
        # Entity errors (run exists / param changed / bad value) are final; only the
        # infrastructure wording below is retried.
        if exc.error_code in ("RESOURCE_ALREADY_EXISTS", "INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST"):
            return "database is locked" in text
    return isinstance(exc, (MlflowException, sqlalchemy.exc.SQLAlchemyError)) and any(
        s in text for s in _TRANSIENT_TEXT)


def with_retries(what: str, uri: str, fn: Callable[[Any], _T]) -> _T:
    """Run ``fn(client)`` until it succeeds, retrying transient errors with capped exponential
    backoff and full jitter (sleep ~ U(0, min(2 s, 0.05 s * 2**k))) for at most RETRY_BUDGET_S
    in all; on a server, no attempt starts that could end past it. Raises TrackingError then.

    ``fn`` must be safe to repeat: metric points carry fixed timestamps (MLflow drops exact
    duplicates), params/tags are set to the same values, runs are looked up before created.
    """
    start, cap, attempt = time.monotonic(), 0.05, 0
    # An attempt on a server can take a whole request timeout: none starts that could end past the budget.
    longest = REQUEST_TIMEOUT_S if scheme(uri) in ("http", "https") else 0.0
    while True:
        try:
            return fn(client(uri))  # inside the loop: building the store can hit a lock too
        except Exception as e:
            attempt += 1
            elapsed = time.monotonic() - start
            if not _is_transient(e):
                raise
            if elapsed + cap + longest > RETRY_BUDGET_S:
                raise TrackingError(f"{what} on MLflow {redact(uri)!r} still failing after {attempt} attempts over "
                                    f"{elapsed:.1f} s: {e.__class__.__name__}: "
                                    f"{str(e).splitlines()[0] if str(e) else ''}") from e
            _log.debug("%s on %s: transient %s, retry %d", what, redact(uri), e.__class__.__name__, attempt)
            time.sleep(random.uniform(0.0, cap))
            cap = min(2.0, cap * 2)


def to_str(value: Any) -> str:
    """MLflow params and tags are strings: lists/dicts as JSON, everything else by str()."""
    return json.dumps(value) if isinstance(value, (list, tuple, dict)) else str(value)

