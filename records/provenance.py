"""Provenance: which code, packages and machine a run used (no MLflow here; `tracking.log_provenance` writes it)."""

from __future__ import annotations

import datetime
import getpass
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Imports inside functions: torch's version is read only where torch is already loaded.

_CODE_DIR = Path(__file__).resolve().parent  # inside the checkout: its git state is the code's


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
    '-dirty' when tracked files are modified; else 'vitsweep-<version>', the installed package's (pyproject.toml's
    as of its install); else 'unknown'. Compute it on the driver and pass it to trials: workers may run a copy of
    the code without .git."""
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


def requirements_txt(packages: Mapping[str, str]) -> str:
    """``pip freeze``-like 'name==version' lines of ``packages`` (``provenance()["packages"]``)."""
    return "".join(f"{name}=={version}\n" for name, version in packages.items())


def provenance() -> dict:
    """Where and with what a run ran: time, host, user, Python, platform, installed
    packages, torch / CUDA / cuDNN versions and visible GPUs (when torch imports),
    git commit + dirty flag + root of the code (when in a checkout), code_version."""
    git = _git_state(_CODE_DIR)
    info: dict[str, Any] = {
        "time_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
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
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
        info["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                         "cudnn": torch.backends.cudnn.version() if cuda else None, "gpus": gpus}
    return info


def git_diff() -> str | None:
    """``git diff HEAD`` of the checkout holding this package, or None outside one."""
    return _git(_CODE_DIR, "diff", "HEAD")
