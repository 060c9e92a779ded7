"""The launch's edges before anything is planned (issue 39): an ``--address`` where no Ray GCS
answers, a path Ray cannot carry on a command line, the lock's refusal, the fallback log folder."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _launch_args(*argv: str):
    from sweeps import run as launcher
    from sweeps.launch import options

    parser = launcher.argparse.ArgumentParser()
    options.add_arguments(parser)
    return parser.parse_args(["demo", "--gpus-per-trial", "0", *argv])


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the test's output is the launcher's lines alone
        pass


def _http_server(port: int = 0) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_an_http_server_as_ray_address_is_refused_in_one_line_naming_the_gcs_port(tmp_path, capsys):
    from sweeps import run as launcher

    server = _http_server()
    address = f"127.0.0.1:{server.server_address[1]}"
    try:
        started = time.monotonic()
        status = launcher.run(_launch_args("--address", address, "--results", str(tmp_path / "results")))
        took = time.monotonic() - started
    finally:
        server.shutdown()
    assert status == 2 and took < 10  # (Ray itself sat silent 150-240 s on such an address)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: --address '{address}': {address} answers, but not in gRPC: no Ray GCS")
    assert "Ray's GCS listens on another port: 6379 unless" in line and "ray_current_cluster" in line
    assert not (tmp_path / "results").exists()  # nothing planned, no folder made


def test_the_dashboards_port_is_named_as_such():
    from sweeps.run import check_address

    try:
        server = _http_server(8265)
    except OSError:
        pytest.skip("port 8265 is taken on this machine")
    try:
        with pytest.raises(ValueError, match=r"\(8265 is the port of Ray's dashboard\); Ray's GCS listens on another"):
            check_address("127.0.0.1:8265")
    finally:
        server.shutdown()


def test_a_running_ray_gcs_passes_the_address_check(ray_local):
    from sweeps.run import check_address

    check_address(ray_local.get_runtime_context().gcs_address)  # no error


def test_sigterm_during_the_address_check_ends_the_launch_at_once(tmp_path):
    """A listener that never answers: the check waits up to its timeout, and a SIGTERM then ends it."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent.settimeout(60)
        launch = subprocess.Popen(
            [sys.executable, "sweeps/run.py", "demo", "--address", f"127.0.0.1:{silent.getsockname()[1]}",
             "--gpus-per-trial", "0", "--results", str(tmp_path / "results")],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            conn, _ = silent.accept()  # the check is connected and waiting for an answer now
            launch.send_signal(signal.SIGTERM)
            _, err = launch.communicate(timeout=5)
            conn.close()
        finally:
            launch.kill()
            launch.wait()
    assert launch.returncode == 130
    assert err.strip().splitlines()[-1].startswith("vitsweep: interrupted (SIGTERM)")
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("flag", ["--results", "--storage"])
def test_a_non_ascii_path_is_refused_in_one_line_naming_the_character(tmp_path, capsys, flag):
    """Ray's out-of-memory report cuts command lines at a byte length; a cut inside a multi-byte
    character aborted every raylet on the machine, so such a path never reaches a launch."""
    from sweeps import run as launcher

    path = tmp_path / "résultats"
    status = launcher.run(_launch_args(flag, str(path), "--dry-run"))
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    at = str(path).index("é") + 1
    assert line.startswith(f"error: {flag} '{path}' has a non-ASCII character 'é' (U+00E9) at position {at}: ")
    assert line.endswith(f"pass an ASCII path instead, e.g. a symlink with an ASCII name (ln -s '{path}' ASCII_PATH)")
    assert not path.exists()


def test_a_symlink_with_an_ascii_name_is_the_way_around(tmp_path, capsys):
    from sweeps.launch import options

    target = tmp_path / "résultats"
    target.mkdir()
    (tmp_path / "results").symlink_to(target)
    options.check(_launch_args("--results", str(tmp_path / "results")))  # no error


def test_analyze_refuses_a_non_ascii_results_path_too(tmp_path, capsys):
    from sweeps import cli

    assert cli.main(["analyze", "demo", "--results", str(tmp_path / "ü")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: --results '{tmp_path / 'ü'}' has a non-ASCII character 'ü' (U+00FC)")


def test_the_locks_refusal_names_the_refused_ones_next_command(tmp_path):
    from sweeps.launch.lock import LaunchLock, LaunchLockError

    results = str(tmp_path / "results")
    with LaunchLock(results, "demo", "launch"):
        with pytest.raises(LaunchLockError) as refused:
            LaunchLock(results, "demo", "analysis").acquire()
    assert str(refused.value).startswith("another launch of study 'demo'")
    assert str(refused.value).endswith("and run the same `vitsweep analyze` command again")  # analyze has no --resume
    with LaunchLock(results, "demo", "analysis"):
        with pytest.raises(LaunchLockError, match=r"^another analysis .* and launch again with --resume$"):
            LaunchLock(results, "demo", "launch").acquire()


def _log_folders(folder: Path) -> list[Path]:
    return sorted(folder.glob("vitsweep-logs-*"))


def test_a_launch_log_makes_no_fallback_folder_while_the_results_folder_takes_it(tmp_path, monkeypatch):
    import tempfile

    from sweeps.launch import faults

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(faults, "_PRIVATE", [])
    log = faults.LaunchLog(str(tmp_path / "results"), "demo")
    log.write_text("a line")
    log.close()
    assert Path(log.path).parent == tmp_path / "results" / "demo" / "logs"
    assert _log_folders(tmp_path / "tmp") == []
    (tmp_path / "blocked").write_text("a file where the results folder would be")
    log = faults.LaunchLog(str(tmp_path / "blocked"), "demo")  # the results folder cannot take it
    log.write_text("a line")
    log.close()
    assert _log_folders(tmp_path / "tmp") == [Path(log.path).parent]


@pytest.mark.parametrize("written", [False, True])
def test_an_empty_fallback_log_folder_is_removed_at_exit(tmp_path, written):
    code = "from pathlib import Path; from sweeps.launch import faults; folder = faults.private_log_folder()"
    if written:
        code += "; Path(folder, 'x.log').write_text('x')"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp_path)}, check=True)
    assert len(_log_folders(tmp_path)) == (1 if written else 0)  # a folder holding a log stays


def test_the_dashboards_http_address_is_refused_before_any_connection():
    from sweeps.run import check_address

    with pytest.raises(ValueError, match=r"^--address 'http://127\.0\.0\.1:8265' is an HTTP address \(the dashboard"):
        check_address("http://127.0.0.1:8265")
