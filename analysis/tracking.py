"""MLflow tracking: the one module in vitsweep that talks to MLflow.

Every function takes the tracking URI explicitly and builds its own
``MlflowClient(tracking_uri=uri)``; nothing here calls ``mlflow.set_tracking_uri``
or uses the fluent ``mlflow.start_run`` state, because several trials may share
one process (Ray actors, tests) and each must write to the store it was given.
Ray's ``setup_mlflow`` integration is not used: it fails inside a trial unless
the experiment already exists, and it keeps global state.

Layout in MLflow: one experiment per study, one run per trial. The run's name
is the trial id and its tag ``vitsweep.trial_id`` holds the same id, so a Ray
retry or ``--resume`` finds and continues the run instead of making a second
one. Params are the flat run config (every ``RunConfig.to_flat()`` field);
tags are study / dataset / pe / protocol / rpt / seed / code_version; metrics
are per epoch (step = epoch) and the analysis measurements (step = checkpoint
epoch); artifacts are ``config.json``, ``provenance/environment.json``,
``provenance/requirements.txt`` (+ ``provenance/git_diff.patch`` when the
tree is dirty) and figures.

Stores (``check_tracking_uri`` explains each to the user):

- ``sqlite:////abs/path/mlflow.db``: the embedded default, under the results
  folder (``default_tracking_uri``); ONE machine only (trials on other nodes
  would each write their own file at that path). SQLite allows one writer at a
  time: MLflow sets ``PRAGMA busy_timeout = 20000`` on each session, and every
  write here is also retried on "database is locked" / OperationalError with
  exponential backoff and jitter (``RETRY_BUDGET_S`` in all). The first build
  of a store on a fresh file runs MLflow's schema migrations, which are not
  transactional and break when two trials start at once; a lock file
  ``mlflow.db.init-lock`` beside the database serialises that step. Artifacts
  go to ``<db folder>/mlartifacts/<experiment>`` instead of MLflow's default
  ``./mlruns`` (relative to each process's working directory, which differs
  between Ray workers); ``mlflow ui --backend-store-uri <uri>`` serves them.
- ``http(s)://host:port``: an MLflow server (the cluster YAML starts one on the
  head node; ``start_local_server`` starts one here). Needed whenever trials run
  on more than one machine or results live on object storage. MLflow's own HTTP
  client retries 429/5xx and connection errors first (MLFLOW_HTTP_REQUEST_MAX_RETRIES,
  default 7 with exponential backoff), then the retries here apply.
- ``postgresql://``, ``mysql://``, ``mssql://``: a database directly.
- ``databricks``: accepted, not checked.
- ``file:`` / a bare path: refused. MLflow 3 puts the file store in maintenance
  mode and refuses to open it, and it was never safe for concurrent writers.

Use (launcher, then each trial)::

    uri = args.mlflow_uri or tracking.default_tracking_uri(args.results)
    tracking.check_tracking_uri(uri)                      # before any trial starts
    experiment_id = tracking.ensure_experiment(uri, study_name)
    ...                                                   # in the trial:
    flat = config.to_flat()
    with tracking.trial_run(uri, experiment_id, trial_id, params=flat,
                            tags=tracking.trial_tags(flat, code_version=version)) as run:
        run.log_provenance(flat)
        for epoch in ...:
            run.log_metrics({"train_loss": ..., "eval_acc": ...}, step=epoch)
    ...                                                   # after the sweep returns:
    tracking.end_orphaned_runs(uri, experiment_id)

Public API (``uri`` is a tracking URI, ``run_id`` an MLflow run id):

- ``default_tracking_uri(results) -> str``
- ``check_tracking_uri(uri, *, timeout_s=CONNECT_TIMEOUT_S) -> None``: raises
  ``ValueError`` (malformed or unsupported URI, unusable SQLite folder) or
  ``TrackingError`` (server or database unreachable within ``timeout_s``),
  naming the URI.
- ``ensure_experiment(uri, name, artifact_location=None) -> experiment_id``
- ``start_trial_run(uri, experiment_id, trial_id, *, params, tags=None) -> run_id``
- ``find_trial_run(uri, experiment_id, trial_id) -> run_id | None``
- ``trial_run(uri, experiment_id, trial_id, *, params, tags=None)``: context
  manager yielding a ``TrialRun``; ends FINISHED, or FAILED on an exception
  (KILLED on KeyboardInterrupt / SystemExit), and re-raises.
- ``log_metrics(uri, run_id, metrics, step)``, ``set_tags(uri, run_id, tags)``,
  ``log_artifact_dict(uri, run_id, name, obj)``,
  ``log_artifact_text(uri, run_id, name, text)``,
  ``log_artifact_file(uri, run_id, path, artifact_dir=None)``,
  ``log_measurements(uri, run_id, rows, *, per_head=False)``,
  ``log_provenance(uri, run_id, config=None) -> dict``,
  ``end_trial_run(uri, run_id, status="FINISHED")``
- ``end_orphaned_runs(uri, experiment_id, *, keep_trial_ids=()) -> list[str]``
- ``search_trial_runs(uri, experiment_name) -> pandas.DataFrame``
- ``trial_tags(config, *, code_version=None) -> dict``,
  ``measurement_metric_key(intervention, level, layer, head, metric) -> str``
- ``provenance() -> dict``, ``requirements_txt(packages=None) -> str``,
  ``code_version(path=None) -> str``
- ``start_local_server(backend_store_uri, artifacts_destination, ...) -> (uri, process)``,
  ``stop_local_server(process)``
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import getpass
import importlib.metadata
import json
import logging
import math
import os
import platform
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

TRIAL_ID_TAG = "vitsweep.trial_id"
ATTEMPT_TAG = "vitsweep.attempt"  # 1 for a fresh run, +1 every time a retry/resume continues it
ERROR_TAG = "vitsweep.error"  # why the run ended FAILED/KILLED; cleared when it is continued
TRIAL_TAG_FIELDS = ("study", "dataset", "pe", "protocol", "rpt", "seed")
END_STATUSES = ("FINISHED", "FAILED", "KILLED")
VALID_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")
SQL_DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")

RETRY_BUDGET_S = 30.0  # total time one write may spend retrying transient errors
CONNECT_TIMEOUT_S = 5.0  # check_tracking_uri: how long an unreachable server may take to fail
# MLflow's per-request batch limits (mlflow.utils.validation); larger inputs are chunked.
_MAX_METRICS_PER_BATCH = 1000
_MAX_PARAMS_TAGS_PER_BATCH = 100
_REMOTE_HINT = (
    "an MLflow server, e.g. --mlflow-uri http://<head-node>:5000 (the cluster YAMLs start one "
    "on the head node; `mlflow server --backend-store-uri sqlite:////abs/mlflow.db "
    "--artifacts-destination <dir or s3://...> --workers 1` starts one by hand)"
)


class TrackingError(RuntimeError):
    """MLflow could not be reached, or a write kept failing after all retries."""


# ----------------------------------------------------------------------------------- URIs


def default_tracking_uri(results: str | os.PathLike) -> str:
    """``sqlite:////<abs results>/mlflow.db`` for a local results folder.

    Raises ValueError for a remote results URI (s3://, gs://, ...): a SQLite file
    cannot live on object storage, so ``--mlflow-uri`` must name a server there.
    """
    text = os.fspath(results)
    scheme = urllib.parse.urlparse(text).scheme
    if scheme == "file":
        text = urllib.parse.unquote(urllib.parse.urlparse(text).path)
    elif scheme:
        raise ValueError(
            f"--results {text!r} is on {scheme}:// storage, where a SQLite tracking file cannot "
            f"live (object stores have no file locking or in-place writes); pass --mlflow-uri "
            f"with {_REMOTE_HINT}."
        )
    path = Path(text).expanduser().resolve() / "mlflow.db"
    return f"sqlite:///{path.as_posix()}"


def _scheme(uri: str) -> str:
    """'postgresql+psycopg2://...' -> 'postgresql'; '/a/b' -> ''."""
    if uri == "databricks" or uri.startswith("databricks://"):
        return "databricks"
    return urllib.parse.urlparse(uri).scheme.split("+", 1)[0].lower()


def _redact(uri: str) -> str:
    """The URI with any password replaced by ***, for error messages and logs."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _sqlite_path(uri: str) -> Path:
    """The database file of a ``sqlite:///`` URI (query string dropped)."""
    return Path(urllib.parse.unquote(uri[len("sqlite:///") :].split("?", 1)[0]))


def check_tracking_uri(uri: str, *, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast, before any trial starts, if ``uri`` cannot be used.

    ValueError: empty, unknown scheme (lists the valid ones), file store, in-memory
    or relative SQLite path, SQLite folder not creatable/writable, not a SQLite file,
    missing database driver. TrackingError: an http(s) server or a database that
    does not answer within ``timeout_s``, or refuses the credentials.
    Creates the SQLite folder; does not create the database itself.
    """
    if not uri or not uri.strip():
        raise ValueError(f"empty MLflow tracking URI; valid schemes: {', '.join(VALID_SCHEMES)}")
    scheme = _scheme(uri)
    shown = _redact(uri)
    if scheme in ("", "file"):
        raise ValueError(
            f"MLflow tracking URI {shown!r} names the file store, which MLflow 3 keeps in "
            f"maintenance mode and refuses to open (and which concurrent trials corrupt). Use "
            f"sqlite:////<abs folder>/mlflow.db on one machine, or {_REMOTE_HINT}."
        )
    if scheme not in VALID_SCHEMES:
        raise ValueError(
            f"MLflow tracking URI {shown!r} has unknown scheme {scheme!r}; valid schemes: "
            f"{', '.join(VALID_SCHEMES)} (e.g. sqlite:////abs/results/mlflow.db, "
            f"http://127.0.0.1:5000)."
        )
    if scheme == "sqlite":
        _check_sqlite(uri)
    elif scheme in ("http", "https"):
        _check_http(uri, timeout_s)
    elif scheme in SQL_DATABASE_SCHEMES:
        _check_database(uri, timeout_s)
    # databricks: credentials come from the Databricks config; nothing cheap to check.


def _check_sqlite(uri: str) -> None:
    if not uri.startswith("sqlite:///") or uri[len("sqlite:///") :] in ("", ":memory:"):
        raise ValueError(
            f"MLflow tracking URI {uri!r} is an in-memory SQLite database, which each trial "
            f"process would see empty; use sqlite:////<abs folder>/mlflow.db."
        )
    path = _sqlite_path(uri)
    if not path.is_absolute():
        raise ValueError(
            f"MLflow tracking URI {uri!r} has a relative SQLite path, which each Ray worker "
            f"resolves against its own working directory; use four slashes and an absolute "
            f"path: sqlite:///{Path(path).resolve().as_posix()}"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(
            f"MLflow tracking URI {uri!r}: cannot create the folder {str(path.parent)!r} for the "
            f"SQLite file ({e.strerror or e})."
        ) from e
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise ValueError(f"MLflow tracking URI {uri!r}: folder {str(path.parent)!r} is not writable.")
    if path.is_dir():
        raise ValueError(f"MLflow tracking URI {uri!r} names a folder, not a SQLite file.")
    if path.exists() and path.stat().st_size > 0:
        with open(path, "rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                raise ValueError(f"MLflow tracking URI {uri!r}: {str(path)!r} is not a SQLite database.")


def _host_creds(uri: str):
    """Host + credentials the way MLflow's own REST client builds them (auth env vars, TLS)."""
    try:  # private module, stable since MLflow 1.x; fall back to no auth if it moves
        from mlflow.tracking._tracking_service.utils import get_default_host_creds

        return get_default_host_creds(uri)
    except ImportError:
        from mlflow.utils.rest_utils import MlflowHostCreds

        return MlflowHostCreds(uri)


def _check_http(uri: str, timeout_s: float) -> None:
    from mlflow.utils.rest_utils import http_request

    # A real API call rather than /health: it proves the thing listening is MLflow and that
    # the credentials work. No retries: an unreachable server must fail in seconds, not the
    # minutes MLflow's client backoff would take.
    endpoint = "/api/2.0/mlflow/experiments/search"
    try:
        response = http_request(
            _host_creds(uri), endpoint, "POST", max_retries=0, backoff_factor=0,
            timeout=timeout_s, raise_on_status=False, json={"max_results": 1},
        )
    except Exception as e:  # MlflowException wrapping ConnectionError / Timeout
        raise TrackingError(
            f"MLflow tracking server {_redact(uri)!r} is not reachable within "
            f"{timeout_s:g} s ({e}). Start it, or pass another --mlflow-uri; "
            f"{_REMOTE_HINT}."
        ) from e
    if response.status_code == 403 and "Invalid Host header" in response.text:
        host = urllib.parse.urlsplit(uri).netloc.rsplit("@", 1)[-1]
        raise TrackingError(
            f"MLflow tracking server {_redact(uri)!r} rejects the Host header {host!r}: MLflow 3 "
            f"serves only localhost and private IPs by default (its /health answers anyway). "
            f"Start the server with --allowed-hosts {host.split(':')[0]!r} (start_local_server("
            f"allowed_hosts=...)), or reach it by its private IP."
        )
    if response.status_code in (401, 403):
        raise TrackingError(
            f"MLflow tracking server {_redact(uri)!r} refused the credentials (HTTP "
            f"{response.status_code}); set MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD or "
            f"MLFLOW_TRACKING_TOKEN."
        )
    if response.status_code != 200:
        raise TrackingError(
            f"{_redact(uri)!r} answered HTTP {response.status_code} to {endpoint}; is it an MLflow "
            f"tracking server (right host, port and path prefix)? Body: {response.text[:200]!r}"
        )


def _check_database(uri: str, timeout_s: float) -> None:
    import sqlalchemy

    connect_args = {} if _scheme(uri) == "mssql" else {"connect_timeout": max(1, round(timeout_s))}
    try:
        engine = sqlalchemy.create_engine(uri, connect_args=connect_args)
    except ModuleNotFoundError as e:
        raise ValueError(
            f"MLflow tracking URI {_redact(uri)!r} needs the Python module {e.name!r} (its database "
            f"driver); install it, e.g. psycopg[binary] for postgresql://, pymysql for "
            f"mysql+pymysql://."
        ) from e
    try:
        with engine.connect():
            pass
    except sqlalchemy.exc.SQLAlchemyError as e:
        raise TrackingError(
            f"MLflow tracking database {_redact(uri)!r} is not reachable: {e.__class__.__name__}: "
            f"{str(e).splitlines()[0]}"
        ) from e
    finally:
        engine.dispose()


# ------------------------------------------------------------------------ client + retries


@functools.lru_cache(maxsize=32)
def _client(uri: str):
    """MlflowClient for ``uri``. Cheap after the first call: MLflow caches the store and
    its SQLAlchemy engine per URI, and this cache keeps the client."""
    from mlflow.tracking import MlflowClient

    if _scheme(uri) != "sqlite":
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
    path = _sqlite_path(uri)
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
_TRANSIENT_TEXT = (
    "database is locked", "database table is locked", "deadlock", "api request to",
    "connection refused", "connection reset", "timed out", "max retries exceeded",
    "temporarily unavailable",
)


def _is_transient(exc: BaseException) -> bool:
    """True for errors another attempt may not hit: locks, migration races, network blips."""
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    if isinstance(exc, (sqlalchemy.exc.OperationalError, sqlite3.OperationalError, ConnectionError,
                        TimeoutError)):
        return True
    text = str(exc).lower()
    if isinstance(exc, MlflowException):
        if exc.error_code in _TRANSIENT_CODES:
            return True
        # Entity errors (run exists / param changed / bad value) are final; only the
        # infrastructure wording below is retried.
        if exc.error_code in ("RESOURCE_ALREADY_EXISTS", "INVALID_PARAMETER_VALUE",
                              "RESOURCE_DOES_NOT_EXIST"):
            return "database is locked" in text
    return isinstance(exc, (MlflowException, sqlalchemy.exc.SQLAlchemyError)) and any(
        s in text for s in _TRANSIENT_TEXT
    )


def _with_retries(what: str, uri: str, fn: Callable[[Any], _T]) -> _T:
    """Run ``fn(client)`` until it succeeds, retrying transient errors with capped exponential
    backoff and full jitter (sleep ~ U(0, min(2 s, 0.05 s * 2**k))) for at most RETRY_BUDGET_S.

    ``fn`` must be safe to repeat: metric points carry fixed timestamps (MLflow drops exact
    duplicates), params/tags are set to the same values, runs are looked up before created.
    """
    start = time.monotonic()
    cap = 0.05
    attempt = 0
    while True:
        try:
            return fn(_client(uri))  # inside the loop: building the store can hit a lock too
        except Exception as e:
            attempt += 1
            elapsed = time.monotonic() - start
            if not _is_transient(e):
                raise
            if elapsed + cap > RETRY_BUDGET_S:
                raise TrackingError(
                    f"{what} on MLflow {_redact(uri)!r} still failing after {attempt} attempts over "
                    f"{elapsed:.1f} s: {e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                ) from e
            _log.debug("%s on %s: transient %s, retry %d", what, _redact(uri), e.__class__.__name__, attempt)
            time.sleep(random.uniform(0.0, cap))
            cap = min(2.0, cap * 2)


def _chunks(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _to_str(value: Any) -> str:
    """MLflow params and tags are strings: lists/dicts as JSON, everything else by str()."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return str(value)


# ---------------------------------------------------------------------------- experiments


def _default_artifact_location(uri: str, name: str) -> str | None:
    """Artifacts of a SQLite store live next to the database; servers choose their own."""
    if _scheme(uri) != "sqlite":
        return None
    folder = _sqlite_path(uri).parent / "mlartifacts" / urllib.parse.quote(name, safe="")
    return folder.as_uri()


def ensure_experiment(uri: str, name: str, artifact_location: str | None = None) -> str:
    """The id of experiment ``name``, created if missing (idempotent, race-safe).

    Two processes creating it at once both get the same id: the loser of the race
    sees RESOURCE_ALREADY_EXISTS and reads the winner's. ``artifact_location``
    defaults to ``<db folder>/mlartifacts/<name>`` for SQLite and to the server's
    choice otherwise; it is ignored when the experiment already exists. Raises
    ValueError if the experiment exists but was deleted (restore or purge it).
    """
    from mlflow.exceptions import MlflowException

    if not name:
        raise ValueError("empty MLflow experiment name")
    location = artifact_location or _default_artifact_location(uri, name)

    def get_or_create(client) -> str:
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            try:
                return client.create_experiment(name, artifact_location=location)
            except MlflowException as e:
                if e.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
                experiment = client.get_experiment_by_name(name)
                if experiment is None:
                    raise
        if experiment.lifecycle_stage != "active":
            raise ValueError(
                f"MLflow experiment {name!r} (id {experiment.experiment_id}) on {_redact(uri)!r} is "
                f"deleted; restore it (`mlflow experiments restore --experiment-id "
                f"{experiment.experiment_id}`) or purge it (`mlflow gc --experiment-ids "
                f"{experiment.experiment_id}`) before logging to that name."
            )
        return experiment.experiment_id

    return _with_retries(f"ensure_experiment({name!r})", uri, get_or_create)


# -------------------------------------------------------------------------------- runs


def _check_trial_id(trial_id: str) -> None:
    # The id goes into a search filter string; quotes and backslashes would need escaping
    # that MLflow's filter grammar does not document.
    if not trial_id or any(c in trial_id for c in "'\"`\\\n"):
        raise ValueError(f"trial id {trial_id!r} must be non-empty without quotes or backslashes")


def _search_all(client, experiment_id: str, filter_string: str, order_by=None) -> list:
    runs, token = [], None
    while True:
        page = client.search_runs(
            [experiment_id], filter_string=filter_string, max_results=1000,
            order_by=order_by, page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _find_trial_run(client, experiment_id: str, trial_id: str):
    runs = _search_all(client, experiment_id, f"tags.`{TRIAL_ID_TAG}` = '{trial_id}'",
                       order_by=["attributes.start_time ASC"])
    if len(runs) > 1:
        _log.warning("trial %s has %d MLflow runs; using the oldest, %s",
                     trial_id, len(runs), runs[0].info.run_id)
    return runs[0] if runs else None


def find_trial_run(uri: str, experiment_id: str, trial_id: str) -> str | None:
    """The run id of ``trial_id`` in the experiment (the oldest, should a race have made
    two), or None. Deleted runs are not found."""
    _check_trial_id(trial_id)
    run = _with_retries(f"find_trial_run({trial_id!r})", uri,
                        lambda c: _find_trial_run(c, experiment_id, trial_id))
    return run.info.run_id if run else None


def start_trial_run(
    uri: str,
    experiment_id: str,
    trial_id: str,
    *,
    params: Mapping[str, Any],
    tags: Mapping[str, Any] | None = None,
) -> str:
    """Create the run of ``trial_id`` (run name = trial id), or continue it if it exists.

    Continuing sets the status back to RUNNING, bumps ``vitsweep.attempt`` and clears
    ``vitsweep.error``.
    ``params`` (the flat run config) are logged as MLflow params; those already on
    the run with the same value are skipped. MLflow params are immutable, so a
    param whose value differs from the run's (a config changed between attempts)
    keeps its first value and the new one is recorded as tag
    ``vitsweep.changed_param.<key>`` with a warning, instead of failing the trial.
    ``tags`` (see ``trial_tags``) are set, overwriting earlier values.
    Returns the run id.
    """
    from mlflow.entities import Param, RunTag

    _check_trial_id(trial_id)
    wanted = {str(k): _to_str(v) for k, v in params.items()}

    def find_or_create(client):
        # Looked up again on every attempt, so a create that committed but reported an
        # error (an HTTP timeout) is found instead of duplicated.
        run = _find_trial_run(client, experiment_id, trial_id)
        if run is None:
            run = client.create_run(
                experiment_id, run_name=trial_id, tags={TRIAL_ID_TAG: trial_id, ATTEMPT_TAG: "1"}
            )
            return run, True
        return run, False

    run, created = _with_retries(f"start_trial_run({trial_id!r})", uri, find_or_create)
    run_id = run.info.run_id
    new_tags = {str(k): _to_str(v) for k, v in (tags or {}).items()}
    if not created:
        attempt = int(run.data.tags.get(ATTEMPT_TAG, "1")) + 1
        new_tags[ATTEMPT_TAG] = str(attempt)
        _with_retries(f"resume run {run_id}", uri, lambda c: c.update_run(run_id, status="RUNNING"))
        if ERROR_TAG in run.data.tags:  # the earlier attempt's error no longer describes the run
            _with_retries("clear error tag", uri, lambda c: c.delete_tag(run_id, ERROR_TAG))
        _log.info("continuing MLflow run %s of trial %s (attempt %d)", run_id, trial_id, attempt)
    existing = run.data.params
    missing = [Param(k, v) for k, v in wanted.items() if k not in existing]
    for key in sorted(k for k in wanted if k in existing and existing[k] != wanted[k]):
        _log.warning("trial %s: param %r was %r and is now %r; MLflow params are immutable, "
                     "keeping the first and tagging the new value", trial_id, key, existing[key], wanted[key])
        new_tags[f"vitsweep.changed_param.{key}"] = wanted[key]
    for batch in _chunks(missing, _MAX_PARAMS_TAGS_PER_BATCH):
        _with_retries("log params", uri, lambda c, b=batch: c.log_batch(run_id, params=b, synchronous=True))
    tag_list = [RunTag(k, v) for k, v in new_tags.items()]
    for batch in _chunks(tag_list, _MAX_PARAMS_TAGS_PER_BATCH):
        _with_retries("set tags", uri, lambda c, b=batch: c.log_batch(run_id, tags=b, synchronous=True))
    return run_id


def log_metrics(uri: str, run_id: str, metrics: Mapping[str, Any], step: int,
                *, timestamp_ms: int | None = None) -> None:
    """Log ``{key: number}`` at ``step`` in batches (log_batch). None values are skipped
    so optional metrics can be passed as they are; NaN/inf are kept (MLflow stores them).
    Raises ValueError naming a key whose value is not a number."""
    from mlflow.entities import Metric

    timestamp = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
    points = []
    for key, value in metrics.items():
        if value is None:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"metric {key!r} has non-numeric value {value!r}") from None
        # Fixed timestamp per point: a retried batch repeats exact duplicates, which MLflow drops.
        points.append(Metric(str(key), number, timestamp, int(step)))
    for batch in _chunks(points, _MAX_METRICS_PER_BATCH):
        _with_retries(f"log_metrics(step={step})", uri,
                      lambda c, b=batch: c.log_batch(run_id, metrics=b, synchronous=True))


def set_tags(uri: str, run_id: str, tags: Mapping[str, Any]) -> None:
    """Set run tags (overwrites earlier values)."""
    from mlflow.entities import RunTag

    tag_list = [RunTag(str(k), _to_str(v)) for k, v in tags.items()]
    for batch in _chunks(tag_list, _MAX_PARAMS_TAGS_PER_BATCH):
        _with_retries("set_tags", uri, lambda c, b=batch: c.log_batch(run_id, tags=b, synchronous=True))


def log_artifact_text(uri: str, run_id: str, name: str, text: str) -> None:
    """Write ``text`` to artifact path ``name`` (e.g. 'provenance/requirements.txt')."""
    _with_retries(f"log artifact {name}", uri, lambda c: c.log_text(run_id, text, name))


def log_artifact_dict(uri: str, run_id: str, name: str, obj: Any) -> None:
    """Write ``obj`` as indented JSON to artifact path ``name`` (e.g. 'config.json');
    values JSON cannot hold are written with ``str``."""
    log_artifact_text(uri, run_id, name, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def log_artifact_file(uri: str, run_id: str, path: str | os.PathLike,
                      artifact_dir: str | None = None) -> None:
    """Upload a local file (a figure, a table) under ``artifact_dir`` (e.g. 'figures')."""
    if not Path(path).is_file():
        raise ValueError(f"artifact file {os.fspath(path)!r} does not exist")
    _with_retries(f"log artifact {os.fspath(path)}", uri,
                  lambda c: c.log_artifact(run_id, os.fspath(path), artifact_dir))


def end_trial_run(uri: str, run_id: str, status: str = "FINISHED") -> None:
    """Mark the run ended with ``status`` in FINISHED, FAILED, KILLED."""
    if status not in END_STATUSES:
        raise ValueError(f"run end status {status!r} is not one of {', '.join(END_STATUSES)}")
    _with_retries(f"end run {run_id}", uri, lambda c: c.set_terminated(run_id, status=status))


@dataclasses.dataclass(frozen=True)
class TrialRun:
    """Handle on one trial's run: the module functions with uri and run_id bound.
    Plain data, so it pickles into Ray tasks."""

    uri: str
    experiment_id: str
    trial_id: str
    run_id: str

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        log_metrics(self.uri, self.run_id, metrics, step)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        set_tags(self.uri, self.run_id, tags)

    def log_artifact_dict(self, name: str, obj: Any) -> None:
        log_artifact_dict(self.uri, self.run_id, name, obj)

    def log_artifact_text(self, name: str, text: str) -> None:
        log_artifact_text(self.uri, self.run_id, name, text)

    def log_artifact_file(self, path: str | os.PathLike, artifact_dir: str | None = None) -> None:
        log_artifact_file(self.uri, self.run_id, path, artifact_dir)

    def log_measurements(self, rows, *, per_head: bool = False) -> int:
        return log_measurements(self.uri, self.run_id, rows, per_head=per_head)

    def log_provenance(self, config: Mapping[str, Any] | None = None) -> dict:
        return log_provenance(self.uri, self.run_id, config)

    def end(self, status: str = "FINISHED") -> None:
        end_trial_run(self.uri, self.run_id, status)


@contextlib.contextmanager
def trial_run(
    uri: str,
    experiment_id: str,
    trial_id: str,
    *,
    params: Mapping[str, Any],
    tags: Mapping[str, Any] | None = None,
) -> Iterator[TrialRun]:
    """``start_trial_run`` as a context manager: the run ends FINISHED when the block
    completes, FAILED when it raises an Exception (its type and message go to tag
    ``vitsweep.error``), KILLED on KeyboardInterrupt/SystemExit; the exception is
    re-raised. A process killed outright (SIGKILL, node loss) cannot do this:
    ``end_orphaned_runs`` cleans those up afterwards."""
    run = TrialRun(uri, experiment_id, trial_id,
                   start_trial_run(uri, experiment_id, trial_id, params=params, tags=tags))
    try:
        yield run
    except BaseException as e:
        status = "FAILED" if isinstance(e, Exception) else "KILLED"
        try:
            set_tags(uri, run.run_id, {ERROR_TAG: f"{type(e).__name__}: {e}"[:4000]})
            end_trial_run(uri, run.run_id, status)
        except Exception:  # never hide the trial's own error behind a tracking error
            _log.exception("could not mark MLflow run %s of trial %s %s", run.run_id, trial_id, status)
        raise
    end_trial_run(uri, run.run_id, "FINISHED")


def end_orphaned_runs(uri: str, experiment_id: str, *, keep_trial_ids: Iterable[str] = ()) -> list[str]:
    """Mark FAILED every RUNNING run of the experiment whose trial is not in
    ``keep_trial_ids``: runs whose process died without ending them (SIGKILL, OOM,
    lost node). Call it when no trial of the experiment is running except those kept,
    e.g. after the sweep returns. Returns the trial ids (or run ids) it ended."""
    keep = set(keep_trial_ids)
    runs = _with_retries("search RUNNING runs", uri,
                         lambda c: _search_all(c, experiment_id, "attributes.status = 'RUNNING'"))
    ended = []
    for run in runs:
        trial_id = run.data.tags.get(TRIAL_ID_TAG, run.info.run_id)
        if trial_id in keep:
            continue
        set_tags(uri, run.info.run_id, {ERROR_TAG: "orphaned: its process ended without ending the run"})
        end_trial_run(uri, run.info.run_id, "FAILED")
        ended.append(trial_id)
    return ended


def search_trial_runs(uri: str, experiment_name: str):
    """All live runs of an experiment as a pandas DataFrame, one row per run, like
    ``mlflow.search_runs`` but with an explicit URI: run_id, run_name, trial_id,
    experiment_id, status, start_time, end_time (UTC timestamps), artifact_uri,
    then ``metrics.<key>`` (latest value), ``params.<key>``, ``tags.<key>``.
    Raises ValueError if the experiment does not exist, listing those that do."""
    import pandas as pd

    experiment = _with_retries("get experiment", uri, lambda c: c.get_experiment_by_name(experiment_name))
    if experiment is None:
        experiments = _with_retries("list experiments", uri, lambda c: c.search_experiments())
        names = sorted(e.name for e in experiments)
        raise ValueError(f"no MLflow experiment {experiment_name!r} on {_redact(uri)!r}; "
                         f"experiments: {', '.join(names) or '(none)'}")
    runs = _with_retries("search runs", uri,
                         lambda c: _search_all(c, experiment.experiment_id, "",
                                             order_by=["attributes.start_time ASC"]))
    rows = []
    for run in runs:
        info, data = run.info, run.data
        row = {
            "run_id": info.run_id, "run_name": info.run_name,
            "trial_id": data.tags.get(TRIAL_ID_TAG), "experiment_id": info.experiment_id,
            "status": info.status,
            "start_time": pd.to_datetime(info.start_time, unit="ms", utc=True),
            "end_time": pd.to_datetime(info.end_time, unit="ms", utc=True) if info.end_time else pd.NaT,
            "artifact_uri": info.artifact_uri,
        }
        row.update({f"metrics.{k}": v for k, v in data.metrics.items()})
        row.update({f"params.{k}": v for k, v in data.params.items()})
        row.update({f"tags.{k}": v for k, v in data.tags.items()})
        rows.append(row)
    base = ["run_id", "run_name", "trial_id", "experiment_id", "status", "start_time", "end_time",
            "artifact_uri"]
    return pd.DataFrame(rows, columns=None if rows else base)


# --------------------------------------------------------------- tags and measurement keys


def trial_tags(config: Mapping[str, Any], *, code_version: str | None = None) -> dict[str, str]:
    """The run tags the MLflow UI filters on, taken from the flat run config:
    study, dataset, pe, protocol, rpt, seed (those present), plus code_version."""
    tags = {k: _to_str(config[k]) for k in TRIAL_TAG_FIELDS if k in config}
    if code_version is not None:
        tags["code_version"] = code_version
    return tags


def measurement_metric_key(intervention: str, level: float | None, layer: int, head: int, metric: str) -> str:
    """MLflow metric key of one measurements row, grouped in the UI by intervention:
    ('clean', None, -1, -1, 'acc') -> 'clean/acc'; ('jpeg', 5.0, -1, -1, 'fs') -> 'jpeg_5/fs';
    ('clean', None, 3, 2, 'mad') -> 'clean/mad/layer3/head2'; ('pe_scale', 0.5, 1, -1, 'ssdc')
    -> 'pe_scale_0.5/ssdc/layer1'."""
    group = intervention
    if level is not None and not (isinstance(level, float) and math.isnan(level)):
        group += f"_{float(level):g}"
    key = f"{group}/{metric}"
    if layer is not None and layer >= 0:
        key += f"/layer{int(layer)}"
    if head is not None and head >= 0:
        key += f"/head{int(head)}"
    return key


def log_measurements(uri: str, run_id: str, rows, *, per_head: bool = False) -> int:
    """Log measurements rows (schema ``measurements``: a pandas DataFrame, a pyarrow
    Table or an iterable of dicts) as metrics with step = checkpoint_epoch and keys
    from ``measurement_metric_key``. The run may have ended already (the analysis
    job runs after training and finds it with ``find_trial_run``). Per-head rows
    (head >= 0, hundreds per checkpoint) are skipped unless ``per_head``: they stay
    in Parquet, where they are queryable, and out of the MLflow runs table.
    Returns the number of points logged."""
    if hasattr(rows, "to_pylist"):  # pyarrow Table
        rows = rows.to_pylist()
    elif hasattr(rows, "to_dict"):  # pandas DataFrame
        rows = rows.to_dict("records")
    by_step: dict[int, dict[str, float]] = {}
    for row in rows:
        head = row.get("head", -1)
        if head is not None and head >= 0 and not per_head:
            continue
        key = measurement_metric_key(row["intervention"], row.get("level"), row.get("layer", -1), head,
                                     row["metric"])
        by_step.setdefault(int(row["checkpoint_epoch"]), {})[key] = row["value"]
    for step, metrics in sorted(by_step.items()):
        log_metrics(uri, run_id, metrics, step)
    return sum(len(m) for m in by_step.values())


# ----------------------------------------------------------------------------- provenance

_CODE_DIR = Path(__file__).resolve().parent


def _git(path: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None  # git missing, or a hung network mount
    return out.stdout if out.returncode == 0 else None


def _git_state(path: Path) -> dict | None:
    """commit, dirty flag and root of the git checkout containing ``path``; None outside one
    (e.g. code shipped to Ray workers as a runtime_env working_dir has no .git)."""
    commit = _git(path, "rev-parse", "HEAD")
    if commit is None:
        return None
    # Untracked files (results, data) do not change the code; tracked modifications do.
    status = _git(path, "status", "--porcelain", "--untracked-files=no")
    root = _git(path, "rev-parse", "--show-toplevel")
    return {"commit": commit.strip(), "dirty": bool(status and status.strip()),
            "root": root.strip() if root else None}


def code_version(path: str | os.PathLike | None = None) -> str:
    """Short git commit of the checkout containing ``path`` (default: this package), with
    '-dirty' when tracked files are modified; else the installed vitsweep version
    ('vitsweep-0.1.0'); else 'unknown'. Compute it on the driver and pass it to trials:
    workers may run a copy of the code without .git."""
    return _code_version(_git_state(Path(path) if path is not None else _CODE_DIR))


def _code_version(state: dict | None) -> str:
    if state is not None:
        return state["commit"][:12] + ("-dirty" if state["dirty"] else "")
    try:
        return f"vitsweep-{importlib.metadata.version('vitsweep')}"
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _installed_packages() -> dict[str, str]:
    packages: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and name not in packages:  # first on sys.path wins, as for imports
            packages[name] = dist.version
    return dict(sorted(packages.items(), key=lambda kv: kv[0].lower()))


def requirements_txt(packages: Mapping[str, str] | None = None) -> str:
    """``pip freeze``-like 'name==version' lines of ``packages`` (default: those installed
    in the running interpreter, read with importlib.metadata, no pip subprocess)."""
    packages = _installed_packages() if packages is None else packages
    return "".join(f"{name}=={version}\n" for name, version in packages.items())


def provenance() -> dict:
    """Where and with what a run ran: time, host, user, Python, platform, installed
    packages, torch / CUDA / cuDNN versions and visible GPUs (when torch imports),
    git commit + dirty flag + root of the code (when in a checkout), code_version."""
    git = _git_state(_CODE_DIR)
    info: dict[str, Any] = {
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "git": git,
        "code_version": _code_version(git),
        "packages": _installed_packages(),
    }
    try:
        info["user"] = getpass.getuser()
    except (KeyError, OSError):  # containers without a passwd entry
        info["user"] = None
    try:
        import torch
    except ImportError:
        info["torch"] = None
    else:
        cuda = torch.cuda.is_available()
        info["torch"] = {
            "version": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if cuda else None,
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        }
    return info


def log_provenance(uri: str, run_id: str, config: Mapping[str, Any] | None = None,
                   info: Mapping[str, Any] | None = None) -> dict:
    """Log ``provenance()`` as provenance/environment.json, the package list as
    provenance/requirements.txt, ``git diff HEAD`` as provenance/git_diff.patch when the
    checkout is dirty, ``config`` (the resolved flat run config) as config.json, and tags
    code_version, mlflow.source.git.commit (shown by the UI), vitsweep.host.
    ``info``: a ``provenance()`` taken once for a whole sweep (it costs seconds: it
    imports torch and lists every package); taken here when None.
    Returns the provenance dict."""
    info = dict(info) if info is not None else provenance()
    log_artifact_dict(uri, run_id, "provenance/environment.json", info)
    log_artifact_text(uri, run_id, "provenance/requirements.txt", requirements_txt(info["packages"]))
    git = info["git"]
    if git and git["dirty"]:
        diff = _git(_CODE_DIR, "diff", "HEAD")
        if diff:
            log_artifact_text(uri, run_id, "provenance/git_diff.patch", diff[:5_000_000])
    if config is not None:
        log_artifact_dict(uri, run_id, "config.json", dict(config))
    tags = {"code_version": info["code_version"], "vitsweep.host": info["hostname"]}
    if git:
        tags["mlflow.source.git.commit"] = git["commit"]
    set_tags(uri, run_id, tags)
    return info


# ----------------------------------------------------------------------------- local server


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_local_server(
    backend_store_uri: str,
    artifacts_destination: str | os.PathLike,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    workers: int = 1,
    allowed_hosts: str | None = None,
    wait_s: float = 60.0,
    log_path: str | os.PathLike | None = None,
) -> tuple[str, subprocess.Popen]:
    """Start ``mlflow server`` in its own process group and wait until /health answers.

    One worker and ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``: with MLflow 3's defaults
    the server takes ~3 GB and 15 processes (job runners for GenAI features we do not
    use); like this it is two processes, ~0.6 GB. Clients upload artifacts through the
    server (``--artifacts-destination``: a folder or an s3://, gs:// URI), so trial
    workers need no storage credentials. ``host='0.0.0.0'`` serves other machines; MLflow 3
    then still answers only requests addressed to localhost or a private IP (Host header)
    unless ``allowed_hosts`` (comma-separated names, fnmatch patterns, '*') says more.
    Returns (tracking URI, process); stop it with ``stop_local_server``.
    """
    import urllib.request

    port = port or _free_port(host)
    destination = os.fspath(artifacts_destination)
    if not urllib.parse.urlparse(destination).scheme:
        Path(destination).mkdir(parents=True, exist_ok=True)
        destination = str(Path(destination).resolve())
    command = [
        sys.executable, "-m", "mlflow", "server", "--host", host, "--port", str(port),
        "--workers", str(workers), "--backend-store-uri", backend_store_uri,
        "--artifacts-destination", destination,
    ]
    if allowed_hosts:
        command += ["--allowed-hosts", allowed_hosts]
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)  # own group: stop kills uvicorn workers too
    if log_path:
        log.close()
    local_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    uri = f"http://{local_host}:{port}"
    deadline = time.monotonic() + wait_s
    while True:
        if process.poll() is not None:
            raise TrackingError(f"mlflow server exited with code {process.returncode} before answering "
                                f"on {uri}" + (f"; see {log_path}" if log_path else ""))
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=1) as response:
                if response.status == 200:
                    return uri, process
        except OSError:
            pass
        if time.monotonic() > deadline:
            stop_local_server(process)
            raise TrackingError(f"mlflow server on {uri} did not answer /health within {wait_s:g} s")
        time.sleep(0.2)


def stop_local_server(process: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM the server's process group, SIGKILL it if still alive after ``timeout_s``.
    Works for any process started in its own session (``start_new_session=True``)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout_s)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # uvicorn workers outliving the parent
        os.killpg(process.pid, signal.SIGKILL)
