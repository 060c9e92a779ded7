"""Which MLflow stores vitsweep accepts, and whether one answers: checked before any trial starts.

Every check names the URI (passwords redacted) and says what to use instead:

- ``sqlite:////abs/path/mlflow.db``: the embedded default, under the results folder
  (``default_tracking_uri``); ONE machine only (trials on other nodes would each write their own
  file at that path); its writers and first build are serialised by ``records.client``. Artifacts
  go to ``<db folder>/mlartifacts/<experiment>`` instead of MLflow's default ``./mlruns`` (relative
  to each process's working directory, which differs between Ray workers). MLflow stores those
  locations as absolute URIs, so a copy of the results folder would still write into (and read
  from) the original's artifacts: a store found under another folder than the one it was made in
  is re-rooted when it is checked (``reroot_artifacts``).
- ``http(s)://host:port``: an MLflow server (the cluster YAML starts one on the head node). Needed
  whenever trials run on more than one machine or results live on object storage; its requests
  are bounded and retried by ``records.client``.
- ``postgresql://``, ``mysql://``, ``mssql://``: a database directly.
- ``databricks``: accepted, not checked.
- ``file:`` / a bare path: refused. MLflow 3 puts the file store in maintenance
  mode and refuses to open it, and it was never safe for concurrent writers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import urllib.parse
from pathlib import Path

from records.layout import tracking_db

# Imports inside functions: MLflow and SQLAlchemy load only when a store is checked or built (see
# records/client.py).

VALID_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")
SQL_DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")
CONNECT_TIMEOUT_S = 5.0  # check_tracking_uri: how long an unreachable server may take to fail
_REMOTE_HINT = (
    "an MLflow server, e.g. --mlflow-uri http://<head-node>:5000 (the cluster YAMLs start one "
    "on the head node; `mlflow server --backend-store-uri sqlite:////abs/mlflow.db "
    "--artifacts-destination <dir or s3://...> --workers 1` starts one by hand)"
)


class TrackingError(RuntimeError):
    """MLflow could not be reached, or a write kept failing after all retries."""


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
        raise ValueError(f"--results {text!r} is on {scheme}:// storage, where a SQLite tracking file cannot live "
                         "(object stores have no file locking or in-place writes); pass --mlflow-uri with "
                         f"{_REMOTE_HINT}.")
    return f"sqlite:///{tracking_db(text).as_posix()}"


def scheme(uri: str) -> str:
    """'postgresql+psycopg2://...' -> 'postgresql'; '/a/b' -> ''."""
    if uri == "databricks" or uri.startswith("databricks://"):
        return "databricks"
    return urllib.parse.urlparse(uri).scheme.split("+", 1)[0].lower()


def redact(uri: str) -> str:
    """The URI with any password replaced by ***, for error messages and logs."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def sqlite_path(uri: str) -> Path:
    """The database file of a ``sqlite:///`` URI (query string dropped)."""
    return Path(urllib.parse.unquote(uri[len("sqlite:///") :].split("?", 1)[0]))


