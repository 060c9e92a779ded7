"""Ray start-up and its security settings: what the launcher, the analysis job and the tests share.

    init_ray(address)     join a cluster, or start a local Ray bound to loopback with a private token
    DRIVER_RESOURCES      what a Tune trial's driver asks for (a token of memory, no CPU)

A Tune trial's function is only a driver (``trainables.trial.ray_trial``): it asks for no CPU at all
(Tune refuses an empty request), so drivers never hold the cores their own Train workers need.
With 1 CPU per driver two drivers fill a 2-core machine and their workers never start; with
0.01 CPU a worker asking for a whole CPU no longer fits beside a driver, and trials silently run
one at a time.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Imports inside functions: Ray loads only where it starts; the launcher's checks read this module's settings.

DRIVER_RESOURCES = {"CPU": 0, "memory": 2**20}


def init_ray(address: str | None = None, **kwargs: Any) -> None:
    """Connect to ``address`` ("auto" or host:port), or start a fresh local Ray.

    Locally, a second Ray instance on the same machine (another user's sweep, a test) breaks Ray Train's
    placement-group cleaner: it finds its cluster's state API by scanning for running instances and gives
    up when there are two, leaking the CPUs of every early-stopped trial until the sweep deadlocks. So the
    local instance gets a dashboard port chosen here, and every process of the job is told where it is
    (``RAY_API_SERVER_ADDRESS``). It listens on loopback only (``single_node``) and its token file is
    readable by the user alone (``private_token_file``); a cluster (``address``) keeps the binding its
    ``ray start`` gave it."""
    import ray

    if ray.is_initialized():
        return
    with _own_sigterm():
        _start(address, **kwargs)


@contextmanager
def _own_sigterm():
    """``ray.init`` makes SIGTERM ``sys.exit`` from wherever the main thread is (it ends in an abort);
    a handler the process set before (the launcher's, ``sweeps.launch.interrupt``) stays in place."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if callable(before) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, before)


def _start(address: str | None, **kwargs: Any) -> None:
    import ray

    if address:
        ray.init(address=address, **kwargs)
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {"RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{port}"}
    private_token_file()
    with single_node():
        ray.init(address="local", include_dashboard=True, dashboard_host="127.0.0.1", dashboard_port=port,
                 runtime_env={"env_vars": env}, **kwargs)
    os.environ.update(env)  # this driver's own state-API calls


SINGLE_NODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextmanager
def single_node():
    """Ray's own switch for a one-machine Ray (its default on macOS and Windows): with
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` the node IP is 127.0.0.1, and GCS, raylet, every worker's gRPC
    server, the dashboard agent, the runtime-env agent and the metrics endpoints bind to it instead of
    0.0.0.0 / the machine's address. (``_node_ip_address="127.0.0.1"`` does not do it: Ray replaces a
    loopback node IP by the machine's address.) Ray reads the variable once, when ``ray`` is imported,
    so the constant it sets is applied too, for a ``ray`` imported before this call; both are restored
    after the start, so a later cluster connection in the same process is not affected."""
    from ray._private import ray_constants

    # (A Ray without the constant reads only the variable; tests/test_ray_resume.py checks the sockets either way.)
    before_env, before_const = os.environ.get(SINGLE_NODE_ENV), getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[SINGLE_NODE_ENV] = "0"
    if before_const is not None:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if before_const is not None:
            ray_constants.ENABLE_RAY_CLUSTER = before_const
        if before_env is None:
            os.environ.pop(SINGLE_NODE_ENV, None)
        else:
            os.environ[SINGLE_NODE_ENV] = before_env


def private_token_file() -> None:
    """A new local Ray enables token auth and writes its token to ``~/.ray/auth_token`` (or
    ``$RAY_AUTH_TOKEN_PATH``) with the default umask, i.e. readable by everyone (0644). Create the file
    first with mode 0600 (Ray then fills it and keeps the mode) and tighten an existing one."""
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        return  # the token is not in a file, or there is none
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token").expanduser()
    try:
        if path.exists():
            if path.stat().st_mode & 0o077:
                path.chmod(0o600)
            return
        from ray._private.authentication.authentication_token_generator import generate_new_authentication_token

        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(generate_new_authentication_token())
    except FileExistsError:  # another launch created it meanwhile: Ray will read theirs
        pass
    except OSError as exc:  # e.g. a read-only home: Ray reports its own error if it cannot write either
        logging.getLogger("vitsweep").warning("could not make Ray's token file %s private: %s", path, exc)
