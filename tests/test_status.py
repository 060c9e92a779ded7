"""`vitsweep status`: progress from the results folder alone (trials table + sweep manifest + heartbeat)."""

from __future__ import annotations

import datetime
import json

import pytest

from records import manifest, tables
from sweeps import cli, status


def _row(trial_id: str, state: str) -> None:
    return {"trial_id": trial_id, "study": "s", "status": state}


@pytest.fixture()
def partial(tmp_path):
    """A sweep of 5 planned trials: 2 finished, 1 running, 1 failed, 1 not started."""
    results = str(tmp_path)
    manifest.write_manifest(results, "s", planned=[{"trial_id": f"t{i}"} for i in range(5)],
                            command=["vitsweep", "sweep", "s"], code_version="abc123")
    for tid, state in [("t0", "finished"), ("t1", "finished"), ("t2", "running"), ("t3", "failed")]:
        tables.write_trial(results, "s", {}, _row(tid, state))
    return results


def test_status_counts_pending_and_live_running(partial):
    manifest.beat(partial, "s")
    got = status.study_status(partial, "s")
    assert got["counts"] == {"finished": 2, "running": 1, "stale": 0, "failed": 1, "stopped": 0, "pending": 1}
    assert got["ids"]["pending"] == ["t4"] and got["ids"]["failed"] == ["t3"]
    text = status.format_status(got)
    assert "5 planned trials" in text and "launcher: running" in text and "code abc123" in text


def test_running_rows_of_a_dead_launcher_are_stale(partial):
    old = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=10 * manifest.STALE_AFTER_S)
    manifest._write_json(f"{partial}/s/{manifest.HEARTBEAT_FILE}",
                         {"time": old.isoformat(), "host": "h", "pid": 1, "ended": False})
    got = status.study_status(partial, "s")
    assert got["counts"]["running"] == 0 and got["counts"]["stale"] == 1 and got["ids"]["stale"] == ["t2"]
    assert "--resume" in status.format_status(got)


def test_heartbeat_context_ends_with_a_stamp(tmp_path):
    with manifest.heartbeat(str(tmp_path), "s", interval_s=0.01):
        assert manifest.launcher_alive(manifest.read_heartbeat(str(tmp_path), "s"))
    beat = manifest.read_heartbeat(str(tmp_path), "s")
    assert beat["ended"] and not manifest.launcher_alive(beat)


def test_status_cli_json_and_unknown_study(partial, capsys):
    assert cli.main(["status", "s", "--results", partial, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["pending"] == 1
    assert cli.main(["status", "nosuch", "--results", partial]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nosuch" in err and "['s']" in err
