"""A local MLflow server for the tests (the cluster YAMLs start their own)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from records.stores import TrackingError


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
