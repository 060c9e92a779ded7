"""The console's vitsweep lines: one per ended trial, from its trials row, with an ETA; a summary."""

from __future__ import annotations

import io

from records import tables
from records.vocab import format_duration
from sweeps.launch import progress


def test_trial_lines_say_score_or_failure():
    ok = {"status": "finished", "test_acc": 0.4812, "wall_time_s": 84.0}
    assert progress.trial_line(3, 60, ok, "t3") == "[3/60] t3: test 0.481 in 84 s"
    holdout = {"status": "finished", "test_acc": None, "eval_acc": 0.5, "wall_time_s": 4000.0, "did_not_learn": True}
    assert progress.trial_line(1, 2, holdout, "h") == "[1/2] h: holdout 0.500 (did not learn) in 67 min"
    bad = {"status": "failed", "epochs_completed": 12, "error": "loss is nan at epoch 12", "wall_time_s": 30.0}
    assert (progress.trial_line(4, 60, bad, "t4")
            == "[4/60] t4: FAILED after 12 epoch(s) (loss is nan at epoch 12) in 30 s")
    assert "without a record" in progress.trial_line(5, 60, None, "t5")


def test_a_pack_prints_each_member_once_with_an_eta(tmp_path):
    results = str(tmp_path)
    for tid, acc in (("a", 0.5), ("b", 0.25)):
        tables.write_trial(results, "s", {}, {"trial_id": tid, "study": "s", "status": "finished",
                                              "test_acc": acc, "wall_time_s": 10.0})
    out = io.StringIO()
    p = progress.TrialProgress(results, "s", total=3, members={"pack-1": ["a", "b"]}, stream=out)
    p.ended("pack-1")
    p.ended("pack-1")  # Tune may report an error after completion: no member is counted twice
    lines = out.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == ["[1/3] a", "[2/3] b"]
    assert "ETA" in lines[0] and "test 0.500" in lines[0]
    p.ended("c")  # a trial alone is its own Tune trial; it left no row
    assert "[3/3] c" in out.getvalue() and "ETA" not in out.getvalue().splitlines()[-1]
    assert p.summary().startswith("s: 3 of 3 trials ended") and "2 finished" in p.summary()


def test_a_restart_and_a_retry_are_each_said_once(tmp_path):
    from trainables.trial.lifecycle import RESTART_KEYS

    out = io.StringIO()
    p = progress.TrialProgress(str(tmp_path), "s", total=2, members={"pack-1": ["a", "b"]}, stream=out)
    report = dict(zip(RESTART_KEYS, (1, "its Train worker on node 10.0.0.7 n1 was lost (ActorDiedError: gone)",
                                     2, "10.0.0.9 n2")))
    p.restarted("pack-1", report)
    p.restarted("pack-1", report)  # Tune may hand the same result on twice: said once
    p.retried("pack-1", "Traceback (most recent call last):\n  ...\nray.exceptions.ActorDiedError: the actor died\n")
    assert out.getvalue().splitlines() == [
        "[train] pack pack-1 (2 trials): its Train worker on node 10.0.0.7 n1 was lost (ActorDiedError: gone); "
        "resumed from epoch 2 on node 10.0.0.9 n2 (restart 1)",
        "[train] pack pack-1 (2 trials): failed (ray.exceptions.ActorDiedError: the actor died); Tune starts it "
        "again, each member from its last checkpoint"]
    moved = {"status": "finished", "test_acc": 0.5, "wall_time_s": 10.0, "restarts": 1}
    assert progress.trial_line(1, 2, moved, "a") == "[1/2] a: test 0.500 in 10 s, after 1 restart(s)"


def test_the_callback_survives_tunes_pickling_on_a_real_terminal(tmp_path):
    # Tune pickles its callbacks with its state; a progress object holding sys.stdout would not pickle.
    import pickle

    import ray.cloudpickle

    p = progress.TrialProgress(str(tmp_path), "s", total=1, members={})
    assert pickle.loads(ray.cloudpickle.dumps(p.as_callback())) is not None


def test_the_closing_lines_name_a_report_only_when_there_is_one(tmp_path):
    results = str(tmp_path)
    tables.write_trial(results, "s", {}, {"trial_id": "a", "study": "s", "status": "finished"})
    after_train = progress.closing_lines(results, "s", "sqlite:////x/mlflow.db")
    assert "report:" not in after_train and "trials: 1 finished" in after_train
    index = "/here/s-report/index.html"  # a remote run's report is written where the launcher runs
    assert f"report:         {index}" in progress.closing_lines(results, "s", "sqlite:////x.db", report=index)


