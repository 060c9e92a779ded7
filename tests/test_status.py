"""`vitsweep status`: progress from the results folder alone (trials table + sweep manifest + heartbeat)."""

from __future__ import annotations

import datetime
import json

import pytest

from records import files, manifest, tables
from sweeps import cli
from sweeps.launch import status


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
    assert "5 planned trials" in text and "launcher: running on this machine" in text and "code abc123" in text


def test_a_killed_launcher_on_this_machine_is_not_running_whatever_its_heartbeats_age(partial):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    code = f"from records import manifest; manifest.beat({partial!r}, 's')"  # beats, then dies (no "ended")
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, env={**os.environ, "PYTHONPATH": str(root)})
    beat = manifest.read_heartbeat(partial, "s")
    assert not beat["ended"] and manifest.heartbeat_age(beat) < manifest.STALE_AFTER_S  # fresh, yet dead
    got = status.study_status(partial, "s")
    assert not got["alive"] and got["counts"]["stale"] == 1 and got["counts"]["running"] == 0
    assert f"launcher: not alive (pid {beat['pid']} is no longer running)" in status.format_status(got)


def test_on_another_machine_status_says_the_heartbeats_age(partial):
    now = datetime.datetime.now(datetime.UTC)
    files.write_json(f"{partial}/s/{manifest.HEARTBEAT_FILE}",
                         {"time": (now - datetime.timedelta(seconds=42)).isoformat(), "host": "gpu-node-7",
                          "pid": 1, "ended": False})
    got = status.study_status(partial, "s")
    assert got["alive"] and not got["pid_checked"] and got["counts"]["running"] == 1
    text = status.format_status(got, now=now)
    assert "launcher: running on gpu-node-7 by its heartbeat, 42 s ago (its pid 1 cannot be checked" in text


def test_running_rows_of_a_dead_launcher_are_stale(partial):
    old = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=10 * manifest.STALE_AFTER_S)
    files.write_json(f"{partial}/s/{manifest.HEARTBEAT_FILE}",
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


def test_status_shows_the_stage_and_its_progress_while_it_runs_and_after(partial):
    with manifest.heartbeat(partial, "s", stage="analyze"):
        manifest.report_progress(partial, "s", done=3, total=12, unit="checkpoints", eta_s=130.0)
        text = status.format_status(status.study_status(partial, "s"))
        assert "launcher: running on this machine" in text
        assert "stage analyze (measuring checkpoints): 3 of 12 checkpoints, ETA 2 min" in text
    text = status.format_status(status.study_status(partial, "s"))
    assert "after its analyze stage" in text and "stage analyze (" not in text
    manifest.report_progress(partial, "s", done=4, total=12, unit="checkpoints")  # no live heartbeat: a no-op
    assert manifest.read_heartbeat(partial, "s")["progress"]["done"] == 3


def test_an_interrupted_launch_and_a_cut_short_analysis_say_so_and_what_continues_them(partial):
    with manifest.heartbeat(partial, "s") as beat:  # the launcher closed its trials, then says why it ended
        beat.outcome = "the launch was interrupted (SIGTERM)"
    text = status.format_status(status.study_status(partial, "s"))
    assert "in its train stage: the launch was interrupted (SIGTERM)" in text
    assert "training unfinished: the launch command with --resume continues" in text

    with pytest.raises(KeyboardInterrupt), manifest.heartbeat(partial, "s", stage="analyze"):
        manifest.report_progress(partial, "s", done=3, total=12, unit="checkpoints measured", checkpoints="all",
                                 eval_size=500)
        raise KeyboardInterrupt  # nothing is left open in the analysis: its beat is stamped, interrupted
    text = status.format_status(status.study_status(partial, "s"))
    assert "in its analyze stage: interrupted" in text
    assert (f"analysis unfinished: 3 of 12 checkpoints measured; `vitsweep analyze s --results {partial} "
            "--checkpoints all --eval-size 500` continues it") in text

    with pytest.raises(RuntimeError), manifest.heartbeat(partial, "s"):  # died with trials open: no stamp
        raise RuntimeError
    assert not manifest.read_heartbeat(partial, "s")["ended"]


def test_an_analysis_counts_the_measurement_files_on_disk_not_its_last_heartbeat(partial):
    """The heartbeat's progress lags (written at most every few seconds, and not at all once the disk
    fills): the measurement files, written last for each checkpoint, are the count, live and cut short."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    manifest.write_analysis_plan(partial, "s", checkpoints="all", eval_size=500,
                                 planned=[("t0", 0), ("t0", 2), ("t1", 2)], missing=[])
    progress = {"done": 0, "total": 3, "unit": "checkpoints measured", "checkpoints": "all", "eval_size": 500}
    with manifest.heartbeat(partial, "s", stage="analyze"):
        manifest.report_progress(partial, "s", **progress)
        for trial_id, epoch in (("t0", 0), ("t1", 2), ("t9", 4)):  # t9's is of no plan of this analysis
            tables.write_measurements(partial, "s", trial_id, epoch, [])
        assert "stage analyze (measuring checkpoints): 2 of 3 checkpoints measured" in status.format_status(
            status.study_status(partial, "s"))
    code = f"from records import manifest; manifest.beat({partial!r}, 's', stage='analyze', progress={progress!r})"
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True,  # an analysis that died, its beat saying 0 of 3
                   env={**os.environ, "PYTHONPATH": str(root)})
    text = status.format_status(status.study_status(partial, "s"))
    assert (f"analysis unfinished: 2 of 3 checkpoints measured; `vitsweep analyze s --results {partial} "
            "--checkpoints all --eval-size 500` continues it") in text


def test_a_launch_cut_short_after_every_trial_finished_is_not_called_training_unfinished(tmp_path):
    results = str(tmp_path)
    manifest.write_manifest(results, "s", planned=[{"trial_id": "t0"}, {"trial_id": "t1"}],
                            command=["vitsweep", "sweep", "s"], code_version="abc123")
    for tid in ("t0", "t1"):
        tables.write_trial(results, "s", {}, _row(tid, "finished"))
    with manifest.heartbeat(results, "s") as beat:
        beat.outcome = "the launch was interrupted (SIGTERM)"
    text = status.format_status(status.study_status(results, "s"))
    assert "training unfinished" not in text
    assert (f"training finished (all 2 trials): `vitsweep analyze s --results {results}` measures their checkpoints"
            in text)