def check_tracking_uri(uri: str, *, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast, before any trial starts, if ``uri`` cannot be used.

    ValueError: empty, unknown scheme (lists the valid ones), file store, in-memory
    or relative SQLite path, SQLite folder not creatable/writable, not a SQLite file,
    missing database driver. TrackingError: an http(s) server or a database that
    does not answer within ``timeout_s``, or refuses the credentials.
    Creates the SQLite folder; does not create the database itself; re-roots a copied one.
    """
    if not uri or not uri.strip():
        raise ValueError(f"empty MLflow tracking URI; valid schemes: {', '.join(VALID_SCHEMES)}")
    kind = scheme(uri)
    shown = redact(uri)
    if kind in ("", "file"):
        raise ValueError(f"MLflow tracking URI {shown!r} names the file store, which MLflow 3 keeps in maintenance "
                         "mode and refuses to open (and which concurrent trials corrupt). Use sqlite:////<abs "
                         f"folder>/mlflow.db on one machine, or {_REMOTE_HINT}.")
    if kind not in VALID_SCHEMES:
        raise ValueError(f"MLflow tracking URI {shown!r} has unknown scheme {kind!r}; valid schemes: "
                         f"{', '.join(VALID_SCHEMES)} (e.g. sqlite:////abs/results/mlflow.db, http://127.0.0.1:5000).")
    if kind == "sqlite":
        _check_sqlite(uri)
    elif kind in ("http", "https"):
        check_http(uri, timeout_s)
    elif kind in SQL_DATABASE_SCHEMES:
        _check_database(uri, timeout_s)
    # databricks: credentials come from the Databricks config; nothing cheap to check.


def reroot_artifacts(uri: str) -> str | None:
    """Point the artifact locations of a SQLite store's experiments and runs that lie under
    ``<folder it was made in>/mlartifacts/`` (``records.tracking``'s default) under the folder it is
    in now, for a copied or moved results folder; returns one line saying so, or None when nothing
    had to move. MLflow offers no call to change a location, so it is changed in its tables."""
    path = sqlite_path(uri)
    if not path.is_file() or path.stat().st_size == 0:
        return None
    here = (path.parent / "mlartifacts").as_uri()
    with contextlib.closing(sqlite3.connect(path, timeout=20)) as con:
        try:
            found = con.execute("SELECT artifact_location FROM experiments WHERE artifact_location LIKE ?",
                                ("file://%/mlartifacts/%",)).fetchall()
        except sqlite3.OperationalError:  # no MLflow tables yet
            return None
        roots = {loc[: loc.rindex("/mlartifacts/") + len("/mlartifacts")] for (loc,) in found} - {here}
        if not roots:
            return None
        with con:  # one transaction
            for old in roots:
                for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri")):
                    con.execute(f"UPDATE {table} SET {column} = ? || substr({column}, ?) "  # noqa: S608 - fixed names
                                f"WHERE substr({column}, 1, ?) = ?", (here, len(old) + 1, len(old) + 1, old + "/"))
    return (f"MLflow store {path} was made beside artifacts at {', '.join(sorted(roots))}: its experiments and runs "
            f"now keep their artifacts at {here} (this copy's own)")


def _check_sqlite(uri: str) -> None:
    if not uri.startswith("sqlite:///") or uri[len("sqlite:///") :] in ("", ":memory:"):
        raise ValueError(f"MLflow tracking URI {uri!r} is an in-memory SQLite database, which each trial process "
                         "would see empty; use sqlite:////<abs folder>/mlflow.db.")
    path = sqlite_path(uri)
    if not path.is_absolute():
        raise ValueError(f"MLflow tracking URI {uri!r} has a relative SQLite path, which each Ray worker resolves "
                         "against its own working directory; use four slashes and an absolute path: "
                         f"sqlite:///{Path(path).resolve().as_posix()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"MLflow tracking URI {uri!r}: cannot create the folder {str(path.parent)!r} for the SQLite "
                         f"file ({e.strerror or e}).") from e
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise ValueError(f"MLflow tracking URI {uri!r}: folder {str(path.parent)!r} is not writable.")
    if path.is_dir():
        raise ValueError(f"MLflow tracking URI {uri!r} names a folder, not a SQLite file.")
    if path.exists() and path.stat().st_size > 0:
        with open(path, "rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                raise ValueError(f"MLflow tracking URI {uri!r}: {str(path)!r} is not a SQLite database.")
    if moved := reroot_artifacts(uri):
        logging.getLogger("vitsweep").warning(moved)


def _host_creds(uri: str):
    """Host + credentials the way MLflow's own REST client builds them (auth env vars, TLS)."""
    try:  # private module, stable since MLflow 1.x; fall back to no auth if it moves
        from mlflow.tracking._tracking_service.utils import get_default_host_creds

        return get_default_host_creds(uri)
    except ImportError:
        from mlflow.utils.rest_utils import MlflowHostCreds

        return MlflowHostCreds(uri)


def check_http(uri: str, timeout_s: float) -> None:
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
        raise TrackingError(f"MLflow tracking server {redact(uri)!r} is not reachable within {timeout_s:g} s ({e}). "
                            f"Start it, or pass another --mlflow-uri; {_REMOTE_HINT}.") from e
    if response.status_code == 403 and "Invalid Host header" in response.text:
        host = urllib.parse.urlsplit(uri).netloc.rsplit("@", 1)[-1]
        raise TrackingError(f"MLflow tracking server {redact(uri)!r} rejects the Host header {host!r}: MLflow 3 "
                            "serves only localhost and private IPs by default (its /health answers anyway). Start "
                            f"the server with --allowed-hosts {host.split(':')[0]!r} "
                            "(start_local_server(allowed_hosts=...)), or reach it by its private IP.")
    if response.status_code in (401, 403):
        raise TrackingError(f"MLflow tracking server {redact(uri)!r} refused the credentials (HTTP "
                            f"{response.status_code}); set MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD or "
                            "MLFLOW_TRACKING_TOKEN.")
    if response.status_code != 200:
        raise TrackingError(f"{redact(uri)!r} answered HTTP {response.status_code} to {endpoint}; is it an MLflow "
                            f"tracking server (right host, port and path prefix)? Body: {response.text[:200]!r}")


def _check_database(uri: str, timeout_s: float) -> None:
    import sqlalchemy

    connect_args = {} if scheme(uri) == "mssql" else {"connect_timeout": max(1, round(timeout_s))}
    try:
        engine = sqlalchemy.create_engine(uri, connect_args=connect_args)
    except ModuleNotFoundError as e:
        raise ValueError(f"MLflow tracking URI {redact(uri)!r} needs the Python module {e.name!r} (its database "
                         "driver); install it, e.g. psycopg[binary] for postgresql://, pymysql for "
                         "mysql+pymysql://.") from e
    try:
        with engine.connect():
            pass
    except sqlalchemy.exc.SQLAlchemyError as e:
        raise TrackingError(f"MLflow tracking database {redact(uri)!r} is not reachable: {e.__class__.__name__}: "
                            f"{str(e).splitlines()[0]}") from e
    finally:
        engine.dispose()

