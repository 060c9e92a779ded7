"""Session-wide fixtures: one real local Ray and one real demo sweep, shared.

Starting Ray and training the demo study cost tens of seconds on a 2-core
machine, so the suite pays for them once; tests that only read the demo's
Parquet tables, MLflow runs or report reuse its output. Also ``diverge``, a pack member's
divergence injected in-process (the wrappers of ``tests/trialfaults/``).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Settings that keep the demo sweep inside the suite's time budget on 2 cores: its 4 trials train in two
# packs of two (a Train worker's start-up is most of a demo trial's time), as the cluster test does.
FAST_DEMO = ["--set", "epochs=2", "--set", "max_train_images=1024", "--pack", "2"]
# Test images measured per checkpoint in the suite's demo sweeps (the demo's own cap is 500). The
# analysis stage is most of a demo sweep's time on 2 cores (measured: ~80% of the fixture at 500 images,
# 56 forward passes per batch for an additive PE) and is linear in the images; 100 is still every
# measurement of the vocabulary. The rows name the count, so tests that read it check the study's cap
# reached the analysis.
FAST_EVAL_SIZE = 100


def load_script(path: Path):
    """A script outside the packages (``bench/*.py``, a ``sitecustomize.py``) loaded as a module of its own."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def diverge(monkeypatch):
    """``diverge(trial_id, epoch)``: that pack member's weights turn non-finite at the start of that
    epoch, in this process (``tests/trialfaults/sitecustomize.py``, which does it in a sweep's workers)."""
    faults = load_script(ROOT / "tests" / "trialfaults" / "sitecustomize.py")
    return lambda trial_id, epoch: faults.diverge(trial_id, epoch, monkeypatch.setattr)


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray instance with its own temp dir (never another session's)."""
    import ray

    from trainables.trial.ray_start import init_ray

    # Unix socket paths must stay short: a short dir under /tmp, not pytest's tmp_path.
    temp_dir = tempfile.mkdtemp(prefix="vsr-", dir="/tmp")
    init_ray(num_cpus=2, _temp_dir=temp_dir, configure_logging=False, log_to_driver=False)  # as the launcher
    yield ray
    ray.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)


@contextlib.contextmanager
def terminal(stdout: Path, stderr: Path):
    """What a terminal shows, as a user's launch would write it: file descriptors 1 and 2 into
    ``stdout`` and ``stderr`` (where Ray's C++ core writes), Python's streams and every logging
    stream handler (Ray's, MLflow's, bound to pytest's capture at import) writing to those
    descriptors, and the launcher's own INFO lines on stderr as its ``logging.basicConfig`` puts
    them outside pytest."""
    import logging
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    files = [open(stdout, "wb"), open(stderr, "wb")]  # noqa: SIM115
    os.dup2(files[0].fileno(), 1)
    os.dup2(files[1].fileno(), 2)
    out, err = open(1, "w", closefd=False, buffering=1), open(2, "w", closefd=False, buffering=1)  # noqa: SIM115
    handlers = [h for lg in [logging.getLogger(), *logging.root.manager.loggerDict.values()]
                if isinstance(lg, logging.Logger) for h in lg.handlers
                if type(h) is logging.StreamHandler or type(h).__name__ == "StreamHandler"]
    streams = [h.stream for h in handlers]
    for h in handlers:
        h.setStream(err)
    root = logging.getLogger()
    console = logging.StreamHandler(err)
    console.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
    level = root.level
    root.setLevel(logging.INFO)
    root.addHandler(console)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield
    finally:
        out.flush()
        err.flush()
        root.removeHandler(console)
        root.setLevel(level)
        for h, stream in zip(handlers, streams):
            h.setStream(stream)
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        for f in files:
            f.close()


@pytest.fixture(scope="session")
def demo_results(ray_local, tmp_path_factory):
    """The demo study trained, analysed and reported once: returns the results folder, where
    ``console.txt`` and ``console-err.txt`` keep what the launch showed on stdout and stderr.

    The demo's evaluation cap is lowered to ``FAST_EVAL_SIZE`` for this run only (the launcher reads
    it from the study module, ``sweeps.studies.demo.EVAL_SIZE``, as it reads any study's)."""
    from sweeps import run as launcher
    from sweeps.launch import options
    from sweeps.studies import demo

    results = tmp_path_factory.mktemp("demo-results")
    parser = launcher.argparse.ArgumentParser()
    options.add_arguments(parser)
    args = parser.parse_args(["demo", "--stage", "all", "--results", str(results), *FAST_DEMO])
    with terminal(results / "console.txt", results / "console-err.txt"), pytest.MonkeyPatch.context() as patch:
        patch.setattr(demo, "EVAL_SIZE", FAST_EVAL_SIZE)
        status = launcher.run(args)
    print((results / "console.txt").read_text(), (results / "console-err.txt").read_text())
    assert status == 0
    return results


@pytest.fixture()
def small_disk(tmp_path):
    """A real 4 MiB tmpfs (needs mount rights; skipped without), and what fills it up: a full disk
    for the storage-fault tests."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")

    def fill():
        with contextlib.suppress(OSError), open(mount / "ballast", "wb") as fh:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()

    yield mount, fill
    subprocess.run(["umount", "-l", str(mount)], check=False)
