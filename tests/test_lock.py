"""The launch lock: one launch per (results, study); a dead holder's lock is taken over."""

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from records.layout import lock_path
from records.manifest import boot_id, proc_start
from sweeps import cli
from sweeps import run as launcher
from sweeps.launch import options
from sweeps.launch.lock import LaunchLock, LaunchLockError

ROOT = Path(__file__).resolve().parent.parent


def _hold_in_subprocess(results: Path) -> subprocess.Popen:
    """Another process that holds the demo study's lock until killed."""
    code = ("import sys, time; from sweeps.launch.lock import LaunchLock; "
            f"LaunchLock({str(results)!r}, 'demo').acquire(); print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_launch_is_refused_naming_the_holder_then_a_dead_holder_is_taken_over(tmp_path, capsys, caplog):
    import ray

    ray_was_up = ray.is_initialized()
    results = tmp_path / "results"
    holder = _hold_in_subprocess(results)
    try:
        parser = launcher.argparse.ArgumentParser()
        options.add_arguments(parser)
        assert launcher.run(parser.parse_args(["demo", "--results", str(results)])) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: another launch of study 'demo' into ") and len(err.strip().splitlines()) == 1
        assert f"host {socket.gethostname()}, pid {holder.pid}, started 20" in err
        assert f"kill {holder.pid}" in err and "--resume" in err
        assert ray.is_initialized() == ray_was_up  # refused before Ray started
        assert not (results / "demo" / "trials").exists()
        assert cli.main(["analyze", "demo", "--results", str(results)]) == 2  # an analysis too, in one line
        err = capsys.readouterr().err
        assert err.startswith("error: another launch of study 'demo' into ") and len(err.strip().splitlines()) == 1
        assert f"pid {holder.pid}," in err
        with LaunchLock(str(results), "other_study"):  # another study is not blocked
            pass
    finally:
        holder.kill()
        holder.wait()

    caplog.set_level(logging.WARNING, logger="vitsweep")
    with LaunchLock(str(results), "demo", "analysis") as taken:
        assert json.loads(Path(taken.uri).read_text())["pid"] == os.getpid()
        assert launcher.run(parser.parse_args(["demo", "--results", str(results)])) == 2  # a launch, by an analysis
        assert capsys.readouterr().err.startswith("error: another analysis of study 'demo' into ")
        assert f"from host {socket.gethostname()}, pid {holder.pid}" in caplog.text
        assert f"pid {holder.pid} is no longer running" in caplog.text
        with pytest.raises(LaunchLockError, match=f"pid {os.getpid()}"):  # held by us now
            LaunchLock(str(results), "demo").acquire()
    assert not Path(lock_path(str(results), "demo")).exists()  # released


def _write_lock(path: Path, **holder) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    base = {"token": "t0", "host": socket.gethostname(), "pid": os.getpid(), "started": "2026-01-01T00:00:00+00:00",
            "boot_id": boot_id(), "proc_start": proc_start(os.getpid()),
            "heartbeat": time.time()}
    path.write_text(json.dumps({**base, **holder}))


@pytest.mark.parametrize(
    "holder, taken_over, why",
    [
        ({}, False, ""),  # this very process: alive
        ({"proc_start": "1"}, True, "now belongs to another process"),  # a reused pid
        ({"boot_id": "another-boot"}, True, "rebooted"),
        ({"host": "elsewhere", "heartbeat": time.time() - 3600}, True, "last renewed"),
        ({"host": "elsewhere"}, False, ""),  # a live lease on another machine
    ],
)
def test_liveness_of_a_recorded_holder(tmp_path, caplog, holder, taken_over, why):
    uri = lock_path(str(tmp_path), "demo")
    _write_lock(Path(uri), **holder)
    caplog.set_level(logging.WARNING, logger="vitsweep")
    lk = LaunchLock(str(tmp_path), "demo")
    if taken_over:
        lk.acquire()
        assert why in caplog.text
        lk.release()
    else:
        with pytest.raises(LaunchLockError, match="is running"):
            lk.acquire()
        assert json.loads(Path(uri).read_text())["token"] == "t0"  # left alone


def test_release_never_removes_a_lock_that_was_taken_over(tmp_path):
    lk = LaunchLock(str(tmp_path), "demo")
    lk.acquire()
    _write_lock(Path(lk.uri), token="someone-else")
    lk.release()
    assert json.loads(Path(lk.uri).read_text())["token"] == "someone-else"


def test_lease_on_a_uri_storage(tmp_path):
    """The object-store path (no conditional put: write, read back) on a file:// URI."""
    results = f"file://{tmp_path}"
    first = LaunchLock(results, "demo")
    first.acquire()
    assert (tmp_path / "demo" / ".launch.lock").exists()
    with pytest.raises(LaunchLockError, match=f"pid {os.getpid()}"):
        LaunchLock(results, "demo").acquire()
    first.release()
    assert not (tmp_path / "demo" / ".launch.lock").exists()
    with LaunchLock(results, "demo"):
        pass


def test_an_unreadable_lock_is_respected_briefly_then_taken_over(tmp_path, caplog):
    uri = Path(lock_path(str(tmp_path), "demo"))
    uri.parent.mkdir(parents=True)
    uri.write_text("{half a lock")
    with pytest.raises(LaunchLockError):  # just created: its writer may still be writing it
        LaunchLock(str(tmp_path), "demo").acquire()
    old = time.time() - 3600
    os.utime(uri, (old, old))
    caplog.set_level(logging.WARNING, logger="vitsweep")
    with LaunchLock(str(tmp_path), "demo") as taken:
        assert json.loads(uri.read_text())["token"] == taken.token
    assert "not readable JSON" in caplog.text


def test_release_removes_a_half_written_renewal_and_the_folder_it_made(tmp_path):
    results = str(tmp_path / "results")
    lock = LaunchLock(results, "demo")
    lock.acquire()
    Path(f"{lock.uri}.{lock.token}.tmp").write_bytes(b'{"tok')  # a renewal a full disk cut short
    lock.release()
    assert not (tmp_path / "results" / "demo").exists()  # nothing left: not the lock, its temp, the folder
    (tmp_path / "results" / "demo" / "trials").mkdir(parents=True)
    with LaunchLock(results, "demo"):
        pass
    assert sorted(p.name for p in (tmp_path / "results" / "demo").iterdir()) == ["trials"]  # a study's folder stays


def test_a_killed_holder_not_yet_reaped_is_not_running():
    """A zombie (killed, its parent gone, init not yet reaping it: slow in some containers) still has a
    pid and a /proc entry; it holds nothing."""
    import socket
    import subprocess
    import sys
    import time

    from records.manifest import proc_start, process_alive

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    holder = {"host": socket.gethostname(), "pid": child.pid, "proc_start": proc_start(child.pid)}
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":  # exited, not reaped
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        assert process_alive(holder) == (False, f"pid {child.pid} is no longer running")
    finally:
        child.wait()