def test_the_summary_comes_from_the_trials_table_not_from_what_the_callback_counted(tmp_path):
    # A restored Tune run revives the killed launcher's callback: the summary must not depend on it.
    results = str(tmp_path)
    for tid, state in (("a", "finished"), ("b", "failed")):
        tables.write_trial(results, "s", {}, {"trial_id": tid, "study": "s", "status": state})
    p = progress.TrialProgress(results, "s", total=3, members={"a": ["a"], "b": ["b"], "c": ["c"]},
                               stream=io.StringIO())
    assert p.summary().startswith("s: 2 of 3 trials ended") and "(1 failed, 1 finished, 1 not started)" in p.summary()


# ------------------------------------------------------------------------------------ live progress

def _demo_like_schedule(n=4, slots=2, startup=20.0, epochs=8, epoch_s=6.0, close=4.0, gap=1.0):
    """Start, loop start and end of each of ``n`` trials on ``slots`` slots, as Tune runs them: the
    demo's shape (4 trials, 2 at once), with per-trial jitter so no two are alike."""
    free = [0.0] * slots
    plan = {}
    for i in range(n):
        slot = min(range(slots), key=free.__getitem__)
        start = free[slot] + gap
        up = startup + 2.0 * (i % 2)  # some start slower
        each = epoch_s * (1.0 + 0.05 * i)
        loop = start + up
        end = loop + epochs * each + close
        plan[f"t{i}"] = (start, loop, each, end)
        free[slot] = end
    return plan, max(free)


def _fake_reader(plan, epochs, clock):
    from sweeps.launch import live

    def read(names, running=()):
        now, out = clock[0], []
        for name in names:
            start, loop, each, end = plan[name]
            if now < start:
                out.append(live.Unit(name, 1, epochs, "shapes@32/tiny"))
                continue
            done = max(0, min(epochs, int((now - loop) // each))) if now >= loop else 0
            fields = {"done": done, "last_at": loop + done * each, "loop_s": done * each, "epoch_s": each,
                      "images_per_s": 1000.0} if done else {}
            out.append(live.Unit(name, 1, epochs, "shapes@32/tiny", started=start,
                                 ended=end if now >= end else None, **fields))
        return out

    return read


def test_live_eta_is_within_30_percent_of_the_truth_by_the_second_line():
    from sweeps.launch import live

    epochs = 8
    plan, truth_end = _demo_like_schedule(epochs=epochs)
    clock = [0.0]
    units = {n: {"size": 1, "epochs": epochs, "shape": "shapes@32/tiny"} for n in plan}
    lp = live.LiveProgress(units, _fake_reader(plan, epochs, clock), poll_s=10.0)
    lines = []
    while clock[0] < truth_end:
        running = [n for n, (start, _, _, end) in plan.items() if start <= clock[0] < end]
        lines += [(clock[0], line) for line in lp.tick(running, clock[0])]
        clock[0] += 1.0
    assert len(lines) >= 4, lines
    now, second = lines[1]
    truth = truth_end - now
    assert abs(second.eta_s - truth) <= 0.3 * truth, (second.text, truth)
    assert f"ETA {format_duration(second.eta_s)}" in second.text
    assert second.text.startswith("[train] t") and "epoch 1/8" in second.text and "1,000 images/s" in second.text
    # Throttled: a unit's lines at least 30 s apart, and one at least every 5 minutes while it runs.
    for name in plan:
        times = [t for t, line in lines if line.unit == name]
        assert times and all(b - a >= live.MIN_INTERVAL_S for a, b in zip(times, times[1:])), (name, times)
        assert all(b - a <= live.MAX_INTERVAL_S + live.POLL_S for a, b in zip(times, times[1:]))


def test_live_eta_accounts_for_the_slots():
    from sweeps.launch import live

    one = live.Unit("a", 1, 10, "s", done=1, started=0.0, last_at=15.0, loop_s=10.0, epoch_s=10.0)
    waiting = [live.Unit(n, 1, 10, "s") for n in "bcd"]
    # a: 90 s left; each waiting trial costs 5 s start-up + 100 s. Two slots: b beside a, c after a, d after b.
    assert live.sweep_eta([one, *waiting], slots=2, now=15.0) == 5 + 100 + 105
    assert live.sweep_eta([one, *waiting], slots=4, now=15.0) == 105  # everything at once
    assert live.sweep_eta([one, *waiting], slots=1, now=15.0) == 90 + 3 * 105
    assert live.sweep_eta(waiting, slots=2, now=0.0) is None  # nothing measured yet: no ETA


def test_a_unit_still_starting_says_so_after_five_quiet_minutes():
    from sweeps.launch import live

    def read(names, running=()):
        return [live.Unit(n, 8, 100, "s", started=0.0) for n in names]

    lp = live.LiveProgress({"p0": {"size": 8, "epochs": 100, "shape": "s"}}, read)
    quiet = [line for t in range(0, 301, 10) for line in lp.tick(["p0"], float(t))]
    assert len(quiet) == 1 and quiet[0].text.startswith("[train] pack p0 (8 trials): starting (5 min so far)")
    assert "ETA after the first epoch" in quiet[0].text


def test_epoch_fields_take_the_latest_training_loop():
    from sweeps.launch import live

    rows = [{"epoch": 1, "wall_time_s": 10.0, "images_per_s": 5.0}, {"epoch": 2, "wall_time_s": 20.0},
            {"epoch": 3, "wall_time_s": 4.0}, {"epoch": 4, "wall_time_s": 8.0, "images_per_s": 7.0}]  # resumed at 3
    got = live.epoch_fields(rows, written_at=100.0)
    assert got == {"done": 4, "last_at": 100.0, "loop_s": 8.0, "epoch_s": 4.0, "images_per_s": 7.0}


def test_the_analysis_eta_leaves_out_the_pools_start_up_and_counts_its_actors():
    from analysis.measuring.job import eta_s

    # 60 s of start-up, then 12 checkpoints of 5 s each on 2 actors (two end every 5 s).
    ended = [60 + 5 * (i // 2 + 1) for i in range(12)]
    truth = [ended[-1] - t for t in ended]
    for k in (2, 3, 4):  # from the second line on (two ending together: no rate yet, the seconds say it)
        got = eta_s(ended[:k], [5.0] * k, 12, actors=2)
        assert abs(got - truth[k - 1]) <= 0.3 * truth[k - 1] + 5, (k, got, truth[k - 1])
    assert eta_s(ended[:1], [5.0], 12, actors=2) == 11 * 5 / 2
    assert eta_s(ended, [5.0] * 12, 12, actors=2) == 0.0


def test_the_console_keeps_vitsweeps_lines_and_moves_ray_tune_and_mlflow_ones(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    foreign = [
        "[2026-12-02 01:18:53,448 E 5523 5523] core_worker.cc:2465: Actor with class name: 'MapWorker(MapBatches("
        "Measurer))' and ID: '4b' has constructor arguments in the object store and max_restarts > 0. If ...",
        "\x1b[33m(raylet)\x1b[0m WARNING: 8 PYTHON worker processes have been started on node: 27 with address: 1",
        "2026-12-02 01:16:29,456\tWARNING authentication_token_setup.py:85 -- Token authentication is enabled",
        "2026/12/02 01:16:18 INFO mlflow.store.db.utils: Creating initial MLflow database tables...",
        "2026-12-02 01:20:13,756 fontTools.subset: maxp pruned",
    ]
    ours = ["[1/4] shapes-none-cutmix-s0-b1cb20a4: test 0.103 in 6 s; ETA 3 min",
            "2026-12-02 01:16:29,392 vitsweep: 4 trials, 0 already finished, 4 to run",
            "[train] t0: epoch 1/8, 1,000 images/s, ETA 39 s; all 4 trials: ETA 2 min (2 running, 2 waiting)"]
    assert [progress.classify_line(line) for line in foreign] == ["ray core", "ray process", "ray", "mlflow", "library"]
    assert all(progress.classify_line(line) is None for line in ours)
    # Through the file descriptors, as Ray's C++ core writes: a child process with the guard on.
    log = tmp_path / "console.log"
    code = (f"import os, sys; from sweeps.launch import progress\n"
            f"with progress.QuietConsole({str(log)!r}):\n"
            f"    for line in {foreign + ours!r}: os.write(2, (line + '\\n').encode())\n"
            f"    os.write(2, b'[2026-12-02 01:18:53,448 E 1 1] raylet.cc:1: something broke\\n')\n"
            f"    print('stdout passes', flush=True)\n"
            f"print('after', flush=True)\n")
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(root)})
    err = out.stderr.splitlines()
    assert err[:3] == ours and out.stdout.splitlines() == ["stdout passes", "after"]
    assert len(err) == 4 and err[3].startswith("vitsweep: Ray reported an error; its lines are kept in " + str(log))
    kept = log.read_text()
    assert all(progress._ANSI.sub("", line) in kept for line in foreign) and "something broke" in kept


def test_each_batch_of_trials_that_starts_gets_one_line(tmp_path):
    out = io.StringIO()
    p = progress.TrialProgress(str(tmp_path), "s", total=5,
                               members={"pack-1": ["a", "b"], "pack-2": ["c", "d"], "e": ["e"]}, stream=out)
    p.tick(["pack-1", "pack-2"])
    p.tick(["pack-1", "pack-2"])  # still running: nothing new
    p.tick(["pack-2", "e"])
    lines = out.getvalue().splitlines()
    assert lines == ["[train] started 4 trial(s) in 2 pack(s): pack-1, pack-2; 4 of 5 started",
                     "[train] started 1 trial(s): e; 5 of 5 started"]
